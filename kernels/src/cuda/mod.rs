//! The CUDA device layer: one [`Gpu`] per device (context, a compute stream, a copy stream,
//! cuBLAS and cuBLASLt handles, a cuDNN handle where `libcudnn.so.9` loads, and its loaded kernel
//! modules), and the kernel modules themselves ([`sources`]): built into the crate as cubins where the build could
//! (`build.rs`), else compiled by NVRTC once per machine and kept on disk ([`modules`]).
//!
//! Kernels take raw device addresses (`u64`), because tensors hold blocks of the device's
//! caching allocator, not one driver allocation each. Every op of the `<family>/cuda.rs`
//! files enqueues on the device's compute stream and returns without waiting.
//!
//! Built without the `cuda` feature, [`Gpu::get`] still exists and reports
//! [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda); built with it but run
//! where no driver is installed, it reports that no driver was found. Neither panics.

#[cfg(not(feature = "cuda"))]
mod absent;
#[cfg(feature = "cuda")]
pub(crate) mod decisions;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod modules;
#[cfg(feature = "cuda")]
mod profile;
#[cfg(feature = "cuda")]
pub(crate) mod sources;

#[cfg(not(feature = "cuda"))]
pub use absent::{Gpu, device_count, driver_present, set_kernel_cache};
#[cfg(feature = "cuda")]
pub use gpu::{
    CopyEvent, CudaType, DeviceArena, DeviceBuffer, Gpu, GpuGraph, HostCopy, PinnedBuffer, Turn,
    device_count, driver_present, pinned_host_bytes,
};

#[cfg(feature = "cuda")]
pub(crate) use gpu::{
    FloatKernels, Launch, StridedShape, aligned16, broadcast_strides, contiguous_strides, cuda_err,
    float_kernel, float_kernels, kernel_args, unsupported,
};
#[cfg(feature = "cuda")]
pub use modules::{built_in_kernels, set_built_in_kernels, set_kernel_cache};
#[cfg(feature = "cuda")]
pub(crate) use sources::KernelSource;

/// GPU time spent in one kernel (or cuBLAS call shape) since the last report.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Kernel name, or `gemmNT MxNxK xBATCH` for cuBLAS (N / T: operand stored plain / transposed).
    pub label: String,
    /// Launches.
    pub calls: usize,
    /// Summed GPU time in milliseconds.
    pub total_ms: f64,
}

/// How one f32 product geometry, or one pass of a convolution, was tuned ([`Gpu::gemm_tuning`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmTuning {
    /// `gemmNT MxNxK xBATCH`, as in [`KernelTime`]; `cudnn fwd NxCxHxW -> O k3x3 s1 p1` for a convolution.
    pub label: String,
    /// Algorithms timed: the cuBLASLt heuristics' picks and their split-K variants, or cuDNN's algorithms.
    pub candidates: usize,
    /// µs per product of the heuristic's first pick (`None`: it failed to run).
    pub heuristic_us: Option<f64>,
    /// µs per product of the fastest, now used.
    pub best_us: f64,
    /// Its index among them.
    pub best_index: usize,
    /// Bytes of workspace it runs with (memory its call holds at the member's peak, where it falls there).
    pub workspace: usize,
}

/// The modules only some models use, each made alone when one of its kernels is first launched (where the build did
/// not build it in), so that a job without them never waits for NVRTC over them: batch norm (1.9 s on an H100
/// machine's CPU, the slowest module of the rest; built in with the common ones), the pooled convolution's (built in
/// too) and attention's, which take seconds each (on a 2-core machine 3-15 s per tensor-core type and width; on an
/// H100 machine's CPU the fp32 multiply-add module took 8 s).
#[cfg(feature = "cuda")]
fn first_use_sources() -> impl Iterator<Item = &'static KernelSource> {
    use crate::attention::cuda::{BF16_SRC, F16_SRC, SRC, TF32_SRC, TF32X3_SRC};
    [&sources::BATCHNORM, &sources::CONV_POOLED, &SRC]
        .into_iter()
        .chain(
            [&BF16_SRC, &F16_SRC, &TF32_SRC, &TF32X3_SRC]
                .into_iter()
                .flatten(),
        )
}

/// Every kernel source of the crate.
#[cfg(feature = "cuda")]
fn all_sources() -> impl Iterator<Item = &'static KernelSource> {
    sources::COMMON_SOURCES
        .into_iter()
        .chain(first_use_sources())
}

/// Compiles every `.cu` source to PTX for `arch` (`"compute_90"`; `None`: NVRTC's default)
/// without touching a GPU: NVRTC is a host library. Returns how many sources compiled.
///
/// # Errors
/// NVRTC is missing, or a source does not compile (the error carries NVRTC's log).
#[cfg(feature = "cuda")]
pub fn compile_kernels(arch: Option<&'static str>) -> crate::Result<usize> {
    let mut n = 0;
    for s in all_sources() {
        s.compile(arch)?;
        n += 1;
    }
    Ok(n)
}
