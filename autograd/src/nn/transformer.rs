use cohort_tensor::{DType, Device};
use serde::Serialize;

use super::attention::{AttentionSpec, sequence_dims};
use super::{
    Activation, ActivationKind, Dropout, Features, LayerNorm, Linear, Module, MultiHeadAttention,
    mix,
};
use crate::spec::{Fields, LayerCtx, Shape, SpecResult};
use crate::{Param, Result, Tape, Var};

/// Salts of the MLP's initial weights and of the dropout masks (distinct from attention's and a lone Linear's).
const SALT_FC1: u64 = 0x6d6c_7031; // "mlp1"
const SALT_FC2: u64 = 0x6d6c_7032; // "mlp2"
const SALT_DROP_ATTN: u64 = 0x6472_6f61; // "droa"
const SALT_DROP_MLP: u64 = 0x6472_6f6d; // "drom"

/// A pre-norm transformer encoder block: `x + Attn(LN1(x))`, then `x + MLP(LN2(x))` with
/// `MLP = Linear(D, hidden) · GELU · Linear(hidden, D)`; dropout (while training) on the attention's and the MLP's
/// outputs before each sum.
///
/// Takes a sequence `[M, B, L, D]` (or shared `[B, L, D]`), gives `[M, B, L, D]` and keeps its padding mask.
/// Parameters: `norm1.{weight,bias}`, `attn.qkv.{weight,bias}`, `attn.out.{weight,bias}`, `norm2.{weight,bias}`,
/// `mlp.0.{weight,bias}`, `mlp.2.{weight,bias}` (the indices of PyTorch's `Sequential(Linear, GELU, Linear)`).
///
/// The dropout masks, as [`Dropout`]'s, are drawn once for all members (from the first member's seed), so a fused
/// model with dropout matches lone models only in evaluation or with a rate of 0.
#[derive(Debug)]
pub struct TransformerBlock {
    norm1: LayerNorm,
    attn: MultiHeadAttention,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    dropout: Option<[Dropout; 2]>,
}

impl TransformerBlock {
    /// A block of width `dim`, `heads` heads, an MLP of `hidden` units and dropout rate `dropout` (0: none);
    /// `causal` masks later positions.
    ///
    /// # Errors
    /// When `heads` does not divide `dim`, `dropout` is outside `[0, 1)`, or the tensors cannot be made on `dev`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dim: usize,
        heads: usize,
        hidden: usize,
        dropout: f64,
        causal: bool,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<TransformerBlock> {
        let m = seeds.len();
        let gelu = ActivationKind::Gelu.gain();
        let drop = |salt| Dropout::new(dropout, mix(seeds.first().copied().unwrap_or(0), salt));
        let dropout = if dropout > 0.0 {
            Some([drop(SALT_DROP_ATTN)?, drop(SALT_DROP_MLP)?])
        } else {
            drop(0)?; // refuses a rate outside [0, 1)
            None
        };
        let block = TransformerBlock {
            norm1: LayerNorm::new(dim, 1e-5, m, dtype, dev)?,
            attn: MultiHeadAttention::new(dim, heads, causal, seeds, dtype, dev)?,
            norm2: LayerNorm::new(dim, 1e-5, m, dtype, dev)?,
            fc1: Linear::salted(dim, hidden, true, gelu, seeds, SALT_FC1, dtype, dev)?,
            fc2: Linear::salted(hidden, dim, true, 1.0, seeds, SALT_FC2, dtype, dev)?,
            dropout,
        };
        for (name, p) in block.params() {
            p.set_name(name);
        }
        Ok(block)
    }

    /// `x + f` per member, with `f` dropped out by dropout `i` while training.
    fn add(&self, tape: &Tape, x: &Features, f: Features, i: usize) -> Result<Features> {
        let f = match &self.dropout {
            Some(d) => d[i].forward(tape, f)?,
            None => f,
        };
        let sum: Var = x.var.add(&f.var)?;
        Ok(Features::members(sum).with_mask(x.mask.clone()))
    }
}

impl Module for TransformerBlock {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let ws = self.fc1.weight().shape();
        sequence_dims(&x, ws[0], ws[1])?;
        let a = self
            .attn
            .forward(tape, self.norm1.forward(tape, x.clone())?)?;
        let x = self.add(tape, &x, a, 0)?;
        let h = self
            .fc1
            .forward(tape, self.norm2.forward(tape, x.clone())?)?;
        let h = Activation(ActivationKind::Gelu).forward(tape, h)?;
        let f = self.fc2.forward(tape, h)?;
        self.add(tape, &x, f, 1)
    }

    fn params(&self) -> Vec<(String, Param)> {
        let parts: [(&str, &dyn Module); 5] = [
            ("norm1", &self.norm1),
            ("attn", &self.attn),
            ("norm2", &self.norm2),
            ("mlp.0", &self.fc1),
            ("mlp.2", &self.fc2),
        ];
        parts
            .into_iter()
            .flat_map(|(prefix, l)| {
                l.params()
                    .into_iter()
                    .map(move |(n, p)| (format!("{prefix}.{n}"), p))
            })
            .collect()
    }

    fn set_masks_drawn(&self, n: u64) {
        self.dropout.iter().flatten().for_each(|d| d.set_calls(n));
    }

    fn kind(&self) -> &'static str {
        "transformer"
    }
}

/// `{ transformer = HEADS, hidden = 4 * D, dropout = 0.0, causal = false }`: a pre-norm encoder block over a
/// sequence `[L, D]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransformerSpec {
    /// Attention heads (dividing the width).
    pub heads: usize,
    /// Units of the MLP; `None`: four times the width.
    pub hidden: Option<usize>,
    /// Dropout rate on the attention's and the MLP's outputs.
    pub dropout: f64,
    /// Whether position `t` attends only to positions `<= t`.
    pub causal: bool,
}

impl TransformerSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<TransformerSpec> {
        let dropout = f.f64("dropout")?.unwrap_or(0.0);
        if !(0.0..1.0).contains(&dropout) {
            return Err(f.error(
                "dropout",
                format!("expected a rate in [0, 1), found {dropout}"),
            ));
        }
        Ok(TransformerSpec {
            heads: f.usize("transformer", 1)?.unwrap_or(1),
            hidden: f.usize("hidden", 1)?,
            dropout,
            causal: f.bool("causal")?.unwrap_or(false),
        })
    }

    fn hidden(&self, width: usize) -> usize {
        self.hidden.unwrap_or(4 * width)
    }

    /// Attention, two layer norms and the MLP.
    pub(crate) fn params(&self, width: usize) -> usize {
        let h = self.hidden(width);
        AttentionSpec::params(width) + 4 * width + width * h + h + h * width + width
    }

    /// The attention's scores and the MLP's hidden values beside the block's sums and norms.
    pub(crate) fn scratch(&self, input: &Shape) -> usize {
        let (l, d) = (input.dims()[0], input.width());
        AttentionSpec::scratch(self.heads, input) + 2 * l * self.hidden(d) + 6 * l * d
    }

    pub(crate) fn build(&self, input: &Shape, ctx: &LayerCtx<'_>) -> Result<TransformerBlock> {
        let d = input.width();
        TransformerBlock::new(
            d,
            self.heads,
            self.hidden(d),
            self.dropout,
            self.causal,
            &ctx.seeds,
            ctx.dtype,
            ctx.device,
        )
    }
}
