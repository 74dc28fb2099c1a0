//! The pooled convolution's launches (`pooled.cu`).

use super::PooledConv;
use crate::cuda::{
    CudaType, Gpu, Launch, float_kernel, float_kernels, kernel_args, sources::CONV_POOLED as SRC,
};
use crate::{Error, Result};

/// Forward block shape (`POOLED_TILE_W` x `POOLED_TILE_H`) and output channels per thread (`POOLED_GROUP`).
const TILE: (usize, usize) = (32, 8);
const GROUP: usize = 16;
/// Pooled rows and columns of a backward block (`POOLED_BAND`, `POOLED_COLS`).
const BAND: usize = 2;
const COLS: usize = 32;

/// Shared memory of a backward block: a tile's gradients and indices for 32 channels (rows padded by one), then
/// the input under it, every channel.
fn filter_shared_bytes(p: &PooledConv) -> usize {
    let c = &p.conv;
    let input = c.c_in * (BAND * p.pool + c.kh - 1) * (COLS * p.pool + c.kw - 1);
    (2 * 32 * (BAND * COLS + 1) + input) * 4
}

/// Backward blocks per chunk of images: the tiles of [`BAND`] x [`COLS`] windows.
fn filter_tiles(p: &PooledConv) -> usize {
    p.out_h().div_ceil(BAND) * p.out_w().div_ceil(COLS)
}

/// `p`'s kernel names for `ty`: forward, then the weight's gradient.
fn kernels(op: &str, p: &PooledConv, ty: CudaType) -> Result<(&'static str, &'static str)> {
    if !p.fuses() {
        return Err(Error::Cuda(format!(
            "{op}: the one-pass kernels do not take {:?} pooled {}x{}",
            p.conv, p.pool, p.pool
        )));
    }
    let (fwd, filter) = match p.conv.kh {
        3 => (
            float_kernels!("conv_pooled_k3s2"),
            float_kernels!("conv_pooled_filter_k3s2"),
        ),
        _ => (
            float_kernels!("conv_pooled_k5s2"),
            float_kernels!("conv_pooled_filter_k5s2"),
        ),
    };
    Ok((float_kernel(op, ty, fwd)?, float_kernel(op, ty, filter)?))
}

/// The convolution's geometry as the kernels take it: `[c, h, w, cout, pad, ph, pw]`.
fn dims(p: &PooledConv) -> [u32; 7] {
    let c = &p.conv;
    [c.c_in, c.h, c.w, c.c_out, c.padding, p.out_h(), p.out_w()].map(|v| v as u32)
}

/// The convolution of `x` (`[n, c, h, w]`, `ty`) with `weight` (f32 `[cout, c, k, k]`), max-pooled, each max given
/// its channel's `bias` (f32 `[cout]`) and a ReLU: `out` (`ty`) and `idx` (i32, the max's flat index in the
/// convolution's plane, as `max_pool2d` records it), both `[n, cout, ph, pw]`.
///
/// # Safety
/// Every pointer holds what its shape says, on this device.
///
/// # Errors
/// A geometry the kernels do not take ([`PooledConv::fuses`]), another type, or a launch failure.
pub unsafe fn forward(
    gpu: &Gpu,
    ty: CudaType,
    p: &PooledConv,
    [x, weight, bias]: [u64; 3],
    [out, idx]: [u64; 2],
) -> Result<()> {
    let (name, _) = kernels("conv2d_max_pool_bias_relu", p, ty)?;
    let [c, h, w, cout, pad, ph, pw] = dims(p);
    let k = p.conv.kh;
    let (iw, ih) = (TILE.0 * p.pool + k - 1, TILE.1 * p.pool + k - 1);
    let shared = (p.conv.c_in * (ih * iw + GROUP * k * k) * 4) as u32;
    let tiles = p.out_h().div_ceil(TILE.1) * p.out_w().div_ceil(TILE.0);
    let cfg = Launch {
        grid: (
            tiles as u32,
            p.conv.c_out.div_ceil(GROUP) as u32,
            p.conv.batch as u32,
        ),
        block: (TILE.0 as u32, TILE.1 as u32, 1),
        shared,
    };
    let mut args = kernel_args![c, h, w, cout, pad, ph, pw, x, weight, bias, out, idx];
    // SAFETY: matches `conv_pooled_k*s2_<ty>(u32 x7, const T*, const float*, const float*, T*, int*)`; the
    // pointers as the caller promised.
    unsafe { gpu.launch(&SRC, name, cfg, &mut args) }
}

/// The weight's and the bias's gradients (f32 `[cout, c, k, k]` into `dw`, `[cout]` into `db`) from `grad`, the
/// pooled output's gradient, the output `y` (the ReLU's mask is `y > 0`; both `[n, cout, ph, pw]`, `ty`), the
/// forward's `idx` and its input `x`. Partial sums per tile of windows and chunk of images, added up in order: the
/// same bits every run.
///
/// # Safety
/// Every pointer holds what its shape says, on this device.
///
/// # Errors
/// A geometry the kernels do not take, another type, out of scratch memory, or a launch failure (an index outside
/// its window is reported at the next synchronisation).
pub unsafe fn backward(
    gpu: &Gpu,
    ty: CudaType,
    p: &PooledConv,
    [grad, y, idx, x]: [u64; 4],
    [dw, db]: [u64; 2],
) -> Result<()> {
    let (_, name) = kernels("conv2d_max_pool_backward", p, ty)?;
    let [c, h, w, cout, pad, ph, pw] = dims(p);
    let n = p.conv.batch;
    let tiles = filter_tiles(p);
    let groups = p.conv.c_out.div_ceil(32);
    // About four blocks a multiprocessor: images are split into chunks until there are.
    let chunks = (gpu.sm_count() as usize * 4)
        .div_ceil(tiles * groups)
        .clamp(1, n);
    let chunk = n.div_ceil(chunks);
    let chunks = n.div_ceil(chunk);
    let ckk = p.conv.weight_len() / p.conv.c_out;
    let len = p.conv.c_out * (ckk + 1);
    let flag = gpu.flag_ptr()?;
    let cfg = Launch {
        grid: (tiles as u32, groups as u32, chunks as u32),
        block: (256, 1, 1),
        shared: filter_shared_bytes(p) as u32,
    };
    let (nn, chunk32, parts, ckk32) = (n as u32, chunk as u32, (chunks * tiles) as u32, ckk as u32);
    gpu.with_scratch(chunks * tiles * len * 4, |partial| {
        let mut args = kernel_args![
            c, h, w, cout, pad, ph, pw, nn, chunk32, grad, y, idx, x, partial, flag
        ];
        // SAFETY: matches `conv_pooled_filter_k*s2_<ty>(u32 x9, const T*, const T*, const int*, const T*, float*,
        // int*)`; the scratch holds a part's sums for every tile and chunk.
        unsafe { gpu.launch(&SRC, name, cfg, &mut args)? };
        let mut args = kernel_args![parts, cout, ckk32, partial, dw, db];
        // SAFETY: matches `conv_pooled_filter_finalize(u32 x3, const float*, float*, float*)`; dw and db hold
        // cout·ckk and cout f32.
        unsafe {
            gpu.launch(
                &SRC,
                "conv_pooled_filter_finalize",
                gpu.grid(len, 256),
                &mut args,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::pooled::tests::first_layer;

    #[test]
    fn a_backward_block_fits_the_default_shared_memory_at_any_width() {
        for (c, h, w, k) in [(3, 64, 64, 3), (4, 8, 4096, 5), (1, 28, 28, 5)] {
            let mut p = first_layer(c, w, k, k / 2);
            p.conv.h = h;
            assert!(p.fuses());
            assert!(
                filter_shared_bytes(&p) <= 48 << 10,
                "{}",
                filter_shared_bytes(&p)
            );
        }
        let mut wide = first_layer(4, 4096, 5, 2);
        wide.conv.h = 8;
        assert_eq!(
            filter_tiles(&wide),
            2 * 64,
            "2 bands of 2 rows, 64 tiles of 32 columns"
        );
        assert_eq!(
            filter_tiles(&first_layer(3, 64, 3, 1)),
            16,
            "the CNN's: 16 bands of 2 rows, 32 columns"
        );
    }
}
