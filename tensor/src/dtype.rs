use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

use crate::storage::CpuStorage;
use crate::{Error, Result};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float: the compute type.
    F32,
    /// 64-bit float: CPU only (gradient checks).
    F64,
    /// IEEE half: stored, and computed in by the ops a mixed policy keeps activations in on CUDA (see
    /// [`crate::Precision`]); cast to f32 for the others.
    F16,
    /// bfloat16: as [`DType::F16`].
    BF16,
    /// 32-bit signed integer: labels and indices.
    I32,
    /// Byte: masks and raw pixels.
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Whether the dtype is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// The lowercase name (`"f32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => DType::F32,
            "f64" | "float64" => DType::F64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i32" | "int32" => DType::I32,
            "u8" | "uint8" => DType::U8,
            _ => return Err(Error::ParseDType(s.to_string())),
        })
    }
}

/// A Rust type that is the element of one [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// Wraps a vector as CPU storage.
    fn into_storage(v: Vec<Self>) -> CpuStorage;
    /// The elements of `s` when it holds this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    /// The elements of `s`, to change in place, when it holds this type.
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_storage(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$d(v)
            }
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$d(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$d(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(f16, F16);
element!(bf16, BF16);
element!(i32, I32);
element!(u8, U8);
