use cohort_tensor::{DType, Device, Tensor};
use serde::Serialize;

use super::{Features, Layout, Linear, Module};
use crate::spec::{Fields, Shape, SpecResult};
use crate::{Error, Param, Result, Tape};

/// Salts of the two projections' initial weights (distinct from a lone Linear's 0).
const SALT_QKV: u64 = 0x6174_7471; // "attq"
const SALT_OUT: u64 = 0x6174_746f; // "atto"

/// Multi-head self-attention per member: a fused query/key/value projection `qkv` (weight `[M, D, 3D]`, bias
/// `[M, 3D]`), scaled dot products per head, softmax over the keys, and an output projection `out` (`[M, D, D]`,
/// `[M, D]`).
///
/// Takes a sequence `[M, B, L, D]` (or shared `[B, L, D]`) and gives `[M, B, L, D]`, keeping its padding mask.
/// Padded keys ([`Features::mask`]) get no attention; with `causal`, position `t` attends to positions `<= t`
/// only; a position that may attend to no key gives zeros. The attention itself is one fused kernel
/// ([`Var::attention`](crate::Var::attention)) over every member, example and head, with memory linear in the sequence length.
#[derive(Debug)]
pub struct MultiHeadAttention {
    qkv: Linear,
    out: Linear,
    heads: usize,
    causal: bool,
}

impl MultiHeadAttention {
    /// `heads` heads over width `dim`; projections drawn from N(0, 1/dim) per member seed, zero biases.
    ///
    /// # Errors
    /// When `heads` does not divide `dim`, or the tensors cannot be made on `dev`.
    pub fn new(
        dim: usize,
        heads: usize,
        causal: bool,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<MultiHeadAttention> {
        if heads == 0 || dim % heads != 0 {
            return Err(Error::Shape {
                op: "attention",
                reason: format!(
                    "{heads} heads do not divide the width {dim}: pick a head count that divides it"
                ),
            });
        }
        let attn = MultiHeadAttention {
            qkv: Linear::salted(dim, 3 * dim, true, 1.0, seeds, SALT_QKV, dtype, dev)?,
            out: Linear::salted(dim, dim, true, 1.0, seeds, SALT_OUT, dtype, dev)?,
            heads,
            causal,
        };
        for (name, p) in attn.params() {
            p.set_name(name);
        }
        Ok(attn)
    }

    /// The key-padding mask as the fused kernel takes it, `[R, L]` in `dtype` with `R` the batch (a mask shared
    /// by the members) or members × batch; `None` when every key is one.
    fn keys(&self, x: &Features, l: usize, b: usize, dtype: DType) -> Result<Option<Tensor>> {
        let Some(k) = x.member_mask(dtype)? else {
            return Ok(None);
        };
        let ks = k.shape().to_vec();
        let m = self.qkv.weight().shape()[0];
        if ks[1..] != [b, l] || (ks[0] != 1 && ks[0] != m) {
            return Err(Error::Shape {
                op: "attention",
                reason: format!("padding mask {ks:?} for a sequence {:?}", x.var.shape()),
            });
        }
        Ok(Some(k.reshape(&[ks[0] * b, l])?))
    }
}

/// `(B, L)` of a sequence `[B, L, d]` (shared) or `[m, B, L, d]`; anything else is refused with a hint.
pub(crate) fn sequence_dims(x: &Features, m: usize, d: usize) -> Result<(usize, usize)> {
    let s = x.var.shape();
    match x.layout {
        Layout::Shared if s.len() == 3 && s[2] == d => Ok((s[0], s[1])),
        Layout::Members if s.len() == 4 && s[0] == m && s[3] == d => Ok((s[1], s[2])),
        _ => Err(Error::Shape {
            op: "attention",
            reason: format!(
                "input {s:?} ({:?}): attention needs a sequence [B, L, {d}] (or [{m}, B, L, {d}]); put an \
                 embedding or a `sequence` layer before it",
                x.layout
            ),
        }),
    }
}

impl Module for MultiHeadAttention {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let ws = self.qkv.weight().shape();
        let (m, d) = (ws[0], ws[1]);
        let (b, l) = sequence_dims(&x, m, d)?;
        let dt = x.var.dtype();
        // The fused kernel computes in f32 (or f64); 16-bit models pass through it in f32.
        let compute = if dt == DType::F64 { dt } else { DType::F32 };
        let keys = self.keys(&x, l, b, compute)?;
        let mask = x.mask.clone();
        let qkv = self.qkv.forward(tape, x)?.var.reshape(&[m * b, l, 3 * d])?;
        let ctx = qkv
            .to_dtype(compute)?
            .attention(self.heads, self.causal, keys.as_ref())?
            .to_dtype(dt)?
            .reshape(&[m, b, l, d])?;
        let y = self.out.forward(tape, Features::members(ctx))?.var;
        Ok(Features::members(y).with_mask(mask))
    }

    fn params(&self) -> Vec<(String, Param)> {
        let qkv = self
            .qkv
            .params()
            .into_iter()
            .map(|(n, p)| (format!("qkv.{n}"), p));
        let out = self
            .out
            .params()
            .into_iter()
            .map(|(n, p)| (format!("out.{n}"), p));
        qkv.chain(out).collect()
    }

    fn kind(&self) -> &'static str {
        "attention"
    }
}

/// `{ attention = HEADS, causal = false }`: multi-head self-attention over a sequence `[L, D]`, `HEADS` dividing `D`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttentionSpec {
    /// Heads.
    pub heads: usize,
    /// Whether position `t` attends only to positions `<= t`.
    pub causal: bool,
}

impl AttentionSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<AttentionSpec> {
        Ok(AttentionSpec {
            heads: f.usize("attention", 1)?.unwrap_or(1),
            causal: f.bool("causal")?.unwrap_or(false),
        })
    }

    /// A sequence `[L, D]` whose width `D` the heads divide; the shape is kept.
    pub(crate) fn output(heads: usize, input: &Shape) -> std::result::Result<Shape, String> {
        match input {
            Shape::Dense(d) if d.len() == 2 => {
                if d[1] % heads != 0 {
                    return Err(format!(
                        "{heads} heads do not divide the width {}: pick a head count that divides it",
                        d[1]
                    ));
                }
                Ok(input.clone())
            }
            _ => Err(format!(
                "attention needs a sequence [L, D], got {input}; add an embedding or {{ sequence = L }} first"
            )),
        }
    }

    /// The projections: `4 D^2 + 4 D`.
    pub(crate) fn params(width: usize) -> usize {
        4 * width * width + 4 * width
    }

    /// Each head's scores and their softmax, `[L, L]` twice.
    pub(crate) fn scratch(heads: usize, input: &Shape) -> usize {
        let l = input.dims()[0];
        2 * heads * l * l
    }
}
