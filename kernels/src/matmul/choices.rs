//! How each f32 product geometry runs on a GPU, as plain data: what the cuBLASLt tuner decided
//! ([`GemmChoices`]), so that a run can save its choices and a resumed run can adopt them instead of timing afresh
//! (timing picks whichever candidate was fastest that moment, and different algorithms round differently). Built
//! with or without the `cuda` feature, so a checkpoint can carry them either way.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::conv::ConvChoices;

/// One column-major product `D = op(A)·op(B)` (batched with strides), as cuBLAS sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Geometry {
    /// A is stored transposed.
    pub trans_a: bool,
    /// B is stored transposed.
    pub trans_b: bool,
    /// Rows of D.
    pub m: i32,
    /// Columns of D.
    pub n: i32,
    /// The contracted dimension.
    pub k: i32,
    /// Leading dimension of A.
    pub lda: i32,
    /// Leading dimension of B.
    pub ldb: i32,
    /// Leading dimension of D.
    pub ldc: i32,
    /// Products.
    pub batch: i32,
    /// Elements between consecutive A matrices.
    pub stride_a: i64,
    /// Elements between consecutive B matrices.
    pub stride_b: i64,
    /// Elements between consecutive D matrices.
    pub stride_c: i64,
}

/// What cuBLASLt does besides each product, with a vector per batch entry `stride` elements apart (0: one for
/// all): add a bias per row of D (an output feature of the row-major product), then a ReLU when asked; or write
/// the sums of A over the contracted dimension.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Epilogue {
    /// The product alone.
    #[default]
    None,
    /// A bias added to each row of D, then a ReLU when `relu`.
    Bias {
        /// Elements between the biases of consecutive batch entries.
        stride: i64,
        /// A ReLU after the bias.
        relu: bool,
    },
    /// The sums of A over the contracted dimension written beside the product.
    SumsOfA {
        /// Elements between the sums of consecutive batch entries.
        stride: i64,
    },
}

#[cfg(feature = "cuda")]
impl Epilogue {
    /// Elements between the vectors of consecutive batch entries.
    pub(crate) fn stride(&self) -> i64 {
        match self {
            Epilogue::None => 0,
            Epilogue::Bias { stride, .. } | Epilogue::SumsOfA { stride } => *stride,
        }
    }

    /// The suffix of a product's label in profiles and tuning reports.
    pub(crate) fn tag(&self) -> &'static str {
        match self {
            Epilogue::None => "",
            Epilogue::Bias { relu: false, .. } => "+bias",
            Epilogue::Bias { relu: true, .. } => "+bias+relu",
            Epilogue::SumsOfA { .. } => "+colsums",
        }
    }
}

/// How one product runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmDecision {
    /// On a cuBLASLt algorithm: the words of its `cublasLtMatmulAlgo_t` and the workspace bytes it runs with.
    Algorithm {
        /// `cublasLtMatmulAlgo_t::data`.
        algo: [u64; 8],
        /// Workspace bytes.
        workspace: usize,
    },
    /// As two products, D's columns before `column` and the rest (each half has an entry of its own).
    Split {
        /// The first column of the second product.
        column: i32,
    },
    /// A thread per output element.
    Thin,
    /// cuBLASLt offers no algorithm for it: it runs on cuBLAS.
    Refused,
}

/// One product geometry and how it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmChoice {
    /// The product.
    pub geometry: Geometry,
    /// What runs with it.
    pub epilogue: Epilogue,
    /// Alignment in bytes (a power of two, at most 256) of every batch of A, B and D: the heuristics offer
    /// algorithms by alignment.
    pub align: [u32; 3],
    /// How it runs.
    pub decision: GemmDecision,
}

/// What choices are valid for: an algorithm is a cuBLASLt build's description of a kernel for one architecture,
/// and its results are the same bits only on the same number of multiprocessors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmDevice {
    /// The device's name, as the driver reports it.
    pub name: String,
    /// Its compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Its streaming multiprocessors.
    pub sm_count: u32,
    /// `cublasLtGetVersion()` (0: cuBLASLt was not found).
    pub cublaslt_version: u64,
}

impl fmt::Display for GemmDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "{} (compute capability {major}.{minor}, {} SMs) with cuBLASLt {}",
            self.name, self.sm_count, self.cublaslt_version
        )
    }
}

/// Every f32 product geometry a device has decided on, for the device they were made on, and its convolutions'
/// cuDNN algorithms; entries in a fixed order, so the same choices serialize to the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmChoices {
    /// What they are valid for.
    pub device: GemmDevice,
    /// The decisions.
    pub entries: Vec<GemmChoice>,
    /// How each convolution runs (absent from choices saved before convolutions were recorded: none).
    #[serde(default)]
    pub convolutions: ConvChoices,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_choices_survive_a_json_round_trip() {
        let g = Geometry {
            trans_a: true,
            trans_b: false,
            m: 272,
            n: 64,
            k: 96,
            lda: 96,
            ldb: 96,
            ldc: 272,
            batch: 3,
            stride_a: 0,
            stride_b: 96 * 64,
            stride_c: 272 * 64,
        };
        let choice = |epilogue, decision| GemmChoice {
            geometry: g,
            epilogue,
            align: [256, 16, 4],
            decision,
        };
        let choices = GemmChoices {
            device: GemmDevice {
                name: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                sm_count: 132,
                cublaslt_version: 130_100,
            },
            entries: vec![
                choice(
                    Epilogue::None,
                    GemmDecision::Algorithm {
                        // Words above 2^53 must come back exactly (JSON numbers are often read as f64).
                        algo: [u64::MAX, 1 << 60, 3, 0, 7, 1 << 33, 0, 42],
                        workspace: 8 << 20,
                    },
                ),
                choice(
                    Epilogue::Bias {
                        stride: 16,
                        relu: true,
                    },
                    GemmDecision::Split { column: 256 },
                ),
                choice(Epilogue::SumsOfA { stride: 0 }, GemmDecision::Thin),
                choice(Epilogue::None, GemmDecision::Refused),
            ],
            convolutions: ConvChoices::default(),
        };
        let json = serde_json::to_string(&choices).unwrap();
        let back: GemmChoices = serde_json::from_str(&json).unwrap();
        assert_eq!(back, choices, "{json}");
        assert!(json.contains("\"split\":{\"column\":256}"), "{json}");
        assert_eq!(
            choices.device.to_string(),
            "NVIDIA H200 (compute capability 9.0, 132 SMs) with cuBLASLt 130100"
        );
    }
}
