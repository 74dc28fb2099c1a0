//! Fused scaled dot-product self-attention over a packed query/key/value projection, flash-style: scores are
//! made a tile at a time and never stored whole, so memory is linear in the sequence length. The forward pass
//! keeps each query's log-sum-exp of scores; the backward pass recomputes the scores from it.
//!
//! Layout (FlashAttention's `qkvpacked` form): `qkv` is `[n, L, 3, heads, d]` (a projection's `[n, L, 3D]`
//! output as it is, `D = heads · d`), the output `[n, L, heads, d]` (`[n, L, D]`, ready for the output
//! projection), the log-sum-exps `[n, heads, L]`. Query `i` of group `(s, h)` sees key `j` when `j <= i` (if
//! causal) and key `j` of its sequence is not padding; a query that sees no key gives zeros and passes no
//! gradient.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The geometry of one fused attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Sequences (`n`): examples, times members when they are fused.
    pub seqs: usize,
    /// Positions per sequence (`L`), queries and keys alike.
    pub len: usize,
    /// Heads per position.
    pub heads: usize,
    /// Width of one head (`d`).
    pub head_dim: usize,
    /// The scores' factor, `1/√d` as usual.
    pub scale: f64,
    /// Query `i` sees keys `j <= i` only.
    pub causal: bool,
    /// Rows of the key-padding mask (`[rows, L]`, 1 = a key, 0 = padding); sequence `s` takes row `s % rows`.
    /// 0: no mask.
    pub mask_rows: usize,
}

impl AttentionShape {
    /// Width of one position's projections, `D`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Elements of `qkv` (and of its gradient).
    pub fn qkv_len(&self) -> usize {
        self.seqs * self.len * 3 * self.width()
    }

    /// Elements of the output.
    pub fn out_len(&self) -> usize {
        self.seqs * self.len * self.width()
    }

    /// Elements of the log-sum-exps, one per query of every head.
    pub fn lse_len(&self) -> usize {
        self.seqs * self.heads * self.len
    }

    /// Elements of the key-padding mask.
    pub fn mask_len(&self) -> usize {
        self.mask_rows * self.len
    }

    /// Multiply-adds of one forward pass (the backward pass does 2.5 times as many); causal halves both.
    pub fn flops(&self) -> u64 {
        let full = 4 * (self.seqs * self.heads * self.len * self.len * self.head_dim) as u64;
        if self.causal { full / 2 } else { full }
    }
}
