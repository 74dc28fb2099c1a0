//! Fused optimizer steps on tensors, and dynamic loss scaling's device-side ops: each validates
//! shapes, dtypes and devices, then dispatches to the CPU or CUDA backend.

use cohort_kernels::optim::{AdamParams, LossScaleState, SgdParams, cpu as optim_cpu};

use crate::backend::{CudaBackend, OptimizerSteps};
use crate::cuda::CudaStorage;
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Tensor};

impl Tensor {
    fn check_step(op: &'static str, param: &Tensor, others: &[&Tensor], lrs: &[f64]) -> Result<()> {
        param.require_float(op)?;
        for o in others {
            param.same_shape(op, o)?;
            param.same_dtype(op, o)?;
            param.same_device(op, o)?;
        }
        for (i, a) in others.iter().enumerate() {
            if param.same_storage(a) || others[i + 1..].iter().any(|b| a.same_storage(b)) {
                return Err(Error::InvalidArgument {
                    op,
                    reason: "parameter, gradient and state must be distinct tensors".into(),
                });
            }
        }
        let members = param.shape.first().copied().unwrap_or(1);
        if lrs.is_empty() || (lrs.len() > 1 && lrs.len() != members) {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "got {} learning rates for a parameter of shape {:?}: give one, or one per member (the leading dim)",
                    lrs.len(),
                    param.shape
                ),
            });
        }
        Ok(())
    }

    /// One fused SGD step on `param` in place (PyTorch semantics; the momentum buffer starts at
    /// zero). `lrs`: one rate, or one per member for a parameter with a leading member dim.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; a missing buffer with momentum; bad `lrs`.
    #[allow(clippy::too_many_arguments)]
    pub fn sgd_step_(
        param: &Tensor,
        grad: &Tensor,
        momentum_buf: Option<&Tensor>,
        lrs: &[f64],
        momentum: f64,
        dampening: f64,
        weight_decay: f64,
        nesterov: bool,
    ) -> Result<()> {
        const OP: &str = "sgd_step_";
        let mut others = vec![grad];
        others.extend(momentum_buf);
        Tensor::check_step(OP, param, &others, lrs)?;
        if momentum != 0.0 && momentum_buf.is_none() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "momentum {momentum} needs a momentum buffer (a zeroed tensor shaped like the parameter)"
                ),
            });
        }
        let h = SgdParams {
            lrs,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        };
        let mut p = param.write();
        let g = grad.read();
        let mut b = momentum_buf.map(Tensor::write);
        match (&mut *p, &*g, b.as_deref_mut()) {
            (Storage::Cpu(p), Storage::Cpu(g), None) => p.sgd_step(g, None, &h),
            (Storage::Cpu(p), Storage::Cpu(g), Some(Storage::Cpu(b))) => p.sgd_step(g, Some(b), &h),
            (Storage::Cuda(p), Storage::Cuda(g), None) => p.sgd_step(g, None, &h),
            (Storage::Cuda(p), Storage::Cuda(g), Some(Storage::Cuda(b))) => {
                p.sgd_step(g, Some(b), &h)
            }
            _ => Err(param.device_mismatch(OP, grad)),
        }
    }

    /// One fused Adam (or AdamW when `decoupled`) step on `param`, `m` and `v` in place (PyTorch
    /// semantics); `step` is the 1-based step number of this update.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; `step == 0`; bad `lrs`.
    #[allow(clippy::too_many_arguments)]
    pub fn adam_step_(
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        lrs: &[f64],
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
        step: u64,
    ) -> Result<()> {
        const OP: &str = "adam_step_";
        Tensor::check_step(OP, param, &[grad, m, v], lrs)?;
        if step == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "step is 1-based: pass 1 for the first update".into(),
            });
        }
        let h = AdamParams {
            lrs,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            step,
        };
        let mut p = param.write();
        let g = grad.read();
        let mut mg = m.write();
        let mut vg = v.write();
        match (&mut *p, &*g, &mut *mg, &mut *vg) {
            (Storage::Cpu(p), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                p.adam_step(g, m, v, &h)
            }
            (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                p.adam_step(g, m, v, &h)
            }
            _ => Err(param.device_mismatch(OP, grad)),
        }
    }

    /// Adam / AdamW steps on many parameters at once, each entry `(param, grad, m, v, lrs)`; on
    /// CUDA one fused launch updates them all (f32), on the CPU they run one after another.
    /// Same semantics as [`Tensor::adam_step_`]. With a `skip` (a loss scale state, see
    /// [`Tensor::loss_scale_state`]), nothing is updated where its overflow flag is raised when the
    /// step runs: read on the device by the fused launch, so that no host read waits for it.
    ///
    /// # Errors
    /// As [`Tensor::adam_step_`] for any entry (checked before anything is updated); a tensor
    /// appearing in two entries; a `skip` that is not a loss scale state on the parameters' device.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub fn adam_step_many_(
        params: &[(&Tensor, &Tensor, &Tensor, &Tensor, &[f64])],
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
        step: u64,
        skip: Option<&Tensor>,
    ) -> Result<()> {
        const OP: &str = "adam_step_many_";
        if step == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "step is 1-based: pass 1 for the first update".into(),
            });
        }
        let mut seen: Vec<&Tensor> = Vec::with_capacity(params.len() * 4);
        for &(p, g, m, v, lrs) in params {
            Tensor::check_step(OP, p, &[g, m, v], lrs)?;
            for t in [p, g, m, v] {
                if seen.iter().any(|s| s.same_storage(t)) {
                    return Err(Error::InvalidArgument {
                        op: OP,
                        reason: format!("a tensor of shape {:?} appears in two entries", t.shape),
                    });
                }
                seen.push(t);
            }
        }
        if let Some(&(first, ..)) = params.first() {
            let fused = first.device.is_cuda()
                && params
                    .iter()
                    .all(|(p, ..)| p.device == first.device && p.dtype == DType::F32);
            if fused {
                let mut pg: Vec<_> = params.iter().map(|e| e.0.write()).collect();
                let gg: Vec<_> = params.iter().map(|e| e.1.read()).collect();
                let mut mg: Vec<_> = params.iter().map(|e| e.2.write()).collect();
                let mut vg: Vec<_> = params.iter().map(|e| e.3.write()).collect();
                let mut entries = Vec::with_capacity(params.len());
                for ((((p, g), m), v), e) in pg
                    .iter_mut()
                    .zip(&gg)
                    .zip(mg.iter_mut())
                    .zip(vg.iter_mut())
                    .zip(params)
                {
                    match (&mut **p, &**g, &mut **m, &mut **v) {
                        (
                            Storage::Cuda(p),
                            Storage::Cuda(g),
                            Storage::Cuda(m),
                            Storage::Cuda(v),
                        ) => {
                            entries.push((p, g, m, v, e.4));
                        }
                        _ => return Err(e.0.device_mismatch(OP, e.1)),
                    }
                }
                let h = AdamParams {
                    lrs: &[],
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    decoupled,
                    step,
                };
                return with_skip(OP, first, skip, |skip| {
                    CudaStorage::adam_step_many(&mut entries, &h, skip)
                });
            }
        }
        if overflowed(OP, params.first().map(|e| e.0), skip)? {
            return Ok(());
        }
        for &(p, g, m, v, lrs) in params {
            Tensor::adam_step_(
                p,
                g,
                m,
                v,
                lrs,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                step,
            )?;
        }
        Ok(())
    }

    /// SGD steps on many parameters at once, each entry `(param, grad, momentum_buf, lrs)`; on
    /// CUDA one fused launch updates them all (f32), on the CPU they run one after another.
    /// Same semantics as [`Tensor::sgd_step_`]; `skip` as in [`Tensor::adam_step_many_`].
    ///
    /// # Errors
    /// As [`Tensor::sgd_step_`] for any entry (checked before anything is updated); a tensor
    /// appearing in two entries; a `skip` that is not a loss scale state on the parameters' device.
    #[allow(clippy::type_complexity)]
    pub fn sgd_step_many_(
        params: &[(&Tensor, &Tensor, Option<&Tensor>, &[f64])],
        momentum: f64,
        dampening: f64,
        weight_decay: f64,
        nesterov: bool,
        skip: Option<&Tensor>,
    ) -> Result<()> {
        const OP: &str = "sgd_step_many_";
        let mut seen: Vec<&Tensor> = Vec::with_capacity(params.len() * 3);
        for &(p, g, b, lrs) in params {
            let mut others = vec![g];
            others.extend(b);
            Tensor::check_step(OP, p, &others, lrs)?;
            if momentum != 0.0 && b.is_none() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "momentum {momentum} needs a momentum buffer for the parameter of shape {:?}",
                        p.shape
                    ),
                });
            }
            for t in [p, g].into_iter().chain(b) {
                if seen.iter().any(|s| s.same_storage(t)) {
                    return Err(Error::InvalidArgument {
                        op: OP,
                        reason: format!("a tensor of shape {:?} appears in two entries", t.shape),
                    });
                }
                seen.push(t);
            }
        }
        if let Some(&(first, ..)) = params.first() {
            let fused = first.device.is_cuda()
                && params
                    .iter()
                    .all(|(p, ..)| p.device == first.device && p.dtype == DType::F32);
            if fused {
                let mut pg: Vec<_> = params.iter().map(|e| e.0.write()).collect();
                let gg: Vec<_> = params.iter().map(|e| e.1.read()).collect();
                let mut bg: Vec<_> = params.iter().map(|e| e.2.map(Tensor::write)).collect();
                let mut entries = Vec::with_capacity(params.len());
                for (((p, g), b), e) in pg.iter_mut().zip(&gg).zip(bg.iter_mut()).zip(params) {
                    let b = match b.as_deref_mut() {
                        None => None,
                        Some(Storage::Cuda(b)) => Some(b),
                        Some(Storage::Cpu(_)) => return Err(e.0.device_mismatch(OP, e.1)),
                    };
                    match (&mut **p, &**g) {
                        (Storage::Cuda(p), Storage::Cuda(g)) => entries.push((p, g, b, e.3)),
                        _ => return Err(e.0.device_mismatch(OP, e.1)),
                    }
                }
                let h = SgdParams {
                    lrs: &[],
                    momentum,
                    dampening,
                    weight_decay,
                    nesterov,
                };
                return with_skip(OP, first, skip, |skip| {
                    CudaStorage::sgd_step_many(&mut entries, &h, skip)
                });
            }
        }
        if overflowed(OP, params.first().map(|e| e.0), skip)? {
            return Ok(());
        }
        for &(p, g, b, lrs) in params {
            Tensor::sgd_step_(p, g, b, lrs, momentum, dampening, weight_decay, nesterov)?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- loss scaling

    /// A dynamic loss scale's state on `dev`, as GradScaler keeps it on the device: a tensor of the
    /// four f32 of `state` (the overflow flag is raised by [`Tensor::unscale_grads_`] and read by the
    /// optimizer steps' `skip`).
    ///
    /// # Errors
    /// Out of memory.
    pub fn loss_scale_state(state: LossScaleState, dev: &Device) -> Result<Tensor> {
        Tensor::from_vec(state.to_array().to_vec(), &[LossScaleState::LEN], dev)
    }

    /// Divides every gradient by the scale in `state` (see [`Tensor::loss_scale_state`]) and raises
    /// its overflow flag where any quotient is not finite; on CUDA one fused launch and no read-back,
    /// so that it can be captured in a graph.
    ///
    /// # Errors
    /// A `state` that is not a loss scale state, gradients on another device or (on CUDA) not f32.
    pub fn unscale_grads_(grads: &[&Tensor], state: &Tensor) -> Result<()> {
        const OP: &str = "unscale_grads_";
        check_loss_scale(OP, state)?;
        for g in grads {
            g.require_float(OP)?;
            g.same_device(OP, state)?;
        }
        let mut gg: Vec<_> = grads.iter().map(|g| g.write()).collect();
        if let Storage::Cuda(s) = &mut *state.write() {
            let mut cuda: Vec<&mut CudaStorage> = Vec::with_capacity(grads.len());
            for (g, t) in gg.iter_mut().zip(grads) {
                match &mut **g {
                    Storage::Cuda(g) => cuda.push(g),
                    Storage::Cpu(_) => return Err(t.device_mismatch(OP, state)),
                }
            }
            return CudaStorage::unscale_grads(&mut cuda, s);
        }
        let mut s = read_state(state)?;
        let inv = 1.0 / f64::from(s.scale);
        for (g, t) in gg.iter_mut().zip(grads) {
            let Storage::Cpu(g) = &mut **g else {
                return Err(t.device_mismatch(OP, state));
            };
            if !g.unscale(inv)? {
                s.overflow = 1.0;
            }
        }
        drop(gg);
        state.assign_(&Tensor::loss_scale_state(s, &state.device)?)
    }

    /// Moves a loss scale `state` on after a step, GradScaler's update: an overflow halves the scale
    /// (not below `min_scale`) and counts a skipped step; `interval` clean steps in a row double it
    /// (not above `max_scale`); the overflow flag clears. On CUDA one launch, no read-back.
    ///
    /// # Errors
    /// A `state` that is not a loss scale state, a failed launch.
    pub fn update_loss_scale_(
        state: &Tensor,
        interval: u64,
        min_scale: f64,
        max_scale: f64,
    ) -> Result<()> {
        const OP: &str = "update_loss_scale_";
        check_loss_scale(OP, state)?;
        let (min_scale, max_scale) = (min_scale as f32, max_scale as f32);
        if let Storage::Cuda(s) = &mut *state.write() {
            return CudaStorage::update_loss_scale(s, interval, min_scale, max_scale);
        }
        let mut s = read_state(state)?;
        optim_cpu::update_scale(&mut s, interval, min_scale, max_scale);
        state.assign_(&Tensor::loss_scale_state(s, &state.device)?)
    }
}

/// A loss scale state tensor's values, read on the host.
fn read_state(state: &Tensor) -> Result<LossScaleState> {
    let v = state.to_vec::<f32>()?;
    LossScaleState::from_slice(&v).ok_or_else(|| Error::InvalidArgument {
        op: "loss scale state",
        reason: format!(
            "{} values where a loss scale state has {}",
            v.len(),
            LossScaleState::LEN
        ),
    })
}

fn check_loss_scale(op: &'static str, state: &Tensor) -> Result<()> {
    if state.dtype != DType::F32 || state.shape != [LossScaleState::LEN] {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "a loss scale state is {} f32 (Tensor::loss_scale_state), not {:?} {:?}",
                LossScaleState::LEN,
                state.dtype,
                state.shape
            ),
        });
    }
    Ok(())
}

/// Runs a fused CUDA step with `skip`'s device storage, checked to be a loss scale state on
/// `param`'s device.
fn with_skip<R>(
    op: &'static str,
    param: &Tensor,
    skip: Option<&Tensor>,
    run: impl FnOnce(Option<&CudaStorage>) -> Result<R>,
) -> Result<R> {
    let Some(skip) = skip else {
        return run(None);
    };
    check_loss_scale(op, skip)?;
    param.same_device(op, skip)?;
    match &*skip.read() {
        Storage::Cuda(s) => run(Some(s)),
        Storage::Cpu(_) => Err(param.device_mismatch(op, skip)),
    }
}

/// Whether `skip`'s overflow flag is raised, read on the host: for the steps that do not run as one
/// fused launch (the CPU).
fn overflowed(op: &'static str, param: Option<&Tensor>, skip: Option<&Tensor>) -> Result<bool> {
    let Some(skip) = skip else {
        return Ok(false);
    };
    check_loss_scale(op, skip)?;
    if let Some(p) = param {
        p.same_device(op, skip)?;
    }
    Ok(read_state(skip)?.overflow != 0.0)
}
