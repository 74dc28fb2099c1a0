//! Softmax and log-softmax along the last dim.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
