//! cohort-autograd: reverse-mode differentiation on a tape, nn layers with named parameters, losses.
//!
//! A [`Tape`] records operations on [`Var`]s (like `tf.GradientTape`); [`Tape::backward`] accumulates gradients into
//! the [`Param`]s that entered the tape. Every layer carries a leading member dimension `M`, so `M` models of one
//! [`ModelSpec`] train as one batched model; `M = 1` is the ordinary case.
//!
//! [`spec`] is the layer vocabulary: a model written as TOML (`layers = [{ conv = 16 }, ...]`), read once into typed
//! specs that sit beside their layers in [`nn`] (`LinearSpec` next to `Linear`), checked against the input's shape
//! and built. A network of one's own is any [`nn::Module`] wrapped by [`Model::new`].
//!
//! ```
//! use cohort_autograd::{BuildOptions, ModelSpec, Tape, loss};
//! use cohort_tensor::{Device, Tensor};
//!
//! let spec = ModelSpec::from_toml(r#"layers = [{ linear = 8, act = "relu" }, { linear = 3 }]"#).unwrap();
//! let model = spec.build(&[4], &BuildOptions::new(2, 7, Device::Cpu))?; // two members
//! let x = Tensor::rand_uniform(&[5, 4], -1.0, 1.0, cohort_tensor::DType::F32, 1, &Device::Cpu)?;
//! let y = Tensor::from_vec(vec![0i32, 1, 2, 0, 1], &[5], &Device::Cpu)?;
//! let tape = Tape::new();
//! let logits = model.forward(&tape, &x)?; // [2, 5, 3]
//! let l = loss::cross_entropy(&logits, &y)?; // [2]: one loss per member
//! tape.backward(&l)?;
//! assert_eq!(model.params()[0].grad().unwrap().shape(), &[2, 4, 8]);
//! # Ok::<(), cohort_autograd::Error>(())
//! ```

mod backward;
mod error;
pub mod loss;
pub mod nn;
mod ops;
mod param;
pub mod spec;
mod tape;

pub use error::{Error, Result};
pub use param::Param;
pub use spec::{BuildOptions, LayerSpec, Model, ModelSpec, Shape, SpecError};
pub use tape::{Gradients, Tape, Var};
