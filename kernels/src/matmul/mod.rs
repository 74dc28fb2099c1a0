//! Matrix products: plain, batched, and batched with one side broadcast (fused members).

mod choices;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub(crate) mod lt;
#[cfg(feature = "cuda")]
pub(crate) mod thin;

pub use choices::{Epilogue, GemmChoice, GemmChoices, GemmDecision, GemmDevice, Geometry};

/// The geometry of a (batched) matrix product `out[b] = op(lhs[b]) · op(rhs[b])`.
///
/// `lhs` holds `[m, k]` matrices (`[k, m]` when `trans_lhs`), `rhs` `[k, n]` ones (`[n, k]` when
/// `trans_rhs`), the output `batch` row-major `[m, n]` matrices. A batch stride of 0 broadcasts
/// that operand to every batch entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulShape {
    /// Number of products.
    pub batch: usize,
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Elements between consecutive lhs matrices (0: the same matrix for every batch entry).
    pub lhs_batch_stride: usize,
    /// Elements between consecutive rhs matrices (0: the same matrix for every batch entry).
    pub rhs_batch_stride: usize,
    /// lhs is stored transposed (`[k, m]`).
    pub trans_lhs: bool,
    /// rhs is stored transposed (`[n, k]`).
    pub trans_rhs: bool,
}

impl MatmulShape {
    /// A single `[m, k] · [k, n]` product with no transposes.
    pub fn plain(m: usize, n: usize, k: usize) -> Self {
        MatmulShape {
            batch: 1,
            m,
            n,
            k,
            lhs_batch_stride: m * k,
            rhs_batch_stride: k * n,
            trans_lhs: false,
            trans_rhs: false,
        }
    }

    /// Floating-point operations of the whole product (2·batch·m·n·k).
    pub fn flops(&self) -> u64 {
        2 * (self.batch * self.m * self.n * self.k) as u64
    }
}
