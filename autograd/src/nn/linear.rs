use cohort_tensor::{DType, Device};
use serde::Serialize;

use super::{ActivationKind, Features, Layout, Module, init_full, init_normal, per_member};
use crate::spec::{Fields, LayerCtx, Shape, SpecResult};
use crate::{Error, Param, Result, Tape};

/// `y = x W + b` per member: weight `[M, in, out]`, bias `[M, out]`. Acts on the last dimension.
#[derive(Debug)]
pub struct Linear {
    weight: Param,
    bias: Option<Param>,
}

impl Linear {
    /// Weights drawn from N(0, std) per member seed (`std = sqrt(gain / in)`), zero bias.
    ///
    /// # Errors
    /// When the tensors cannot be made on `dev`.
    pub fn new(
        inp: usize,
        out: usize,
        bias: bool,
        gain: f64,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<Linear> {
        Linear::salted(inp, out, bias, gain, seeds, 0, dtype, dev)
    }

    /// [`Linear::new`] drawing with `salt`, for layers holding several linear maps of one seed (attention's
    /// projections, a transformer's MLP): distinct salts keep their weights independent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn salted(
        inp: usize,
        out: usize,
        bias: bool,
        gain: f64,
        seeds: &[u64],
        salt: u64,
        dtype: DType,
        dev: &Device,
    ) -> Result<Linear> {
        let w = init_normal(
            &[inp, out],
            (gain / inp as f64).sqrt(),
            seeds,
            salt,
            dtype,
            dev,
        )?;
        let b = if bias {
            Some(Param::new(
                "bias",
                init_full(&[out], 0.0, seeds.len(), dtype, dev)?,
            ))
        } else {
            None
        };
        Ok(Linear {
            weight: Param::new("weight", w),
            bias: b,
        })
    }

    /// From existing parameters: weight `[M, in, out]`, bias `[M, out]`.
    pub fn from_params(weight: Param, bias: Option<Param>) -> Linear {
        Linear { weight, bias }
    }

    /// The weight `[M, in, out]`.
    pub fn weight(&self) -> &Param {
        &self.weight
    }
}

impl Linear {
    /// `x W + b`, then the ReLU when `relu` (fused with the bias where there is one).
    fn run(&self, tape: &Tape, x: Features, relu: bool) -> Result<Features> {
        let ws = self.weight.shape();
        let (m, inp, out) = (ws[0], ws[1], ws[2]);
        let s = x.var.shape().to_vec();
        let bad = |why: &str| Error::Shape {
            op: "linear",
            reason: format!("input {s:?} ({:?}) for weight {ws:?}: {why}", x.layout),
        };
        if s.last() != Some(&inp) {
            return Err(bad("the last dimension must equal the layer's input size"));
        }
        let (lead, flat) = match x.layout {
            Layout::Shared if s.len() >= 2 => (
                s[..s.len() - 1].to_vec(),
                x.var.reshape(&[s[..s.len() - 1].iter().product(), inp])?,
            ),
            Layout::Members if s.len() >= 3 && s[0] == m => {
                let n: usize = s[1..s.len() - 1].iter().product();
                (s[1..s.len() - 1].to_vec(), x.var.reshape(&[m, n, inp])?)
            }
            Layout::Packed => return Err(bad("convolution features must be flattened first")),
            _ => return Err(bad("expected [B, .., in] shared or [M, B, .., in]")),
        };
        let w = tape.param(&self.weight);
        // [M, N, out]
        let y = match &self.bias {
            Some(b) => flat.linear(&w, &per_member(&tape.param(b), 3)?, relu)?,
            None if relu => flat.matmul(&w)?.relu()?,
            None => flat.matmul(&w)?,
        };
        let mut shape = vec![m];
        shape.extend_from_slice(&lead);
        shape.push(out);
        Ok(x.keep_mask(y.reshape(&shape)?, Layout::Members))
    }
}

impl Module for Linear {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        self.run(tape, x, false)
    }

    fn forward_relu(&self, tape: &Tape, x: Features) -> Option<Result<Features>> {
        Some(self.run(tape, x, true))
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }

    fn kind(&self) -> &'static str {
        "linear"
    }
}

/// `{ linear = OUT, act = "relu", bias = true }`: a dense layer on the last dimension of its input.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinearSpec {
    /// Output features.
    pub out: usize,
    /// The activation after it.
    pub act: Option<ActivationKind>,
    /// Whether it adds a bias (default true).
    #[serde(skip_serializing_if = "crate::spec::is_true")]
    pub bias: bool,
}

impl LinearSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<LinearSpec> {
        Ok(LinearSpec {
            out: f.usize("linear", 1)?.unwrap_or(1),
            act: ActivationKind::read(f)?,
            bias: f.bool("bias")?.unwrap_or(true),
        })
    }

    /// The input's last dimension becomes `out`.
    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        match input {
            Shape::Dense(d) => {
                let mut d = d.clone();
                *d.last_mut().expect("a dense shape has a dimension") = self.out;
                Ok(Shape::Dense(d))
            }
            Shape::Image { .. } => Err(format!(
                "needs flat features, got {input}; add {{ flatten = true }} or {{ global_avgpool = true }} before it"
            )),
            Shape::Tokens(_) => Err(format!(
                "needs features, got {input}; add an {{ embedding = D, vocab = V }} first"
            )),
        }
    }

    pub(crate) fn params(&self, input: &Shape) -> usize {
        let inp = input.width();
        inp * self.out + if self.bias { self.out } else { 0 }
    }

    pub(crate) fn build(&self, input: &Shape, ctx: &LayerCtx<'_>) -> Result<Linear> {
        let gain = self.act.map_or(1.0, ActivationKind::gain);
        Linear::new(
            input.width(),
            self.out,
            self.bias,
            gain,
            &ctx.seeds,
            ctx.dtype,
            ctx.device,
        )
    }
}
