//! CUDA fused attention (`attention.cu`): a forward kernel, then for the gradients one kernel per query row
//! (the query's gradient) and one per key row (the key's and value's), so no element is written twice.

use super::AttentionShape;
use crate::cuda::{Gpu, KernelSource, Launch, kernel_args};
use crate::{Error, Result};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "attention",
    code: include_str!("attention.cu"),
};

/// The widest head the kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// The kernels for a head width (`[forward, grad_q, grad_kv]`), rows (warps) per block, and the tile of keys or
/// queries.
struct Tiling {
    kernels: [&'static str; 3],
    rows: usize,
    tile: usize,
}

impl Tiling {
    fn new(d: usize) -> Result<Tiling> {
        let (kernels, rows, tile) = match d {
            0..=64 => (
                [
                    "attention_forward_f32_64",
                    "attention_grad_q_f32_64",
                    "attention_grad_kv_f32_64",
                ],
                16,
                32,
            ),
            65..=128 => (
                [
                    "attention_forward_f32_128",
                    "attention_grad_q_f32_128",
                    "attention_grad_kv_f32_128",
                ],
                8,
                32,
            ),
            129..=MAX_HEAD_DIM => (
                [
                    "attention_forward_f32_256",
                    "attention_grad_q_f32_256",
                    "attention_grad_kv_f32_256",
                ],
                4,
                16,
            ),
            _ => {
                return Err(Error::Cuda(format!(
                    "attention: heads of width {d} exceed the fused kernel's {MAX_HEAD_DIM}; use more heads"
                )));
            }
        };
        Ok(Tiling {
            kernels,
            rows,
            tile,
        })
    }

    /// A launch over every group and block of rows, with `floats` of shared memory.
    fn launch(&self, shape: &AttentionShape, floats: usize) -> Launch {
        Launch {
            grid: (
                (shape.seqs * shape.heads) as u32,
                shape.len.div_ceil(self.rows) as u32,
                1,
            ),
            block: (32 * self.rows as u32, 1, 1),
            shared: (4 * floats) as u32,
        }
    }
}

/// The kernels' leading arguments: `len, heads, d, scale, causal, mask_rows`.
fn dims(shape: &AttentionShape) -> (u64, u64, u64, f32, i32, u64) {
    (
        shape.len as u64,
        shape.heads as u64,
        shape.head_dim as u64,
        shape.scale as f32,
        i32::from(shape.causal),
        shape.mask_rows as u64,
    )
}

/// The forward pass of f32 `qkv` with the f32 key-padding `mask` (0 when `shape.mask_rows` is 0) into `out` and
/// `lse` (see [`super`]).
///
/// # Safety
/// Each buffer must hold the f32 count `shape` gives it.
///
/// # Errors
/// A head wider than [`MAX_HEAD_DIM`], or a launch failure.
pub unsafe fn forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    (qkv, mask): (u64, u64),
    (out, lse): (u64, u64),
) -> Result<()> {
    if shape.lse_len() == 0 {
        return Ok(());
    }
    let t = Tiling::new(shape.head_dim)?;
    let d = shape.head_dim;
    let cfg = t.launch(shape, t.rows * d + t.tile * (d | 1) + t.tile * d);
    let (len, heads, d, scale, causal, mask_rows) = dims(shape);
    let mut args = kernel_args![len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse];
    // SAFETY: matches `attention_forward_f32_*(u64 x3, float, int, u64, const float* x2, float* x2)`; buffers per
    // the caller.
    unsafe { gpu.launch(&SRC, t.kernels[0], cfg, &mut args) }
}

/// The gradient `dqkv` of f32 `qkv` given the forward's `out` and `lse` and the output's gradient `dout`;
/// `delta` is scratch of `shape.lse_len()` f32.
///
/// # Safety
/// Each buffer must hold the f32 count `shape` gives it.
///
/// # Errors
/// A head wider than [`MAX_HEAD_DIM`], or a launch failure.
pub unsafe fn backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    (qkv, mask, out, lse, dout): (u64, u64, u64, u64, u64),
    delta: u64,
    dqkv: u64,
) -> Result<()> {
    if shape.lse_len() == 0 {
        return Ok(());
    }
    let t = Tiling::new(shape.head_dim)?;
    let d = shape.head_dim;
    let rows_and_tiles = 2 * t.rows * d + 2 * t.tile * (d | 1);
    let (len, heads, d, scale, causal, mask_rows) = dims(shape);
    let [_, grad_q, grad_kv] = t.kernels;
    let mut args = kernel_args![
        len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse, dout, delta, dqkv
    ];
    // SAFETY: matches `attention_grad_q_f32_*(u64 x3, float, int, u64, const float* x5, float* x2)`; it writes
    // `delta` (read by the next kernel, later on the same stream) and the query third of `dqkv`.
    unsafe { gpu.launch(&SRC, grad_q, t.launch(shape, rows_and_tiles), &mut args)? };
    let mut args = kernel_args![
        len, heads, d, scale, causal, mask_rows, qkv, mask, lse, dout, delta, dqkv
    ];
    // SAFETY: matches `attention_grad_kv_f32_*(u64 x3, float, int, u64, const float* x5, float*)`; it writes the key
    // and value thirds of `dqkv`.
    unsafe {
        gpu.launch(
            &SRC,
            grad_kv,
            t.launch(shape, rows_and_tiles + 2 * t.tile),
            &mut args,
        )
    }
}
