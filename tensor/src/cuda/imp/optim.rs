//! Optimizer steps on [`CudaStorage`] ([`OptimizerSteps`]); during a graph capture with their step
//! state in device memory (see [`super::capture`]).

use std::sync::Arc;

use cohort_kernels::cuda::Gpu;
use cohort_kernels::optim::{AdamParams, SgdParams, cuda as optim_cuda};

use super::{CudaStorage, capture, mismatch, same_device, want};
use crate::backend::OptimizerSteps;
use crate::{DType, Error, Result};

pub(super) fn optim_check(
    op: &'static str,
    p: &CudaStorage,
    others: &[&CudaStorage],
) -> Result<()> {
    want(op, p, &[DType::F32])?;
    for o in others {
        if o.dtype != p.dtype {
            return Err(mismatch(op, p.dtype, o.dtype));
        }
        if o.len != p.len {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "the parameter has {} elements but its gradient or state has {}",
                    p.len, o.len
                ),
            });
        }
        same_device(op, p, o)?;
    }
    Ok(())
}

/// Launches SGD over checked buffers; during a graph capture, with a device factor on the rates
/// that the host sets before each replay (see [`capture`]).
pub(super) fn sgd_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &SgdParams<'_>,
) -> Result<()> {
    let state = if gpu.is_capturing() {
        Some(capture::rate_state(gpu)?)
    } else {
        None
    };
    // SAFETY: every buffer was checked to hold len f32 on this device; a state lives as long as
    // the graph.
    unsafe { optim_cuda::sgd_step(gpu, bufs, h, state)? };
    Ok(())
}

/// Launches Adam over checked buffers; during a graph capture, with the step number and a factor
/// on the rates in device memory: every replay advances the step (see [`capture`]).
pub(super) fn adam_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &AdamParams<'_>,
) -> Result<()> {
    let state = if gpu.is_capturing() {
        Some(capture::step_state(gpu, h.step)?)
    } else {
        None
    };
    // SAFETY: every buffer was checked to hold len f32 on this device; a state lives as long as
    // the graph.
    unsafe { optim_cuda::adam_step(gpu, bufs, h, state)? };
    Ok(())
}

impl OptimizerSteps for CudaStorage {
    /// # Errors
    /// Not f32, mismatched buffers, a missing momentum buffer, or a launch failure.
    fn sgd_step(
        &mut self,
        grad: &CudaStorage,
        momentum_buf: Option<&mut CudaStorage>,
        h: &SgdParams<'_>,
    ) -> Result<()> {
        let buf = momentum_buf.map(|b| &*b);
        let mut others = vec![grad];
        others.extend(buf);
        optim_check("sgd_step", self, &others)?;
        let pb = optim_cuda::ParamBuffers {
            param: self.device_ptr(),
            grad: grad.device_ptr(),
            state1: buf.map_or(0, CudaStorage::device_ptr),
            state2: 0,
            len: self.len,
            lrs: h.lrs,
        };
        sgd_launch(&self.gpu, &[pb], h)
    }

    /// # Errors
    /// Not f32, mismatched buffers, or a launch failure.
    fn adam_step(
        &mut self,
        grad: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        h: &AdamParams<'_>,
    ) -> Result<()> {
        optim_check("adam_step", self, &[grad, &*m, &*v])?;
        let pb = optim_cuda::ParamBuffers {
            param: self.device_ptr(),
            grad: grad.device_ptr(),
            state1: m.device_ptr(),
            state2: v.device_ptr(),
            len: self.len,
            lrs: h.lrs,
        };
        adam_launch(&self.gpu, &[pb], h)
    }
}
