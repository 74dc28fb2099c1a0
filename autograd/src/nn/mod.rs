//! Layers with a leading member dimension `M`: `M` same-shaped models run as one batched model, and `M = 1` is the
//! ordinary single model through the same code.
//!
//! Activations travel between layers as a [`Features`]: a [`Var`] and its [`Layout`]. Dense features are
//! member-major (`[M, B, ..]`); convolution features keep the members inside the channels (`[B, M*C, H, W]`), so a
//! fused convolution is one grouped convolution; the model's input is shared by all members (`[B, ..]`).

mod activation;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod norm;
mod sequential;

pub use activation::{Activation, ActivationKind};
pub use conv::{Conv2d, ConvSpec, Flatten, MaxPool2d, PoolSpec};
pub use dropout::{Dropout, DropoutSpec};
pub use embedding::{Embedding, EmbeddingBag, EmbeddingSpec};
pub use linear::{Linear, LinearSpec};
pub use norm::{LayerNorm, LayerNormSpec};
pub use sequential::Sequential;

use std::fmt::Debug;

use cohort_tensor::{DType, Device, Tensor};

use crate::{Param, Result, Tape, Var};

/// Where the member dimension is in a [`Features`] value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// No member dimension: one value for all members (`[B, ..]`), as the model's input.
    Shared,
    /// Member-major: `[M, B, ..]`.
    Members,
    /// Members inside the channels of an image: `[B, M*C, H, W]`.
    Packed,
}

/// A value flowing between layers.
#[derive(Clone, Debug)]
pub struct Features {
    /// The value.
    pub var: Var,
    /// Where its member dimension is.
    pub layout: Layout,
}

impl Features {
    /// Input shared by every member (`[B, ..]`).
    pub fn shared(var: Var) -> Features {
        Features {
            var,
            layout: Layout::Shared,
        }
    }

    /// One input per member (`[M, B, ..]`).
    pub fn members(var: Var) -> Features {
        Features {
            var,
            layout: Layout::Members,
        }
    }

    /// The value as `[M, B, ..]` for `members` members (unpacking channels, broadcasting a shared value).
    ///
    /// # Errors
    /// When the shape does not hold `members` members.
    pub fn into_members(self, members: usize) -> Result<Var> {
        match self.layout {
            Layout::Members => Ok(self.var),
            Layout::Shared => {
                let mut s = vec![members];
                s.extend_from_slice(self.var.shape());
                self.var.broadcast_to(&s)
            }
            Layout::Packed => {
                let s = self.var.shape().to_vec();
                let (b, mc) = (s[0], s[1]);
                let mut split = vec![b, members, mc / members.max(1)];
                split.extend_from_slice(&s[2..]);
                let v = self.var.reshape(&split)?;
                if members == 1 {
                    let mut t = vec![1, b];
                    t.extend_from_slice(&split[2..]);
                    return v.reshape(&t);
                }
                v.swap_leading()
            }
        }
    }
}

/// A layer: forward on [`Features`], named parameters with the member dimension first.
pub trait Module: Debug + Send + Sync {
    /// Runs the layer, recording on `tape` (parameters enter it with [`Tape::param`]).
    ///
    /// # Errors
    /// When the input's shape or layout does not fit the layer.
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features>;

    /// The layer followed by a ReLU, in fewer passes where the layer can fuse it (a Linear layer with a bias
    /// adds the bias and applies the ReLU in one kernel); `None` where it cannot.
    fn forward_relu(&self, tape: &Tape, x: Features) -> Option<Result<Features>> {
        let _ = (tape, x);
        None
    }

    /// Parameters with their names relative to the layer (`weight`, `bias`).
    fn params(&self) -> Vec<(String, Param)>;

    /// Non-trainable state saved with the parameters (running statistics), named like them.
    fn buffers(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    /// The kind, as written in a model spec (`linear`, `conv`, ...).
    fn kind(&self) -> &'static str;
}

/// Initial values for `members` members, each from its own seed: `[M, ..shape]`.
pub(crate) fn init_normal(
    shape: &[usize],
    std: f64,
    seeds: &[u64],
    salt: u64,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let parts = seeds
        .iter()
        .map(|&s| Tensor::rand_normal(shape, 0.0, std, dtype, mix(s, salt), dev))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    Ok(Tensor::stack(&refs, 0)?)
}

/// `[M, ..shape]` filled with `value`.
pub(crate) fn init_full(
    shape: &[usize],
    value: f64,
    members: usize,
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let mut s = vec![members];
    s.extend_from_slice(shape);
    Ok(Tensor::full(&s, value, dtype, dev)?)
}

/// A seed for one parameter of one member (splitmix64 of both), so that member `m` of a fused model is initialized
/// exactly as a lone model with member `m`'s seed.
pub(crate) fn mix(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `[M, 1, .., 1, D]` view of a per-member vector parameter for a value of rank `rank` whose last dim is `D`.
pub(crate) fn per_member(p: &Var, rank_with_members: usize) -> Result<Var> {
    let s = p.shape();
    let mut t = vec![s[0]];
    t.extend(std::iter::repeat_n(1, rank_with_members.saturating_sub(2)));
    t.push(s[1]);
    p.reshape(&t)
}
