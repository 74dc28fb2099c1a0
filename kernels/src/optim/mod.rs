//! Fused optimizer steps: one pass over a parameter updates it and its state.
//!
//! A parameter with a leading member dim (horizontal fusion) takes one learning rate per member:
//! `lrs.len()` equal parts of the flat buffer each use their own rate.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// Adam's bias correction `1 - beta^step` (1-based `step`), the power taken by squaring in f64: the operations
/// `adam_f32_counted` in `optim.cu` repeats on the device, so that a step replayed from a CUDA graph scales its
/// update by the bits an eager step uses (the library `powi` and the device's `pow` need not round alike).
pub fn bias_correction(beta: f64, step: u64) -> f64 {
    let (mut power, mut base, mut n) = (1.0f64, beta, step);
    while n > 0 {
        if n & 1 == 1 {
            power *= base;
        }
        base *= base;
        n >>= 1;
    }
    1.0 - power
}

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

#[cfg(test)]
mod tests {
    use super::bias_correction;

    #[test]
    fn bias_correction_is_one_less_the_power() {
        assert_eq!(bias_correction(0.9, 1), 1.0 - 0.9);
        assert_eq!(bias_correction(0.5, 3), 0.875);
        for (beta, step) in [(0.9, 7), (0.999, 10), (0.999, 1000), (0.999, 123_457)] {
            let want = 1.0 - f64::powf(beta, step as f64);
            let got = bias_correction(beta, step);
            assert!(
                (got - want).abs() <= 1e-12 * want,
                "{beta}^{step}: {got} against {want}"
            );
        }
    }
}
