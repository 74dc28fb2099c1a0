//! CUDA fused attention (`attention.cu`): a forward kernel, then for the gradients one kernel per tile of queries
//! (their gradient) and one per tile of keys (the keys' and values' gradients), so no element is written twice.

use super::AttentionShape;
use crate::cuda::{Gpu, KernelSource, Launch, kernel_args};
use crate::{Error, Result};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "attention",
    code: include_str!("attention.cu"),
};

/// The widest head the kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// The kernels for a head width (`[forward, grad_q, grad_kv]`), compiled for `padded` columns (the width rounded up
/// to 32, 64, 128 or 256), and the rows of a tile (16 · RA in `attention.cu`): a block's 256 threads each hold a
/// 4 × 4 (or 2 × 2) patch of a tile's scores.
struct Tiling {
    kernels: [&'static str; 3],
    padded: usize,
    rows: usize,
}

impl Tiling {
    fn new(d: usize) -> Result<Tiling> {
        macro_rules! kernels {
            ($dp:literal) => {
                [
                    concat!("attention_forward_f32_", $dp),
                    concat!("attention_grad_q_f32_", $dp),
                    concat!("attention_grad_kv_f32_", $dp),
                ]
            };
        }
        let (kernels, padded, rows) = match d {
            0..=32 => (kernels!(32), 32, 64),
            33..=64 => (kernels!(64), 64, 64),
            65..=128 => (kernels!(128), 128, 32),
            129..=MAX_HEAD_DIM => (kernels!(256), 256, 32),
            _ => {
                return Err(Error::Cuda(format!(
                    "attention: heads of width {d} exceed the fused kernel's {MAX_HEAD_DIM}; use more heads"
                )));
            }
        };
        Ok(Tiling {
            kernels,
            padded,
            rows,
        })
    }

    /// Floats of one tile of rows, `[rows][padded + 4]`.
    fn tile(&self) -> usize {
        self.rows * (self.padded + 4)
    }

    /// Floats of one tile of weights or score gradients, `[rows][rows + 4]`.
    fn weights(&self) -> usize {
        self.rows * (self.rows + 4)
    }

    /// A launch over every group and tile of rows, with `floats` of shared memory.
    fn launch(&self, shape: &AttentionShape, floats: usize) -> Launch {
        Launch {
            grid: (
                (shape.seqs * shape.heads) as u32,
                shape.len.div_ceil(self.rows) as u32,
                1,
            ),
            block: (256, 1, 1),
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
    let cfg = t.launch(shape, 3 * t.tile() + t.weights());
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
    let (len, heads, d, scale, causal, mask_rows) = dims(shape);
    let [_, grad_q, grad_kv] = t.kernels;
    let mut args = kernel_args![
        len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse, dout, delta, dqkv
    ];
    // SAFETY: matches `attention_grad_q_f32_*(u64 x3, float, int, u64, const float* x5, float* x2)`; it writes
    // `delta` (read by the next kernel, later on the same stream) and the query third of `dqkv`.
    unsafe {
        gpu.launch(
            &SRC,
            grad_q,
            t.launch(shape, 4 * t.tile() + t.weights()),
            &mut args,
        )?
    };
    let mut args = kernel_args![
        len, heads, d, scale, causal, mask_rows, qkv, mask, lse, dout, delta, dqkv
    ];
    // SAFETY: matches `attention_grad_kv_f32_*(u64 x3, float, int, u64, const float* x5, float*)`; it writes the key
    // and value thirds of `dqkv`.
    unsafe {
        gpu.launch(
            &SRC,
            grad_kv,
            t.launch(shape, 4 * t.tile() + 2 * t.rows + 2 * t.weights()),
            &mut args,
        )
    }
}
