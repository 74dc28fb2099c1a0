//! The CPU backend: every op of [`crate::backend`] on [`CpuStorage`], dispatching on dtype to
//! cohort-kernels, one module per concern (as the CUDA backend's `cuda/imp/`).
//!
//! Shapes are validated by [`crate::Tensor`] before these run; here only dtypes are checked.

use half::{bf16, f16};

use crate::storage::CpuStorage;
use crate::{DType, Element, Error, Result};

const HALF_HINT: &str = " (f16/bf16 are storage types: cast to f32 with to_dtype to compute)";

fn unsupported(op: &'static str, dtype: DType) -> Error {
    let hint = match dtype {
        DType::F16 | DType::BF16 => HALF_HINT,
        DType::I32 | DType::U8 => " (this op needs a float dtype: cast with to_dtype)",
        _ => "",
    };
    Error::UnsupportedDType { op, dtype, hint }
}

fn mismatch(op: &'static str, a: &CpuStorage, b: &CpuStorage) -> Error {
    Error::DTypeMismatch {
        op,
        lhs: a.dtype(),
        rhs: b.dtype(),
    }
}

/// Applies a generic expression to float storages (f32, f64), rewrapping the result.
macro_rules! float_map {
    ($op:expr, $s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            other => return Err(unsupported($op, other.dtype())),
        }
    };
}

/// Applies a generic expression to numeric storages (f32, f64, i32, u8), rewrapping the result.
macro_rules! num_map {
    ($op:expr, $s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            CpuStorage::I32($v) => CpuStorage::I32($e),
            CpuStorage::U8($v) => CpuStorage::U8($e),
            other => return Err(unsupported($op, other.dtype())),
        }
    };
}

/// Applies a generic expression to every storage type, rewrapping the result.
macro_rules! any_map {
    ($s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            CpuStorage::F16($v) => CpuStorage::F16($e),
            CpuStorage::BF16($v) => CpuStorage::BF16($e),
            CpuStorage::I32($v) => CpuStorage::I32($e),
            CpuStorage::U8($v) => CpuStorage::U8($e),
        }
    };
}

// Declared after the macros above, which they use.
mod attention;
mod conv;
mod elementwise;
mod index;
mod layout;
mod norm;
mod optim;
mod products;
mod reductions;

fn indices<'a>(op: &'static str, idx: &'a CpuStorage) -> Result<&'a [i32]> {
    match idx {
        CpuStorage::I32(v) => Ok(v),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other.dtype(),
            hint: " (indices must be i32)",
        }),
    }
}

/// `len` elements of `value` (cast to `dtype`).
pub fn full(len: usize, value: f64, dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(vec![value as f32; len]),
        DType::F64 => CpuStorage::F64(vec![value; len]),
        DType::F16 => CpuStorage::F16(vec![f16::from_f64(value); len]),
        DType::BF16 => CpuStorage::BF16(vec![bf16::from_f64(value); len]),
        DType::I32 => CpuStorage::I32(vec![value as i32; len]),
        DType::U8 => CpuStorage::U8(vec![value as u8; len]),
    })
}

/// `len` zeros.
pub fn zeros(len: usize, dtype: DType) -> Result<CpuStorage> {
    full(len, 0.0, dtype)
}

/// The elements of `s`, which must have `first`'s type `T`.
fn like<'a, T: Element>(
    op: &'static str,
    first: &CpuStorage,
    s: &'a CpuStorage,
) -> Result<&'a [T]> {
    T::slice(s).ok_or_else(|| mismatch(op, first, s))
}
