use serde::{Deserialize, Serialize};

use super::{Features, Module};
use crate::spec::{Fields, SpecResult};
use crate::{Param, Result, Tape};

/// An element-wise non-linearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationKind {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh approximation.
    Gelu,
    /// `tanh(x)`.
    Tanh,
    /// The logistic function `1 / (1 + e^-x)`.
    Sigmoid,
}

impl ActivationKind {
    /// The names a spec accepts, for messages.
    pub const ACCEPTED: &'static str = "\"relu\", \"gelu\", \"tanh\" or \"sigmoid\"";

    /// From its spec name (`relu`, `gelu`, `tanh`, `sigmoid`).
    pub fn parse(s: &str) -> Option<ActivationKind> {
        match s {
            "relu" => Some(ActivationKind::Relu),
            "gelu" => Some(ActivationKind::Gelu),
            "tanh" => Some(ActivationKind::Tanh),
            "sigmoid" => Some(ActivationKind::Sigmoid),
            _ => None,
        }
    }

    /// The optional `act` key of a layer table.
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<Option<ActivationKind>> {
        match f.str("act", Self::ACCEPTED)? {
            None => Ok(None),
            Some(a) => ActivationKind::parse(a).map(Some).ok_or_else(|| {
                f.error("act", format!("expected {}, found \"{a}\"", Self::ACCEPTED))
            }),
        }
    }

    /// Variance gain for the layer feeding it (He for ReLU-like, 1 otherwise).
    pub fn gain(self) -> f64 {
        match self {
            ActivationKind::Relu | ActivationKind::Gelu => 2.0,
            ActivationKind::Tanh | ActivationKind::Sigmoid => 1.0,
        }
    }
}

/// ReLU / GELU / Tanh as a layer (any layout).
#[derive(Debug)]
pub struct Activation(pub ActivationKind);

impl Module for Activation {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        let var = match self.0 {
            ActivationKind::Relu => x.var.relu()?,
            ActivationKind::Gelu => x.var.gelu()?,
            ActivationKind::Tanh => x.var.tanh()?,
            ActivationKind::Sigmoid => x.var.sigmoid()?,
        };
        Ok(x.keep_mask(var, x.layout))
    }

    fn takes_16bit(&self) -> bool {
        self.0 == ActivationKind::Relu
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        match self.0 {
            ActivationKind::Relu => "relu",
            ActivationKind::Gelu => "gelu",
            ActivationKind::Tanh => "tanh",
            ActivationKind::Sigmoid => "sigmoid",
        }
    }
}
