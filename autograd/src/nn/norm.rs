use cohort_tensor::{DType, Device};
use serde::Serialize;

use super::{Features, Layout, Module, init_full, per_member};
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
        let last = s.len() - 1;
        let mu = x.var.mean(last, true)?;
        let xc = x.var.sub(&mu)?;
        let var = xc.square()?.mean(last, true)?;
        let xhat = xc.div(&var.add_scalar(self.eps)?.sqrt()?)?;
        let rank = if x.layout == Layout::Shared {
            s.len() + 1
        } else {
            s.len()
        };
        let g = per_member(&tape.param(&self.weight), rank)?;
        let b = per_member(&tape.param(&self.bias), rank)?;
        Ok(x.keep_mask(xhat.mul(&g)?.add(&b)?, Layout::Members))
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
