//! Fused batch normalization in training ([`Tensor::batch_norm`]) and its gradient: two passes over the
//! activations each way instead of the forty or so of a composition of element-wise ops and reductions.

use cohort_kernels::batchnorm::BatchNormShape;

use crate::backend::Normalization;
use crate::storage::{Storage, on_cpu, on_cuda};
use crate::{DType, Error, Result, Tensor};

/// The running statistics a training step of [`Tensor::batch_norm`] moves towards the batch's, in place:
/// `running = (1 - momentum) · running + momentum · batch`, the variance unbiased (PyTorch's rule).
#[derive(Clone, Copy, Debug)]
pub struct RunningStats<'a> {
    /// The running mean `[members, channels]`.
    pub mean: &'a Tensor,
    /// The running variance `[members, channels]`.
    pub var: &'a Tensor,
    /// The weight of the batch's statistics.
    pub momentum: f64,
}

impl Tensor {
    /// Batch normalization in training of `self`, `[outer, members, rows, channels, inner]`: each channel of each
    /// member normalized by its mean and biased variance over the `outer`, `rows` and `inner` axes, then scaled
    /// by `weight` and shifted by `bias` (`[members, channels]`), and rectified when `relu`. Returns the output
    /// (`self`'s shape) and the batch's mean and `1 / √(var + eps)` (`[members, channels]`), which the gradient
    /// needs; `running`, when given, moves in place. Packed images `[B, M·C, H, W]` are `[B, M, 1, C, H·W]`,
    /// features per member `[M, B, C]` are `[1, M, B, C, 1]`.
    ///
    /// f32 and f64 on the CPU; on CUDA f32, or bf16 and f16 activations (a mixed policy keeps them in the low
    /// type) with f32 parameters, statistics and their gradients.
    ///
    /// # Errors
    /// Not 5-D or no element per channel, parameters or statistics not `[members, channels]`, running statistics
    /// that share storage with an operand, a dtype or device mismatch, out of memory.
    pub fn batch_norm(
        &self,
        (weight, bias): (&Tensor, &Tensor),
        running: Option<RunningStats<'_>>,
        eps: f64,
        relu: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "batch_norm";
        let shape = self.batch_norm_shape(OP)?;
        let stats = [shape.members, shape.channels];
        let mut each = vec![weight, bias];
        each.extend(running.iter().flat_map(|r| [r.mean, r.var]));
        self.per_channel(OP, &each, &stats)?;
        if let Some(r) = running {
            let shared = |t: &Tensor| t.same_storage(r.mean) || t.same_storage(r.var);
            if r.mean.same_storage(r.var) || [self, weight, bias].into_iter().any(shared) {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: "the running statistics must be two tensors of their own, apart from the input and \
                             the parameters"
                        .into(),
                });
            }
        }
        let mut guards = running.map(|r| (r.mean.write(), r.var.write(), r.momentum));
        let mismatch = || self.device_mismatch(OP, weight);
        let (out, mean, invstd) = Tensor::read_all(&[self, weight, bias], |s| -> Result<_> {
            let running = guards.as_mut().map(|(m, v, k)| (&mut **m, &mut **v, *k));
            if let Some(c) = on_cpu(s) {
                let r = match running {
                    Some((Storage::Cpu(m), Storage::Cpu(v), k)) => Some((m, v, k)),
                    Some(_) => return Err(mismatch()),
                    None => None,
                };
                let (y, m, i) = c[0].batch_norm((c[1], c[2]), (&shape, eps), relu, r)?;
                return Ok((Storage::Cpu(y), Storage::Cpu(m), Storage::Cpu(i)));
            }
            let g = on_cuda(s).ok_or_else(mismatch)?;
            let r = match running {
                Some((Storage::Cuda(m), Storage::Cuda(v), k)) => Some((m, v, k)),
                Some(_) => return Err(mismatch()),
                None => None,
            };
            let (y, m, i) = g[0].batch_norm((g[1], g[2]), (&shape, eps), relu, r)?;
            Ok((Storage::Cuda(y), Storage::Cuda(m), Storage::Cuda(i)))
        })?;
        Ok((
            Tensor::from_storage(out, self.shape.clone()),
            Tensor::from_storage(mean, stats.to_vec()),
            Tensor::from_storage(invstd, stats.to_vec()),
        ))
    }

    /// The gradients `(of self, of weight, of bias)` of [`batch_norm`](Tensor::batch_norm) on `self`, given the
    /// output's gradient `dout`, that call's `mean` and `invstd`, the `weight`, and its output `out` when it
    /// rectified (the gradient passes where the output is positive).
    ///
    /// # Errors
    /// As [`batch_norm`](Tensor::batch_norm), and `dout` or `out` not of `self`'s shape.
    pub fn batch_norm_backward(
        &self,
        out: Option<&Tensor>,
        dout: &Tensor,
        (mean, invstd, weight): (&Tensor, &Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "batch_norm_backward";
        let shape = self.batch_norm_shape(OP)?;
        let stats = [shape.members, shape.channels];
        self.per_channel(OP, &[mean, invstd, weight], &stats)?;
        for t in out.into_iter().chain([dout]) {
            self.same_device(OP, t)?;
            self.same_dtype(OP, t)?;
            self.same_shape(OP, t)?;
        }
        let ts: Vec<&Tensor> = [self, dout, mean, invstd, weight]
            .into_iter()
            .chain(out)
            .collect();
        let (dx, dw, db) = Tensor::read_all(&ts, |s| -> Result<_> {
            if let Some(c) = on_cpu(s) {
                let saved = (c[2], c[3], c[4]);
                let (dx, dw, db) =
                    c[0].batch_norm_backward(c.get(5).copied(), c[1], saved, &shape)?;
                return Ok((Storage::Cpu(dx), Storage::Cpu(dw), Storage::Cpu(db)));
            }
            let g = on_cuda(s).ok_or_else(|| self.device_mismatch(OP, dout))?;
            let saved = (g[2], g[3], g[4]);
            let (dx, dw, db) = g[0].batch_norm_backward(g.get(5).copied(), g[1], saved, &shape)?;
            Ok((Storage::Cuda(dx), Storage::Cuda(dw), Storage::Cuda(db)))
        })?;
        Ok((
            Tensor::from_storage(dx, self.shape.clone()),
            Tensor::from_storage(dw, stats.to_vec()),
            Tensor::from_storage(db, stats.to_vec()),
        ))
    }

    /// The kernels' geometry of `self` as `[outer, members, rows, channels, inner]`.
    fn batch_norm_shape(&self, op: &'static str) -> Result<BatchNormShape> {
        self.require_float(op)?;
        let &[outer, members, rows, channels, inner] = &self.shape[..] else {
            return Err(Error::InvalidShape {
                op,
                shape: self.shape.clone(),
                reason: "expected [outer, members, rows, channels, inner]: packed images [B, M*C, H, W] as \
                         [B, M, 1, C, H*W], features per member [M, B, C] as [1, M, B, C, 1]"
                    .into(),
            });
        };
        let s = BatchNormShape {
            outer,
            members,
            rows,
            channels,
            inner,
        };
        if s.stat_len() > 0 && s.per_channel() == 0 {
            return Err(Error::InvalidShape {
                op,
                shape: self.shape.clone(),
                reason: "no element per channel to take statistics over".into(),
            });
        }
        Ok(s)
    }

    /// Checks that each of `ts` is `[members, channels]` on `self`'s device, of `self`'s dtype (f32 beside 16-bit
    /// activations).
    fn per_channel(&self, op: &'static str, ts: &[&Tensor], stats: &[usize; 2]) -> Result<()> {
        let dtype = match self.dtype {
            DType::BF16 | DType::F16 => DType::F32,
            d => d,
        };
        for t in ts {
            self.same_device(op, t)?;
            if t.dtype != dtype {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: dtype,
                    rhs: t.dtype,
                });
            }
            if t.shape != stats {
                return Err(Error::InvalidShape {
                    op,
                    shape: t.shape.clone(),
                    reason: format!(
                        "expected {stats:?}, one per member and channel of the input {:?}",
                        self.shape
                    ),
                });
            }
        }
        Ok(())
    }
}
