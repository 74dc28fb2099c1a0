use cohort_tensor::{DType, Device, RunningStats};
use serde::Serialize;

use super::{ActivationKind, Features, Layout, Module, init_full};
use crate::spec::{Fields, LayerCtx, Shape, SpecResult};
use crate::{Error, Param, Result, Tape, Var};

/// Batch normalization per member and channel: `weight`, `bias` `[M, C]`, running statistics `running_mean`,
/// `running_var` `[M, C]` (buffers); a ReLU after it runs in its kernels ([`Module::forward_relu`]).
///
/// Statistics are taken per channel over every dimension but the member's and the channel's: over `B, H, W` for
/// images (`[B, M*C, H, W]` packed, `[B, C, H, W]` shared, `[M, B, C, H, W]` per member), over `B, ..` for dense
/// features `[M, B, .., C]` (or shared `[B, .., C]`). Training ([`Tape::is_training`]) normalizes with the batch's
/// statistics (biased variance) and moves the running ones towards them as PyTorch does (`running_var` with the
/// unbiased variance); evaluation normalizes with the running ones.
///
/// Training runs [`Var::batch_norm`]: two passes over the activations each way, where the composition of
/// element-wise ops that evaluation uses takes about forty. The running statistics are updated in place on the
/// device, off the tape, by the same kernels, so a training step captured as a CUDA graph updates them on every
/// replay. A shared image becomes per-member packed features `[B, M*C, H, W]`, shared
/// dense features per-member `[M, B, .., C]`.
#[derive(Debug)]
pub struct BatchNorm {
    weight: Param,
    bias: Param,
    running_mean: Param,
    running_var: Param,
    eps: f64,
    momentum: f64,
}

/// Where the statistics of an input are taken: the input seen as 4-D with the member axis, the channel at axis 2
/// and the two reduced axes.
struct Plan {
    /// The input reshaped to 4-D.
    x: Var,
    /// The axis holding the members (size `M`, or 1 for a shared input).
    member_axis: usize,
    /// The two axes reduced over.
    reduce: [usize; 2],
    /// The output's shape and layout.
    out: Vec<usize>,
    layout: Layout,
}

impl BatchNorm {
    /// PyTorch's default `eps`.
    pub const EPS: f64 = 1e-5;
    /// PyTorch's default momentum of the running statistics.
    pub const MOMENTUM: f64 = 0.1;

    /// Ones and zeros (weight, bias), zeros and ones (running mean, variance) for `members` members of `channels`
    /// channels; `momentum` is the weight of a new batch in the running statistics.
    ///
    /// # Errors
    /// When the tensors cannot be made on `dev`.
    pub fn new(
        channels: usize,
        eps: f64,
        momentum: f64,
        members: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<BatchNorm> {
        let full = |v| init_full(&[channels], v, members, dtype, dev);
        Ok(BatchNorm {
            weight: Param::new("weight", full(1.0)?),
            bias: Param::new("bias", full(0.0)?),
            running_mean: Param::new("running_mean", full(0.0)?),
            running_var: Param::new("running_var", full(1.0)?),
            eps,
            momentum,
        })
    }

    /// The running mean `[M, C]`.
    pub fn running_mean(&self) -> &Param {
        &self.running_mean
    }

    /// The running variance `[M, C]`.
    pub fn running_var(&self) -> &Param {
        &self.running_var
    }

    fn plan(&self, x: Features) -> Result<Plan> {
        let (m, c) = (self.weight.shape()[0], self.weight.shape()[1]);
        let s = x.var.shape().to_vec();
        let plan =
            |x: Var, shape: [usize; 4], member_axis, out: Vec<usize>, layout| -> Result<Plan> {
                let reduce = if member_axis == 1 { [0, 3] } else { [1, 3] };
                Ok(Plan {
                    x: x.reshape(&shape)?,
                    member_axis,
                    reduce,
                    out,
                    layout,
                })
            };
        let r = s.len();
        match x.layout {
            Layout::Packed if r == 4 && s[1] == m * c => plan(
                x.var,
                [s[0], m, c, s[2] * s[3]],
                1,
                s.clone(),
                Layout::Packed,
            ),
            Layout::Shared if r == 4 && s[1] == c => plan(
                x.var,
                [s[0], 1, c, s[2] * s[3]],
                1,
                vec![s[0], m * c, s[2], s[3]],
                Layout::Packed,
            ),
            Layout::Members if r == 5 && s[0] == m && s[2] == c => plan(
                x.var,
                [m, s[1], c, s[3] * s[4]],
                0,
                s.clone(),
                Layout::Members,
            ),
            Layout::Members if (3..=4).contains(&r) && s[0] == m && s[r - 1] == c => {
                let n = s[1..r - 1].iter().product();
                plan(x.var, [m, n, c, 1], 0, s.clone(), Layout::Members)
            }
            Layout::Shared if (2..=3).contains(&r) && s[r - 1] == c => {
                let n = s[..r - 1].iter().product();
                let mut out = vec![m];
                out.extend_from_slice(&s);
                plan(x.var, [1, n, c, 1], 0, out, Layout::Members)
            }
            _ => Err(Error::Shape {
                op: "batchnorm",
                reason: format!(
                    "input {s:?} ({:?}) for {m} members of {c} channels: expected images [B, M*C, H, W], \
                     [B, C, H, W] or [M, B, C, H, W], or dense [M, B, .., C] / [B, .., C]",
                    x.layout
                ),
            }),
        }
    }

    /// `v` `[M, C]` (a parameter or statistic) shaped to broadcast against the plan's 4-D input.
    fn view(p: &Var, member_axis: usize) -> Result<Var> {
        let s = p.shape();
        if member_axis == 1 {
            p.reshape(&[1, s[0], s[1], 1])
        } else {
            p.reshape(&[s[0], 1, s[1], 1])
        }
    }

    /// The layer's output, rectified when `relu`.
    fn run(&self, tape: &Tape, x: Features, relu: bool) -> Result<Features> {
        let x = if tape.is_training() { x } else { x.in_f32()? };
        let mask = x.mask.clone();
        let p = self.plan(x)?;
        let [a, b] = p.reduce;
        let xs = p.x.shape().to_vec();
        let g = tape.param(&self.weight);
        let bias = tape.param(&self.bias);
        let y = if tape.is_training() {
            if xs[a] * xs[b] < 2 {
                return Err(Error::Shape {
                    op: "batchnorm",
                    reason: format!(
                        "training needs more than one value per channel, got input {:?}",
                        p.out
                    ),
                });
            }
            // A shared input meets each member's statistics as its own copy.
            let m = g.shape()[0];
            let mut full = xs.clone();
            full[p.member_axis] = m;
            let x = p.x.broadcast_to(&full)?;
            let five = if p.member_axis == 1 {
                [full[0], m, 1, full[2], full[3]]
            } else {
                [1, m, full[1], full[2], full[3]]
            };
            let running = RunningStats {
                mean: self.running_mean.value(),
                var: self.running_var.value(),
                momentum: self.momentum,
            };
            x.reshape(&five)?
                .batch_norm((&g, &bias), Some(running), self.eps, relu)?
        } else {
            let rm = Var::constant(self.running_mean.value().clone());
            let rv = Var::constant(self.running_var.value().clone());
            let rm = Self::view(&rm, p.member_axis)?;
            let rv = Self::view(&rv, p.member_axis)?;
            let xhat = p.x.sub(&rm)?.div(&rv.add_scalar(self.eps)?.sqrt()?)?;
            let g = Self::view(&g, p.member_axis)?;
            let y = xhat.mul(&g)?.add(&Self::view(&bias, p.member_axis)?)?;
            if relu { y.relu()? } else { y }
        };
        // A shared input meets the members in the weight's broadcast: its member axis is now M.
        Ok(Features::new(y.reshape(&p.out)?, p.layout).with_mask(mask))
    }
}

impl Module for BatchNorm {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        self.run(tape, x, false)
    }

    fn forward_relu(&self, tape: &Tape, x: Features) -> Option<Result<Features>> {
        Some(self.run(tape, x, true))
    }

    fn takes_16bit(&self) -> bool {
        true // in training; evaluation composes f32 ops, on the input cast
    }

    fn params(&self) -> Vec<(String, Param)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }

    fn buffers(&self) -> Vec<(String, Param)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
        ]
    }

    fn kind(&self) -> &'static str {
        "batchnorm"
    }
}

/// `{ batchnorm = true, momentum = 0.1, eps = 1e-5, act = "relu" }`: batch normalization of an image's channels or
/// of features' last dimension, PyTorch's defaults.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchNormSpec {
    /// Weight of a new batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
    /// The activation after it.
    pub act: Option<ActivationKind>,
}

impl BatchNormSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<BatchNormSpec> {
        f.flag("batchnorm")?;
        Ok(BatchNormSpec {
            momentum: f
                .f64_in("momentum", 0.0, 1.0, "a momentum in [0, 1]")?
                .unwrap_or(BatchNorm::MOMENTUM),
            eps: f
                .f64_in("eps", 1e-12, 1.0, "an epsilon in (0, 1]")?
                .unwrap_or(BatchNorm::EPS),
            act: ActivationKind::read(f)?,
        })
    }

    /// The channels normalized: an image's, or the last dimension of features.
    pub(crate) fn channels(input: &Shape) -> std::result::Result<usize, String> {
        match input {
            Shape::Image { channels, .. } => Ok(*channels),
            Shape::Dense(d) => Ok(d[d.len() - 1]),
            Shape::Tokens(_) => Err(format!("needs features or an image, got {input}")),
        }
    }

    pub(crate) fn build(&self, input: &Shape, ctx: &LayerCtx<'_>) -> Result<BatchNorm> {
        let c = Self::channels(input).map_err(|reason| Error::Shape {
            op: "batchnorm",
            reason,
        })?;
        BatchNorm::new(
            c,
            self.eps,
            self.momentum,
            ctx.seeds.len(),
            ctx.dtype,
            ctx.device,
        )
    }
}
