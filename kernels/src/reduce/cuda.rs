//! CUDA reductions along one dim (`reduce.cu`), two-pass where one pass would leave the GPU idle.

use super::{ReduceOp, ReduceShape};
use crate::cuda::{CudaType, Gpu, Launch, kernel_args, sources::REDUCE as SRC, unsupported};
use crate::{Error, Result};

const BLOCK: u32 = 256;

fn names(op: ReduceOp, ty: CudaType) -> Option<(&'static str, &'static str)> {
    Some(match (op, ty) {
        (ReduceOp::Sum | ReduceOp::Mean, CudaType::F32) => ("sum_rows_f32", "sum_cols_f32"),
        (ReduceOp::Max, CudaType::F32) => ("max_rows_f32", "max_cols_f32"),
        (ReduceOp::Min, CudaType::F32) => ("min_rows_f32", "min_cols_f32"),
        (ReduceOp::Sum, CudaType::I32) => ("sum_rows_i32", "sum_cols_i32"),
        (ReduceOp::Max, CudaType::I32) => ("max_rows_i32", "max_cols_i32"),
        (ReduceOp::Min, CudaType::I32) => ("min_rows_i32", "min_cols_i32"),
        _ => return None,
    })
}

fn grid_limit(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&v| v <= i32::MAX as u32)
        .ok_or_else(|| Error::Cuda(format!("{what}: {n} blocks exceed the grid limit")))
}

/// Reduces `x` (`[outer, dim, inner]`, type `ty`) along `dim` into `out` (`[outer, inner]`).
/// An empty `dim` gives the op's identity (0 for sums; the lowest / highest value for max / min).
///
/// # Safety
/// `x` must hold `outer * dim * inner` elements and `out` `outer * inner`, on this device.
///
/// # Errors
/// No kernel for the pair (f32: all; i32: sum, max, min), or a launch failure.
pub unsafe fn reduce(
    gpu: &Gpu,
    op: ReduceOp,
    ty: CudaType,
    x: u64,
    out: u64,
    s: ReduceShape,
) -> Result<()> {
    let (rows_k, cols_k) = names(op, ty).ok_or_else(|| unsupported(op.name(), ty))?;
    let outputs = s.outer * s.inner;
    if outputs == 0 {
        return Ok(());
    }
    let scale: f32 = match (op, s.dim) {
        // The mean of nothing is NaN, as on the CPU.
        (ReduceOp::Mean, 0) => f32::NAN,
        (ReduceOp::Mean, d) => (1.0 / d as f64) as f32,
        _ => 1.0,
    };
    // Enough independent pieces to fill the device: split `dim` when there are few outputs.
    let target = gpu.sm_count() as usize * 8;
    let pieces = if s.inner == 1 {
        s.outer
    } else {
        outputs.div_ceil(BLOCK as usize)
    };
    // A rows block shares its split among its threads; a cols thread walks its split alone, so long columns over
    // few outputs are split much finer (one block summing 256 rows of 128 columns took 30 µs on an H200).
    let max_splits = if s.inner == 1 {
        s.dim / 1024
    } else {
        s.dim / 32
    }
    .max(1);
    let splits = if pieces >= target {
        1
    } else {
        target.div_ceil(pieces).min(max_splits).min(65_535)
    };
    let elem = ty.size();
    // `by_rows`: a block per row (inner must be 1); else a thread per output.
    let run = |x: u64,
               out: u64,
               (outer, dim, inner): (usize, usize, usize),
               splits: usize,
               scale: f32,
               by_rows: bool|
     -> Result<()> {
        let chunk = dim.div_ceil(splits).max(1) as u64;
        if by_rows {
            let cfg = Launch {
                grid: (grid_limit("reduce", outer)?, splits as u32, 1),
                block: (BLOCK, 1, 1),
                shared: 0,
            };
            let d = dim as u64;
            let mut args = kernel_args![d, chunk, x, out, scale];
            // SAFETY: matches `<op>_rows_<t>(u64, u64, const T*, T*, float)`.
            unsafe { gpu.launch(&SRC, rows_k, cfg, &mut args) }
        } else {
            let cfg = Launch {
                grid: (
                    grid_limit("reduce", (outer * inner).div_ceil(BLOCK as usize))?,
                    splits as u32,
                    1,
                ),
                block: (BLOCK, 1, 1),
                shared: 0,
            };
            let (o, d, i) = (outer as u64, dim as u64, inner as u64);
            let mut args = kernel_args![o, d, i, chunk, x, out, scale];
            // SAFETY: matches `<op>_cols_<t>(u64, u64, u64, u64, const T*, T*, float)`.
            unsafe { gpu.launch(&SRC, cols_k, cfg, &mut args) }
        }
    };
    let shape = (s.outer, s.dim, s.inner);
    if splits == 1 {
        return run(x, out, shape, 1, scale, s.inner == 1);
    }
    gpu.with_scratch(outputs * splits * elem, |partial| {
        run(x, partial, shape, splits, 1.0, s.inner == 1)?;
        // partial is [outer * inner, splits]. Few outputs: a block per output adds its splits (a thread per output
        // walking them alone waited on one load after another, 16 µs for 128 splits of 256 outputs on an H200).
        // Enough outputs to fill the device a thread each: a thread per output, where a block per output left
        // 254 of 256 threads idle (270 µs for 2 splits of 262,144 outputs, a conv bias's gradient, on an H100).
        let by_rows = outputs < gpu.sm_count() as usize * BLOCK as usize;
        run(partial, out, (outputs, splits, 1), 1, scale, by_rows)
    })
}

/// Index (i32) of the first largest element of `x` (`[outer, dim, inner]`) along `dim`.
///
/// # Safety
/// `x` must hold `outer * dim * inner` elements of `ty`, `out` `outer * inner` i32.
///
/// # Errors
/// `ty` is not f32 or i32, or a launch failure.
pub unsafe fn argmax(gpu: &Gpu, ty: CudaType, x: u64, out: u64, s: ReduceShape) -> Result<()> {
    let (rows_k, cols_k) = match ty {
        CudaType::F32 => ("argmax_rows_f32", "argmax_cols_f32"),
        CudaType::I32 => ("argmax_rows_i32", "argmax_cols_i32"),
        other => return Err(unsupported("argmax", other)),
    };
    let outputs = s.outer * s.inner;
    if outputs == 0 {
        return Ok(());
    }
    if s.dim == 0 {
        // SAFETY: out holds `outputs` i32.
        return unsafe { gpu.fill(out, 0, 4, outputs) };
    }
    if s.inner == 1 {
        let cfg = Launch {
            grid: (grid_limit("argmax", s.outer)?, 1, 1),
            block: (BLOCK, 1, 1),
            shared: 0,
        };
        let d = s.dim as u64;
        let mut args = kernel_args![d, x, out];
        // SAFETY: matches `argmax_rows_<t>(u64, const T*, int*)`.
        unsafe { gpu.launch(&SRC, rows_k, cfg, &mut args) }
    } else {
        let cfg = Launch {
            grid: (
                grid_limit("argmax", outputs.div_ceil(BLOCK as usize))?,
                1,
                1,
            ),
            block: (BLOCK, 1, 1),
            shared: 0,
        };
        let (o, d, i) = (s.outer as u64, s.dim as u64, s.inner as u64);
        let mut args = kernel_args![o, d, i, x, out];
        // SAFETY: matches `argmax_cols_<t>(u64, u64, u64, const T*, int*)`.
        unsafe { gpu.launch(&SRC, cols_k, cfg, &mut args) }
    }
}
