//! CUDA fused attention: `attention.cu` (fp32 multiply-adds) and `tensor_core.cu` (16-bit, TF32 or 3xTF32 tensor
//! cores, fp32 sums): a forward kernel, then for the gradients one kernel per tile of queries (their gradient) and one
//! per tile of keys (the keys' and values' gradients), so no element is written twice. The tensor-core kernels read
//! q, k, v (and dO) packed in their operand type by a kernel before them, into a buffer the caller provides
//! ([`packed_bytes`]).

use super::AttentionShape;
use crate::cuda::{Gpu, KernelSource, Launch, kernel_args};
use crate::{Error, Result};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "attention",
    code: concat!(include_str!("attention.cuh"), include_str!("attention.cu")),
};

/// The tensor-core kernels of one operand type and padded head width (`tensor_core.cu` instantiated for the type
/// `TC_T` at width `TC_DP` by the macro `TC_KERNELS`, its kernels named by `TC_TY`): a module each, since NVRTC takes
/// seconds over each and a run uses one or two of them (all twelve as one module took 69 s on an H100 machine's CPU).
macro_rules! tensor_core_source {
    ($kernels:literal, $ty:literal, $t:literal, $dp:literal) => {
        KernelSource {
            name: concat!("attention_", $ty, "_", $dp),
            code: concat!(
                "#define TC_KERNELS ",
                $kernels,
                "\n#define TC_TY ",
                $ty,
                "\n#define TC_T ",
                $t,
                "\n#define TC_DP ",
                $dp,
                "\n",
                include_str!("attention.cuh"),
                include_str!("tensor_core.cu")
            ),
        }
    };
}

/// An operand type's modules at padded head widths 32, 64 and 128.
macro_rules! tensor_core_widths {
    ($kernels:literal, $ty:literal, $t:literal) => {
        [
            tensor_core_source!($kernels, $ty, $t, 32),
            tensor_core_source!($kernels, $ty, $t, 64),
            tensor_core_source!($kernels, $ty, $t, 128),
        ]
    };
}

pub(crate) static BF16_SRC: [KernelSource; 3] =
    tensor_core_widths!("PACKED_KERNELS", "bf16", "Bf16");
pub(crate) static F16_SRC: [KernelSource; 3] = tensor_core_widths!("PACKED_KERNELS", "f16", "F16");
pub(crate) static TF32_SRC: [KernelSource; 3] =
    tensor_core_widths!("TENSOR_CORE_KERNELS", "tf32", "Tf32");
pub(crate) static TF32X3_SRC: [KernelSource; 3] =
    tensor_core_widths!("TENSOR_CORE_KERNELS", "tf32x3", "Tf32x3");

/// The widest head the kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// The widest head the tensor-core kernels take; wider ones run in fp32.
pub const MAX_TENSOR_CORE_HEAD_DIM: usize = 128;

/// Blocks per SM (64-row tiles over every sequence and head) from which fp32 attention runs as 3xTF32 on tensor
/// cores. Measured on an H100: with 8 per SM (the attention benchmark) 3xTF32 is 1.1-1.3x the fp32 multiply-add
/// kernels, with 1 to 2 per SM (the transformer benchmark's layers) those kernels' larger blocks finish sooner.
const TF32X3_BLOCKS_PER_SM: usize = 4;

/// In what arithmetic attention's products run; the softmax and every tensor stay f32 whichever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMath {
    /// fp32 accuracy: each product as three TF32 ones on tensor cores (3xTF32, as PyTorch's fp32 attention runs;
    /// sm_80 and later), fp32 multiply-adds on older devices and for heads wider than 128.
    F32,
    /// bfloat16 operands on tensor cores, fp32 sums (sm_80 and later).
    Bf16,
    /// float16 operands on tensor cores, fp32 sums (sm_80 and later).
    F16,
    /// TF32 operands (f32 rounded to 10-bit mantissas) on tensor cores, fp32 sums (sm_80 and later).
    Tf32,
}

/// The kernels for a head width and arithmetic (`[forward, grad_q, grad_kv]`), compiled for the width rounded up to
/// 32, 64, 128 or 256 columns, with the rows of a tile, the threads of a block and each kernel's bytes of shared
/// memory. In fp32 a block's 256 threads each hold a 4 × 4 (or 2 × 2) patch of a tile's scores, tiles of 64 (or
/// 32) rows of f32; on tensor cores 4 warps each take 16 of a tile's 64 rows, tiles of the operand type.
struct Tiling {
    src: &'static KernelSource,
    kernels: [&'static str; 3],
    rows: usize,
    threads: u32,
    shared: [usize; 3],
    /// How the 16-bit types' kernels' inputs are packed; `None` where the kernels read the f32 tensors.
    pack: Option<Pack>,
}

/// How the 16-bit tensor-core kernels' inputs are packed (`attention_pack_*`): per (sequence, head), its rows padded
/// to whole tiles of 64 and its columns to `width`, in elements of `size` bytes.
struct Pack {
    kernel: &'static str,
    size: usize,
    width: usize,
}

impl Pack {
    /// Bytes of one packed tensor (q, k, v or dO) of `shape`.
    fn part_bytes(&self, shape: &AttentionShape) -> usize {
        shape.seqs * shape.heads * shape.len.div_ceil(64) * 64 * self.width * self.size
    }
}

/// The three kernels of one arithmetic and padded width.
macro_rules! kernels {
    ($ty:literal, $dp:literal) => {
        [
            concat!("attention_forward_", $ty, "_", $dp),
            concat!("attention_grad_q_", $ty, "_", $dp),
            concat!("attention_grad_kv_", $ty, "_", $dp),
        ]
    };
}

impl Tiling {
    /// The kernels `math` asks for, on tensor cores (fp32 as 3xTF32 where there are enough tiles to fill the device),
    /// or the fp32 multiply-add ones where the device (before sm_80, or too little shared memory for f32 tiles of a
    /// wide head) or the head's width does not allow tensor cores.
    fn new(gpu: &Gpu, shape: &AttentionShape, math: AttentionMath) -> Result<Tiling> {
        let d = shape.head_dim;
        let tiles = shape.seqs * shape.heads * shape.len.div_ceil(64);
        let wide = tiles >= TF32X3_BLOCKS_PER_SM * gpu.sm_count() as usize;
        if gpu.compute_capability() >= (8, 0)
            && d <= MAX_TENSOR_CORE_HEAD_DIM
            && (math != AttentionMath::F32 || wide)
        {
            let dp = if d <= 32 {
                32
            } else if d <= 64 {
                64
            } else {
                128
            };
            // an operand type's module, element size, kernels and packing kernel at width dp
            macro_rules! operand {
                ($ty:literal, $srcs:expr, $size:literal) => {
                    match dp {
                        32 => (
                            &$srcs[0],
                            $size,
                            kernels!($ty, 32),
                            concat!("attention_pack_", $ty, "_32"),
                        ),
                        64 => (
                            &$srcs[1],
                            $size,
                            kernels!($ty, 64),
                            concat!("attention_pack_", $ty, "_64"),
                        ),
                        _ => (
                            &$srcs[2],
                            $size,
                            kernels!($ty, 128),
                            concat!("attention_pack_", $ty, "_128"),
                        ),
                    }
                };
            }
            let (src, size, kernels, pack) = match math {
                AttentionMath::F32 => operand!("tf32x3", TF32X3_SRC, 4),
                AttentionMath::Bf16 => operand!("bf16", BF16_SRC, 2),
                AttentionMath::F16 => operand!("f16", F16_SRC, 2),
                AttentionMath::Tf32 => operand!("tf32", TF32_SRC, 4),
            };
            // tiles [64][dp + 8] of the operand type; grad_kv's f32 deltas and lse of 64 rows
            let (tile, row) = (size * 64 * (dp + 8), 4 * 64);
            let shared = [3 * tile, 4 * tile, 4 * tile + 2 * row];
            if shared.iter().all(|&s| s <= gpu.shared_per_block()) {
                return Ok(Tiling {
                    src,
                    kernels,
                    rows: 64,
                    threads: 128,
                    shared,
                    // the 16-bit types read packed inputs (a TF32 copy would be as large as its tensor)
                    pack: (size == 2).then_some(Pack {
                        kernel: pack,
                        size,
                        width: dp,
                    }),
                });
            }
        }
        let (kernels, dp, rows) = match d {
            0..=32 => (kernels!("f32", 32), 32, 64),
            33..=64 => (kernels!("f32", 64), 64, 64),
            65..=128 => (kernels!("f32", 128), 128, 32),
            129..=MAX_HEAD_DIM => (kernels!("f32", 256), 256, 32),
            _ => {
                return Err(Error::Cuda(format!(
                    "attention: heads of width {d} exceed the fused kernel's {MAX_HEAD_DIM}; use more heads"
                )));
            }
        };
        // f32 tiles [rows][dp + 4], weights [rows][rows + 4], lse and deltas of a tile's rows
        let (tile, weights, row) = (4 * rows * (dp + 4), 4 * rows * (rows + 4), 4 * rows);
        Ok(Tiling {
            src: &SRC,
            kernels,
            rows,
            threads: 256,
            shared: [
                3 * tile + weights,
                4 * tile + weights,
                4 * tile + 2 * row + 2 * weights,
            ],
            pack: None,
        })
    }

    /// Packs `parts` column blocks of `input` (f32 rows `stride` apart: q, k and v of qkv, or dO) into `dst` where
    /// the kernels read packed inputs; a no-op where they do not.
    ///
    /// # Safety
    /// `input` holds the f32 tensor `shape` gives it, `dst` `parts` packed tensors ([`Pack::part_bytes`]).
    unsafe fn pack(
        &self,
        gpu: &Gpu,
        shape: &AttentionShape,
        (input, stride): (u64, usize),
        parts: u32,
        dst: u64,
    ) -> Result<()> {
        let Some(pack) = &self.pack else {
            return Ok(());
        };
        let mut cfg = self.launch(shape, 0);
        cfg.grid.2 = parts;
        let (len, heads, d, ..) = dims(shape);
        let stride = stride as u64;
        let mut args = kernel_args![len, heads, d, stride, input, dst];
        // SAFETY: matches `attention_pack_*(u64 x4, const float*, E*)`; buffers per the caller.
        unsafe { gpu.launch(self.src, pack.kernel, cfg, &mut args) }
    }

    /// The tensor-core kernels (which take a packed-input argument after qkv), not the fp32 multiply-add ones.
    fn tensor_cores(&self) -> bool {
        !std::ptr::eq(self.src, &SRC)
    }

    /// A launch over every group and tile of rows, with `bytes` of shared memory.
    fn launch(&self, shape: &AttentionShape, bytes: usize) -> Launch {
        Launch {
            grid: (
                (shape.seqs * shape.heads) as u32,
                shape.len.div_ceil(self.rows) as u32,
                1,
            ),
            block: (self.threads, 1, 1),
            shared: bytes as u32,
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

/// Bytes of the buffer that [`forward`] (`backward` false) or [`backward`] (true) packs its inputs into: q, k and v
/// (and for the backward pass dO) in a 16-bit operand type; 0 where the kernels read the f32 tensors as they are
/// (TF32, 3xTF32, fp32 multiply-adds).
///
/// # Errors
/// A head wider than [`MAX_HEAD_DIM`].
pub fn packed_bytes(
    gpu: &Gpu,
    shape: &AttentionShape,
    math: AttentionMath,
    backward: bool,
) -> Result<usize> {
    let parts = if backward { 4 } else { 3 };
    Ok(Tiling::new(gpu, shape, math)?
        .pack
        .map_or(0, |p| parts * p.part_bytes(shape)))
}

/// The forward pass of f32 `qkv` with the f32 key-padding `mask` (0 when `shape.mask_rows` is 0) into `out` and
/// `lse` (see [`super`]), its products in `math`; `packed` is scratch of [`packed_bytes`] (0 where that is 0).
///
/// # Safety
/// Each buffer must hold the f32 count `shape` gives it, `packed` its bytes.
///
/// # Errors
/// A head wider than [`MAX_HEAD_DIM`], or a launch failure.
pub unsafe fn forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    math: AttentionMath,
    (qkv, mask): (u64, u64),
    packed: u64,
    (out, lse): (u64, u64),
) -> Result<()> {
    if shape.lse_len() == 0 {
        return Ok(());
    }
    let t = Tiling::new(gpu, shape, math)?;
    let width = shape.heads * shape.head_dim;
    // SAFETY: qkv rows are 3 * width f32; `packed` holds q, k and v packed (the caller's promise).
    unsafe { t.pack(gpu, shape, (qkv, 3 * width), 3, packed)? };
    let cfg = t.launch(shape, t.shared[0]);
    let (len, heads, d, scale, causal, mask_rows) = dims(shape);
    // SAFETY: matches `attention_forward_*(u64 x3, float, int, u64, const float*, [const E* packed,] const float*,
    // float* x2)`; buffers per the caller.
    unsafe {
        if t.tensor_cores() {
            let mut args = kernel_args![
                len, heads, d, scale, causal, mask_rows, qkv, packed, mask, out, lse
            ];
            gpu.launch(t.src, t.kernels[0], cfg, &mut args)
        } else {
            let mut args =
                kernel_args![len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse];
            gpu.launch(t.src, t.kernels[0], cfg, &mut args)
        }
    }
}

/// The gradient `dqkv` of f32 `qkv` given the forward's `out` and `lse` and the output's gradient `dout`;
/// `delta` is scratch of `shape.lse_len()` f32, `packed` scratch of [`packed_bytes`] (0 where that is 0); the
/// products in `math`.
///
/// # Safety
/// Each buffer must hold the f32 count `shape` gives it, `packed` its bytes.
///
/// # Errors
/// A head wider than [`MAX_HEAD_DIM`], or a launch failure.
pub unsafe fn backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    math: AttentionMath,
    (qkv, mask, out, lse, dout): (u64, u64, u64, u64, u64),
    (delta, packed): (u64, u64),
    dqkv: u64,
) -> Result<()> {
    if shape.lse_len() == 0 {
        return Ok(());
    }
    let t = Tiling::new(gpu, shape, math)?;
    let width = shape.heads * shape.head_dim;
    let part = t.pack.as_ref().map_or(0, |p| p.part_bytes(shape)) as u64;
    // SAFETY: as forward's; dO's rows are width f32, packed after q, k and v.
    unsafe {
        t.pack(gpu, shape, (qkv, 3 * width), 3, packed)?;
        t.pack(gpu, shape, (dout, width), 1, packed + 3 * part)?;
    }
    let (len, heads, d, scale, causal, mask_rows) = dims(shape);
    let [_, grad_q, grad_kv] = t.kernels;
    let [_, q_shared, kv_shared] = t.shared;
    let (q_cfg, kv_cfg) = (t.launch(shape, q_shared), t.launch(shape, kv_shared));
    // SAFETY: grad_q matches `attention_grad_q_*(u64 x3, float, int, u64, const float*, [const E* packed,]
    // const float* x4, float* x2)`: it writes `delta` (read by the next kernel, later on the same stream) and the
    // query third of `dqkv`; grad_kv matches `attention_grad_kv_*(u64 x3, float, int, u64, const float*,
    // [const E* packed,] const float* x4, float*)`: it writes the key and value thirds of `dqkv`.
    unsafe {
        if t.tensor_cores() {
            let mut args = kernel_args![
                len, heads, d, scale, causal, mask_rows, qkv, packed, mask, out, lse, dout, delta,
                dqkv
            ];
            gpu.launch(t.src, grad_q, q_cfg, &mut args)?;
            let mut args = kernel_args![
                len, heads, d, scale, causal, mask_rows, qkv, packed, mask, lse, dout, delta, dqkv
            ];
            gpu.launch(t.src, grad_kv, kv_cfg, &mut args)
        } else {
            let mut args = kernel_args![
                len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse, dout, delta, dqkv
            ];
            gpu.launch(t.src, grad_q, q_cfg, &mut args)?;
            let mut args = kernel_args![
                len, heads, d, scale, causal, mask_rows, qkv, mask, lse, dout, delta, dqkv
            ];
            gpu.launch(t.src, grad_kv, kv_cfg, &mut args)
        }
    }
}
