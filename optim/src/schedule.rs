use serde::{Deserialize, Serialize};

/// A learning-rate schedule: a factor applied to the base rate at each step (counted from 0).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Schedule {
    /// Always the base rate.
    #[default]
    Constant,
    /// Multiplied by `gamma` every `every` steps (PyTorch `StepLR`).
    Step {
        /// Steps between decays.
        every: u64,
        /// Factor per decay.
        gamma: f64,
    },
    /// Cosine from the base rate to `min_factor` times it over `total` steps, then flat (PyTorch
    /// `CosineAnnealingLR` with `eta_min = min_factor * lr`).
    Cosine {
        /// Steps of the decay.
        total: u64,
        /// Final factor.
        #[serde(default)]
        min_factor: f64,
    },
    /// Linear warm-up from `1 / (steps + 1)` to 1 over `steps` steps, then `then` (counted from the warm-up's end).
    Warmup {
        /// Warm-up steps.
        steps: u64,
        /// The schedule after the warm-up.
        then: Box<Schedule>,
    },
}

impl Schedule {
    /// The factor at `step` (0 for the first update).
    pub fn factor(&self, step: u64) -> f64 {
        match self {
            Schedule::Constant => 1.0,
            Schedule::Step { every, gamma } => gamma.powi((step / (*every).max(1)) as i32),
            Schedule::Cosine { total, min_factor } => {
                let t = step.min(*total) as f64 / (*total).max(1) as f64;
                min_factor + (1.0 - min_factor) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            Schedule::Warmup { steps, then } => {
                if step < *steps {
                    (step + 1) as f64 / (*steps + 1) as f64
                } else {
                    then.factor(step - steps)
                }
            }
        }
    }
}
