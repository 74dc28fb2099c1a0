//! cohort-tensor: tensors on the CPU and on CUDA, with GPU storage from the cohort allocator.
//!
//! A [`Tensor`] is a contiguous row-major array with a [`DType`] and a [`Device`]; its storage is
//! shared (cheap clones) and sits behind a lock so that optimizers can update it in place. Every op
//! checks shapes, dtypes and devices and returns an [`Error`] that names them; the compute itself
//! runs in `cohort-kernels` (gemm and rayon on the CPU, cuBLAS, cuDNN and NVRTC kernels on CUDA).
//!
//! Index ops (`index_select`, `index_add`, `gather_last`, `scatter_add_last`, `one_hot`, max-pool's
//! backward) fail at the op on the CPU when an index is out of range. On CUDA they skip the bad
//! index and flag it on the device, and the next read-back or synchronize of the thread that
//! queued the op fails with the op, the index and the size (as PyTorch's device-side checks do,
//! but never reported to another thread): waiting for every index op would stall the stream once
//! per training step.
//!
//! [`set_deterministic`] makes every GPU op give the same bits from run to run (fixed GEMM
//! algorithms, ordered sums where threads would race; see [`cohort_kernels::determinism`]); the
//! CPU ops already do, whatever the number of threads. [`GemmChoices`] carry the GEMM and
//! convolution algorithms a run picked by timing to the run that resumes it
//! ([`cuda::gemm_choices`], [`cuda::adopt_gemm_choices`]).
//!
//! ```
//! use cohort_tensor::{DType, Device, Tensor};
//! # fn main() -> cohort_tensor::Result<()> {
//! let dev = Device::Cpu;
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], &[2, 2], &dev)?;
//! let w = Tensor::ones(&[2, 3], DType::F32, &dev)?;
//! let y = x.matmul(&w)?.relu()?;
//! assert_eq!(y.shape(), &[2, 3]);
//! assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
//! assert!(x.matmul(&x.reshape(&[4, 1])?).is_err()); // shapes [2, 2] and [4, 1] do not match
//! # Ok(())
//! # }
//! ```

mod attention;
pub mod backend;
mod batchnorm;
mod conv;
pub mod cpu;
pub mod cuda;
mod device;
mod dtype;
mod error;
mod layernorm;
pub mod memory;
mod ops;
mod optim;
mod pooled_conv;
mod precision;
mod products;
mod random;
pub mod storage;
mod tensor;

pub use attention::AttentionMask;
pub use batchnorm::RunningStats;
pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use ops::broadcast_shape;
pub use precision::{Precision, PrecisionScope};
pub use tensor::{HostRead, Tensor};

pub use cohort_kernels::Math;
pub use cohort_kernels::binary::BinaryOp;
pub use cohort_kernels::cuda::set_kernel_cache;
pub use cohort_kernels::matmul::GemmChoices;
pub use cohort_kernels::optim::LossScaleState;
pub use cohort_kernels::reduce::ReduceOp;
pub use cohort_kernels::unary::UnaryOp;
pub use cohort_kernels::{deterministic, set_deterministic};
