//! In what arithmetic a product (a matrix product or a convolution) runs on CUDA: the precision policy of
//! cohort-tensor as the kernels see it. Built with or without the `cuda` feature, since the convolution choices a
//! checkpoint carries name it.

use serde::{Deserialize, Serialize};

/// A product's operand type and multiply-adds; the sums are fp32 in every case.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Math {
    /// f32 operands, fp32 multiply-adds.
    #[default]
    Fp32,
    /// f32 operands on TF32 tensor cores (inputs rounded to 10-bit mantissas).
    Tf32,
    /// bfloat16 operands on tensor cores.
    Bf16,
    /// float16 operands on tensor cores.
    F16,
}

impl Math {
    /// Whether the operands are f32 (`Fp32`, `Tf32`) rather than a 16-bit type.
    #[must_use]
    pub fn f32_operands(self) -> bool {
        matches!(self, Math::Fp32 | Math::Tf32)
    }
}
