//! The CUDA backend: every op of [`crate::cpu`] on [`CudaStorage`].
//!
//! With the `cuda` feature the functions run cohort-kernels' CUDA kernels (`imp.rs`); without it
//! they exist with the same signatures and return [`crate::Error::NotCompiledWithCuda`].

#[cfg(not(feature = "cuda"))]
mod absent;
#[cfg(feature = "cuda")]
mod imp;

#[cfg(not(feature = "cuda"))]
pub use absent::*;
#[cfg(feature = "cuda")]
pub use imp::*;
