use std::sync::Mutex;

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
    /// Tensors a lookup on a GPU needs, made at its first lookup on the weight's device, so a captured step uploads
    /// nothing.
    on_device: Mutex<Option<DeviceLookup>>,
}

/// What a GPU lookup of `M` members' tables `[M·V, D]` needs: member `i`'s offset `i · V` (`[M, 1]` i32), and a
/// `[V]` probe whose gather checks the ids against the vocabulary (an index error, reported at the device's next
/// read-back as every index op's is).
#[derive(Debug, Clone)]
struct DeviceLookup {
    offsets: Tensor,
    probe: Tensor,
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
            on_device: Mutex::new(None),
        })
    }

    /// The same table, marking positions whose id is `id` as padding in the output's mask.
    pub fn with_padding(mut self, id: usize) -> Embedding {
        self.padding = Some(i32::try_from(id).unwrap_or(i32::MAX));
        self
    }

    /// The padding mask of `ids`: 1 for a real token, 0 for the padding id, in the weight's dtype.
    fn mask(&self, ids: &Tensor) -> Result<Option<Tensor>> {
        let Some(pad) = self.padding else {
            return Ok(None);
        };
        let w = self.weight.value();
        // Computed in f32 (f64 on the CPU for an f64 table): the element-wise kernels have no 16-bit forms.
        let calc = if w.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let real = ids
            .to_dtype(calc)?
            .add_scalar(-f64::from(pad))?
            .abs()?
            .gt_scalar(0.5)?;
        Ok(Some(real.to_dtype(w.dtype())?))
    }

    /// The offsets and probe of a GPU lookup on `dev`, made at the first one there.
    fn device_lookup(&self, m: usize, v: usize, dev: &Device) -> Result<DeviceLookup> {
        let mut cached = self
            .on_device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = cached.as_ref().filter(|c| c.offsets.device() == *dev) {
            return Ok(c.clone());
        }
        let offsets: Vec<i32> = (0..m).map(|i| (i * v) as i32).collect();
        let made = DeviceLookup {
            offsets: Tensor::from_vec(offsets, &[m, 1], dev)?,
            probe: Tensor::zeros(&[v], DType::F32, dev)?,
        };
        *cached = Some(made.clone());
        Ok(made)
    }

    /// The rows for `x`'s ids and, with a padding id, their padding mask. The ids stay on their device: no read-back,
    /// so a step with a lookup can be captured as a CUDA graph.
    fn lookup(
        &self,
        tape: &Tape,
        x: &Features,
        op: &'static str,
    ) -> Result<(crate::Var, Option<Tensor>)> {
        let (idx, shape) = self.rows(x, op)?;
        let rows = self.stacked(tape)?.index_select(&idx, 0)?;
        Ok((rows.reshape(&shape)?, self.mask(x.var.value())?))
    }

    /// The members, the vocabulary and the width of the table.
    fn table(&self) -> (usize, usize, usize) {
        let ws = self.weight.shape();
        (ws[0], ws[1], ws[2])
    }

    /// The members' tables stacked as one, `[M·V, D]`, recorded on `tape`.
    fn stacked(&self, tape: &Tape) -> Result<crate::Var> {
        let (m, v, d) = self.table();
        tape.param(&self.weight).reshape(&[m * v, d])
    }

    /// The rows of the stacked tables `[M·V, D]` that the ids of `x` pick (checked against the vocabulary), and the
    /// shape of the picked rows: `[M, ..ids, D]`.
    fn rows(&self, x: &Features, op: &'static str) -> Result<(Tensor, Vec<usize>)> {
        let (m, v, d) = self.table();
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
        let dev = ids_t.device();
        // One gather for all members from the stacked tables `[M*V, D]`: member i's ids offset by i·V.
        let (groups, per) = match x.layout {
            Layout::Shared => (1, ids_t.elem_count()),
            _ => (m, ids_t.elem_count() / m),
        };
        let ids = ids_t.reshape(&[groups, per])?;
        let idx = if dev.is_cuda() {
            let c = self.device_lookup(m, v, &dev)?;
            c.probe.index_select(&ids.reshape(&[groups * per])?, 0)?;
            ids.add(&c.offsets)?.reshape(&[m * per])?
        } else {
            // On the CPU the ids are at hand: check them here, naming the id.
            let host = ids_t.to_vec::<i32>()?;
            if let Some(bad) = host.iter().find(|&&i| i < 0 || i as usize >= v) {
                return Err(Error::Shape {
                    op,
                    reason: format!("token id {bad} outside the vocabulary of {v}"),
                });
            }
            let flat = (0..m)
                .flat_map(|mi| {
                    let g = if groups == 1 { 0 } else { mi };
                    host[g * per..(g + 1) * per]
                        .iter()
                        .map(move |&i| i + (mi * v) as i32)
                })
                .collect();
            Tensor::from_vec(flat, &[m * per], &dev)?
        };
        let mut shape = vec![m];
        shape.extend_from_slice(if x.layout == Layout::Shared {
            &s[..]
        } else {
            &s[1..]
        });
        shape.push(d);
        Ok((idx, shape))
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
        let (idx, shape) = self.0.rows(&x, "embedding_bag")?; // rows [M, B, L, D]
        let &[m, b, l, d] = shape.as_slice() else {
            return Err(Error::Shape {
                op: "embedding_bag",
                reason: format!("needs bags [B, L] of ids, got rows {shape:?}"),
            });
        };
        let bags = self.0.stacked(tape)?.bag_mean(&idx, l)?; // [M·B, D]
        Ok(Features::members(bags.reshape(&[m, b, d])?))
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
