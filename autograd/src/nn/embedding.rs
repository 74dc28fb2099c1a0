use cohort_tensor::{DType, Device, Tensor};
use serde::Serialize;

use super::{Features, Layout, Module, init_normal};
use crate::spec::{Fields, LayerCtx, Shape, SpecResult};
use crate::{Error, Param, Result, Tape};

/// A lookup table per member: weight `[M, V, D]`; i32 token ids `[B, ..]` (shared) or `[M, B, ..]` give
/// `[M, B, .., D]`.
///
/// With a padding id ([`Embedding::with_padding`]) the output carries a padding mask of the ids' shape (0 where
/// the id is the padding id), which attention and a mean [`SequencePool`](super::SequencePool) honour. The padding
/// id's row is an ordinary row: only the mask keeps padded positions from reaching real ones. Without a padding
/// id, a mask that came with the ids is passed on.
#[derive(Debug)]
pub struct Embedding {
    weight: Param,
    padding: Option<i32>,
}

impl Embedding {
    /// N(0, 1) rows per member seed.
    ///
    /// # Errors
    /// When the table cannot be made on `dev`.
    pub fn new(
        vocab: usize,
        dim: usize,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<Embedding> {
        Ok(Embedding {
            weight: Param::new(
                "weight",
                init_normal(&[vocab, dim], 1.0, seeds, 0, dtype, dev)?,
            ),
            padding: None,
        })
    }

    /// The same table, marking positions whose id is `id` as padding in the output's mask.
    pub fn with_padding(mut self, id: usize) -> Embedding {
        self.padding = Some(i32::try_from(id).unwrap_or(i32::MAX));
        self
    }

    /// The padding mask of host ids `ids` (shape `shape`): 1 for a real token, 0 for the padding id.
    fn mask(&self, ids: &[i32], shape: &[usize]) -> Result<Option<Tensor>> {
        let Some(pad) = self.padding else {
            return Ok(None);
        };
        let w = self.weight.value();
        let m: Vec<f64> = ids.iter().map(|&i| f64::from(u8::from(i != pad))).collect();
        // Cast on the host: f64 does not exist on CUDA.
        let mask = Tensor::from_vec(m, shape, &Device::Cpu)?.to_dtype(w.dtype())?;
        Ok(Some(mask.to_device(&w.device())?))
    }

    /// The rows for `x`'s ids and, with a padding id, their padding mask.
    fn lookup(
        &self,
        tape: &Tape,
        x: &Features,
        op: &'static str,
    ) -> Result<(crate::Var, Option<Tensor>)> {
        let ws = self.weight.shape();
        let (m, v, d) = (ws[0], ws[1], ws[2]);
        let ids_t = x.var.value();
        let s = ids_t.shape().to_vec();
        if ids_t.dtype() != DType::I32
            || s.is_empty()
            || (x.layout == Layout::Members && s[0] != m)
            || x.layout == Layout::Packed
        {
            return Err(Error::Shape {
                op,
                reason: format!(
                    "needs i32 token ids [B, ..] or [{m}, B, ..], got {s:?} {} ({:?})",
                    ids_t.dtype(),
                    x.layout
                ),
            });
        }
        let ids = ids_t.to_device(&Device::Cpu)?.to_vec::<i32>()?;
        if let Some(bad) = ids.iter().find(|&&i| i < 0 || i as usize >= v) {
            return Err(Error::Shape {
                op,
                reason: format!("token id {bad} outside the vocabulary of {v}"),
            });
        }
        // Offsets into the members' stacked tables `[M*V, D]`: one gather for all members.
        let per = if x.layout == Layout::Shared {
            ids.len()
        } else {
            ids.len() / m
        };
        let mut flat = Vec::with_capacity(per * m);
        for mi in 0..m {
            let src = if x.layout == Layout::Shared {
                &ids[..]
            } else {
                &ids[mi * per..(mi + 1) * per]
            };
            flat.extend(src.iter().map(|&i| i + (mi * v) as i32));
        }
        let idx = Tensor::from_vec(flat, &[per * m], &ids_t.device())?;
        let rows = tape
            .param(&self.weight)
            .reshape(&[m * v, d])?
            .index_select(&idx, 0)?;
        let mut shape = vec![m];
        shape.extend_from_slice(if x.layout == Layout::Shared {
            &s[..]
        } else {
            &s[1..]
        });
        shape.push(d);
        Ok((rows.reshape(&shape)?, self.mask(&ids, &s)?))
    }
}

impl Module for Embedding {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        // Without a padding id, a mask given with the ids still holds for their rows.
        let (rows, mask) = self.lookup(tape, &x, "embedding")?;
        Ok(Features::members(rows).with_mask(mask.or(x.mask)))
    }

    fn params(&self) -> Vec<(String, Param)> {
        vec![("weight".into(), self.weight.clone())]
    }

    fn kind(&self) -> &'static str {
        "embedding"
    }
}

/// The mean of the embeddings of each bag: ids `[B, L]` (or `[M, B, L]`) give `[M, B, D]`.
#[derive(Debug)]
pub struct EmbeddingBag(Embedding);

impl EmbeddingBag {
    /// N(0, 1) rows per member seed.
    ///
    /// # Errors
    /// When the table cannot be made on `dev`.
    pub fn new(
        vocab: usize,
        dim: usize,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<EmbeddingBag> {
        Ok(EmbeddingBag(Embedding::new(vocab, dim, seeds, dtype, dev)?))
    }
}

impl Module for EmbeddingBag {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let (rows, _) = self.0.lookup(tape, &x, "embedding_bag")?; // [M, B, L, D]
        let r = rows.shape().len();
        if r != 4 {
            return Err(Error::Shape {
                op: "embedding_bag",
                reason: format!("needs bags [B, L] of ids, got rows {:?}", rows.shape()),
            });
        }
        Ok(Features::members(rows.mean(2, false)?))
    }

    fn params(&self) -> Vec<(String, Param)> {
        self.0.params()
    }

    fn kind(&self) -> &'static str {
        "embedding_bag"
    }
}

/// `{ embedding = D, vocab = V }` (a vector per token id) or `{ embedding_bag = D, vocab = V }` (the mean of a bag's
/// vectors); the first layer of a model whose input is i32 token ids.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EmbeddingSpec {
    /// Width of each vector.
    pub dim: usize,
    /// Number of token ids.
    pub vocab: usize,
    /// The id of padding: positions holding it are masked in attention and sequence means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub padding_id: Option<usize>,
}

impl EmbeddingSpec {
    pub(crate) fn read(f: &Fields<'_>, key: &str) -> SpecResult<EmbeddingSpec> {
        let vocab = f.usize("vocab", 1)?.ok_or_else(|| {
            f.error(
                "vocab",
                "missing: an embedding needs `vocab = <number of token ids>`",
            )
        })?;
        let padding_id = f.usize("padding_id", 0)?;
        if let Some(p) = padding_id.filter(|&p| p >= vocab) {
            return Err(f.error(
                "padding_id",
                format!("{p} is not an id of the vocabulary of {vocab}"),
            ));
        }
        Ok(EmbeddingSpec {
            dim: f.usize(key, 1)?.unwrap_or(1),
            vocab,
            padding_id,
        })
    }

    pub(crate) fn build(&self, ctx: &LayerCtx<'_>) -> Result<Embedding> {
        let e = Embedding::new(self.vocab, self.dim, &ctx.seeds, ctx.dtype, ctx.device)?;
        Ok(match self.padding_id {
            Some(id) => e.with_padding(id),
            None => e,
        })
    }

    /// Token ids `[..]` gain a last dimension `dim`; a bag (`bag`) of ids `[L]` becomes one vector.
    pub(crate) fn output(&self, input: &Shape, bag: bool) -> std::result::Result<Shape, String> {
        let Shape::Tokens(t) = input else {
            return Err(format!(
                "needs i32 token ids, got {input}: an embedding must be the model's first layer"
            ));
        };
        if bag {
            if t.len() != 1 {
                return Err(format!("needs bags of ids [L] per example, got {input}"));
            }
            return Ok(Shape::Dense(vec![self.dim]));
        }
        let mut d = t.clone();
        d.push(self.dim);
        Ok(Shape::Dense(d))
    }

    pub(crate) fn params(&self) -> usize {
        self.vocab * self.dim
    }
}
