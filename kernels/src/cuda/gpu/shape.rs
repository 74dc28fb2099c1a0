//! Launch geometry, strided and broadcast shapes, and the element types the kernels know.

use crate::{Error, Math, Result};

/// Most dimensions a strided or broadcasting kernel handles (matches `MAX_RANK` in `common.cuh`).
pub(crate) const MAX_RANK: usize = 8;

/// A kernel launch geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared: u32,
}

/// Shape and up to three stride sets of a strided or broadcasting kernel (`Strided` in `common.cuh`).
///
/// Strides are in elements; a stride of 0 broadcasts that dimension.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct StridedShape {
    pub rank: u32,
    /// Bit 0: every operand is contiguous with the output shape (no index arithmetic needed).
    pub flags: u32,
    pub shape: [u64; MAX_RANK],
    pub strides: [[u64; MAX_RANK]; 3],
}

impl StridedShape {
    /// Builds the descriptor for an iteration over `shape` (row-major), one stride set per operand.
    ///
    /// # Errors
    /// More than [`MAX_RANK`] dimensions, or a stride set of another length.
    pub(crate) fn new(shape: &[usize], strides: &[&[usize]]) -> Result<Self> {
        if shape.len() > MAX_RANK {
            return Err(Error::Cuda(format!(
                "strided kernels handle at most {MAX_RANK} dimensions, got shape {shape:?}"
            )));
        }
        let mut s = StridedShape {
            rank: shape.len() as u32,
            flags: 0,
            shape: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; 3],
        };
        for (d, &n) in shape.iter().enumerate() {
            s.shape[d] = n as u64;
        }
        let contiguous = contiguous_strides(shape);
        let mut all_contiguous = true;
        for (k, st) in strides.iter().enumerate().take(3) {
            if st.len() != shape.len() {
                return Err(Error::Cuda(format!(
                    "stride set {st:?} does not match shape {shape:?}"
                )));
            }
            for (d, &v) in st.iter().enumerate() {
                s.strides[k][d] = v as u64;
                if shape[d] > 1 && v != contiguous[d] {
                    all_contiguous = false;
                }
            }
        }
        if all_contiguous {
            s.flags |= 1;
        }
        Ok(s)
    }
}

/// Row-major strides of a contiguous tensor of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1];
    }
    st
}

/// Strides of an operand of `src_shape` broadcast (numpy rules, aligned at the right) to `out_shape`.
pub(crate) fn broadcast_strides(src_shape: &[usize], out_shape: &[usize]) -> Result<Vec<usize>> {
    if src_shape.len() > out_shape.len() {
        return Err(Error::Cuda(format!(
            "cannot broadcast {src_shape:?} to {out_shape:?}"
        )));
    }
    let own = contiguous_strides(src_shape);
    let lead = out_shape.len() - src_shape.len();
    let mut st = vec![0; out_shape.len()];
    for (d, &n) in src_shape.iter().enumerate() {
        if n == out_shape[lead + d] {
            st[lead + d] = if n == 1 { 0 } else { own[d] };
        } else if n != 1 {
            return Err(Error::Cuda(format!(
                "cannot broadcast {src_shape:?} to {out_shape:?}"
            )));
        }
    }
    Ok(st)
}

/// Builds the argument array of a kernel launch from local variables (each one is borrowed, so
/// it must outlive the launch call).
macro_rules! kernel_args {
    ($($a:ident),* $(,)?) => {
        [$( (&$a) as *const _ as *mut ::std::ffi::c_void ),*]
    };
}
pub(crate) use kernel_args;

/// Element types the CUDA kernels know (the tensor crate maps its `DType` onto these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer (labels, indices).
    I32,
    /// Byte (masks).
    U8,
}

impl CudaType {
    /// The type of a product's or a convolution's operands under `math`.
    pub fn operands_of(math: Math) -> CudaType {
        match math {
            Math::Fp32 | Math::Tf32 => CudaType::F32,
            Math::Bf16 => CudaType::BF16,
            Math::F16 => CudaType::F16,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            CudaType::F32 | CudaType::I32 => 4,
            CudaType::F16 | CudaType::BF16 => 2,
            CudaType::U8 => 1,
        }
    }

    /// The name used in kernel names (`add_f32`).
    pub fn name(self) -> &'static str {
        match self {
            CudaType::F32 => "f32",
            CudaType::F16 => "f16",
            CudaType::BF16 => "bf16",
            CudaType::I32 => "i32",
            CudaType::U8 => "u8",
        }
    }
}

/// The error for an op asked of a type it has no kernel for.
pub(crate) fn unsupported(op: &str, ty: CudaType) -> Error {
    Error::Cuda(format!(
        "{op} has no CUDA kernel for {}: cast to f32 first",
        ty.name()
    ))
}

/// A kernel's entry points for the float types, in the order f32, bf16, f16 (`None` where it has none).
pub(crate) type FloatKernels = [Option<&'static str>; 3];

/// The entry points `<base>_f32`, `<base>_bf16` and `<base>_f16` of a kernel compiled for each float type.
macro_rules! float_kernels {
    ($base:literal) => {
        [
            Some(concat!($base, "_f32")),
            Some(concat!($base, "_bf16")),
            Some(concat!($base, "_f16")),
        ]
    };
}
pub(crate) use float_kernels;

/// The entry point of `names` for elements of `ty`; [`unsupported`]'s error where it has none.
pub(crate) fn float_kernel(op: &str, ty: CudaType, names: FloatKernels) -> Result<&'static str> {
    let name = match ty {
        CudaType::F32 => names[0],
        CudaType::BF16 => names[1],
        CudaType::F16 => names[2],
        CudaType::I32 | CudaType::U8 => None,
    };
    name.ok_or_else(|| unsupported(op, ty))
}

/// Whether every address is 16-byte aligned (four-wide float loads).
pub(crate) fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p % 16 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides_follow_numpy() {
        assert_eq!(broadcast_strides(&[3], &[2, 3]).unwrap(), vec![0, 1]);
        assert_eq!(broadcast_strides(&[2, 1], &[2, 3]).unwrap(), vec![1, 0]);
        assert_eq!(broadcast_strides(&[2, 3], &[2, 3]).unwrap(), vec![3, 1]);
        assert!(broadcast_strides(&[4], &[2, 3]).is_err());
    }

    #[test]
    fn strided_shape_detects_contiguous_operands() {
        let s = StridedShape::new(&[2, 3], &[&[3, 1], &[3, 1]]).unwrap();
        assert_eq!(s.flags & 1, 1);
        let s = StridedShape::new(&[2, 3], &[&[3, 1], &[0, 1]]).unwrap();
        assert_eq!(s.flags & 1, 0);
        assert!(StridedShape::new(&[1; 9], &[]).is_err());
    }
}
