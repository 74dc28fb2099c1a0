//! CUDA softmax and log-softmax along the last dim (`softmax.cu`).

use crate::Result;
use crate::cuda::{Gpu, Launch, kernel_args, sources::SOFTMAX as SRC};

/// Softmax (or log-softmax when `log`) of each of `rows` rows of `cols` f32; `out` may be `x`.
///
/// # Safety
/// `x` and `out` must each hold `rows * cols` f32 on this device.
///
/// # Errors
/// A launch failure.
pub unsafe fn softmax_last(
    gpu: &Gpu,
    x: u64,
    out: u64,
    rows: usize,
    cols: usize,
    log: bool,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    if rows > i32::MAX as usize {
        return Err(crate::Error::Cuda(format!(
            "softmax_last: {rows} rows exceed the grid limit; split the batch"
        )));
    }
    let block = match cols {
        0..=64 => 32,
        65..=512 => 128,
        513..=4096 => 256,
        _ => 512,
    };
    let cfg = Launch {
        grid: (rows as u32, 1, 1),
        block: (block, 1, 1),
        shared: 0,
    };
    let cols = cols as u64;
    let mut args = kernel_args![cols, x, out];
    let name = if log {
        "log_softmax_f32"
    } else {
        "softmax_f32"
    };
    // SAFETY: matches `<name>(u64, const float*, float*)`; buffers per the caller.
    unsafe { gpu.launch(&SRC, name, cfg, &mut args) }
}

/// Softmax cross-entropy of `rows` rows of `cols` f32 logits at `x` against i32 `labels`
/// (`label_rows` of them: row `r` takes `labels[r % label_rows]`): the loss of each row into
/// `loss` (`rows` f32) and `(softmax - onehot) · scale` into `grad` (`rows · cols` f32). An
/// out-of-range label is flagged (reported at the next synchronize) and its row left at zero loss.
///
/// # Safety
/// The buffers must hold the sizes above on this device; `label_rows` must divide `rows`.
///
/// # Errors
/// The launch failed.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cross_entropy(
    gpu: &Gpu,
    x: u64,
    labels: u64,
    rows: usize,
    cols: usize,
    label_rows: usize,
    scale: f32,
    loss: u64,
    grad: u64,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    // A warp per row, or a thread per row where a row is narrower than a warp.
    const BLOCK: usize = 256;
    let narrow = cols <= 32;
    let per_block = if narrow { BLOCK } else { BLOCK / 32 };
    let blocks = u32::try_from(rows.div_ceil(per_block)).map_err(|_| {
        crate::Error::Cuda(format!(
            "cross_entropy: {rows} rows exceed the grid limit; split the batch"
        ))
    })?;
    let cfg = Launch {
        grid: (blocks, 1, 1),
        block: (BLOCK as u32, 1, 1),
        shared: 0,
    };
    let kernel = if narrow {
        "cross_entropy_narrow_f32"
    } else {
        "cross_entropy_f32"
    };
    let (rows, cols, label_rows) = (rows as u64, cols as u64, label_rows.max(1) as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![rows, cols, label_rows, scale, labels, x, loss, grad, flag];
    // SAFETY: matches `cross_entropy[_narrow]_f32(u64, u64, u64, float, const int*, const float*,
    // float*, float*, int*)`; buffers per the caller.
    unsafe { gpu.launch(&SRC, kernel, cfg, &mut args) }
}

/// [`cross_entropy`] averaged over each group of `batch` rows (`rows / batch` groups, e.g. the
/// members of a fused model), in one kernel: `loss` gets one mean per group and `grad` uses
/// `scale = 1 / batch`. Returns `false`, queuing nothing, for more than 32 columns or a batch of
/// more than 1,024 rows (the caller then takes the mean of [`cross_entropy`]'s rows).
///
/// # Safety
/// As [`cross_entropy`], with `loss` holding `rows / batch` f32; `batch` must divide `rows`.
///
/// # Errors
/// The launch failed.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cross_entropy_mean(
    gpu: &Gpu,
    x: u64,
    labels: u64,
    rows: usize,
    cols: usize,
    batch: usize,
    label_rows: usize,
    loss: u64,
    grad: u64,
) -> Result<bool> {
    if cols > 32 || batch == 0 || batch > 1024 || rows % batch != 0 {
        return Ok(false);
    }
    let groups = u32::try_from(rows / batch).map_err(|_| {
        crate::Error::Cuda(format!(
            "cross_entropy: {rows} rows exceed the grid limit; split the batch"
        ))
    })?;
    let cfg = Launch {
        grid: (groups, 1, 1),
        block: (batch.next_multiple_of(32) as u32, 1, 1),
        shared: 0,
    };
    let (batch, cols, label_rows) = (batch as u64, cols as u64, label_rows.max(1) as u64);
    let flag = gpu.flag_ptr()?;
    let mut args = kernel_args![batch, cols, label_rows, labels, x, loss, grad, flag];
    // SAFETY: matches `cross_entropy_mean_narrow_f32(u64, u64, u64, const int*, const float*,
    // float*, float*, int*)`; buffers per the caller.
    unsafe { gpu.launch(&SRC, "cross_entropy_mean_narrow_f32", cfg, &mut args)? };
    Ok(true)
}
