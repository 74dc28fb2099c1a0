//! CUDA max pooling (`max_pool.cu`).

use super::PoolParams;
use crate::cuda::{
    CudaType, Gpu, float_kernel, float_kernels, kernel_args, sources::MAX_POOL as SRC,
};
use crate::{Error, Result};

/// Max over each window of `x` (`[planes, h, w]`, f32, bf16 or f16) into `out` (the same type), with the flat
/// in-plane index of each maximum (the first one on ties) in `idx` (i32). With `bias` (`(f32 pointer,
/// channels)`, planes cycling through the channels), each max then gets its channel's bias and a ReLU, in the
/// same pass: windows that tile ([`PoolParams::tiles`]) only.
///
/// # Safety
/// `x` holds `planes·h·w` elements of `ty`; `out` and `idx` `planes·out_h·out_w` elements each; a bias
/// `channels` f32.
///
/// # Errors
/// Another type, a bias for windows that do not tile, or a launch failure.
pub unsafe fn max_pool2d(
    gpu: &Gpu,
    ty: CudaType,
    p: &PoolParams,
    bias: Option<(u64, usize)>,
    x: u64,
    out: u64,
    idx: u64,
) -> Result<()> {
    let n = p.planes * p.out_h() * p.out_w();
    if n == 0 {
        return Ok(());
    }
    if let Some([n, w, k, ow, ohw]) = tiling(p) {
        let name = float_kernel("max_pool2d_tiled", ty, float_kernels!("max_pool2d_tiled"))?;
        let (b, channels) = bias.map_or((0, 1), |(b, c)| (b, c.max(1) as u32));
        let mut args = kernel_args![n, w, k, ow, ohw, channels, b, x, out, idx];
        // SAFETY: matches `max_pool2d_tiled_<ty>(u32 x6, const float*, const T*, T*, int*)`.
        return unsafe { gpu.launch(&SRC, name, gpu.grid(n as usize, 256), &mut args) };
    }
    if bias.is_some() {
        return Err(Error::Cuda(format!(
            "max_pool2d with a bias: {}x{} windows {} apart do not tile {}x{} planes",
            p.kernel, p.kernel, p.stride, p.h, p.w
        )));
    }
    let name = float_kernel("max_pool2d", ty, float_kernels!("max_pool2d"))?;
    let [pl, h, w, k, s, oh, ow] = geometry(p);
    let mut args = kernel_args![pl, h, w, k, s, oh, ow, x, out, idx];
    // SAFETY: matches `max_pool2d_<ty>(u64 x7, const T*, T*, int*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}

/// `[planes, h, w, kernel, stride, out_h, out_w]` as the kernels take them.
fn geometry(p: &PoolParams) -> [u64; 7] {
    [p.planes, p.h, p.w, p.kernel, p.stride, p.out_h(), p.out_w()].map(|v| v as u64)
}

/// `[windows, w, kernel, out_w, out_h·out_w]` for the tiled kernels, where `p`'s windows tile its planes
/// ([`PoolParams::tiles`]).
fn tiling(p: &PoolParams) -> Option<[u32; 5]> {
    p.tiles().then(|| {
        let (ow, ohw) = (p.out_w(), p.out_h() * p.out_w());
        [p.planes * ohw, p.w, p.kernel, ow, ohw].map(|v| v as u32)
    })
}

/// The backward of [`max_pool2d`] for windows that do not overlap (`stride >= kernel`, where each input element has
/// at most one window), on 16-bit (bf16 or f16) gradients, or on f32 ones where the windows tile
/// ([`PoolParams::tiles`]): every element of `grad_in` (`[planes, h, w]`) gathers its window's gradient from
/// `grad_out` where it was the window's max, else 0; in a fixed order, so deterministic mode needs nothing more.
///
/// # Safety
/// `grad_out` and `idx` hold `planes·out_h·out_w` elements, `grad_in` `planes·h·w`, of `ty` (`idx` i32).
///
/// # Errors
/// Overlapping windows, f32 over windows that do not tile, another type, or a launch failure (bad indices are
/// reported at the next synchronisation).
pub unsafe fn max_pool2d_backward_gather(
    gpu: &Gpu,
    ty: CudaType,
    p: &PoolParams,
    grad_out: u64,
    idx: u64,
    grad_in: u64,
) -> Result<()> {
    const OP: &str = "max_pool2d_backward_gather";
    if p.stride < p.kernel {
        return Err(Error::Cuda(format!(
            "{OP}: windows of {k} with stride {s} overlap; their gradients add up in f32",
            k = p.kernel,
            s = p.stride
        )));
    }
    let flag = gpu.flag_ptr()?;
    if let Some([n, w, k, ow, ohw]) = tiling(p) {
        let name = float_kernel(OP, ty, float_kernels!("max_pool2d_backward_tiled"))?;
        if n == 0 {
            return Ok(());
        }
        let mut args = kernel_args![n, w, k, ow, ohw, grad_out, idx, grad_in, flag];
        // SAFETY: matches `max_pool2d_backward_tiled_<ty>(u32 x5, const T*, const int*, T*, int*)`.
        return unsafe { gpu.launch(&SRC, name, gpu.grid(n as usize, 256), &mut args) };
    }
    let gather = [
        None,
        Some("max_pool2d_backward_gather_bf16"),
        Some("max_pool2d_backward_gather_f16"),
    ];
    let name = float_kernel(OP, ty, gather)?;
    let n = p.planes * p.h * p.w;
    if n == 0 {
        return Ok(());
    }
    let [pl, h, w, k, s, oh, ow] = geometry(p);
    let mut args = kernel_args![pl, h, w, k, s, oh, ow, grad_out, idx, grad_in, flag];
    // SAFETY: matches `max_pool2d_backward_gather_<ty>(u64 x7, const T*, const int*, T*, int*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
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
