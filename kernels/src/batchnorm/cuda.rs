//! CUDA batch normalization (`batchnorm.cu`): three kernels forward (the sums of a split of each channel, the
//! statistics, the output) and three backward (likewise for the gradient's sums, then the input's gradient). The
//! activations are f32, bf16 or f16 (a mixed policy keeps them in the low type); statistics and parameters f32.

use super::BatchNormShape;
use crate::cuda::{
    CudaType, FloatKernels, Gpu, Launch, float_kernel, float_kernels, kernel_args,
    sources::BATCHNORM as SRC,
};
use crate::{Error, Result};

const BLOCK: u32 = 256;
/// Most elements one block sums: enough for each thread to sum a few dozen, few enough that an f32 sum of them
/// keeps its precision.
const MAX_CHUNK: usize = 64 * BLOCK as usize;

/// `Dims` of `batchnorm.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dims {
    outer: u64,
    members: u64,
    rows: u64,
    channels: u64,
    inner: u64,
}

impl Dims {
    fn of(s: &BatchNormShape) -> Dims {
        Dims {
            outer: s.outer as u64,
            members: s.members as u64,
            rows: s.rows as u64,
            channels: s.channels as u64,
            inner: s.inner as u64,
        }
    }
}

/// A kernel's entry points for u32 and for u64 indices, each by activation type.
macro_rules! entries {
    ($base:literal) => {
        [
            [
                Some(concat!($base, "_u32_f32")),
                Some(concat!($base, "_u32_bf16")),
                Some(concat!($base, "_u32_f16")),
            ],
            [
                Some(concat!($base, "_u64_f32")),
                Some(concat!($base, "_u64_bf16")),
                Some(concat!($base, "_u64_f16")),
            ],
        ]
    };
}

/// The entry point of `names` for activations of `ty` and `s`'s index width: u32 where every index (with a grid
/// stride past the end) fits.
fn entry(
    op: &str,
    s: &BatchNormShape,
    ty: CudaType,
    names: [FloatKernels; 2],
) -> Result<&'static str> {
    float_kernel(op, ty, names[usize::from(s.len() >= 1 << 31)])
}

/// How the per-channel sums are spread: `splits` blocks of up to `chunk` elements per channel, enough blocks to
/// fill the device.
struct Split {
    dims: Dims,
    channels: usize,
    splits: usize,
    chunk: usize,
}

impl Split {
    fn new(gpu: &Gpu, s: &BatchNormShape) -> Result<Split> {
        let n = s.per_channel();
        let channels = s.stat_len();
        if channels > i32::MAX as usize || n == 0 {
            return Err(Error::Cuda(format!(
                "batch_norm: {channels} channels of {n} elements each: the kernels take at least one element \
                 per channel and up to {} channels",
                i32::MAX
            )));
        }
        let target = gpu.sm_count() as usize * 8;
        let splits = target
            .div_ceil(channels)
            .max(n.div_ceil(MAX_CHUNK))
            .min(n.div_ceil(BLOCK as usize))
            .clamp(1, 65_535);
        Ok(Split {
            dims: Dims::of(s),
            channels,
            splits,
            chunk: n.div_ceil(splits),
        })
    }

    /// Runs `f` with scratch for the partial sums, `[channels, splits, 2]` f32.
    fn with_partials(&self, gpu: &Gpu, f: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        gpu.with_scratch(self.channels * self.splits * 8, f)
    }

    /// A block per channel and split.
    fn blocks(&self) -> Launch {
        Launch {
            grid: (self.channels as u32, self.splits as u32, 1),
            block: (BLOCK, 1, 1),
            shared: 0,
        }
    }
}

fn per_channel(gpu: &Gpu, channels: usize) -> Launch {
    gpu.grid(channels, 128)
}

/// The forward pass in training of `x` into `y` (both `ty`), with the batch's `mean` and `invstd` per channel
/// (see [`super::cpu::forward`]); `running` `(mean, var, momentum)` moves in place when given.
///
/// # Safety
/// `x` and `y` must hold `s.len()` elements of `ty`, `gamma`, `beta`, `mean`, `invstd` and the running
/// statistics `s.stat_len()` f32, on this device.
///
/// # Errors
/// A type other than f32, bf16 and f16, more channels or elements per channel than the kernels take, or a
/// launch failure.
pub unsafe fn forward(
    gpu: &Gpu,
    ty: CudaType,
    (s, eps): (&BatchNormShape, f64),
    relu: bool,
    (x, gamma, beta): (u64, u64, u64),
    (y, mean, invstd): (u64, u64, u64),
    running: Option<(u64, u64, f64)>,
) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    const OP: &str = "batch_norm";
    let stats = entry(OP, s, ty, entries!("batch_norm_stats"))?;
    let apply = entry(OP, s, ty, entries!("batch_norm_apply"))?;
    let finalize = float_kernel(OP, ty, float_kernels!("batch_norm_finalize"))?;
    let plan = Split::new(gpu, s)?;
    let d = plan.dims;
    plan.with_partials(gpu, |partial| {
        let chunk = plan.chunk as u64;
        let mut args = kernel_args![d, chunk, x, partial];
        // SAFETY: matches `batch_norm_stats_*(Dims, u64, const T*, float*)`.
        unsafe { gpu.launch(&SRC, stats, plan.blocks(), &mut args)? };
        let (rm, rv, momentum) = running.unwrap_or((0, 0, 0.0));
        let splits = plan.splits as u64;
        let mut args = kernel_args![d, splits, eps, momentum, x, partial, mean, invstd, rm, rv];
        let cfg = per_channel(gpu, plan.channels);
        // SAFETY: matches `batch_norm_finalize_*(Dims, u64, double, double, const T*, const float*, float* x4)`.
        unsafe { gpu.launch(&SRC, finalize, cfg, &mut args) }
    })?;
    let relu = i32::from(relu);
    let mut args = kernel_args![d, relu, x, mean, invstd, gamma, beta, y];
    // SAFETY: matches `batch_norm_apply_*(Dims, int, const T*, const float* x4, T*)`.
    unsafe { gpu.launch(&SRC, apply, gpu.grid(s.len(), BLOCK), &mut args) }
}

/// The backward pass of [`forward`]: `dx`, `dgamma` and `dbeta` from its input `x`, its output `out` when it
/// rectified (0 otherwise), the output's gradient `dy`, and its `mean` and `invstd` (see
/// [`super::cpu::backward`]).
///
/// # Safety
/// As [`forward`]: `x`, `out`, `dy` and `dx` of `s.len()` elements of `ty`, the rest `s.stat_len()` f32.
///
/// # Errors
/// As [`forward`].
pub unsafe fn backward(
    gpu: &Gpu,
    ty: CudaType,
    s: &BatchNormShape,
    (x, out, dy): (u64, u64, u64),
    (mean, invstd, gamma): (u64, u64, u64),
    (dx, dgamma, dbeta): (u64, u64, u64),
) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    const OP: &str = "batch_norm_backward";
    let grad_stats = entry(OP, s, ty, entries!("batch_norm_grad_stats"))?;
    let grad_input = entry(OP, s, ty, entries!("batch_norm_grad_input"))?;
    let plan = Split::new(gpu, s)?;
    let d = plan.dims;
    plan.with_partials(gpu, |partial| {
        let chunk = plan.chunk as u64;
        let mut args = kernel_args![d, chunk, x, out, dy, mean, partial];
        // SAFETY: matches `batch_norm_grad_stats_*(Dims, u64, const T* x3, const float*, float*)`.
        unsafe { gpu.launch(&SRC, grad_stats, plan.blocks(), &mut args)? };
        let (c, splits) = (plan.channels as u64, plan.splits as u64);
        let mut args = kernel_args![c, splits, partial, invstd, dgamma, dbeta];
        let cfg = per_channel(gpu, plan.channels);
        // SAFETY: matches `batch_norm_grad_finalize(u64, u64, const float* x2, float* x2)`.
        unsafe { gpu.launch(&SRC, "batch_norm_grad_finalize", cfg, &mut args) }
    })?;
    let mut args = kernel_args![d, x, out, dy, mean, invstd, gamma, dgamma, dbeta, dx];
    // SAFETY: matches `batch_norm_grad_input_*(Dims, const T* x3, const float* x5, T*)`.
    unsafe { gpu.launch(&SRC, grad_input, gpu.grid(s.len(), BLOCK), &mut args) }
}

/// The sum of each channel of `x` (`ty`, f32, bf16 or f16; channels as [`BatchNormShape`] places them) into
/// `out` (f32, `s.stat_len()`): a convolution's bias gradient from its 16-bit output gradient, summed in f32.
///
/// # Safety
/// `x` must hold `s.len()` elements of `ty`, `out` `s.stat_len()` f32, on this device.
///
/// # Errors
/// As [`forward`].
pub unsafe fn channel_sums(
    gpu: &Gpu,
    ty: CudaType,
    s: &BatchNormShape,
    x: u64,
    out: u64,
) -> Result<()> {
    if s.stat_len() == 0 {
        return Ok(());
    }
    if s.per_channel() == 0 {
        // SAFETY: out holds stat_len f32.
        return unsafe { gpu.zero(out, s.stat_len() * 4) };
    }
    let sums = entry("channel_sums", s, ty, entries!("channel_sums"))?;
    let plan = Split::new(gpu, s)?;
    let d = plan.dims;
    plan.with_partials(gpu, |partial| {
        let chunk = plan.chunk as u64;
        let mut args = kernel_args![d, chunk, x, partial];
        // SAFETY: matches `channel_sums_*(Dims, u64, const T*, float*)`.
        unsafe { gpu.launch(&SRC, sums, plan.blocks(), &mut args)? };
        // SAFETY: the partials the plan made room for; out as the caller promised.
        unsafe { finalize_sums(gpu, &plan, partial, out) }
    })
}

/// Each channel's sum of its splits' `partial` sums (`[channels, splits, 2]`, the first of each pair) into `out`,
/// in split order.
///
/// # Safety
/// `partial` must hold the plan's `channels · splits` pairs of f32 and `out` `channels` f32, on this device.
unsafe fn finalize_sums(gpu: &Gpu, plan: &Split, partial: u64, out: u64) -> Result<()> {
    let (c, splits) = (plan.channels as u64, plan.splits as u64);
    let mut args = kernel_args![c, splits, partial, out];
    // SAFETY: matches `channel_sums_finalize(u64, u64, const float*, float*)`; the buffers as the caller promised.
    unsafe {
        gpu.launch(
            &SRC,
            "channel_sums_finalize",
            per_channel(gpu, plan.channels),
            &mut args,
        )
    }
}

/// ReLU's backward from its output `y` into `dx`, with each channel's sum of `dx` into `out` (f32, `channels`):
/// the gradients of a convolution's output and bias where a ReLU follows it, over image features
/// `[outer, channels, inner]` of `ty`. One pass over the features, where [`channel_sums`] after a ReLU's backward
/// takes two and reads the gradient twice.
///
/// # Safety
/// `dy`, `y` and `dx` must hold `outer · channels · inner` elements of `ty`, `out` `channels` f32, on this device.
///
/// # Errors
/// A type other than f32, bf16 and f16, features of 2³¹ elements or more (u32 indices), or a launch failure.
pub unsafe fn relu_channel_sums(
    gpu: &Gpu,
    ty: CudaType,
    [outer, channels, inner]: [usize; 3],
    (dy, y): (u64, u64),
    (dx, out): (u64, u64),
) -> Result<()> {
    const OP: &str = "relu_channel_sums";
    let s = BatchNormShape {
        outer,
        members: 1,
        rows: 1,
        channels,
        inner,
    };
    if s.is_empty() {
        // SAFETY: out holds `channels` f32.
        return unsafe { gpu.zero(out, channels * 4) };
    }
    if s.len() >= 1 << 31 {
        return Err(Error::Cuda(format!(
            "{OP}: {} elements; the kernel takes fewer than 2^31",
            s.len()
        )));
    }
    let (width, names) = if inner % 4 == 0 {
        (4, float_kernels!("relu_channel_sums4"))
    } else {
        (1, float_kernels!("relu_channel_sums"))
    };
    let kernel = float_kernel(OP, ty, names)?;
    let plan = Split::new(gpu, &s)?;
    let units = s.per_channel() / width;
    let (c, i, u) = (channels as u32, inner as u32, units as u32);
    let chunk = units.div_ceil(plan.splits) as u32;
    plan.with_partials(gpu, |partial| {
        let mut args = kernel_args![c, i, u, chunk, dy, y, dx, partial];
        // SAFETY: matches `relu_channel_sums[4]_*(u32 x4, const T* x2, T*, float*)`; the plan's grid is
        // (channels, splits) and every offset is below 2^31.
        unsafe { gpu.launch(&SRC, kernel, plan.blocks(), &mut args)? };
        // SAFETY: the partials the plan made room for; out as the caller promised.
        unsafe { finalize_sums(gpu, &plan, partial, out) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batchnorm::{Running, cpu};

    fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    /// Both passes against the CPU's, rectified and not, for packed images (split among blocks) and for features
    /// per member, with the running statistics moved on the device as on the CPU.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn both_passes_match_the_cpu_for_packed_images_and_features_per_member() {
        let gpu = Gpu::get(0).unwrap();
        let images = BatchNormShape {
            outer: 64,
            members: 3,
            rows: 1,
            channels: 5,
            inner: 24 * 24,
        };
        let features = BatchNormShape {
            outer: 1,
            members: 2,
            rows: 300,
            channels: 7,
            inner: 1,
        };
        for s in [images, features] {
            let n = s.len();
            let x: Vec<f32> = (0..n)
                .map(|i| 3.0 + ((i * 7919) % 1013) as f32 / 1013.0 * 4.0 - (i % 5) as f32)
                .collect();
            let dy: Vec<f32> = (0..n)
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let c = s.stat_len();
            let gamma: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.1).collect();
            let beta: Vec<f32> = (0..c).map(|i| i as f32 * 0.2 - 1.0).collect();
            for relu in [false, true] {
                let (mut rm, mut rv) = (vec![0.5f32; c], vec![2.0f32; c]);
                let running = Running {
                    mean: &mut rm,
                    var: &mut rv,
                    momentum: 0.1,
                };
                let (y, mean, invstd) =
                    cpu::forward(&x, (&gamma, &beta), (&s, 1e-5), relu, Some(running));
                let out = relu.then_some(&y[..]);
                let (dx, dg, db) = cpu::backward(&x, out, &dy, (&mean, &invstd, &gamma), &s);

                let [gx, gg, gb, gdy] = [&x, &gamma, &beta, &dy].map(|v| gpu.upload_f32(v));
                let [grm, grv] = [vec![0.5f32; c], vec![2.0f32; c]].map(|v| gpu.upload_f32(&v));
                let [gy, gdx] = [n, n].map(|n| gpu.alloc(n * 4).unwrap());
                let [gm, gi, gdg, gdb] = [c; 4].map(|c| gpu.alloc(c * 4).unwrap());
                // SAFETY: every buffer holds what `s` says.
                unsafe {
                    forward(
                        &gpu,
                        CudaType::F32,
                        (&s, 1e-5),
                        relu,
                        (gx.ptr(), gg.ptr(), gb.ptr()),
                        (gy.ptr(), gm.ptr(), gi.ptr()),
                        Some((grm.ptr(), grv.ptr(), 0.1)),
                    )
                    .unwrap();
                    let out = if relu { gy.ptr() } else { 0 };
                    backward(
                        &gpu,
                        CudaType::F32,
                        &s,
                        (gx.ptr(), out, gdy.ptr()),
                        (gm.ptr(), gi.ptr(), gg.ptr()),
                        (gdx.ptr(), gdg.ptr(), gdb.ptr()),
                    )
                    .unwrap();
                }
                let what = |v: &str| format!("{s:?} relu {relu}: {v}");
                close(&what("mean"), &gpu.download_f32(&gm, c), &mean, 1e-5);
                close(&what("invstd"), &gpu.download_f32(&gi, c), &invstd, 1e-4);
                close(&what("running mean"), &gpu.download_f32(&grm, c), &rm, 1e-5);
                close(&what("running var"), &gpu.download_f32(&grv, c), &rv, 1e-4);
                close(&what("y"), &gpu.download_f32(&gy, n), &y, 1e-4);
                close(&what("dgamma"), &gpu.download_f32(&gdg, c), &dg, 1e-3);
                close(&what("dbeta"), &gpu.download_f32(&gdb, c), &db, 1e-3);
                close(&what("dx"), &gpu.download_f32(&gdx, n), &dx, 1e-3);
            }
        }
    }

    /// ReLU's backward and the channel sums in one pass against the two apart, four elements a thread (planes of
    /// 20 x 20) and one (7 x 7), with more elements per channel than one block sums: `dx` bit for bit, the sums
    /// within an f32 sum's rounding.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn relu_channel_sums_match_the_two_passes_apart() {
        let gpu = Gpu::get(0).unwrap();
        for [outer, channels, inner] in [[96, 6, 400], [300, 5, 49]] {
            let n = outer * channels * inner;
            let y: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
                .collect();
            let dy: Vec<f32> = (0..n)
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.3)
                .collect();
            let dx: Vec<f32> = dy
                .iter()
                .zip(&y)
                .map(|(&g, &v)| if v > 0.0 { g } else { 0.0 })
                .collect();
            let sums: Vec<f32> = (0..channels)
                .map(|c| {
                    let plane = |p: usize| &dx[(p * channels + c) * inner..][..inner];
                    (0..outer)
                        .flat_map(plane)
                        .map(|&v| f64::from(v))
                        .sum::<f64>() as f32
                })
                .collect();
            let [gdy, gy] = [&dy, &y].map(|v| gpu.upload_f32(v));
            let gdx = gpu.alloc(n * 4).unwrap();
            let gsums = gpu.alloc(channels * 4).unwrap();
            // SAFETY: every buffer holds what the shape says.
            unsafe {
                relu_channel_sums(
                    &gpu,
                    CudaType::F32,
                    [outer, channels, inner],
                    (gdy.ptr(), gy.ptr()),
                    (gdx.ptr(), gsums.ptr()),
                )
                .unwrap();
            }
            assert_eq!(
                gpu.download_f32(&gdx, n),
                dx,
                "dx of {outer}x{channels}x{inner}"
            );
            close("sums", &gpu.download_f32(&gsums, channels), &sums, 1e-5);
        }
    }
}
