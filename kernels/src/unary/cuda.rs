//! CUDA element-wise unary float ops (`unary.cu`).

use super::UnaryOp;
use crate::cuda::{
    CudaType, Gpu, Launch, aligned16, float_kernel, float_kernels, kernel_args,
    sources::UNARY as SRC, unsupported,
};
use crate::reduce::{ReduceOp, ReduceShape, cuda as reduce_cuda};
use crate::{Error, Result};

fn kernel(op: UnaryOp) -> (&'static str, f32) {
    match op {
        UnaryOp::Neg => ("neg_f32", 0.0),
        UnaryOp::Relu => ("relu_f32", 0.0),
        UnaryOp::Gelu => ("gelu_f32", 0.0),
        UnaryOp::Tanh => ("tanh_f32", 0.0),
        UnaryOp::Sigmoid => ("sigmoid_f32", 0.0),
        UnaryOp::Exp => ("exp_f32", 0.0),
        UnaryOp::Log => ("log_f32", 0.0),
        UnaryOp::Sqrt => ("sqrt_f32", 0.0),
        UnaryOp::Abs => ("abs_f32", 0.0),
        UnaryOp::Square => ("square_f32", 0.0),
        UnaryOp::AddScalar(c) => ("add_scalar_f32", c as f32),
        UnaryOp::MulScalar(c) => ("mul_scalar_f32", c as f32),
        UnaryOp::Powf(c) => ("powf_f32", c as f32),
        UnaryOp::GtScalar(c) => ("gt_scalar_f32", c as f32),
        UnaryOp::LtScalar(c) => ("lt_scalar_f32", c as f32),
    }
}

/// `out[i] = op(x[i])` over `n` elements of `ty`: f32 for every op, bf16 and f16 for ReLU (activations a mixed
/// policy keeps in the low type); `out` may be `x` (in place).
///
/// # Safety
/// `x` and `out` must each hold `n` elements of `ty` on this device.
///
/// # Errors
/// An op without a kernel for `ty`, or a launch failure.
pub unsafe fn unary(
    gpu: &Gpu,
    op: UnaryOp,
    ty: CudaType,
    x: u64,
    out: u64,
    n: usize,
) -> Result<()> {
    let (name, p) = match (ty, op) {
        (CudaType::F32, _) => kernel(op),
        (CudaType::BF16, UnaryOp::Relu) => ("relu_bf16", 0.0),
        (CudaType::F16, UnaryOp::Relu) => ("relu_f16", 0.0),
        _ => return Err(unsupported(op.name(), ty)),
    };
    if n == 0 {
        return Ok(());
    }
    let vec: u32 = u32::from(n % 4 == 0 && aligned16(&[x, out]));
    let work = if vec == 1 { n / 4 } else { n };
    let n = n as u64;
    let mut args = kernel_args![n, vec, p, x, out];
    // SAFETY: matches `<op>_<ty>(u64, u32, float, const T*, T*)`; buffers per the caller.
    unsafe { gpu.launch(&SRC, name, gpu.grid(work, 256), &mut args) }
}

/// `y = x + b`, then `max(y, 0)` when `relu`, for `n` f32 with `b` `[groups, cols]` broadcast over
/// `group`-element blocks of `x` (`[groups, rows, cols]`, `group = rows · cols`).
///
/// # Safety
/// `x` and `y` must hold `n` f32, `b` `n / group · cols` f32, on this device.
///
/// # Errors
/// A launch failure.
pub unsafe fn bias_act(
    gpu: &Gpu,
    (x, b, y): (u64, u64, u64),
    n: usize,
    cols: usize,
    group: usize,
    relu: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let wide = cols % 4 == 0 && aligned16(&[x, b, y]);
    let name = match (relu, wide) {
        (true, false) => "bias_relu_f32",
        (true, true) => "bias_relu_f32x4",
        (false, false) => "bias_add_f32",
        (false, true) => "bias_add_f32x4",
    };
    let (n64, cols, group) = (n as u64, cols.max(1) as u64, group.max(1) as u64);
    let mut args = kernel_args![n64, cols, group, x, b, y];
    let work = if wide { n / 4 } else { n };
    // SAFETY: matches `bias_{relu,add}_f32{,x4}(u64, u64, u64, const float*, const float*, float*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(work, 256), &mut args) }
}

/// `dx = y > 0 ? dy : 0` for `n` elements of `ty` (f32, bf16 or f16).
///
/// # Safety
/// The three buffers must hold `n` elements of `ty` on this device.
///
/// # Errors
/// Another type, or a launch failure.
pub unsafe fn relu_backward(
    gpu: &Gpu,
    ty: CudaType,
    dy: u64,
    y: u64,
    dx: u64,
    n: usize,
) -> Result<()> {
    let name = float_kernel("relu_backward", ty, float_kernels!("relu_backward"))?;
    // SAFETY: forwarded to the caller.
    unsafe { backward_pass(gpu, name, (dy, y, dx), n) }
}

/// GELU's (tanh form) backward from its input `x`, in one pass: `dx = dy · gelu'(x)`, f32 only (`ty`).
///
/// # Safety
/// The three buffers must hold `n` f32 on this device.
///
/// # Errors
/// Another type, or a launch failure.
pub unsafe fn gelu_backward(
    gpu: &Gpu,
    ty: CudaType,
    dy: u64,
    x: u64,
    dx: u64,
    n: usize,
) -> Result<()> {
    if ty != CudaType::F32 {
        return Err(unsupported("gelu_backward", ty));
    }
    // SAFETY: forwarded to the caller.
    unsafe { backward_pass(gpu, "gelu_backward_f32", (dy, x, dx), n) }
}

/// An activation's backward kernel `name(u64 n, const T* dy, const T* saved, T* dx)` over `n` elements.
unsafe fn backward_pass(
    gpu: &Gpu,
    name: &'static str,
    (dy, saved, dx): (u64, u64, u64),
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut args = kernel_args![n64, dy, saved, dx];
    // SAFETY: matches `<name>(u64, const T*, const T*, T*)`; sizes per the caller.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}

/// ReLU's backward with its bias's gradient in one kernel: for `dy` and `y` `[groups, rows, cols]`,
/// `dx = y > 0 ? dy : 0` and `db[g, c]` the sum of `dx[g, .., c]` over the rows (shape
/// `[groups, rows, cols]`).
///
/// # Safety
/// `dy`, `y` and `dx` must hold `groups · rows · cols` f32, `db` `groups · cols` f32, on this device.
///
/// # Errors
/// More than 65,535 groups, or a launch failure.
pub unsafe fn relu_backward_bias(
    gpu: &Gpu,
    dy: u64,
    y: u64,
    dx: u64,
    db: u64,
    [groups, rows, cols]: [usize; 3],
) -> Result<()> {
    if groups == 0 || cols == 0 {
        return Ok(());
    }
    let too_many = || {
        Error::Cuda(format!(
            "relu_backward_bias: {groups} groups of {cols} columns exceed the grid"
        ))
    };
    // Few groups of many rows would leave one block a long loop: there the element-wise backward
    // and a split reduction spread the rows over the GPU.
    let blocks = groups * cols.div_ceil(32);
    if rows > 1024 && 2 * blocks < gpu.sm_count() as usize {
        let rows_shape = ReduceShape {
            outer: groups,
            dim: rows,
            inner: cols,
        };
        // SAFETY: forwarded to the caller (dx holds groups·rows·cols f32, db groups·cols).
        return unsafe {
            relu_backward(gpu, CudaType::F32, dy, y, dx, groups * rows * cols)?;
            reduce_cuda::reduce(gpu, ReduceOp::Sum, CudaType::F32, dx, db, rows_shape)
        };
    }
    let groups32 = u32::try_from(groups)
        .ok()
        .filter(|&g| g <= 65_535)
        .ok_or_else(too_many)?;
    // Four columns a thread where the groups alone keep half the multiprocessors busy; else
    // narrower strips, so that a few groups still spread over many blocks.
    let wide = cols % 4 == 0
        && aligned16(&[dy, y, dx, db])
        && 2 * groups * cols.div_ceil(128) >= gpu.sm_count() as usize;
    let (kernel, strip, block) = if wide {
        ("relu_backward_bias_f32x4", 128, (32, 8, 1))
    } else {
        ("relu_backward_bias_f32", 32, (32, 32, 1))
    };
    let cfg = Launch {
        grid: (
            u32::try_from(cols.div_ceil(strip)).map_err(|_| too_many())?,
            groups32,
            1,
        ),
        block,
        shared: 0,
    };
    let (r, c) = (rows as u64, cols as u64);
    let mut args = kernel_args![r, c, dy, y, dx, db];
    // SAFETY: matches `relu_backward_bias_f32[x4](u64, u64, const float*, const float*, float*,
    // float*)`; the x4 kernel's alignment was checked above.
    unsafe { gpu.launch(&SRC, kernel, cfg, &mut args) }
}
