//! Layer normalization, fused: each row's statistics and its normalized, scaled and shifted output in one pass
//! over the row, and in the backward pass the input's gradient in one more and the parameters' gradients in a
//! column-wise pass, where a composition of element-wise ops and reductions takes some thirty passes over the
//! activations (a Transformer block has two of them).
//!
//! Layout: the input is `[members, rows, dim]`, row-major; each row is normalized by its own mean and biased
//! variance over `dim`, then scaled and shifted by its member's `weight` and `bias` (`[members, dim]`). The
//! statistics kept for the backward pass are each row's mean and `1 / √(var + eps)` (`[members, rows]`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The geometry of one layer normalization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNormShape {
    /// Members (1 for one model).
    pub members: usize,
    /// Rows per member (every dimension between the member and the normalized one).
    pub rows: usize,
    /// The normalized dimension.
    pub dim: usize,
}

impl LayerNormShape {
    /// Elements of the input (and the output, and their gradients).
    pub fn len(&self) -> usize {
        self.members * self.rows * self.dim
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Statistics: one per row of every member.
    pub fn stat_len(&self) -> usize {
        self.members * self.rows
    }

    /// Weights (and biases): one per member and column.
    pub fn param_len(&self) -> usize {
        self.members * self.dim
    }
}
