//! Dynamic loss scaling for float16 mixed precision, as PyTorch's `torch.amp.GradScaler` does it.
//!
//! f16 holds nothing below 6·10⁻⁸, and small gradients vanish in its products. The loss is multiplied by
//! a scale before the backward pass, so the gradients it yields are scaled too; before the update they
//! are divided by it again. Where any of them came out infinite or NaN (the scale was too large), the
//! update is skipped and the scale halved; after [`GROWTH_INTERVAL`] clean steps in a row it doubles.
//! bfloat16 has f32's range and needs none of this.

use cohort_autograd::Var;
use cohort_tensor::Tensor;
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

/// The scale and its clean-step count: kept in a checkpoint so a resumed run goes on with the same scale.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    scale: f64,
    clean: u64,
    skipped: u64,
}

impl Default for LossScaler {
    fn default() -> LossScaler {
        LossScaler {
            scale: INITIAL_SCALE,
            clean: 0,
            skipped: 0,
        }
    }
}

impl LossScaler {
    /// A scaler at [`INITIAL_SCALE`].
    #[must_use]
    pub fn new() -> LossScaler {
        LossScaler::default()
    }

    /// The factor the loss is multiplied by now.
    #[must_use]
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Updates skipped so far (gradients not finite).
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// `loss` times the scale: what the backward pass starts from.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn scaled(&self, loss: &Var) -> Result<Var> {
        Ok(loss.mul_scalar(self.scale)?)
    }

    /// After the backward pass of a [`scaled`](LossScaler::scaled) loss: divides `opt`'s gradients by
    /// the scale and steps it if all of them are finite, otherwise leaves the parameters as they are.
    /// Either way the scale moves on (see the module docs). Returns whether the update ran. Reads one
    /// number back from the device, as PyTorch's scaler does before its step.
    ///
    /// # Errors
    /// When a tensor op or the update fails.
    pub fn step(&mut self, opt: &mut Optimizer) -> Result<bool> {
        let grads = opt.grads();
        if !all_finite(&grads)? {
            self.skipped += 1;
            self.clean = 0;
            self.scale = (self.scale * 0.5).max(MIN_SCALE);
            return Ok(false);
        }
        let inv = 1.0 / self.scale;
        for g in &grads {
            g.assign_(&g.mul_scalar(inv)?)?;
        }
        opt.step()?;
        self.clean += 1;
        if self.clean >= GROWTH_INTERVAL {
            self.clean = 0;
            self.scale = (self.scale * 2.0).min(MAX_SCALE);
        }
        Ok(true)
    }
}

/// Whether every element of `grads` is finite: one sum over all of them (an infinity or NaN anywhere
/// makes it one too), read back once.
fn all_finite(grads: &[Tensor]) -> Result<bool> {
    let mut total: Option<Tensor> = None;
    for g in grads {
        let s = g.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&s)?,
            None => s,
        });
    }
    Ok(match total {
        Some(t) => t.to_vec::<f32>()?.iter().all(|v| v.is_finite()),
        None => true,
    })
}

#[cfg(test)]
mod tests {
    use cohort_autograd::{BuildOptions, ModelSpec, Tape, loss};
    use cohort_tensor::{DType, Device};

    use super::*;
    use crate::{OptimConfig, Schedule};

    fn setup() -> (cohort_autograd::Model, Optimizer, Tensor, Tensor) {
        let dev = Device::Cpu;
        let spec = ModelSpec::from_toml(r#"layers = [{ linear = 3 }]"#).unwrap();
        let model = spec.build(&[4], &BuildOptions::new(1, 0, dev)).unwrap();
        let opt = Optimizer::new(OptimConfig::sgd(0.1), model.params())
            .unwrap()
            .with_schedule(Schedule::Constant);
        let x = Tensor::rand_uniform(&[8, 4], -1.0, 1.0, DType::F32, 1, &dev).unwrap();
        let y = Tensor::from_vec(vec![0i32, 1, 2, 0, 1, 2, 0, 1], &[8], &dev).unwrap();
        (model, opt, x, y)
    }

    fn weights(model: &cohort_autograd::Model) -> Vec<f32> {
        model.params()[0].value().to_vec::<f32>().unwrap()
    }

    #[test]
    fn a_scaled_step_equals_the_plain_one() {
        let (model, mut opt, x, y) = setup();
        let (plain_model, mut plain_opt, ..) = setup();
        let mut scaler = LossScaler::new();
        let tape = Tape::new();
        let l = loss::cross_entropy(&model.forward(&tape, &x).unwrap(), &y).unwrap();
        tape.backward(&scaler.scaled(&l).unwrap()).unwrap();
        assert!(scaler.step(&mut opt).unwrap());
        let tape = Tape::new();
        let l = loss::cross_entropy(&plain_model.forward(&tape, &x).unwrap(), &y).unwrap();
        tape.backward(&l).unwrap();
        plain_opt.step().unwrap();
        for (a, b) in weights(&model).iter().zip(weights(&plain_model)) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        assert_eq!((scaler.scale(), scaler.skipped()), (INITIAL_SCALE, 0));
    }

    #[test]
    fn an_overflow_skips_the_update_and_halves_the_scale() {
        let (model, mut opt, x, y) = setup();
        let before = weights(&model);
        let mut scaler = LossScaler::new();
        let tape = Tape::new();
        let l = loss::cross_entropy(&model.forward(&tape, &x).unwrap(), &y).unwrap();
        tape.backward(&l.mul_scalar(f64::INFINITY).unwrap())
            .unwrap();
        assert!(!scaler.step(&mut opt).unwrap());
        assert_eq!(
            weights(&model),
            before,
            "a skipped step changed the weights"
        );
        assert_eq!(opt.steps(), 0);
        assert_eq!((scaler.scale(), scaler.skipped()), (INITIAL_SCALE / 2.0, 1));
    }

    #[test]
    fn the_scale_doubles_after_its_interval_of_clean_steps() {
        let (model, mut opt, x, y) = setup();
        let mut scaler = LossScaler {
            clean: GROWTH_INTERVAL - 1,
            ..LossScaler::new()
        };
        let tape = Tape::new();
        let l = loss::cross_entropy(&model.forward(&tape, &x).unwrap(), &y).unwrap();
        tape.backward(&scaler.scaled(&l).unwrap()).unwrap();
        assert!(scaler.step(&mut opt).unwrap());
        assert_eq!(scaler.scale(), INITIAL_SCALE * 2.0);
        opt.zero_grad();
    }
}
