//! CUDA 2-D convolution (`im2col.cu` + cuBLAS): the column matrix is `[C·kh·kw, N·OH·OW]`, so
//! the whole batch is one GEMM per group (one strided-batched call over the groups).

use super::ConvParams;
use crate::Result;
use crate::cuda::{CudaType, Gpu, KernelSource, kernel_args};
use crate::matmul::{MatmulShape, cuda::matmul};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "im2col",
    code: include_str!("im2col.cu"),
};

/// f32 elements of scratch every pass below needs: the column matrix plus one `[O, N·OH·OW]`
/// buffer. The caller allocates it (from the device's caching allocator) and passes its address.
pub fn workspace_len(p: &ConvParams) -> usize {
    let q = p.batch * p.out_h() * p.out_w();
    (p.c_in * p.kh * p.kw + p.c_out) * q
}

fn q(p: &ConvParams) -> usize {
    p.batch * p.out_h() * p.out_w()
}

unsafe fn im2col(gpu: &Gpu, p: &ConvParams, x: u64, col: u64) -> Result<()> {
    let n = p.c_in * p.kh * p.kw * q(p);
    if n == 0 {
        return Ok(());
    }
    let (ni, c, h, w, kh, kw, s, pad, oh, ow) = geometry(p);
    let mut args = kernel_args![ni, c, h, w, kh, kw, s, pad, oh, ow, x, col];
    // SAFETY: matches `im2col_f32(u64 x10, const float*, float*)`; sizes per the callers.
    unsafe { gpu.launch(&SRC, "im2col_f32", gpu.grid(n, 256), &mut args) }
}

#[allow(clippy::type_complexity)]
fn geometry(p: &ConvParams) -> (u64, u64, u64, u64, u64, u64, u64, u64, u64, u64) {
    (
        p.batch as u64,
        p.c_in as u64,
        p.h as u64,
        p.w as u64,
        p.kh as u64,
        p.kw as u64,
        p.stride as u64,
        p.padding as u64,
        p.out_h() as u64,
        p.out_w() as u64,
    )
}

/// `[N, O, OH·OW]` gradient into `[O, N·OH·OW]`.
unsafe fn grad_cnhw(gpu: &Gpu, p: &ConvParams, g: u64, out: u64) -> Result<()> {
    let hw = p.out_h() * p.out_w();
    let n = p.batch * p.c_out * hw;
    if n == 0 {
        return Ok(());
    }
    let (ni, co, hww) = (p.batch as u64, p.c_out as u64, hw as u64);
    let mut args = kernel_args![ni, co, hww, g, out];
    // SAFETY: matches `conv_grad_cnhw_f32(u64, u64, u64, const float*, float*)`.
    unsafe { gpu.launch(&SRC, "conv_grad_cnhw_f32", gpu.grid(n, 256), &mut args) }
}

/// Forward: `out` (`[N, O, OH, OW]`) = conv(`input` `[N, C, H, W]`, `weight` `[O, C/g, kh, kw]`)
/// + `bias` (`[O]`, optional), all f32.
///
/// # Safety
/// Buffers of the sizes [`ConvParams`] gives, and `workspace` of [`workspace_len`] f32, on this device.
///
/// # Errors
/// A launch or cuBLAS failure.
pub unsafe fn conv2d(
    gpu: &Gpu,
    p: &ConvParams,
    input: u64,
    weight: u64,
    bias: Option<u64>,
    out: u64,
    workspace: u64,
) -> Result<()> {
    let q = q(p);
    if p.output_len() == 0 {
        return Ok(());
    }
    let col = workspace;
    let tmp = workspace + (p.c_in * p.kh * p.kw * q * 4) as u64;
    let (og, kg) = (p.c_out_g(), p.col_rows());
    // SAFETY: all three calls get sizes per the caller and `workspace_len`.
    unsafe {
        im2col(gpu, p, input, col)?;
        let s = MatmulShape {
            batch: p.groups,
            m: og,
            n: q,
            k: kg,
            lhs_batch_stride: og * kg,
            rhs_batch_stride: kg * q,
            trans_lhs: false,
            trans_rhs: false,
        };
        matmul(gpu, CudaType::F32, weight, col, tmp, &s)?;
        let hw = (p.out_h() * p.out_w()) as u64;
        let (ni, co) = (p.batch as u64, p.c_out as u64);
        let b = bias.unwrap_or(0);
        let mut args = kernel_args![ni, co, hw, tmp, b, out];
        gpu.launch(
            &SRC,
            "conv_out_f32",
            gpu.grid(p.output_len(), 256),
            &mut args,
        )
    }
}

/// Gradient of the input: `grad_in` (`[N, C, H, W]`) from `grad_out` (`[N, O, OH, OW]`) and
/// `weight`, all f32.
///
/// # Safety
/// As [`conv2d`].
///
/// # Errors
/// A launch or cuBLAS failure.
pub unsafe fn conv2d_backward_input(
    gpu: &Gpu,
    p: &ConvParams,
    grad_out: u64,
    weight: u64,
    grad_in: u64,
    workspace: u64,
) -> Result<()> {
    let q = q(p);
    if p.input_len() == 0 {
        return Ok(());
    }
    let dcol = workspace;
    let g = workspace + (p.c_in * p.kh * p.kw * q * 4) as u64;
    let (og, kg) = (p.c_out_g(), p.col_rows());
    // SAFETY: sizes per the caller and `workspace_len`.
    unsafe {
        grad_cnhw(gpu, p, grad_out, g)?;
        let s = MatmulShape {
            batch: p.groups,
            m: kg,
            n: q,
            k: og,
            lhs_batch_stride: og * kg,
            rhs_batch_stride: og * q,
            trans_lhs: true,
            trans_rhs: false,
        };
        matmul(gpu, CudaType::F32, weight, g, dcol, &s)?;
        let (ni, c, h, w, kh, kw, st, pad, oh, ow) = geometry(p);
        let mut args = kernel_args![ni, c, h, w, kh, kw, st, pad, oh, ow, dcol, grad_in];
        gpu.launch(&SRC, "col2im_f32", gpu.grid(p.input_len(), 256), &mut args)
    }
}

/// Gradient of the weight: `grad_w` (`[O, C/g, kh, kw]`) from `input` and `grad_out`, all f32.
///
/// # Safety
/// As [`conv2d`].
///
/// # Errors
/// A launch or cuBLAS failure.
pub unsafe fn conv2d_backward_weight(
    gpu: &Gpu,
    p: &ConvParams,
    input: u64,
    grad_out: u64,
    grad_w: u64,
    workspace: u64,
) -> Result<()> {
    let q = q(p);
    if p.weight_len() == 0 {
        return Ok(());
    }
    let col = workspace;
    let g = workspace + (p.c_in * p.kh * p.kw * q * 4) as u64;
    let (og, kg) = (p.c_out_g(), p.col_rows());
    // SAFETY: sizes per the caller and `workspace_len`.
    unsafe {
        im2col(gpu, p, input, col)?;
        grad_cnhw(gpu, p, grad_out, g)?;
        let s = MatmulShape {
            batch: p.groups,
            m: og,
            n: kg,
            k: q,
            lhs_batch_stride: og * q,
            rhs_batch_stride: kg * q,
            trans_lhs: false,
            trans_rhs: true,
        };
        matmul(gpu, CudaType::F32, g, col, grad_w, &s)
    }
}
