//! Reductions along one dim of a tensor seen as `[outer, dim, inner]`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ
    Sum,
    /// Σ / n
    Mean,
    /// max
    Max,
    /// min
    Min,
}

impl ReduceOp {
    /// The op's name, as used in kernel names and error messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// The layout of a reduction: the input is `[outer, dim, inner]`, the output `[outer, inner]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceShape {
    /// Product of the dims before the reduced one.
    pub outer: usize,
    /// Size of the reduced dim.
    pub dim: usize,
    /// Product of the dims after the reduced one.
    pub inner: usize,
}
