//! cohort-kernels: compute kernels on raw buffers: CPU (gemm, rayon) and CUDA (cuBLAS / cuBLASLt, cuDNN, NVRTC).
//!
//! Every op family lives in its own folder: `mod.rs` holds the parameters shared by all
//! devices, `cpu.rs` the host implementation, `cuda.rs` the GPU one (feature `cuda`).
//! Kernels work on slices and plain shapes; shape checking is the caller's job
//! (cohort-tensor), except for data-dependent checks such as index ranges.
//!
//! The CPU kernels give the same bits whatever the number of threads; on the GPU,
//! [`set_deterministic`] fixes the choices left (see [`determinism`]).
//!
//! ```
//! use cohort_kernels::matmul::{cpu, MatmulShape};
//! let a = [1.0f32, 2.0, 3.0, 4.0]; // [2, 2]
//! let b = [1.0f32, 0.0, 0.0, 1.0]; // identity
//! let c = cpu::matmul(&a, &b, &MatmulShape::plain(2, 2, 2));
//! assert_eq!(c, vec![1.0, 2.0, 3.0, 4.0]);
//! ```

pub mod attention;
pub mod batchnorm;
pub mod binary;
pub mod conv;
pub mod copy;
pub mod cuda;
pub mod determinism;
mod disjoint;
mod error;
pub mod index;
pub mod layernorm;
mod math;
pub mod matmul;
pub mod optim;
pub mod pool;
pub mod reduce;
mod scalar;
pub mod simd;
pub mod softmax;
pub mod unary;

pub use determinism::{deterministic, set_deterministic};
pub use error::{Error, Result};
pub use math::Math;
pub use scalar::{Float, Scalar};

/// Element counts above which CPU element-wise kernels split work across rayon threads.
///
/// Below it, the cost of waking threads outweighs the work.
pub const PAR_THRESHOLD: usize = 1 << 16;

/// Minimum number of elements a rayon task handles in element-wise kernels.
pub const PAR_CHUNK: usize = 1 << 13;
