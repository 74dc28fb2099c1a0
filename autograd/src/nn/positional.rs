use cohort_tensor::{DType, Device};
use serde::Serialize;

use super::{Features, Layout, Module, init_normal};
use crate::spec::{Fields, Shape, SpecResult};
use crate::{Error, Param, Result, Tape};

/// Salt of the initial positions (distinct from an embedding table's 0).
const SALT: u64 = 0x706f_7369; // "posi"

/// Learned positions per member: weight `[M, max_len, D]`, the first `L` rows added to a sequence `[M, B, L, D]`
/// (or shared `[B, L, D]`, which becomes per member), keeping its padding mask.
#[derive(Debug)]
pub struct PositionalEmbedding {
    weight: Param,
}

impl PositionalEmbedding {
    /// N(0, 0.02) rows per member seed (GPT-2's initialization) for sequences of up to `max_len` positions.
    ///
    /// # Errors
    /// When the table cannot be made on `dev`.
    pub fn new(
        max_len: usize,
        dim: usize,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<PositionalEmbedding> {
        Ok(PositionalEmbedding {
            weight: Param::new(
                "weight",
                init_normal(&[max_len, dim], 0.02, seeds, SALT, dtype, dev)?,
            ),
        })
    }
}

impl Module for PositionalEmbedding {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let ws = self.weight.shape();
        let (m, max_len, d) = (ws[0], ws[1], ws[2]);
        let s = x.var.shape().to_vec();
        let l = match x.layout {
            Layout::Shared if s.len() == 3 && s[2] == d => s[1],
            Layout::Members if s.len() == 4 && s[0] == m && s[3] == d => s[2],
            _ => {
                return Err(Error::Shape {
                    op: "positional",
                    reason: format!(
                        "input {s:?} ({:?}): needs a sequence [B, L, {d}] or [{m}, B, L, {d}]",
                        x.layout
                    ),
                });
            }
        };
        if l > max_len {
            return Err(Error::Shape {
                op: "positional",
                reason: format!(
                    "sequence length {l} exceeds max_len {max_len}: make the table longer or the sequences shorter"
                ),
            });
        }
        let pos = tape
            .param(&self.weight)
            .narrow(1, 0, l)?
            .reshape(&[m, 1, l, d])?;
        Ok(x.keep_mask(x.var.add(&pos)?, Layout::Members))
    }

    fn params(&self) -> Vec<(String, Param)> {
        vec![("weight".into(), self.weight.clone())]
    }

    fn kind(&self) -> &'static str {
        "positional"
    }
}

/// `{ positional = MAX_LEN }`: learned positions added to a sequence of at most `MAX_LEN` positions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PositionalSpec {
    /// The longest sequence.
    pub max_len: usize,
}

impl PositionalSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<PositionalSpec> {
        Ok(PositionalSpec {
            max_len: f.usize("positional", 1)?.unwrap_or(1),
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        match input {
            Shape::Dense(d) if d.len() == 2 && d[0] <= self.max_len => Ok(input.clone()),
            Shape::Dense(d) if d.len() == 2 => Err(format!(
                "a sequence of {} positions is longer than the {} it has positions for: raise `positional`",
                d[0], self.max_len
            )),
            _ => Err(format!(
                "needs a sequence [L, D], got {input}; add an embedding or {{ sequence = L }} first"
            )),
        }
    }
}
