//! The CUDA backend: [`CudaStorage`], which implements every trait of [`crate::backend`], and the
//! device-wide functions (synchronization, graph capture, uploads, profiling, GEMM tuning).
//!
//! With the `cuda` feature they run cohort-kernels' CUDA kernels (`imp.rs`, `imp/`); without it
//! they exist with the same signatures and return [`crate::Error::NotCompiledWithCuda`]
//! (`absent.rs`): the shared traits make the compiler check that the two agree.

#[cfg(not(feature = "cuda"))]
mod absent;
#[cfg(feature = "cuda")]
mod imp;

#[cfg(not(feature = "cuda"))]
pub use absent::*;
#[cfg(feature = "cuda")]
pub use imp::*;
