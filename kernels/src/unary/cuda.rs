//! CUDA element-wise unary float ops (`unary.cu`).

use super::UnaryOp;
use crate::Result;
use crate::cuda::{Gpu, KernelSource, aligned16, kernel_args};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "unary",
    code: include_str!("unary.cu"),
};

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

/// `out[i] = op(x[i])` over `n` f32 elements; `out` may be `x` (in place).
///
/// # Safety
/// `x` and `out` must each hold `n` f32 on this device.
///
/// # Errors
/// A launch failure.
pub unsafe fn unary(gpu: &Gpu, op: UnaryOp, x: u64, out: u64, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let (name, p) = kernel(op);
    let vec: u32 = u32::from(n % 4 == 0 && aligned16(&[x, out]));
    let work = if vec == 1 { n / 4 } else { n };
    let n = n as u64;
    let mut args = kernel_args![n, vec, p, x, out];
    // SAFETY: matches `<op>_f32(u64, u32, float, const float*, float*)`; buffers per the caller.
    unsafe { gpu.launch(&SRC, name, gpu.grid(work, 256), &mut args) }
}
