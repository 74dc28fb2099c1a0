//! cohort-optim: SGD (momentum, Nesterov, weight decay), Adam and AdamW over
//! [`Param`](cohort_autograd::Param)s, learning-rate schedules, a learning rate per member for fused models, and
//! state for checkpoints.
//!
//! Adam and AdamW update every parameter in one call (`Tensor::adam_step_many_`: one fused launch on the GPU);
//! SGD likewise (`Tensor::sgd_step_many_`), covering all members of a fused parameter.
//!
//! ```
//! use cohort_autograd::{BuildOptions, ModelSpec, Tape, loss};
//! use cohort_optim::{OptimConfig, Optimizer, Schedule};
//! use cohort_tensor::{DType, Device, Tensor};
//!
//! let spec = ModelSpec::from_toml(r#"layers = [{ linear = 3 }]"#).unwrap();
//! let model = spec.build(&[4], &BuildOptions::new(1, 0, Device::Cpu))?;
//! let mut opt = Optimizer::new(OptimConfig::adam(1e-3), model.params())?.with_schedule(Schedule::Constant);
//! let x = Tensor::rand_uniform(&[8, 4], -1.0, 1.0, DType::F32, 1, &Device::Cpu)?;
//! let y = Tensor::from_vec(vec![0i32, 1, 2, 0, 1, 2, 0, 1], &[8], &Device::Cpu)?;
//! let tape = Tape::new();
//! let l = loss::cross_entropy(&model.forward(&tape, &x)?, &y)?;
//! tape.backward(&l)?;
//! opt.step()?;
//! opt.zero_grad();
//! assert_eq!(opt.steps(), 1);
//! # Ok::<(), cohort_optim::Error>(())
//! ```

mod loss_scale;
mod optimizer;
mod schedule;

pub use loss_scale::{LossScale, LossScaler};
pub use optimizer::{OptimConfig, Optimizer, OptimizerState};
pub use schedule::Schedule;

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong in an optimizer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] cohort_tensor::Error),
    /// From the model side (parameters).
    #[error(transparent)]
    Autograd(#[from] cohort_autograd::Error),
    /// A hyper-parameter is out of range.
    #[error("{name} = {value}: {reason}")]
    Config {
        /// The hyper-parameter.
        name: &'static str,
        /// Its value.
        value: f64,
        /// The valid range.
        reason: &'static str,
    },
    /// A saved state does not fit this optimizer.
    #[error("optimizer state `{name}`: {reason}")]
    State {
        /// The tensor's name (`layers.0.weight.exp_avg`) or the field.
        name: String,
        /// What does not fit.
        reason: String,
    },
    /// Learning rates per member given for a model with another member count.
    #[error("{given} learning rates for {members} members; give one, or one per member")]
    MemberLrs {
        /// How many were given.
        given: usize,
        /// How many members the parameters have.
        members: usize,
    },
}
