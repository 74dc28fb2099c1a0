//! CUDA max pooling (`max_pool.cu`).

use super::PoolParams;
use crate::Result;
use crate::cuda::{Gpu, KernelSource, kernel_args};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "max_pool",
    code: include_str!("max_pool.cu"),
};

/// Max over each window of f32 `x` (`[planes, h, w]`) into `out`, with the flat in-plane index of
/// each maximum (the first one on ties) in `idx` (i32).
///
/// # Safety
/// `x` holds `planes·h·w` f32; `out` and `idx` `planes·out_h·out_w` elements each.
///
/// # Errors
/// A launch failure.
pub unsafe fn max_pool2d(gpu: &Gpu, p: &PoolParams, x: u64, out: u64, idx: u64) -> Result<()> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let n = p.planes * oh * ow;
    if n == 0 {
        return Ok(());
    }
    let (pl, h, w, k, s, ohh, oww) = (
        p.planes as u64,
        p.h as u64,
        p.w as u64,
        p.kernel as u64,
        p.stride as u64,
        oh as u64,
        ow as u64,
    );
    let mut args = kernel_args![pl, h, w, k, s, ohh, oww, x, out, idx];
    // SAFETY: matches `max_pool2d_f32(u64 x7, const float*, float*, int*)`.
    unsafe { gpu.launch(&SRC, "max_pool2d_f32", gpu.grid(n, 256), &mut args) }
}

/// Routes each output gradient to the input element its window took the max from:
/// `grad_in` (`[planes, plane_in]`, zeroed here) gets `grad_out` (`[planes, plane_out]`) by `idx`.
/// In deterministic mode ([`crate::determinism`]) each input element sums its gradients in output
/// order (overlapping windows give it several), as the CPU does; else in no fixed order.
///
/// # Safety
/// `grad_out` and `idx` hold `planes·plane_out` elements, `grad_in` `planes·plane_in` f32.
///
/// # Errors
/// A launch failure (bad indices are reported at the next synchronisation).
pub unsafe fn max_pool2d_backward(
    gpu: &Gpu,
    planes: usize,
    plane_in: usize,
    plane_out: usize,
    grad_out: u64,
    idx: u64,
    grad_in: u64,
) -> Result<()> {
    // SAFETY: grad_in holds planes·plane_in f32.
    unsafe { gpu.zero(grad_in, planes * plane_in * 4)? };
    let n = planes * plane_out;
    if n == 0 {
        return Ok(());
    }
    let (pl, hi, ho) = (planes as u64, plane_in as u64, plane_out as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![pl, hi, ho, grad_out, idx, grad_in, flag];
    let (name, cfg) = if crate::deterministic() {
        // A warp per plane.
        (
            "max_pool2d_backward_ordered_f32",
            gpu.grid(planes * 32, 256),
        )
    } else {
        ("max_pool2d_backward_f32", gpu.grid(n, 256))
    };
    // SAFETY: matches `max_pool2d_backward_<f32|ordered_f32>(u64, u64, u64, const float*, const int*, float*,
    // int*)`.
    unsafe { gpu.launch(&SRC, name, cfg, &mut args) }
}
