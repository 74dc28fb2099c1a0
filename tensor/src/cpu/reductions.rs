//! Reductions and the softmax family on [`CpuStorage`] ([`Reductions`]).

use cohort_kernels::reduce::{ReduceOp, ReduceShape, cpu as reduce_cpu};
use cohort_kernels::softmax::cpu as softmax_cpu;

use super::{indices, unsupported};
use crate::Result;
use crate::backend::Reductions;
use crate::storage::CpuStorage;

impl Reductions for CpuStorage {
    /// Reduction along the middle dim of `[outer, dim, inner]`.
    fn reduce(&self, op: ReduceOp, shape: ReduceShape) -> Result<CpuStorage> {
        Ok(num_map!(op.name(), self, |v| reduce_cpu::reduce(
            op, v, shape
        )))
    }

    /// Index of the maximum along the middle dim of `[outer, dim, inner]`, as i32.
    fn argmax(&self, shape: ReduceShape) -> Result<CpuStorage> {
        Ok(CpuStorage::I32(match self {
            CpuStorage::F32(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::F64(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::I32(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::U8(v) => reduce_cpu::argmax(v, shape),
            other => return Err(unsupported("argmax", other.dtype())),
        }))
    }

    /// Softmax or log-softmax of each row of `cols` elements.
    fn softmax_last(&self, cols: usize, log: bool) -> Result<CpuStorage> {
        let op = if log {
            "log_softmax_last"
        } else {
            "softmax_last"
        };
        Ok(float_map!(op, self, |v| softmax_cpu::softmax_last(
            v, cols, log
        )))
    }

    /// Softmax cross-entropy of rows of `cols` logits against i32 labels (row `r` takes label
    /// `r % labels`): each row's loss and the gradient `(softmax - onehot) · scale`.
    fn cross_entropy(
        &self,
        labels: &CpuStorage,
        cols: usize,
        scale: f64,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let l = indices("cross_entropy", labels)?;
        Ok(match self {
            CpuStorage::F32(x) => {
                let (loss, grad) = softmax_cpu::cross_entropy(x, cols, l, scale as f32)?;
                (CpuStorage::F32(loss), CpuStorage::F32(grad))
            }
            CpuStorage::F64(x) => {
                let (loss, grad) = softmax_cpu::cross_entropy(x, cols, l, scale)?;
                (CpuStorage::F64(loss), CpuStorage::F64(grad))
            }
            other => return Err(unsupported("cross_entropy", other.dtype())),
        })
    }
}
