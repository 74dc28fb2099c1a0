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

/// Dynamic loss scaling's state (GradScaler's, kept on the device beside the parameters), four f32:
/// whether this step's gradients overflowed (non-zero), the scale the loss is multiplied by, clean
/// steps in a row, and steps skipped so far. Counts are f32 so that one f32 tensor holds the state;
/// they are exact to 2^24. `unscale_f32` and `update_scale_f32` in `optim.cu` read this layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LossScaleState {
    /// Non-zero once a gradient of this step is not finite; cleared by the update.
    pub overflow: f32,
    /// The factor on the loss.
    pub scale: f32,
    /// Steps in a row whose gradients were finite.
    pub clean: f32,
    /// Steps whose update was skipped.
    pub skipped: f32,
}

impl LossScaleState {
    /// The f32 elements of a state tensor.
    pub const LEN: usize = size_of::<LossScaleState>() / size_of::<f32>();

    /// Its elements, in the order a state tensor holds them.
    #[must_use]
    pub fn to_array(self) -> [f32; Self::LEN] {
        bytemuck::cast(self)
    }

    /// The state four f32 read back from a state tensor hold; `None` for another count.
    #[must_use]
    pub fn from_slice(v: &[f32]) -> Option<LossScaleState> {
        <[f32; Self::LEN]>::try_from(v).ok().map(bytemuck::cast)
    }
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
