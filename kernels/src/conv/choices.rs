//! How each convolution geometry runs on a GPU, as plain data: the cuDNN algorithm timing (or the heuristics)
//! picked for it ([`ConvChoices`]). They travel in [`GemmChoices::convolutions`](crate::matmul::GemmChoices), so
//! that a run saves them with its product choices and a resumed run adopts both instead of timing afresh (timing
//! picks whichever candidate was fastest that moment, and different algorithms round differently). Built with or
//! without the `cuda` feature, so a checkpoint can carry them either way.

use serde::{Deserialize, Serialize};

use super::ConvParams;
use crate::Math;

/// One of the three passes of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvPass {
    /// The forward convolution, then a bias per output channel when `bias`.
    Forward {
        /// A bias is added.
        bias: bool,
    },
    /// The gradient of the input.
    BackwardData,
    /// The gradient of the weight.
    BackwardFilter,
}

/// How one pass of one geometry runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvDecision {
    /// On a cuDNN algorithm.
    Cudnn {
        /// Its `cudnnConvolutionFwdAlgo_t`, `cudnnConvolutionBwdDataAlgo_t` or `cudnnConvolutionBwdFilterAlgo_t`
        /// value, by pass.
        algo: u32,
        /// Workspace bytes it runs with.
        workspace: usize,
        /// The forward and its bias in one call (`cudnnConvolutionBiasActivationForward`), rather than the
        /// convolution and then `cudnnAddTensor`.
        fused_bias: bool,
        /// On channels-last (NHWC) operands, transposed in the workspace around the call; choices saved before
        /// this existed are NCHW.
        #[serde(default)]
        channels_last: bool,
        /// On f32 copies of 16-bit operands, converted in the workspace around the call; choices saved before
        /// this existed are in the policy's own type.
        #[serde(default)]
        in_f32: bool,
        /// The `cudnnMathType_t` it runs with; `None` in choices saved before this existed: the policy's own.
        #[serde(default)]
        math_type: Option<u32>,
    },
    /// cuDNN offers no algorithm that runs it: cohort's own kernels do.
    Own,
}

/// One pass of one geometry and how it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvChoice {
    /// The pass.
    pub pass: ConvPass,
    /// The geometry.
    pub params: ConvParams,
    /// Its arithmetic (absent in choices saved before precision policies: fp32).
    #[serde(default)]
    pub math: Math,
    /// How it runs.
    pub decision: ConvDecision,
}

/// Every convolution a device has decided on, for the cuDNN they were made with (the device is
/// [`GemmChoices::device`](crate::matmul::GemmChoices)); entries in a fixed order, so the same choices serialize
/// to the same bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvChoices {
    /// `cudnnGetVersion()` of the library that made them (0: cuDNN was not in use, and there are none).
    pub cudnn_version: u64,
    /// The decisions.
    pub entries: Vec<ConvChoice>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{GemmChoices, GemmDevice};

    fn device() -> GemmDevice {
        GemmDevice {
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            cublaslt_version: 130_100,
        }
    }

    #[test]
    fn conv_choices_survive_a_json_round_trip_inside_gemm_choices() {
        let params = ConvParams {
            batch: 7,
            c_in: 64,
            h: 13,
            w: 11,
            c_out: 128,
            kh: 3,
            kw: 3,
            stride: 2,
            padding: 1,
            groups: 1,
        };
        let choice = |pass, decision| ConvChoice {
            pass,
            params,
            math: if pass == ConvPass::BackwardData {
                Math::Bf16
            } else {
                Math::Fp32
            },
            decision,
        };
        let choices = GemmChoices {
            device: device(),
            entries: Vec::new(),
            convolutions: ConvChoices {
                cudnn_version: 91_400,
                entries: vec![
                    choice(
                        ConvPass::Forward { bias: true },
                        ConvDecision::Cudnn {
                            algo: 1,
                            workspace: 0,
                            fused_bias: true,
                            channels_last: false,
                            in_f32: false,
                            math_type: None,
                        },
                    ),
                    choice(
                        ConvPass::BackwardData,
                        ConvDecision::Cudnn {
                            algo: 5,
                            workspace: 3 << 30,
                            fused_bias: false,
                            channels_last: false,
                            in_f32: true,
                            math_type: Some(0),
                        },
                    ),
                    choice(ConvPass::BackwardFilter, ConvDecision::Own),
                ],
            },
        };
        let json = serde_json::to_string(&choices).unwrap();
        let back: GemmChoices = serde_json::from_str(&json).unwrap();
        assert_eq!(back, choices, "{json}");
        assert!(json.contains("\"forward\":{\"bias\":true}"), "{json}");
        assert!(json.contains("\"backward_filter\""), "{json}");
        assert!(json.contains("\"math\":\"bf16\""), "{json}");
        // A choice saved before precision policies has no math: it was made in fp32.
        let old = json.replace("\"math\":\"bf16\",", "");
        let back: GemmChoices = serde_json::from_str(&old).unwrap();
        assert_eq!(back.convolutions.entries[1].math, Math::Fp32, "{old}");
        // One saved before f32 staging: in the policy's own type.
        let old = json.replace("\"in_f32\":true,", "");
        let back: GemmChoices = serde_json::from_str(&old).unwrap();
        assert!(
            matches!(
                back.convolutions.entries[1].decision,
                ConvDecision::Cudnn { in_f32: false, .. }
            ),
            "{old}"
        );
    }

    #[test]
    fn gemm_choices_saved_before_convolutions_were_recorded_still_parse() {
        let old = r#"{"device":{"name":"NVIDIA H200","compute_capability":[9,0],"sm_count":132,
            "cublaslt_version":130100},"entries":[]}"#;
        let back: GemmChoices = serde_json::from_str(old).unwrap();
        assert_eq!(back.device, device());
        assert_eq!(back.convolutions, ConvChoices::default());
    }
}
