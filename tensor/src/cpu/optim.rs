//! Optimizer steps on [`CpuStorage`] ([`OptimizerSteps`]).

use cohort_kernels::optim::{AdamParams, SgdParams, cpu as optim_cpu};

use super::{mismatch, unsupported};
use crate::Result;
use crate::backend::OptimizerSteps;
use crate::storage::CpuStorage;

impl OptimizerSteps for CpuStorage {
    /// One fused SGD step.
    fn sgd_step(
        &mut self,
        grad: &CpuStorage,
        momentum_buf: Option<&mut CpuStorage>,
        h: &SgdParams<'_>,
    ) -> Result<()> {
        match (self, grad, momentum_buf) {
            (CpuStorage::F32(p), CpuStorage::F32(g), None) => optim_cpu::sgd_step(p, g, None, h),
            (CpuStorage::F32(p), CpuStorage::F32(g), Some(CpuStorage::F32(b))) => {
                optim_cpu::sgd_step(p, g, Some(b), h)
            }
            (CpuStorage::F64(p), CpuStorage::F64(g), None) => optim_cpu::sgd_step(p, g, None, h),
            (CpuStorage::F64(p), CpuStorage::F64(g), Some(CpuStorage::F64(b))) => {
                optim_cpu::sgd_step(p, g, Some(b), h)
            }
            (p, g, _) if p.dtype() != g.dtype() => return Err(mismatch("sgd_step", p, g)),
            (p, _, Some(b)) if p.dtype() != b.dtype() => {
                return Err(mismatch("sgd_step (momentum buffer)", p, b));
            }
            (p, _, _) => return Err(unsupported("sgd_step", p.dtype())),
        }
        Ok(())
    }

    /// One fused Adam / AdamW step.
    fn adam_step(
        &mut self,
        grad: &CpuStorage,
        m: &mut CpuStorage,
        v: &mut CpuStorage,
        h: &AdamParams<'_>,
    ) -> Result<()> {
        match (self, grad, m, v) {
            (CpuStorage::F32(p), CpuStorage::F32(g), CpuStorage::F32(m), CpuStorage::F32(v)) => {
                optim_cpu::adam_step(p, g, m, v, h)
            }
            (CpuStorage::F64(p), CpuStorage::F64(g), CpuStorage::F64(m), CpuStorage::F64(v)) => {
                optim_cpu::adam_step(p, g, m, v, h)
            }
            (p, g, m, v) => {
                for (name, o) in [
                    ("adam_step (grad)", g),
                    ("adam_step (m)", &*m),
                    ("adam_step (v)", &*v),
                ] {
                    if o.dtype() != p.dtype() {
                        return Err(mismatch(name, p, o));
                    }
                }
                return Err(unsupported("adam_step", p.dtype()));
            }
        }
        Ok(())
    }
}

impl CpuStorage {
    /// The gradient `self` divided by a loss scale (times `inv`, its reciprocal) in place; whether
    /// every quotient is finite.
    ///
    /// # Errors
    /// Not f32 or f64.
    pub(crate) fn unscale(&mut self, inv: f64) -> Result<bool> {
        match self {
            CpuStorage::F32(g) => Ok(optim_cpu::unscale(g, inv as f32)),
            CpuStorage::F64(g) => Ok(optim_cpu::unscale(g, inv)),
            g => Err(unsupported("unscale_grads_", g.dtype())),
        }
    }
}
