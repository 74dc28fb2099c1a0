//! Dynamic loss scaling for float16 mixed precision, as PyTorch's `torch.amp.GradScaler` does it.
//!
//! f16 holds nothing below 6·10⁻⁸, and small gradients vanish in its products. The loss is multiplied by
//! a scale before the backward pass, so the gradients it yields are scaled too; before the update they
//! are divided by it again. Where any of them came out infinite or NaN (the scale was too large), the
//! update is skipped and the scale halved; after [`GROWTH_INTERVAL`] clean steps in a row it doubles.
//! bfloat16 has f32's range and needs none of this.
//!
//! The scale, its counts and the overflow flag live on the model's device (as the capturable
//! GradScaler keeps them), and every step of the scaler runs there: the optimizer's fused update reads
//! the flag and skips itself. No step waits on a read-back, so a scaled step can be captured in a CUDA
//! graph and replayed; the host reads the scale when it wants to tell it ([`LossScaler::read_later`]).

use cohort_autograd::Var;
use cohort_tensor::{Device, HostRead, LossScaleState, Tensor};
use serde::{Deserialize, Serialize};

use crate::{Optimizer, Result};

/// The first scale: PyTorch's default, 2¹⁶.
pub const INITIAL_SCALE: f64 = 65536.0;
/// Clean steps in a row after which the scale doubles (PyTorch's default).
pub const GROWTH_INTERVAL: u64 = 2000;
/// The scale never falls below this: a loss that overflows even unscaled is the model's, not the
/// scaler's, and shows up as a non-finite loss.
const MIN_SCALE: f64 = 1.0;
/// Nor rises above f16's largest finite value.
const MAX_SCALE: f64 = 65504.0 * 65536.0;

/// A loss scale as the host sees it: the scale, its clean-step count and the steps skipped so far.
/// Kept in a checkpoint so a resumed run goes on with the same scale.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The factor the loss is multiplied by.
    pub scale: f64,
    /// Steps in a row whose gradients were finite.
    pub clean: u64,
    /// Updates skipped so far (gradients not finite).
    pub skipped: u64,
}

impl Default for LossScale {
    fn default() -> LossScale {
        LossScale {
            scale: INITIAL_SCALE,
            clean: 0,
            skipped: 0,
        }
    }
}

impl LossScale {
    /// The scale a state read back holds (see [`LossScaler::read_later`]).
    ///
    /// # Errors
    /// A read of another length than a loss scale state's.
    pub fn from_state(state: &[f32]) -> Result<LossScale> {
        let s = LossScaleState::from_slice(state).ok_or_else(|| crate::Error::State {
            name: "loss_scale".into(),
            reason: format!(
                "{} values read back where a loss scale state has {}",
                state.len(),
                LossScaleState::LEN
            ),
        })?;
        Ok(LossScale {
            scale: f64::from(s.scale),
            clean: s.clean as u64,
            skipped: s.skipped as u64,
        })
    }

    /// The state a scaler starts from, flag down.
    fn state(self) -> LossScaleState {
        LossScaleState {
            overflow: 0.0,
            scale: self.scale as f32,
            clean: self.clean as f32,
            skipped: self.skipped as f32,
        }
    }
}

/// Dynamic loss scaling on a device: the scale, its counts and the overflow flag in one tensor there.
#[derive(Clone, Debug)]
pub struct LossScaler {
    state: Tensor,
}

impl LossScaler {
    /// A scaler on `dev` going on from `start` ([`LossScale::default`] for a new run).
    ///
    /// # Errors
    /// Out of memory.
    pub fn new(start: LossScale, dev: &Device) -> Result<LossScaler> {
        let state = Tensor::loss_scale_state(start.state(), dev)?;
        Ok(LossScaler { state })
    }

    /// `loss` times the scale: what the backward pass starts from. The scale is read on the device.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn scaled(&self, loss: &Var) -> Result<Var> {
        let scale = Var::constant(self.state.narrow(0, 1, 1)?);
        Ok(loss.mul(&scale)?)
    }

    /// After the backward pass of a [`scaled`](LossScaler::scaled) loss: divides `opt`'s gradients by
    /// the scale and steps it unless one of them is not finite, then moves the scale on (see the
    /// module docs). Queued on the device, nothing read back; a skipped step counts as a step of
    /// `opt` all the same, as PyTorch's schedulers step past one.
    ///
    /// # Errors
    /// When a tensor op or the update fails.
    pub fn step(&self, opt: &mut Optimizer) -> Result<()> {
        let grads = opt.grads();
        Tensor::unscale_grads_(&grads.iter().collect::<Vec<_>>(), &self.state)?;
        opt.step_unless(Some(&self.state))?;
        Tensor::update_loss_scale_(&self.state, GROWTH_INTERVAL, MIN_SCALE, MAX_SCALE)?;
        Ok(())
    }

    /// The scale now, waiting for the device's steps to finish.
    ///
    /// # Errors
    /// A device error.
    pub fn read(&self) -> Result<LossScale> {
        LossScale::from_state(&self.state.to_vec::<f32>()?)
    }

    /// The scale as of the steps queued so far, on its way to the host (see
    /// [`LossScale::from_state`]).
    ///
    /// # Errors
    /// A device error.
    pub fn read_later(&self) -> Result<HostRead> {
        Ok(self.state.read_later()?)
    }
}

#[cfg(test)]
mod tests {
    use cohort_autograd::{BuildOptions, ModelSpec, Tape, loss};
    use cohort_tensor::DType;

    use super::*;
    use crate::{OptimConfig, Schedule};

    const CPU: Device = Device::Cpu;

    fn setup(config: OptimConfig) -> (cohort_autograd::Model, Optimizer, Tensor, Tensor) {
        let spec = ModelSpec::from_toml(r#"layers = [{ linear = 3 }]"#).unwrap();
        let model = spec.build(&[4], &BuildOptions::new(1, 0, CPU)).unwrap();
        let opt = Optimizer::new(config, model.params())
            .unwrap()
            .with_schedule(Schedule::Constant);
        let x = Tensor::rand_uniform(&[8, 4], -1.0, 1.0, DType::F32, 1, &CPU).unwrap();
        let y = Tensor::from_vec(vec![0i32, 1, 2, 0, 1, 2, 0, 1], &[8], &CPU).unwrap();
        (model, opt, x, y)
    }

    fn weights(model: &cohort_autograd::Model) -> Vec<f32> {
        model.params()[0].value().to_vec::<f32>().unwrap()
    }

    /// Back-propagates the model's loss times `factor` (on top of the scaler's scale where one is given).
    fn backward(
        model: &cohort_autograd::Model,
        x: &Tensor,
        y: &Tensor,
        scaler: Option<&LossScaler>,
        factor: f64,
    ) {
        let tape = Tape::new();
        let l = loss::cross_entropy(&model.forward(&tape, x).unwrap(), y).unwrap();
        let l = match scaler {
            Some(s) => s.scaled(&l).unwrap(),
            None => l,
        };
        tape.backward(&l.mul_scalar(factor).unwrap()).unwrap();
    }

    #[test]
    fn a_scaled_step_equals_the_plain_one() {
        for config in [OptimConfig::adam(1e-2), OptimConfig::sgd(0.1)] {
            let (model, mut opt, x, y) = setup(config.clone());
            let (plain_model, mut plain_opt, ..) = setup(config);
            let scaler = LossScaler::new(LossScale::default(), &CPU).unwrap();
            backward(&model, &x, &y, Some(&scaler), 1.0);
            scaler.step(&mut opt).unwrap();
            backward(&plain_model, &x, &y, None, 1.0);
            plain_opt.step().unwrap();
            for (a, b) in weights(&model).iter().zip(weights(&plain_model)) {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
            }
            let want = LossScale {
                scale: INITIAL_SCALE,
                clean: 1,
                skipped: 0,
            };
            assert_eq!(scaler.read().unwrap(), want);
            assert_eq!(opt.steps(), 1);
        }
    }

    #[test]
    fn an_overflow_skips_the_update_and_halves_the_scale() {
        // SGD with dampened momentum starts its buffer from the first gradient: an overflowed one must not.
        let dampened = OptimConfig::Sgd {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.5,
            weight_decay: 0.0,
            nesterov: false,
        };
        for config in [OptimConfig::adam(1e-2), OptimConfig::sgd(0.1), dampened] {
            let (model, mut opt, x, y) = setup(config);
            let before = weights(&model);
            let scaler = LossScaler::new(LossScale::default(), &CPU).unwrap();
            backward(&model, &x, &y, Some(&scaler), f64::INFINITY);
            scaler.step(&mut opt).unwrap();
            opt.zero_grad();
            assert_eq!(
                weights(&model),
                before,
                "a skipped step changed the weights"
            );
            // Adam's moments start at zero whatever the gradient; a dampened momentum buffer would not.
            for (name, t) in opt.state_dict().tensors {
                let v = t.to_vec::<f32>().unwrap();
                assert!(
                    v.iter().all(|&x| x == 0.0),
                    "a skipped step moved {name}: {v:?}"
                );
            }
            assert_eq!(opt.steps(), 1, "a skipped step counts as a step");
            let want = LossScale {
                scale: INITIAL_SCALE / 2.0,
                clean: 0,
                skipped: 1,
            };
            assert_eq!(scaler.read().unwrap(), want);
            // The flag cleared: the next, finite step updates.
            backward(&model, &x, &y, Some(&scaler), 1.0);
            scaler.step(&mut opt).unwrap();
            assert_ne!(
                weights(&model),
                before,
                "the step after a skip did not update"
            );
            assert_eq!(scaler.read().unwrap().clean, 1);
        }
    }

    #[test]
    fn the_scale_doubles_after_its_interval_of_clean_steps() {
        let (model, mut opt, x, y) = setup(OptimConfig::adam(1e-3));
        let start = LossScale {
            clean: GROWTH_INTERVAL - 1,
            ..LossScale::default()
        };
        let scaler = LossScaler::new(start, &CPU).unwrap();
        backward(&model, &x, &y, Some(&scaler), 1.0);
        scaler.step(&mut opt).unwrap();
        let want = LossScale {
            scale: INITIAL_SCALE * 2.0,
            clean: 0,
            skipped: 0,
        };
        assert_eq!(scaler.read().unwrap(), want);
        let read = scaler.read_later().unwrap().wait::<f32>().unwrap();
        assert_eq!(LossScale::from_state(&read).unwrap(), want);
        assert!(LossScale::from_state(&read[..3]).is_err());
    }
}
