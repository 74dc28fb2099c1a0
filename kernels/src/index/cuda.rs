//! CUDA index ops (`index.cu`). An out-of-range index is skipped on the device and reported as
//! [`crate::Error::IndexOutOfRange`] by the next [`Gpu::synchronize`] or device-to-host copy.

use crate::Result;
use crate::cuda::{CudaType, Gpu, Launch, kernel_args, sources::INDEX as SRC, unsupported};

fn by_width(ty: CudaType, w4: &'static str, w2: &'static str, w1: &'static str) -> &'static str {
    match ty.size() {
        4 => w4,
        2 => w2,
        _ => w1,
    }
}

/// `out[o, i, :] = src[o, idx[i], :]`; `src` is `[outer, dim, inner]`, `idx` `nidx` i32.
///
/// # Safety
/// `src` holds `outer * dim * inner` elements of `ty`, `idx` `nidx` i32, `out`
/// `outer * nidx * inner` elements of `ty`.
///
/// # Errors
/// A launch failure (bad indices are reported at the next synchronisation).
#[allow(clippy::too_many_arguments)]
pub unsafe fn index_select(
    gpu: &Gpu,
    ty: CudaType,
    src: u64,
    outer: usize,
    dim: usize,
    inner: usize,
    idx: u64,
    nidx: usize,
    out: u64,
) -> Result<()> {
    let name = by_width(
        ty,
        "index_select_u32",
        "index_select_u16",
        "index_select_u8",
    );
    let n = outer * nidx * inner;
    if n == 0 {
        return Ok(());
    }
    let (o, d, k, i) = (outer as u64, dim as u64, nidx as u64, inner as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![o, d, k, i, src, idx, out, flag];
    // SAFETY: matches `index_select_<w>(u64, u64, u64, u64, const T*, const int*, T*, int*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}

/// The mean of each bag of `bag` consecutive ids' rows of the f32 `table` (`[rows, cols]`) into `out`
/// (`[nidx / bag, cols]`): an embedding bag's lookup in one pass, the same order of sums every run.
///
/// # Safety
/// `table` holds `rows * cols` f32, `idx` `nidx` i32, `out` `nidx / bag * cols` f32; `bag` divides `nidx`.
///
/// # Errors
/// A launch failure (an id outside the table is reported at the next synchronisation).
pub unsafe fn bag_mean(
    gpu: &Gpu,
    (table, rows, cols): (u64, usize, usize),
    (idx, nidx, bag): (u64, usize, usize),
    out: u64,
) -> Result<()> {
    if nidx == 0 || cols == 0 {
        return Ok(());
    }
    let (name, width) = if cols % 4 == 0 {
        ("bag_mean4_f32", 4)
    } else {
        ("bag_mean_f32", 1)
    };
    let launch = Launch {
        grid: ((nidx / bag) as u32, cols.div_ceil(64 * width) as u32, 1),
        block: (64, 4, 1),
        shared: 0,
    };
    let (b, r, c) = (bag as u64, rows as u64, cols as u64);
    let scale = (1.0 / bag as f64) as f32;
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![b, r, c, scale, table, idx, out, flag];
    // SAFETY: matches `bag_mean[4]_f32(u64 x3, float, const float*, const int*, float*, int*)`; the grid covers
    // the bags and columns the caller's buffers hold.
    unsafe { gpu.launch(&SRC, name, launch, &mut args) }
}

/// `dst[o, idx[i], :] += src[o, i / repeat, :]`: `repeat` consecutive indices share a row of `src` (1: a row
/// each). Repeated indices accumulate: in f32 in no fixed order, or in index order as the CPU does in deterministic
/// mode, [`crate::determinism`].
///
/// # Safety
/// `dst` holds `outer * dim * inner` elements of `ty`, `idx` `nidx` i32, `src`
/// `outer * (nidx / repeat) * inner` elements of `ty`; `repeat` divides `nidx`.
///
/// # Errors
/// `ty` is not f32 or i32, or a launch failure.
pub unsafe fn index_add(
    gpu: &Gpu,
    ty: CudaType,
    dst: u64,
    (outer, dim, inner): (usize, usize, usize),
    (idx, nidx): (u64, usize),
    (src, repeat): (u64, usize),
) -> Result<()> {
    let n = outer * nidx * inner;
    if n == 0 {
        return Ok(());
    }
    let rows = outer * dim;
    let (name, cfg) = match ty {
        // A block per row of dst; with no rows, the plain kernel reports the (all bad) indices.
        CudaType::F32 if crate::deterministic() && rows > 0 => {
            let blocks = rows.min(gpu.sm_count() as usize * 16) as u32;
            let cfg = Launch {
                grid: (blocks, 1, 1),
                block: (256, 1, 1),
                shared: 0,
            };
            ("index_add_ordered_f32", cfg)
        }
        CudaType::F32 => ("index_add_f32", gpu.grid(n, 256)),
        // Integer sums are exact in any order.
        CudaType::I32 => ("index_add_i32", gpu.grid(n, 256)),
        other => return Err(unsupported("index_add", other)),
    };
    let (o, d, k, i, rep) = (
        outer as u64,
        dim as u64,
        nidx as u64,
        inner as u64,
        repeat.max(1) as u64,
    );
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![o, d, k, i, rep, dst, idx, src, flag];
    // SAFETY: matches `index_add_<t>(u64, u64, u64, u64, u64, T*, const int*, const T*, int*)`, which
    // `index_add_ordered_f32` shares (launched with the 256 threads a block it needs).
    unsafe { gpu.launch(&SRC, name, cfg, &mut args) }
}

/// `out[r] = src[r, idx[r]]`; `src` is `[rows, cols]` of a 4-byte type.
///
/// # Safety
/// `src` holds `rows * cols` elements, `idx` and `out` `rows` each.
///
/// # Errors
/// `ty` is not 4 bytes wide, or a launch failure.
pub unsafe fn gather_last(
    gpu: &Gpu,
    ty: CudaType,
    src: u64,
    rows: usize,
    cols: usize,
    idx: u64,
    out: u64,
) -> Result<()> {
    if ty.size() != 4 {
        return Err(unsupported("gather_last", ty));
    }
    if rows == 0 {
        return Ok(());
    }
    let (r, c) = (rows as u64, cols as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![r, c, src, idx, out, flag];
    // SAFETY: matches `gather_last_u32(u64, u64, const u32*, const int*, u32*, int*)`.
    unsafe { gpu.launch(&SRC, "gather_last_u32", gpu.grid(rows, 256), &mut args) }
}

/// `dst[r, idx[r]] += src[r]` for f32 (the backward of [`gather_last`]).
///
/// # Safety
/// `dst` holds `rows * cols` f32, `idx` and `src` `rows` each.
///
/// # Errors
/// A launch failure.
pub unsafe fn scatter_add_last(
    gpu: &Gpu,
    dst: u64,
    rows: usize,
    cols: usize,
    idx: u64,
    src: u64,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let (r, c) = (rows as u64, cols as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![r, c, dst, idx, src, flag];
    // SAFETY: matches `scatter_add_last_f32(u64, u64, float*, const int*, const float*, int*)`.
    unsafe { gpu.launch(&SRC, "scatter_add_last_f32", gpu.grid(rows, 256), &mut args) }
}

/// `out` (`[rows, classes]` of `ty`) = one-hot rows of `labels` (`rows` i32).
///
/// # Safety
/// `labels` holds `rows` i32, `out` `rows * classes` elements of `ty`.
///
/// # Errors
/// `ty` is not f32, i32 or u8, or a launch failure.
pub unsafe fn one_hot(
    gpu: &Gpu,
    ty: CudaType,
    labels: u64,
    rows: usize,
    classes: usize,
    out: u64,
) -> Result<()> {
    let name = match ty {
        CudaType::F32 => "one_hot_f32",
        CudaType::I32 => "one_hot_i32",
        CudaType::U8 => "one_hot_u8",
        other => return Err(unsupported("one_hot", other)),
    };
    let n = rows * classes;
    if n == 0 {
        return Ok(());
    }
    let (r, c) = (rows as u64, classes as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![r, c, labels, out, flag];
    // SAFETY: matches `one_hot_<t>(u64, u64, const int*, T*, int*)`.
    unsafe { gpu.launch(&SRC, name, gpu.grid(n, 256), &mut args) }
}
