//! Index ops: row selection (embeddings), scatter-add (their backward), gather along the last dim,
//! one-hot encoding.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
