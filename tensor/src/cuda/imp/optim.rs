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
/// that the host sets before each replay (see [`capture`]); skipped where `skip`'s overflow flag is
/// raised (a loss scale state).
pub(super) fn sgd_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &SgdParams<'_>,
    skip: Option<&CudaStorage>,
) -> Result<()> {
    let skip = loss_scale_ptr("sgd_step", gpu, skip)?;
    let state = if gpu.is_capturing() {
        Some(capture::rate_state(gpu)?)
    } else {
        None
    };
    // SAFETY: every buffer was checked to hold len f32 on this device, and skip 4; a state lives as
    // long as the graph, and skip as its tensor, which the caller keeps.
    unsafe { optim_cuda::sgd_step(gpu, bufs, h, state, skip)? };
    Ok(())
}

/// Launches Adam over checked buffers; during a graph capture, with the step number and a factor
/// on the rates in device memory: every replay advances the step (see [`capture`]); skipped as in
/// [`sgd_launch`].
pub(super) fn adam_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &AdamParams<'_>,
    skip: Option<&CudaStorage>,
) -> Result<()> {
    let skip = loss_scale_ptr("adam_step", gpu, skip)?;
    let state = if gpu.is_capturing() {
        Some(capture::step_state(gpu, h.step)?)
    } else {
        None
    };
    // SAFETY: as in sgd_launch.
    unsafe { optim_cuda::adam_step(gpu, bufs, h, state, skip)? };
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
        sgd_launch(&self.gpu, &[pb], h, None)
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
        adam_launch(&self.gpu, &[pb], h, None)
    }
}

/// The address of a loss scale state (four f32 on `gpu`'s device), for a kernel to read or write.
fn loss_scale_ptr(
    op: &'static str,
    gpu: &Arc<Gpu>,
    state: Option<&CudaStorage>,
) -> Result<Option<u64>> {
    let Some(s) = state else { return Ok(None) };
    want(op, s, &[DType::F32])?;
    if s.len != 4 || s.ordinal != gpu.ordinal() {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "a loss scale state is 4 f32 on cuda:{}, not {} on cuda:{}",
                gpu.ordinal(),
                s.len,
                s.ordinal
            ),
        });
    }
    Ok(Some(s.device_ptr()))
}

/// [`CudaBackend::unscale_grads`](crate::backend::CudaBackend::unscale_grads): one launch per 24
/// gradients.
pub(super) fn unscale_grads(grads: &mut [&mut CudaStorage], state: &mut CudaStorage) -> Result<()> {
    const OP: &str = "unscale_grads";
    let ptr = loss_scale_ptr(OP, &state.gpu, Some(state))?.unwrap_or_default();
    let mut bufs = Vec::with_capacity(grads.len());
    for g in grads.iter() {
        want(OP, g, &[DType::F32])?;
        same_device(OP, state, g)?;
        bufs.push((g.device_ptr(), g.len));
    }
    // SAFETY: every gradient holds len f32 on the state's device, and the state 4 f32; the
    // tensors outlive the queued (or captured) work, as the caller holds them.
    unsafe { optim_cuda::unscale(&state.gpu, &bufs, ptr)? };
    Ok(())
}

/// [`CudaBackend::update_loss_scale`](crate::backend::CudaBackend::update_loss_scale).
pub(super) fn update_loss_scale(
    state: &mut CudaStorage,
    interval: u64,
    min_scale: f32,
    max_scale: f32,
) -> Result<()> {
    let ptr = loss_scale_ptr("update_loss_scale", &state.gpu, Some(state))?.unwrap_or_default();
    // SAFETY: the state holds 4 f32 on its device and outlives the work, as the caller holds it.
    unsafe { optim_cuda::update_scale(&state.gpu, ptr, interval, min_scale, max_scale)? };
    Ok(())
}
