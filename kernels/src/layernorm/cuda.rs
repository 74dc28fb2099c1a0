//! CUDA layer normalization (`layernorm.cu`), f32: one kernel forward (a warp per row), and backward one for the
//! input's gradient and two for the parameters' (partial column sums over blocks of rows, then their sum).

use super::LayerNormShape;
use crate::cuda::{Gpu, Launch, kernel_args, sources::LAYERNORM as SRC};
use crate::{Error, Result};

/// Rows of a 256-thread block of the row kernels (a warp each), and rows a block of the parameters' partial sums
/// takes (`ROWS_PER_BLOCK` and `PARAM_ROWS` of `layernorm.cu`).
const ROWS_PER_BLOCK: usize = 8;
const PARAM_ROWS: usize = 64;

fn check(s: &LayerNormShape) -> Result<()> {
    if s.dim == 0 || s.members > 65_535 {
        return Err(Error::Cuda(format!(
            "layer_norm: {s:?}: the kernels take rows of at least one element and up to 65535 members"
        )));
    }
    Ok(())
}

/// A warp per item (a row, a parameter), grid-stride.
fn warp_each(gpu: &Gpu, items: usize) -> Launch {
    Launch {
        block: (256, 1, 1),
        ..gpu.grid(items.div_ceil(ROWS_PER_BLOCK), 1)
    }
}

/// The forward pass of f32 `x` into `y`, with each row's `mean` and `invstd` (see [`super::cpu::forward`]).
///
/// # Safety
/// `x` and `y` must hold `s.len()` f32, `weight` and `bias` `s.param_len()`, `mean` and `invstd`
/// `s.stat_len()`, on this device.
///
/// # Errors
/// Empty rows or too many members, or a launch failure.
pub unsafe fn forward(
    gpu: &Gpu,
    (s, eps): (&LayerNormShape, f64),
    (x, weight, bias): (u64, u64, u64),
    (y, mean, invstd): (u64, u64, u64),
) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    check(s)?;
    let (total, rows, dim, eps) = (s.stat_len() as u64, s.rows as u64, s.dim as u64, eps as f32);
    let mut args = kernel_args![total, rows, dim, eps, x, weight, bias, y, mean, invstd];
    // SAFETY: matches `layer_norm_forward_f32(u64 x3, float, const float* x3, float* x3)`.
    unsafe {
        gpu.launch(
            &SRC,
            "layer_norm_forward_f32",
            warp_each(gpu, s.stat_len()),
            &mut args,
        )
    }
}

/// The backward pass of [`forward`]: `dx`, `dweight` and `dbias` from its input `x`, the output's gradient `dy`,
/// its `mean` and `invstd`, and `weight` (see [`super::cpu::backward`]).
///
/// # Safety
/// As [`forward`]: `x`, `dy` and `dx` of `s.len()` f32, `weight`, `dweight` and `dbias` of `s.param_len()`,
/// `mean` and `invstd` of `s.stat_len()`.
///
/// # Errors
/// As [`forward`].
pub unsafe fn backward(
    gpu: &Gpu,
    s: &LayerNormShape,
    (x, dy): (u64, u64),
    (mean, invstd, weight): (u64, u64, u64),
    (dx, dweight, dbias): (u64, u64, u64),
) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    check(s)?;
    let (total, rows, dim) = (s.stat_len() as u64, s.rows as u64, s.dim as u64);
    let mut args = kernel_args![total, rows, dim, x, dy, mean, invstd, weight, dx];
    // SAFETY: matches `layer_norm_grad_input_f32(u64 x3, const float* x5, float*)`.
    unsafe {
        gpu.launch(
            &SRC,
            "layer_norm_grad_input_f32",
            warp_each(gpu, s.stat_len()),
            &mut args,
        )?
    };
    let blocks = s.rows.div_ceil(PARAM_ROWS).max(1);
    gpu.with_scratch(s.param_len() * blocks * 8, |partial| {
        let cfg = Launch {
            grid: (s.dim.div_ceil(32) as u32, blocks as u32, s.members as u32),
            block: (256, 1, 1),
            shared: 0,
        };
        let mut args = kernel_args![rows, dim, x, dy, mean, invstd, partial];
        // SAFETY: matches `layer_norm_grad_params_f32(u64 x2, const float* x4, float*)`; it writes the
        // `[members, blocks, dim, 2]` partials the scratch holds.
        unsafe { gpu.launch(&SRC, "layer_norm_grad_params_f32", cfg, &mut args)? };
        let (members, blocks) = (s.members as u64, blocks as u64);
        let mut args = kernel_args![members, dim, blocks, partial, dweight, dbias];
        let cfg = warp_each(gpu, s.param_len());
        // SAFETY: matches `layer_norm_grad_finish_f32(u64 x3, const float*, float* x2)`.
        unsafe { gpu.launch(&SRC, "layer_norm_grad_finish_f32", cfg, &mut args) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layernorm::cpu;

    fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    /// Both passes against the CPU's: rows wider and narrower than a warp, several blocks of parameter sums
    /// (and a ragged last one), several members.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn both_passes_match_the_cpu() {
        let gpu = Gpu::get(0).unwrap();
        for s in [
            LayerNormShape {
                members: 3,
                rows: 150,
                dim: 70,
            },
            LayerNormShape {
                members: 1,
                rows: 9,
                dim: 5,
            },
        ] {
            let n = s.len();
            let x: Vec<f32> = (0..n)
                .map(|i| 3.0 + ((i * 7919) % 1013) as f32 / 1013.0 * 4.0 - (i % 5) as f32)
                .collect();
            let dy: Vec<f32> = (0..n)
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let p = s.param_len();
            let w: Vec<f32> = (0..p).map(|i| 0.5 + (i % 13) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..p).map(|i| (i % 7) as f32 * 0.2 - 1.0).collect();
            let (y, mean, invstd) = cpu::forward(&x, (&w, &b), (&s, 1e-5));
            let (dx, dw, db) = cpu::backward(&x, &dy, (&mean, &invstd, &w), &s);

            let [gx, gw, gb, gdy] = [&x, &w, &b, &dy].map(|v| gpu.upload_f32(v));
            let [gy, gdx] = [n, n].map(|n| gpu.alloc(n * 4).unwrap());
            let [gm, gi] = [s.stat_len(); 2].map(|c| gpu.alloc(c * 4).unwrap());
            let [gdw, gdb] = [p; 2].map(|c| gpu.alloc(c * 4).unwrap());
            // SAFETY: every buffer holds what `s` says.
            unsafe {
                forward(
                    &gpu,
                    (&s, 1e-5),
                    (gx.ptr(), gw.ptr(), gb.ptr()),
                    (gy.ptr(), gm.ptr(), gi.ptr()),
                )
                .unwrap();
                backward(
                    &gpu,
                    &s,
                    (gx.ptr(), gdy.ptr()),
                    (gm.ptr(), gi.ptr(), gw.ptr()),
                    (gdx.ptr(), gdw.ptr(), gdb.ptr()),
                )
                .unwrap();
            }
            let what = |v: &str| format!("{s:?}: {v}");
            close(
                &what("mean"),
                &gpu.download_f32(&gm, s.stat_len()),
                &mean,
                1e-5,
            );
            close(
                &what("invstd"),
                &gpu.download_f32(&gi, s.stat_len()),
                &invstd,
                1e-4,
            );
            close(&what("y"), &gpu.download_f32(&gy, n), &y, 1e-4);
            close(&what("dx"), &gpu.download_f32(&gdx, n), &dx, 1e-3);
            close(&what("dweight"), &gpu.download_f32(&gdw, p), &dw, 1e-3);
            close(&what("dbias"), &gpu.download_f32(&gdb, p), &db, 1e-3);
        }
    }
}
