//! Fused scaled dot-product self-attention ([`Tensor::attention`]) and its gradient: one kernel call instead of
//! scores, mask, softmax and two batched products, with memory linear in the sequence length.

use cohort_kernels::attention::AttentionShape;

use crate::backend::Attention;
use crate::storage::{Storage, on_cpu, on_cuda};
use crate::{Error, Result, Tensor};

/// Which keys each query of [`Tensor::attention`] sees.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionMask<'a> {
    /// Query `i` sees keys `j <= i` only.
    pub causal: bool,
    /// Key padding `[R, L]` in the input's dtype (1 a key, 0 padding): sequence `s` takes row `s % R`, so `R`
    /// may be the batch (shared by fused members) or every sequence. `None`: every key is one.
    pub keys: Option<&'a Tensor>,
}

impl Tensor {
    /// Self-attention of `self`, a packed projection `[n, L, 3·D]` (query, key and value of each position, each
    /// `heads` heads of width `d = D / heads`): `softmax(q·kᵀ / √d) · v` per sequence and head, over the keys
    /// `mask` lets each query see. Returns the output `[n, L, D]` (heads side by side, as an output projection
    /// takes it) and the log-sum-exp of each query's scores `[n, heads, L]`, which the gradient needs. A query
    /// that sees no key (all its keys padding) gives zeros.
    ///
    /// f32 and f64 on the CPU, f32 on CUDA (heads up to 256 wide).
    ///
    /// # Errors
    /// A shape that is not `[n, L, 3·D]` with `heads` dividing `D`, a mask that does not fit, a dtype or device
    /// mismatch, out of memory.
    pub fn attention(&self, heads: usize, mask: AttentionMask<'_>) -> Result<(Tensor, Tensor)> {
        const OP: &str = "attention";
        let shape = self.attention_shape(OP, heads, mask)?;
        let ts: Vec<&Tensor> = [self].into_iter().chain(mask.keys).collect();
        let (out, lse) = Tensor::read_all(&ts, |s| -> Result<_> {
            if let Some(c) = on_cpu(s) {
                let (o, l) = c[0].attention(c.get(1).copied(), &shape)?;
                return Ok((Storage::Cpu(o), Storage::Cpu(l)));
            }
            let g =
                on_cuda(s).ok_or_else(|| self.device_mismatch(OP, mask.keys.unwrap_or(self)))?;
            let (o, l) = g[0].attention(g.get(1).copied(), &shape)?;
            Ok((Storage::Cuda(o), Storage::Cuda(l)))
        })?;
        let (n, l, d) = (shape.seqs, shape.len, shape.width());
        Ok((
            Tensor::from_storage(out, vec![n, l, d]),
            Tensor::from_storage(lse, vec![n, heads, l]),
        ))
    }

    /// The gradient of `self`'s [`attention`](Tensor::attention) given that call's output `out`, log-sum-exps
    /// `lse`, and the output's gradient `dout`: `[n, L, 3·D]`, like `self`.
    ///
    /// # Errors
    /// As [`attention`](Tensor::attention), and `out`, `lse` or `dout` not shaped as it made them.
    pub fn attention_backward(
        &self,
        heads: usize,
        mask: AttentionMask<'_>,
        (out, lse): (&Tensor, &Tensor),
        dout: &Tensor,
    ) -> Result<Tensor> {
        const OP: &str = "attention_backward";
        let shape = self.attention_shape(OP, heads, mask)?;
        let (n, l, d) = (shape.seqs, shape.len, shape.width());
        for (t, want) in [
            (out, vec![n, l, d]),
            (dout, vec![n, l, d]),
            (lse, vec![n, heads, l]),
        ] {
            self.same_device(OP, t)?;
            self.same_dtype(OP, t)?;
            if t.shape != want {
                return Err(Error::InvalidShape {
                    op: OP,
                    shape: t.shape.clone(),
                    reason: format!(
                        "expected {want:?}, as the forward pass of {:?} made it",
                        self.shape
                    ),
                });
            }
        }
        let ts: Vec<&Tensor> = [self, out, lse, dout]
            .into_iter()
            .chain(mask.keys)
            .collect();
        let grad = Tensor::read_all(&ts, |s| -> Result<_> {
            if let Some(c) = on_cpu(s) {
                let saved = (c[1], c[2], c[3]);
                return Ok(Storage::Cpu(c[0].attention_backward(
                    c.get(4).copied(),
                    saved,
                    &shape,
                )?));
            }
            let g = on_cuda(s).ok_or_else(|| self.device_mismatch(OP, out))?;
            let saved = (g[1], g[2], g[3]);
            Ok(Storage::Cuda(g[0].attention_backward(
                g.get(4).copied(),
                saved,
                &shape,
            )?))
        })?;
        Ok(Tensor::from_storage(grad, self.shape.clone()))
    }

    /// The kernels' geometry for `self` as a packed `[n, L, 3·D]` projection of `heads` heads, with `mask`
    /// checked against it.
    fn attention_shape(
        &self,
        op: &'static str,
        heads: usize,
        mask: AttentionMask<'_>,
    ) -> Result<AttentionShape> {
        self.require_float(op)?;
        let bad = |reason: String| Error::InvalidShape {
            op,
            shape: self.shape.clone(),
            reason,
        };
        let &[n, l, w3] = &self.shape[..] else {
            return Err(bad(
                "expected a packed projection [sequences, length, 3 * width]".into(),
            ));
        };
        if heads == 0 || w3 % (3 * heads) != 0 {
            return Err(bad(format!(
                "the last dim must be 3 * width with {heads} heads dividing the width: project to 3 * heads * \
                 head width"
            )));
        }
        let head_dim = w3 / 3 / heads;
        let mask_rows = match mask.keys {
            None => 0,
            Some(k) => {
                self.same_device(op, k)?;
                self.same_dtype(op, k)?;
                match k.shape[..] {
                    [r, kl] if kl == l && r > 0 && n % r == 0 => r,
                    _ => {
                        return Err(Error::InvalidShape {
                            op,
                            shape: k.shape.clone(),
                            reason: format!(
                                "a key mask for {n} sequences of {l} is [R, {l}] with R dividing {n} (the batch, \
                                 or every sequence)"
                            ),
                        });
                    }
                }
            }
        };
        Ok(AttentionShape {
            seqs: n,
            len: l,
            heads,
            head_dim,
            scale: 1.0 / (head_dim.max(1) as f64).sqrt(),
            causal: mask.causal,
            mask_rows,
        })
    }
}
