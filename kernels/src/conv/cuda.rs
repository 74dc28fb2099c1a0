//! CUDA 2-D convolution, f32: through cuDNN where it loads (`conv::cudnn`: an algorithm per geometry and pass,
//! timed on first use), else on cohort's own kernels (`im2col.cu` + cuBLAS), which also run any geometry cuDNN
//! offers no algorithm for and every convolution under `COHORT_CUDNN=0` ([`set_cudnn_mode`]).
//!
//! The own kernels cut the batch into tiles of [`ConvParams::tile_images`] images: a tile's column matrix is
//! `[C·kh·kw, n·OH·OW]`, so each tile is one GEMM per group (one strided-batched call over the groups), and the
//! workspace stays within [`COLUMN_TILE_BYTES`](super::COLUMN_TILE_BYTES) however large the batch.
//!
//! Every workspace, cuDNN's and the own kernels', comes from the caller ([`Workspace`]): the tensor crate gives
//! blocks of the device's caching allocator, charged to the member's tenant.

use std::sync::atomic::{AtomicU8, Ordering};

use super::{ConvParams, ConvPass, CudnnMode};
use crate::cuda::{CudaType, Gpu, kernel_args, sources::IM2COL as SRC};
use crate::matmul::{MatmulShape, cuda::matmul_as};
use crate::{Error, Math, Result};

/// A convolution's workspace as the op asks for it: given a byte count, the address of at least that many bytes
/// of device memory on the op's device. The op uses an address until it returns or asks again; work it queued on
/// an earlier one runs before whatever the memory is given to next, on the same stream.
pub type Workspace<'a> = dyn FnMut(usize) -> Result<u64> + 'a;

/// [`CudnnMode`] as stored: 0 before `COHORT_CUDNN` is read.
static MODE: AtomicU8 = AtomicU8::new(0);

fn mode_code(mode: CudnnMode) -> u8 {
    match mode {
        CudnnMode::Off => 1,
        CudnnMode::Heuristic => 2,
        CudnnMode::Timed => 3,
    }
}

/// Where this process's CUDA convolutions run: what [`set_cudnn_mode`] last set, else what `COHORT_CUDNN` says
/// (read once, see [`CudnnMode::from_env_value`]).
pub fn cudnn_mode() -> CudnnMode {
    let mut code = MODE.load(Ordering::Relaxed);
    if code == 0 {
        let env = CudnnMode::from_env_value(std::env::var("COHORT_CUDNN").ok().as_deref());
        // A concurrent `set_cudnn_mode` wins over the environment.
        code = match MODE.compare_exchange(0, mode_code(env), Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => mode_code(env),
            Err(set) => set,
        };
    }
    match code {
        1 => CudnnMode::Off,
        2 => CudnnMode::Heuristic,
        _ => CudnnMode::Timed,
    }
}

/// Sets where this process's CUDA convolutions run, over `COHORT_CUDNN`: `Off` sends every later convolution to
/// the own kernels; between `Heuristic` and `Timed`, a geometry decided on already keeps its algorithm.
pub fn set_cudnn_mode(mode: CudnnMode) {
    MODE.store(mode_code(mode), Ordering::Relaxed);
}

/// The device addresses of one pass: the input (or its gradient), the weight (or its gradient), the output (or its
/// gradient) and the bias (0: none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operands {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub bias: u64,
}

/// `pass` through cuDNN; `false`, queuing nothing, where cuDNN is not in use or has no algorithm for it.
///
/// # Safety
/// As [`conv2d`].
unsafe fn through_cudnn(
    gpu: &Gpu,
    pass: (ConvPass, Math),
    p: &ConvParams,
    x: Operands,
    workspace: &mut Workspace<'_>,
) -> Result<bool> {
    if p.input_len() == 0 || p.weight_len() == 0 || p.output_len() == 0 {
        return Ok(false);
    }
    // SAFETY: forwarded to the caller.
    let ran = gpu.with_cudnn(|dnn| unsafe { dnn.run(gpu, pass, p, x, workspace) })?;
    Ok(ran.unwrap_or(false))
}

/// `pass` of `p` with 16-bit operands (`math` `Bf16` or `F16`) through cuDNN: `x` the input (or its gradient),
/// `w` the weight (or its gradient), `y` the output (or its gradient), all of that type, no bias. Returns `false`,
/// queuing nothing, where cuDNN is not in use or has no algorithm for it: the own kernels are f32 only, and the
/// caller runs the pass in f32 instead.
///
/// # Safety
/// As [`conv2d`], with the operands in the type `math` names.
///
/// # Errors
/// `math` of f32 operands, or as [`conv2d`].
pub unsafe fn conv_pass_16bit(
    gpu: &Gpu,
    (pass, math): (ConvPass, Math),
    p: &ConvParams,
    (x, w, y): (u64, u64, u64),
    workspace: &mut Workspace<'_>,
) -> Result<bool> {
    if math.f32_operands() || pass == (ConvPass::Forward { bias: true }) {
        return Err(Error::Cuda(format!(
            "conv_pass_16bit: {pass:?} under {math:?}: takes bf16 or f16 operands and no bias"
        )));
    }
    let x = Operands { x, w, y, bias: 0 };
    // SAFETY: forwarded to the caller.
    unsafe { through_cudnn(gpu, (pass, math), p, x, workspace) }
}

/// A convolution's epilogue in one pass: `out` = `y` (`[N, O, OH, OW]` of type `from`) + `bias` (`[O]` f32, or 0
/// for none), then `max(·, 0)` when `relu`, written as `out_ty`; `out` may be `y`. After a 16-bit forward pass
/// ([`conv_pass_16bit`]) `from` is bf16 or f16 and `out_ty` f32 or `from`: what the cast, the bias's broadcast add
/// and the activation would do in three passes over the largest tensors of a step. f32 into f32 is the bias and
/// ReLU after a max pool (at a quarter of the size they would have before it).
///
/// # Safety
/// `y` holds `n·o·inner` elements of `from`, `out` as many of `out_ty` and `bias` (where not 0) `o` f32, on `gpu`.
///
/// # Errors
/// Types other than those above, or a launch failure.
pub unsafe fn conv_epilogue(
    gpu: &Gpu,
    (from, out_ty): (CudaType, CudaType),
    (y, bias, out): (u64, u64, u64),
    (o, inner): (usize, usize),
    len: usize,
    relu: bool,
) -> Result<()> {
    let name = match (from, out_ty) {
        (CudaType::BF16, CudaType::F32) => "conv_epilogue_bf16",
        (CudaType::F16, CudaType::F32) => "conv_epilogue_f16",
        (CudaType::BF16, CudaType::BF16) => "conv_epilogue_bf16_bf16",
        (CudaType::F16, CudaType::F16) => "conv_epilogue_f16_f16",
        (CudaType::F32, CudaType::F32) => "conv_epilogue_f32_f32",
        other => {
            return Err(Error::Cuda(format!(
                "conv_epilogue: takes a bf16 or f16 output into f32 or its own type, or f32 into f32, not {other:?}"
            )));
        }
    };
    if len == 0 {
        return Ok(());
    }
    let (n, channels, inner, relu) = (len as u64, o as u64, inner.max(1) as u64, u32::from(relu));
    let mut args = kernel_args![n, channels, inner, y, bias, relu, out];
    // SAFETY: matches `conv_epilogue_*(u64 x3, const T*, const float*, u32, O*)`; sizes per the caller.
    unsafe { gpu.launch(&SRC, name, gpu.grid(len, 256), &mut args) }
}

/// `math` for a pass of f32 operands; an error for another.
fn f32_math(op: &str, math: Math) -> Result<Math> {
    if math.f32_operands() {
        Ok(math)
    } else {
        Err(Error::Cuda(format!(
            "{op}: f32 operands under {math:?} (16-bit operands go through conv_pass_16bit)"
        )))
    }
}

/// Bytes from an f32 element offset.
fn at(elements: usize) -> u64 {
    (elements * 4) as u64
}

/// The tiles of the batch: (first image, the tile's geometry).
fn tiles(p: &ConvParams) -> impl Iterator<Item = (usize, ConvParams)> + '_ {
    let n = p.tile_images();
    (0..p.batch).step_by(n).map(move |b0| {
        (
            b0,
            ConvParams {
                batch: n.min(p.batch - b0),
                ..*p
            },
        )
    })
}

/// Columns of a tile's column matrix: `n·OH·OW`.
fn q(t: &ConvParams) -> usize {
    t.batch * t.out_h() * t.out_w()
}

unsafe fn im2col(gpu: &Gpu, t: &ConvParams, x: u64, col: u64) -> Result<()> {
    let n = t.c_in * t.kh * t.kw * q(t);
    if n == 0 {
        return Ok(());
    }
    let (ni, c, h, w, kh, kw, s, pad, oh, ow) = geometry(t);
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

/// A tile's `[n, O, OH·OW]` gradient into `[O, n·OH·OW]`.
unsafe fn grad_cnhw(gpu: &Gpu, t: &ConvParams, g: u64, out: u64) -> Result<()> {
    let hw = t.out_h() * t.out_w();
    let n = t.batch * t.c_out * hw;
    if n == 0 {
        return Ok(());
    }
    let (ni, co, hww) = (t.batch as u64, t.c_out as u64, hw as u64);
    let mut args = kernel_args![ni, co, hww, g, out];
    // SAFETY: matches `conv_grad_cnhw_f32(u64, u64, u64, const float*, float*)`.
    unsafe { gpu.launch(&SRC, "conv_grad_cnhw_f32", gpu.grid(n, 256), &mut args) }
}

/// Forward: `out` (`[N, O, OH, OW]`) = conv(`input` `[N, C, H, W]`, `weight` `[O, C/g, kh, kw]`)
/// + `bias` (`[O]`, optional), all f32.
///
/// # Safety
/// Buffers of the sizes [`ConvParams`] gives, on this device; `workspace` gives memory of this device (see
/// [`Workspace`]).
///
/// # Errors
/// A launch, cuDNN or cuBLAS failure, or no workspace (the workspace's own error, such as out of memory).
pub unsafe fn conv2d(
    gpu: &Gpu,
    math: Math,
    p: &ConvParams,
    (input, weight): (u64, u64),
    bias: Option<u64>,
    out: u64,
    workspace: &mut Workspace<'_>,
) -> Result<()> {
    if p.output_len() == 0 {
        return Ok(());
    }
    let x = Operands {
        x: input,
        w: weight,
        y: out,
        bias: bias.unwrap_or(0),
    };
    let pass = ConvPass::Forward {
        bias: bias.is_some(),
    };
    let math = f32_math("conv2d", math)?;
    // SAFETY: forwarded to the caller.
    if unsafe { through_cudnn(gpu, (pass, math), p, x, workspace) }? {
        return Ok(());
    }
    let ws = workspace(p.own_workspace_len() * 4)?;
    let col = ws;
    let hw = p.out_h() * p.out_w();
    let tmp = ws + at(p.c_in * p.kh * p.kw * p.tile_images() * hw);
    let (og, kg) = (p.c_out_g(), p.col_rows());
    for (b0, t) in tiles(p) {
        let q = q(&t);
        // SAFETY: the tile's images of the caller's buffers; the workspace holds one tile's columns and product.
        unsafe {
            im2col(gpu, &t, input + at(b0 * p.c_in * p.h * p.w), col)?;
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
            matmul_as(gpu, math, CudaType::F32, (weight, col, tmp), &s)?;
            let (ni, co, hww) = (t.batch as u64, p.c_out as u64, hw as u64);
            let b = bias.unwrap_or(0);
            let y = out + at(b0 * p.c_out * hw);
            let mut args = kernel_args![ni, co, hww, tmp, b, y];
            gpu.launch(
                &SRC,
                "conv_out_f32",
                gpu.grid(t.output_len(), 256),
                &mut args,
            )?;
        }
    }
    Ok(())
}

/// Gradient of the input: `grad_in` (`[N, C, H, W]`) from `grad_out` (`[N, O, OH, OW]`) and
/// `weight`, all f32.
///
/// # Safety
/// As [`conv2d`].
///
/// # Errors
/// As [`conv2d`].
pub unsafe fn conv2d_backward_input(
    gpu: &Gpu,
    math: Math,
    p: &ConvParams,
    grad_out: u64,
    weight: u64,
    grad_in: u64,
    workspace: &mut Workspace<'_>,
) -> Result<()> {
    if p.input_len() == 0 {
        return Ok(());
    }
    let x = Operands {
        x: grad_in,
        w: weight,
        y: grad_out,
        bias: 0,
    };
    let math = f32_math("conv2d_backward_input", math)?;
    // SAFETY: forwarded to the caller.
    if unsafe { through_cudnn(gpu, (ConvPass::BackwardData, math), p, x, workspace) }? {
        return Ok(());
    }
    let ws = workspace(p.own_workspace_len() * 4)?;
    let dcol = ws;
    let hw = p.out_h() * p.out_w();
    let g = ws + at(p.c_in * p.kh * p.kw * p.tile_images() * hw);
    let (og, kg) = (p.c_out_g(), p.col_rows());
    for (b0, t) in tiles(p) {
        let q = q(&t);
        // SAFETY: the tile's images of the caller's buffers; the workspace holds one tile's columns and gradient.
        unsafe {
            grad_cnhw(gpu, &t, grad_out + at(b0 * p.c_out * hw), g)?;
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
            matmul_as(gpu, math, CudaType::F32, (weight, g, dcol), &s)?;
            let (ni, c, h, w, kh, kw, st, pad, oh, ow) = geometry(&t);
            let dx = grad_in + at(b0 * p.c_in * p.h * p.w);
            let mut args = kernel_args![ni, c, h, w, kh, kw, st, pad, oh, ow, dcol, dx];
            gpu.launch(&SRC, "col2im_f32", gpu.grid(t.input_len(), 256), &mut args)?;
        }
    }
    Ok(())
}

/// Gradient of the weight: `grad_w` (`[O, C/g, kh, kw]`) from `input` and `grad_out`, all f32, summed over the
/// batch; on the own kernels tile by tile, the tiles' sums added in order (the same bits run after run).
///
/// # Safety
/// As [`conv2d`].
///
/// # Errors
/// As [`conv2d`].
pub unsafe fn conv2d_backward_weight(
    gpu: &Gpu,
    math: Math,
    p: &ConvParams,
    input: u64,
    grad_out: u64,
    grad_w: u64,
    workspace: &mut Workspace<'_>,
) -> Result<()> {
    if p.weight_len() == 0 {
        return Ok(());
    }
    let x = Operands {
        x: input,
        w: grad_w,
        y: grad_out,
        bias: 0,
    };
    let math = f32_math("conv2d_backward_weight", math)?;
    // SAFETY: forwarded to the caller.
    if unsafe { through_cudnn(gpu, (ConvPass::BackwardFilter, math), p, x, workspace) }? {
        return Ok(());
    }
    if p.batch == 0 {
        // SAFETY: grad_w holds weight_len f32.
        return unsafe { gpu.zero(grad_w, p.weight_len() * 4) };
    }
    let ws = workspace(p.own_workspace_len() * 4)?;
    let hw = p.out_h() * p.out_w();
    let q_tile = p.tile_images() * hw;
    let col = ws;
    let g = ws + at(p.c_in * p.kh * p.kw * q_tile);
    let partial = g + at(p.c_out * q_tile);
    let (og, kg) = (p.c_out_g(), p.col_rows());
    for (i, (b0, t)) in tiles(p).enumerate() {
        let q = q(&t);
        // The first tile's sum is the gradient so far; each later one is added to it.
        let dst = if i == 0 { grad_w } else { partial };
        // SAFETY: the tile's images of the caller's buffers; the workspace holds one tile's columns and gradient,
        // and with more than one tile a partial weight gradient.
        unsafe {
            im2col(gpu, &t, input + at(b0 * p.c_in * p.h * p.w), col)?;
            grad_cnhw(gpu, &t, grad_out + at(b0 * p.c_out * hw), g)?;
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
            matmul_as(gpu, math, CudaType::F32, (g, col, dst), &s)?;
            if i > 0 {
                let n = p.weight_len() as u64;
                let mut args = kernel_args![n, partial, grad_w];
                gpu.launch(
                    &SRC,
                    "conv_accumulate_f32",
                    gpu.grid(p.weight_len(), 256),
                    &mut args,
                )?;
            }
        }
    }
    Ok(())
}
