//! CUDA data movement (`copy.cu`) and dtype casts (`cast.cu`).

use super::Copy2d;
use crate::cuda::{
    CudaType, Gpu, Launch, StridedShape, broadcast_strides, contiguous_strides, kernel_args,
    sources::{CAST as CAST_SRC, COPY as SRC},
    unsupported,
};
use crate::{Error, Result};

fn width_name(op: &str, elem_bytes: usize) -> Result<&'static str> {
    let name = match (op, elem_bytes) {
        ("strided_copy", 8) => "strided_copy_u64",
        ("strided_copy", 4) => "strided_copy_u32",
        ("strided_copy", 2) => "strided_copy_u16",
        ("strided_copy", 1) => "strided_copy_u8",
        ("copy2d", 8) => "copy2d_u64",
        ("copy2d", 4) => "copy2d_u32",
        ("copy2d", 2) => "copy2d_u16",
        ("copy2d", 1) => "copy2d_u8",
        ("transpose", 8) => "transpose_u64",
        ("transpose", 4) => "transpose_u32",
        ("transpose", 2) => "transpose_u16",
        ("transpose", 1) => "transpose_u8",
        _ => {
            return Err(Error::Cuda(format!(
                "{op}: elements of {elem_bytes} bytes are not supported (1, 2, 4 or 8)"
            )));
        }
    };
    Ok(name)
}

/// Performs the block copy `c` (offsets and strides in elements of `elem_bytes` bytes).
///
/// # Safety
/// Every block must lie inside its buffer on this device.
///
/// # Errors
/// An unsupported element width, or a launch failure.
pub unsafe fn copy2d(gpu: &Gpu, elem_bytes: usize, src: u64, dst: u64, c: &Copy2d) -> Result<()> {
    let n = c.rows * c.cols;
    if n == 0 {
        return Ok(());
    }
    let eb = elem_bytes as u64;
    let src = src + c.src_offset as u64 * eb;
    let dst = dst + c.dst_offset as u64 * eb;
    if c.src_stride == c.cols && c.dst_stride == c.cols {
        // SAFETY: one contiguous range in each buffer, per the caller.
        return unsafe { gpu.dtod(dst, src, n * elem_bytes) };
    }
    let name = width_name("copy2d", elem_bytes)?;
    let (r, k, ss, ds) = (
        c.rows as u64,
        c.cols as u64,
        c.src_stride as u64,
        c.dst_stride as u64,
    );
    let mut args = kernel_args![r, k, ss, ds, src, dst];
    // SAFETY: matches `copy2d_<w>(u64, u64, u64, u64, const T*, T*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}

/// `dst[Σ i_d · dst_strides[d]] = src[Σ i_d · src_strides[d]]` over every index of `shape`.
///
/// # Safety
/// Every addressed element must lie inside its buffer on this device.
///
/// # Errors
/// More than 8 dims, an unsupported width, or a launch failure.
pub unsafe fn strided_copy(
    gpu: &Gpu,
    elem_bytes: usize,
    shape: &[usize],
    src: u64,
    src_strides: &[usize],
    dst: u64,
    dst_strides: &[usize],
) -> Result<()> {
    let n_usize: usize = shape.iter().product();
    if n_usize == 0 {
        return Ok(());
    }
    let name = width_name("strided_copy", elem_bytes)?;
    let st = StridedShape::new(shape, &[src_strides, dst_strides])?;
    if st.flags & 1 == 1 {
        // SAFETY: both operands are contiguous with the same shape.
        return unsafe { gpu.dtod(dst, src, n_usize * elem_bytes) };
    }
    let n = n_usize as u64;
    let mut args = kernel_args![n, st, src, dst];
    // SAFETY: matches `strided_copy_<w>(u64, Strided, const T*, T*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n_usize, 256), &mut args) }
}

/// Materialises `src` (contiguous, `src_shape`) broadcast to `out_shape` in `dst`.
///
/// # Safety
/// `src` holds the product of `src_shape` elements, `dst` that of `out_shape`.
///
/// # Errors
/// Shapes that do not broadcast, more than 8 dims, or a launch failure.
pub unsafe fn broadcast(
    gpu: &Gpu,
    elem_bytes: usize,
    src: u64,
    src_shape: &[usize],
    dst: u64,
    out_shape: &[usize],
) -> Result<()> {
    let ss = broadcast_strides(src_shape, out_shape)?;
    let ds = contiguous_strides(out_shape);
    // SAFETY: forwarded.
    unsafe { strided_copy(gpu, elem_bytes, out_shape, src, &ss, dst, &ds) }
}

/// `[batch, rows, cols]` into `[batch, cols, rows]`.
///
/// # Safety
/// Both buffers hold `batch * rows * cols` elements of `elem_bytes` bytes.
///
/// # Errors
/// An unsupported width, or a launch failure.
pub unsafe fn transpose(
    gpu: &Gpu,
    elem_bytes: usize,
    src: u64,
    dst: u64,
    batch: usize,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if batch * rows * cols == 0 {
        return Ok(());
    }
    let name = width_name("transpose", elem_bytes)?;
    if batch > 65_535 || rows.div_ceil(32) > 65_535 {
        // Beyond the tiled kernel's grid: the same permutation as a strided copy.
        // SAFETY: forwarded; the strides address exactly the two buffers.
        return unsafe {
            strided_copy(
                gpu,
                elem_bytes,
                &[batch, cols, rows],
                src,
                &[rows * cols, 1, cols],
                dst,
                &[rows * cols, rows, 1],
            )
        };
    }
    let cfg = Launch {
        grid: (
            cols.div_ceil(32) as u32,
            rows.div_ceil(32) as u32,
            batch as u32,
        ),
        block: (32, 8, 1),
        shared: 0,
    };
    let (r, c) = (rows as u64, cols as u64);
    let mut args = kernel_args![r, c, src, dst];
    // SAFETY: matches `transpose_<w>(u64, u64, const T*, T*)`.
    unsafe { gpu.launch(&SRC, name, cfg, &mut args) }
}

/// `out[i] = i` for `n` elements of `ty` (f32 or i32).
///
/// # Safety
/// `out` holds `n` elements of `ty`.
///
/// # Errors
/// Another type, or a launch failure.
pub unsafe fn arange(gpu: &Gpu, ty: CudaType, out: u64, n: usize) -> Result<()> {
    let name = match ty {
        CudaType::F32 => "arange_f32",
        CudaType::I32 => "arange_i32",
        other => return Err(unsupported("arange", other)),
    };
    if n == 0 {
        return Ok(());
    }
    let nn = n as u64;
    let mut args = kernel_args![nn, out];
    // SAFETY: matches `arange_<t>(u64, T*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}

/// Fills `n` elements of `ty` at `out` with `value` (converted like a cast from f64).
///
/// # Safety
/// `out` holds `n` elements of `ty`.
///
/// # Errors
/// A driver failure.
pub unsafe fn fill(gpu: &Gpu, ty: CudaType, out: u64, n: usize, value: f64) -> Result<()> {
    let bits: u32 = match ty {
        CudaType::F32 => (value as f32).to_bits(),
        CudaType::F16 => u32::from(half::f16::from_f64(value).to_bits()),
        CudaType::BF16 => u32::from(half::bf16::from_f64(value).to_bits()),
        CudaType::I32 => (value as i32) as u32,
        CudaType::U8 => u32::from(value as u8),
    };
    // SAFETY: forwarded; the pattern has the element's width.
    unsafe { gpu.fill(out, bits, ty.size(), n) }
}

/// Converts `n` elements of type `from` at `src` to type `to` at `dst` (same semantics as a cast
/// through f64 on the CPU: truncation toward zero with saturation for integers, NaN to 0).
///
/// # Safety
/// `src` holds `n` elements of `from`, `dst` `n` of `to`.
///
/// # Errors
/// A launch failure.
pub unsafe fn cast(
    gpu: &Gpu,
    from: CudaType,
    to: CudaType,
    src: u64,
    dst: u64,
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if from == to {
        // SAFETY: same size, per the caller.
        return unsafe { gpu.dtod(dst, src, n * from.size()) };
    }
    // Four at a time where both sides allow a whole-vector access (16 bytes of f32, 8 of a 16-bit type); the
    // last n % 4 elements, if any, one at a time.
    let wide = n / 4 * 4;
    if let Some(name) = cast4_name(from, to)
        && wide > 0
        && src % (4 * from.size() as u64) == 0
        && dst % (4 * to.size() as u64) == 0
    {
        let n4 = (wide / 4) as u64;
        let mut args = kernel_args![n4, src, dst];
        // SAFETY: matches `cast4_<from>_<to>(u64, const F*, T*)`; both buffers hold `wide` elements, aligned above.
        unsafe { gpu.launch(&CAST_SRC, name, gpu.grid(wide / 4, 256), &mut args)? };
        if wide == n {
            return Ok(());
        }
        // SAFETY: the tail lies inside both buffers.
        return unsafe {
            cast(
                gpu,
                from,
                to,
                src + (wide * from.size()) as u64,
                dst + (wide * to.size()) as u64,
                n - wide,
            )
        };
    }
    let name = cast_name(from, to);
    let nn = n as u64;
    let mut args = kernel_args![nn, src, dst];
    // SAFETY: matches `cast_<from>_<to>(u64, const F*, T*)`.
    unsafe { gpu.launch(&CAST_SRC, name, gpu.grid(n, 256), &mut args) }
}

/// The four-wide kernel between two float types, if `(from, to)` is such a pair.
fn cast4_name(from: CudaType, to: CudaType) -> Option<&'static str> {
    use CudaType::*;
    Some(match (from, to) {
        (F32, F16) => "cast4_f32_f16",
        (F32, BF16) => "cast4_f32_bf16",
        (F16, F32) => "cast4_f16_f32",
        (BF16, F32) => "cast4_bf16_f32",
        (F16, BF16) => "cast4_f16_bf16",
        (BF16, F16) => "cast4_bf16_f16",
        _ => return None,
    })
}

fn cast_name(from: CudaType, to: CudaType) -> &'static str {
    use CudaType::*;
    match (from, to) {
        (F32, F16) => "cast_f32_f16",
        (F32, BF16) => "cast_f32_bf16",
        (F32, I32) => "cast_f32_i32",
        (F32, U8) => "cast_f32_u8",
        (F16, F32) => "cast_f16_f32",
        (F16, BF16) => "cast_f16_bf16",
        (F16, I32) => "cast_f16_i32",
        (F16, U8) => "cast_f16_u8",
        (BF16, F32) => "cast_bf16_f32",
        (BF16, F16) => "cast_bf16_f16",
        (BF16, I32) => "cast_bf16_i32",
        (BF16, U8) => "cast_bf16_u8",
        (I32, F32) => "cast_i32_f32",
        (I32, F16) => "cast_i32_f16",
        (I32, BF16) => "cast_i32_bf16",
        (I32, U8) => "cast_i32_u8",
        (U8, F32) => "cast_u8_f32",
        (U8, F16) => "cast_u8_f16",
        (U8, BF16) => "cast_u8_bf16",
        (U8, I32) => "cast_u8_i32",
        (F32, F32) => "cast_f32_f32",
        (F16, F16) => "cast_f16_f16",
        (BF16, BF16) => "cast_bf16_bf16",
        (I32, I32) => "cast_i32_i32",
        (U8, U8) => "cast_u8_u8",
    }
}
