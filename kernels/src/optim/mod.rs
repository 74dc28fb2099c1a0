//! Fused optimizer steps: one pass over a parameter updates it and its state.
//!
//! A parameter with a leading member dim (horizontal fusion) takes one learning rate per member:
//! `lrs.len()` equal parts of the flat buffer each use their own rate.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// SGD hyper-parameters, PyTorch semantics (`torch.optim.SGD`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams<'a> {
    /// One learning rate, or one per member (the buffer splits into `lrs.len()` equal parts).
    pub lrs: &'a [f64],
    /// Momentum factor (0: plain SGD, no buffer needed).
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// Adam / AdamW hyper-parameters, PyTorch semantics (`torch.optim.Adam`, `AdamW`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams<'a> {
    /// One learning rate, or one per member (the buffer splits into `lrs.len()` equal parts).
    pub lrs: &'a [f64],
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: L2 on the gradient (Adam) or decoupled (AdamW).
    pub weight_decay: f64,
    /// AdamW: `p *= 1 - lr·wd` instead of adding `wd·p` to the gradient.
    pub decoupled: bool,
    /// 1-based step number (after this update), for bias correction.
    pub step: u64,
}
