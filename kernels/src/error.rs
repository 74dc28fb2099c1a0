/// Result of a kernel call.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors a kernel can report: data-dependent problems (an index out of range) and device failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An index tensor held a value outside `0..size`.
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        /// The op that read the index.
        op: &'static str,
        /// The offending index value.
        index: i64,
        /// The size of the indexed dimension.
        size: usize,
    },
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("cuda: {0}")]
    Cuda(String),
    /// The runtime's own device memory (a scratch area, a library workspace) could not be had from the arena.
    #[error("cuda: {what}: {source}")]
    DeviceMemory {
        /// What was being allocated.
        what: String,
        /// The arena's error (the caching allocator's out-of-memory report).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// GEMM choices saved on another device or library version ([`crate::matmul::GemmChoices`]): none were adopted,
    /// and the products will be chosen afresh.
    #[error(
        "gemm choices were made on {made_on}, this is {this}: none adopted, the products will be chosen afresh"
    )]
    ForeignGemmChoices {
        /// The device and libraries the choices were made on.
        made_on: String,
        /// This device and its libraries.
        this: String,
    },
    /// The crate was built without the `cuda` feature.
    #[error(
        "cohort-kernels was built without the `cuda` feature: rebuild with `--features cuda` to use a GPU"
    )]
    NotCompiledWithCuda,
}
