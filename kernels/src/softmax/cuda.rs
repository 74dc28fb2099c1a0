//! CUDA softmax and log-softmax along the last dim (`softmax.cu`).

use crate::Result;
use crate::cuda::{Gpu, KernelSource, Launch, kernel_args};

pub(crate) static SRC: KernelSource = KernelSource {
    name: "softmax",
    code: include_str!("softmax.cu"),
};

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
