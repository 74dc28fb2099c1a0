//! Fused layer normalization ([`Tensor::layer_norm`]) and its gradient: a pass over each row forward, two
//! backward, instead of the thirty or so of a composition of element-wise ops and reductions.

use cohort_kernels::layernorm::LayerNormShape;

use crate::backend::Normalization;
use crate::storage::{Storage, on_cpu, on_cuda};
use crate::{Error, Result, Tensor};

impl Tensor {
    /// Layer normalization of `self`, `[members, ..., dim]`: each row of `dim` elements normalized by its mean
    /// and biased variance, then scaled by its member's `weight` and shifted by its `bias` (`[members, dim]`).
    /// Returns the output (`self`'s shape) and each row's mean and `1 / √(var + eps)` (`[members, rows]`, `rows`
    /// the product of the dimensions between the first and the last), which the gradient needs.
    ///
    /// f32 and f64 on the CPU, f32 on CUDA.
    ///
    /// # Errors
    /// Fewer than 2 dimensions or rows of no element, parameters not `[members, dim]`, a dtype or device
    /// mismatch, out of memory.
    pub fn layer_norm(
        &self,
        (weight, bias): (&Tensor, &Tensor),
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm";
        let shape = self.layer_norm_shape(OP)?;
        self.layer_norm_operands(OP, &[weight, bias], &[shape.members, shape.dim])?;
        let mismatch = || self.device_mismatch(OP, weight);
        let (out, mean, invstd) = Tensor::read_all(&[self, weight, bias], |s| -> Result<_> {
            if let Some(c) = on_cpu(s) {
                let (y, m, i) = c[0].layer_norm((c[1], c[2]), (&shape, eps))?;
                return Ok((Storage::Cpu(y), Storage::Cpu(m), Storage::Cpu(i)));
            }
            let g = on_cuda(s).ok_or_else(mismatch)?;
            let (y, m, i) = g[0].layer_norm((g[1], g[2]), (&shape, eps))?;
            Ok((Storage::Cuda(y), Storage::Cuda(m), Storage::Cuda(i)))
        })?;
        let stats = vec![shape.members, shape.rows];
        Ok((
            Tensor::from_storage(out, self.shape.clone()),
            Tensor::from_storage(mean, stats.clone()),
            Tensor::from_storage(invstd, stats),
        ))
    }

    /// The gradients `(of self, of weight, of bias)` of [`layer_norm`](Tensor::layer_norm) on `self`, given the
    /// output's gradient `dout`, that call's `mean` and `invstd`, and the `weight`.
    ///
    /// # Errors
    /// As [`layer_norm`](Tensor::layer_norm), and `dout` not of `self`'s shape or the statistics not
    /// `[members, rows]`.
    pub fn layer_norm_backward(
        &self,
        dout: &Tensor,
        (mean, invstd, weight): (&Tensor, &Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm_backward";
        let shape = self.layer_norm_shape(OP)?;
        let params = [shape.members, shape.dim];
        self.layer_norm_operands(OP, &[weight], &params)?;
        self.layer_norm_operands(OP, &[mean, invstd], &[shape.members, shape.rows])?;
        self.same_device(OP, dout)?;
        self.same_dtype(OP, dout)?;
        self.same_shape(OP, dout)?;
        let (dx, dw, db) =
            Tensor::read_all(&[self, dout, mean, invstd, weight], |s| -> Result<_> {
                if let Some(c) = on_cpu(s) {
                    let (dx, dw, db) =
                        c[0].layer_norm_backward(c[1], (c[2], c[3], c[4]), &shape)?;
                    return Ok((Storage::Cpu(dx), Storage::Cpu(dw), Storage::Cpu(db)));
                }
                let g = on_cuda(s).ok_or_else(|| self.device_mismatch(OP, dout))?;
                let (dx, dw, db) = g[0].layer_norm_backward(g[1], (g[2], g[3], g[4]), &shape)?;
                Ok((Storage::Cuda(dx), Storage::Cuda(dw), Storage::Cuda(db)))
            })?;
        Ok((
            Tensor::from_storage(dx, self.shape.clone()),
            Tensor::from_storage(dw, params.to_vec()),
            Tensor::from_storage(db, params.to_vec()),
        ))
    }

    /// The kernels' geometry of `self` as `[members, rows, dim]`.
    fn layer_norm_shape(&self, op: &'static str) -> Result<LayerNormShape> {
        self.require_float(op)?;
        let (Some(&members), Some(&dim)) = (self.shape.first(), self.shape.last()) else {
            return Err(self.layer_norm_refusal(op, "a scalar"));
        };
        if self.shape.len() < 2 {
            return Err(self.layer_norm_refusal(op, "one dimension"));
        }
        let rows = self.shape[1..self.shape.len() - 1].iter().product();
        if dim == 0 && members * rows > 0 {
            return Err(self.layer_norm_refusal(op, "rows of no element"));
        }
        Ok(LayerNormShape { members, rows, dim })
    }

    fn layer_norm_refusal(&self, op: &'static str, what: &str) -> Error {
        Error::InvalidShape {
            op,
            shape: self.shape.clone(),
            reason: format!(
                "{what}: expected [members, ..., dim], each row of dim elements normalized"
            ),
        }
    }

    /// Checks that each of `ts` is `want` of `self`'s dtype and device.
    fn layer_norm_operands(
        &self,
        op: &'static str,
        ts: &[&Tensor],
        want: &[usize; 2],
    ) -> Result<()> {
        for t in ts {
            self.same_device(op, t)?;
            self.same_dtype(op, t)?;
            if t.shape != want {
                return Err(Error::InvalidShape {
                    op,
                    shape: t.shape.clone(),
                    reason: format!("expected {want:?} for the input {:?}", self.shape),
                });
            }
        }
        Ok(())
    }
}
