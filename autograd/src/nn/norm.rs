use cohort_tensor::{DType, Device};
use serde::Serialize;

use super::{Features, Layout, Module, init_full};
use crate::spec::{Fields, Shape, SpecResult};
use crate::{Error, Param, Result, Tape};

/// Layer normalization over the last dimension, per member: `weight`, `bias` `[M, D]`.
#[derive(Debug)]
pub struct LayerNorm {
    weight: Param,
    bias: Param,
    eps: f64,
}

impl LayerNorm {
    /// Ones and zeros for `members` members.
    ///
    /// # Errors
    /// When the tensors cannot be made on `dev`.
    pub fn new(
        dim: usize,
        eps: f64,
        members: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Param::new("weight", init_full(&[dim], 1.0, members, dtype, dev)?),
            bias: Param::new("bias", init_full(&[dim], 0.0, members, dtype, dev)?),
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let s = x.var.shape().to_vec();
        let (m, d) = (self.weight.shape()[0], self.weight.shape()[1]);
        let ok = match x.layout {
            Layout::Shared => s.len() >= 2 && s.last() == Some(&d),
            Layout::Members => s.len() >= 3 && s[0] == m && s.last() == Some(&d),
            Layout::Packed => false,
        };
        if !ok {
            return Err(Error::Shape {
                op: "layernorm",
                reason: format!(
                    "input {s:?} ({:?}) for {m} members of size {d} (flatten convolution features first)",
                    x.layout
                ),
            });
        }
        // A shared input meets each member's parameters as its own copy: [M, ..., D].
        let x_m = if x.layout == Layout::Shared {
            let one: Vec<usize> = [1].iter().chain(&s).copied().collect();
            let full: Vec<usize> = [m].iter().chain(&s).copied().collect();
            x.var.reshape(&one)?.broadcast_to(&full)?
        } else {
            x.var.clone()
        };
        let (g, b) = (tape.param(&self.weight), tape.param(&self.bias));
        Ok(x.keep_mask(x_m.layer_norm((&g, &b), self.eps)?, Layout::Members))
    }

    fn params(&self) -> Vec<(String, Param)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }

    fn kind(&self) -> &'static str {
        "layernorm"
    }
}

/// `{ layernorm = true, eps = 1e-5 }`: layer normalization over the last dimension.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerNormSpec {
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNormSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<LayerNormSpec> {
        f.flag("layernorm")?;
        Ok(LayerNormSpec {
            eps: f
                .f64_in("eps", 1e-12, 1.0, "an epsilon in (0, 1]")?
                .unwrap_or(1e-5),
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        match input {
            Shape::Dense(_) => Ok(input.clone()),
            _ => Err(format!(
                "needs features, got {input}; for images use {{ batchnorm = true }} or flatten first"
            )),
        }
    }
}
