//! Layers with a leading member dimension `M`: `M` same-shaped models run as one batched model, and `M = 1` is the
//! ordinary single model through the same code.
//!
//! Activations travel between layers as a [`Features`]: a [`Var`] and its [`Layout`]. Dense features are
//! member-major (`[M, B, ..]`); convolution features keep the members inside the channels (`[B, M*C, H, W]`), so a
//! fused convolution is one grouped convolution; the model's input is shared by all members (`[B, ..]`).
//! Sequences may carry a padding mask beside their value ([`Features::mask`]).

mod activation;
mod attention;
mod batchnorm;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod norm;
mod pool;
mod positional;
mod residual;
mod sequential;
mod transformer;

pub use activation::{Activation, ActivationKind};
pub use attention::{AttentionSpec, MultiHeadAttention};
pub use batchnorm::{BatchNorm, BatchNormSpec};
pub use conv::{Conv2d, ConvSpec, Flatten, Sequence, SequenceSpec};
pub use dropout::{Dropout, DropoutSpec};
pub use embedding::{Embedding, EmbeddingBag, EmbeddingSpec};
pub use linear::{Linear, LinearSpec};
pub use norm::{LayerNorm, LayerNormSpec};
pub(crate) use pool::global_avgpool_output;
pub use pool::{
    AvgPool2d, GlobalAvgPool, MaxPool2d, PoolMode, PoolSpec, SequencePool, SequencePoolSpec,
};
pub use positional::{PositionalEmbedding, PositionalSpec};
pub use residual::{Residual, ResidualSpec};
pub use sequential::Sequential;
pub use transformer::{TransformerBlock, TransformerSpec};

use std::fmt::Debug;

use cohort_tensor::{DType, Device, Tensor};

use crate::{Error, Param, Result, Tape, Var};

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
    /// Which positions of a sequence are real tokens: 1 real, 0 padding, in the value's float dtype; `[B, L]`
    /// when all members see the same tokens, `[M, B, L]` when each sees its own. `None`: every position is real.
    /// [`Embedding::with_padding`] sets it; layers that keep the sequence pass it on, attention ignores padded keys
    /// and a mean [`SequencePool`] padded positions.
    pub mask: Option<Tensor>,
}

impl Features {
    /// Input shared by every member (`[B, ..]`).
    pub fn shared(var: Var) -> Features {
        Features::new(var, Layout::Shared)
    }

    /// One input per member (`[M, B, ..]`).
    pub fn members(var: Var) -> Features {
        Features::new(var, Layout::Members)
    }

    /// Convolution features with the members inside the channels (`[B, M*C, H, W]`).
    pub fn packed(var: Var) -> Features {
        Features::new(var, Layout::Packed)
    }

    /// `var` in `layout`, without a padding mask.
    pub fn new(var: Var, layout: Layout) -> Features {
        Features {
            var,
            layout,
            mask: None,
        }
    }

    /// The same features with padding mask `mask` (see [`Features::mask`]).
    pub fn with_mask(mut self, mask: Option<Tensor>) -> Features {
        self.mask = mask;
        self
    }

    /// A layer's output `var` in `layout` for these input features, keeping their padding mask (for layers that
    /// keep the sequence).
    pub fn keep_mask(&self, var: Var, layout: Layout) -> Features {
        Features::new(var, layout).with_mask(self.mask.clone())
    }

    /// The same features with a 16-bit value cast to f32 (recorded: the gradient goes back in the 16-bit type).
    ///
    /// # Errors
    /// When the cast fails.
    pub fn in_f32(mut self) -> Result<Features> {
        if matches!(self.var.value().dtype(), DType::BF16 | DType::F16) {
            self.var = self.var.to_dtype(DType::F32)?;
        }
        Ok(self)
    }

    /// The padding mask as `[M or 1, B, L]` in `dtype`, ready to broadcast against per-member values.
    ///
    /// # Errors
    /// When the mask is not of rank 2 or 3, or cannot be cast.
    pub(crate) fn member_mask(&self, dtype: DType) -> Result<Option<Tensor>> {
        let Some(m) = &self.mask else {
            return Ok(None);
        };
        let s = m.shape().to_vec();
        let m = match s.len() {
            2 => m.reshape(&[1, s[0], s[1]])?,
            3 => m.clone(),
            _ => {
                return Err(Error::Shape {
                    op: "mask",
                    reason: format!("a padding mask is [B, L] or [M, B, L], got {s:?}"),
                });
            }
        };
        Ok(Some(m.to_dtype(dtype)?))
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

    /// The layer, a ReLU, then the max pool `pool`, in fewer passes where the layer can reorder them (a
    /// convolution adds its bias and applies the ReLU after the pool, at a quarter of the size for 2x2 windows);
    /// `None` where it cannot.
    fn forward_relu_max_pool(
        &self,
        tape: &Tape,
        x: Features,
        pool: &MaxPool2d,
    ) -> Option<Result<Features>> {
        let _ = (tape, x, pool);
        None
    }

    /// The layer as a max pool, where it is one (for [`Module::forward_relu_max_pool`]).
    fn as_max_pool(&self) -> Option<&MaxPool2d> {
        None
    }

    /// Whether the layer takes features in a 16-bit type. Under a mixed policy on CUDA convolutions give their
    /// output in the low type, as autocast does, and the layers that take it keep it so (half the memory traffic
    /// and saved memory); a [`Sequential`] gives every other layer (a user's own among them) its input in f32.
    fn takes_16bit(&self) -> bool {
        false
    }

    /// Parameters with their names relative to the layer (`weight`, `bias`).
    fn params(&self) -> Vec<(String, Param)>;

    /// Non-trainable state (a batch norm's running statistics), named like parameters (`running_mean`) so that
    /// checkpoints save it; the optimizer never sees it.
    fn buffers(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    /// Sets every dropout layer's count of masks drawn to `n` (a resumed or rebuilt model continues the mask
    /// sequences where `n` training passes left them); layers holding others pass it on.
    fn set_masks_drawn(&self, n: u64) {
        let _ = n;
    }

    /// Gives the model's top-level dropout layers, in order, a rate per member each (a fused group whose members
    /// differ only in their dropout rates); layers that hold a sequence of others pass it on.
    fn set_dropout_rates(&self, rates: &mut dyn Iterator<Item = Vec<f64>>) {
        let _ = rates;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_mask_gives_shared_masks_a_member_axis() {
        let dev = Device::Cpu;
        let x = Features::shared(Var::constant(
            Tensor::zeros(&[2, 3, 4], DType::F32, &dev).unwrap(),
        ));
        assert!(x.member_mask(DType::F32).unwrap().is_none());
        let shared = Tensor::ones(&[2, 3], DType::F64, &dev).unwrap();
        let m = x
            .clone()
            .with_mask(Some(shared))
            .member_mask(DType::F32)
            .unwrap()
            .unwrap();
        assert_eq!((m.shape(), m.dtype()), (&[1, 2, 3][..], DType::F32));
        let own = Tensor::ones(&[4, 2, 3], DType::F32, &dev).unwrap();
        let kept = x
            .keep_mask(x.var.clone(), Layout::Members)
            .with_mask(Some(own));
        assert_eq!(
            kept.member_mask(DType::F32).unwrap().unwrap().shape(),
            &[4, 2, 3]
        );
        let bad = x.with_mask(Some(Tensor::ones(&[3], DType::F32, &dev).unwrap()));
        assert!(bad.member_mask(DType::F32).is_err());
    }
}
