//! CUDA element-wise binary ops (`binary.cuh`): broadcasting through strides, comparisons, where. f32's arithmetic
//! (`binary.cu`) and comparisons (`compare.cu`), the 16-bit types' kernels (`half.cu`), i32's (`int.cu`) and where
//! (`where.cu`) are five modules, so that NVRTC makes them side by side on a machine's first run.

use super::BinaryOp;
use crate::Result;
use crate::cuda::{
    CudaType, Gpu, StridedShape, broadcast_strides, kernel_args,
    sources::{
        BINARY as SRC, BINARY_16 as HALF_SRC, BINARY_COMPARE as COMPARE_SRC, BINARY_INT as INT_SRC,
        WHERE as WHERE_SRC,
    },
    unsupported,
};

fn kernel_name(op: BinaryOp, ty: CudaType) -> Option<&'static str> {
    use BinaryOp::*;
    Some(match (ty, op) {
        (CudaType::F32, Add) => "add_f32",
        (CudaType::F32, Sub) => "sub_f32",
        (CudaType::F32, Mul) => "mul_f32",
        (CudaType::F32, Div) => "div_f32",
        (CudaType::F32, Maximum) => "maximum_f32",
        (CudaType::F32, Minimum) => "minimum_f32",
        (CudaType::F32, Gt) => "gt_f32",
        (CudaType::F32, Ge) => "ge_f32",
        (CudaType::F32, Lt) => "lt_f32",
        (CudaType::F32, Le) => "le_f32",
        (CudaType::F32, Eq) => "eq_f32",
        (CudaType::BF16, Add) => "add_bf16",
        (CudaType::BF16, Sub) => "sub_bf16",
        (CudaType::BF16, Mul) => "mul_bf16",
        (CudaType::F16, Add) => "add_f16",
        (CudaType::F16, Sub) => "sub_f16",
        (CudaType::F16, Mul) => "mul_f16",
        (CudaType::I32, Add) => "add_i32",
        (CudaType::I32, Sub) => "sub_i32",
        (CudaType::I32, Mul) => "mul_i32",
        (CudaType::I32, Div) => "div_i32",
        (CudaType::I32, Maximum) => "maximum_i32",
        (CudaType::I32, Minimum) => "minimum_i32",
        (CudaType::I32, Gt) => "gt_i32",
        (CudaType::I32, Ge) => "ge_i32",
        (CudaType::I32, Lt) => "lt_i32",
        (CudaType::I32, Le) => "le_i32",
        (CudaType::I32, Eq) => "eq_i32",
        _ => return None,
    })
}

/// `out = lhs (op) rhs` with numpy broadcasting; `out` is contiguous with `out_shape`.
/// Comparisons give 1 / 0 of the operands' type. `out` may be `lhs` when the shapes agree.
///
/// # Safety
/// Each address must hold a contiguous tensor of its shape and `ty` on this device.
///
/// # Errors
/// No kernel for `ty` (f32 and i32 have every op, bf16 and f16 add, sub and mul), shapes that do not broadcast, or
/// a launch failure.
#[allow(clippy::too_many_arguments)]
pub unsafe fn binary(
    gpu: &Gpu,
    op: BinaryOp,
    ty: CudaType,
    lhs: u64,
    lhs_shape: &[usize],
    rhs: u64,
    rhs_shape: &[usize],
    out: u64,
    out_shape: &[usize],
) -> Result<()> {
    let name = kernel_name(op, ty).ok_or_else(|| unsupported(op.name(), ty))?;
    let n_usize: usize = out_shape.iter().product();
    if n_usize == 0 {
        return Ok(());
    }
    let ls = broadcast_strides(lhs_shape, out_shape)?;
    let rs = broadcast_strides(rhs_shape, out_shape)?;
    let mut st = StridedShape::new(out_shape, &[&ls, &rs])?;
    let float = matches!(ty, CudaType::F32 | CudaType::BF16 | CudaType::F16);
    // Four elements are 16 bytes of f32, 8 of a 16-bit type.
    let aligned = |p: u64| p % (4 * ty.size() as u64) == 0;
    if st.flags & 1 == 1 && float && n_usize % 4 == 0 && [lhs, rhs, out].into_iter().all(aligned) {
        st.flags |= 2;
    }
    let n = n_usize as u64;
    let work = if st.flags & 2 != 0 {
        n_usize / 4
    } else {
        n_usize
    };
    let src = match (ty, op) {
        (
            CudaType::F32,
            BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Eq,
        ) => &COMPARE_SRC,
        (CudaType::F32, _) => &SRC,
        (CudaType::BF16 | CudaType::F16, _) => &HALF_SRC,
        _ => &INT_SRC,
    };
    let mut args = kernel_args![n, st, lhs, rhs, out];
    // SAFETY: argument types match `<op>_<ty>(u64, Strided, const T*, const T*, T*)`; the caller
    // guarantees the buffers.
    unsafe { gpu.launch(src, name, gpu.grid(work, 256), &mut args) }
}

/// `out = mask != 0 ? on_true : on_false`, each operand broadcast to `out_shape`.
///
/// # Safety
/// As [`binary`]; `mask` has type `mask_ty`, the others `ty`.
///
/// # Errors
/// No kernel for the pair (masks f32 / i32 / u8, values f32 / i32), shapes that do not broadcast.
#[allow(clippy::too_many_arguments)]
pub unsafe fn where_cond(
    gpu: &Gpu,
    mask_ty: CudaType,
    ty: CudaType,
    mask: u64,
    mask_shape: &[usize],
    on_true: u64,
    true_shape: &[usize],
    on_false: u64,
    false_shape: &[usize],
    out: u64,
    out_shape: &[usize],
) -> Result<()> {
    let name = match (mask_ty, ty) {
        (CudaType::F32, CudaType::F32) => "where_f32_f32",
        (CudaType::I32, CudaType::F32) => "where_i32_f32",
        (CudaType::U8, CudaType::F32) => "where_u8_f32",
        (CudaType::F32, CudaType::I32) => "where_f32_i32",
        (CudaType::I32, CudaType::I32) => "where_i32_i32",
        (CudaType::U8, CudaType::I32) => "where_u8_i32",
        _ => return Err(unsupported("where_cond", ty)),
    };
    let n_usize: usize = out_shape.iter().product();
    if n_usize == 0 {
        return Ok(());
    }
    let ms = broadcast_strides(mask_shape, out_shape)?;
    let ts = broadcast_strides(true_shape, out_shape)?;
    let fs = broadcast_strides(false_shape, out_shape)?;
    let st = StridedShape::new(out_shape, &[&ms, &ts, &fs])?;
    let n = n_usize as u64;
    let mut args = kernel_args![n, st, mask, on_true, on_false, out];
    // SAFETY: matches `where_<m>_<t>(u64, Strided, const M*, const T*, const T*, T*)`.
    unsafe { gpu.launch(&WHERE_SRC, name, gpu.grid(n_usize, 256), &mut args) }
}
