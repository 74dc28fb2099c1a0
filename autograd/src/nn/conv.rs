use cohort_tensor::{DType, Device};
use serde::Serialize;
use toml::Value;

use super::{ActivationKind, Features, Layout, MaxPool2d, Module, init_full, init_normal};
use crate::spec::{Fields, LayerCtx, Shape, SpecResult, describe};
use crate::{Error, Param, Result, Tape, Var};

/// 2-D convolution per member, NCHW: weight `[M, O, C, k, k]`, bias `[M, O]`.
///
/// A shared input `[B, C, H, W]` meets all members' filters in one convolution; member features stay packed in the
/// channels (`[B, M*O, H', W']`) and the next convolution is grouped by member.
#[derive(Debug)]
pub struct Conv2d {
    weight: Param,
    bias: Option<Param>,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// He-style normal weights (`std = sqrt(gain / (C k k))`) per member seed, zero bias.
    ///
    /// # Errors
    /// When the tensors cannot be made on `dev`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inp: usize,
        out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        gain: f64,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<Conv2d> {
        let fan_in = (inp * kernel * kernel) as f64;
        let w = init_normal(
            &[out, inp, kernel, kernel],
            (gain / fan_in).sqrt(),
            seeds,
            0,
            dtype,
            dev,
        )?;
        let b = init_full(&[out], 0.0, seeds.len(), dtype, dev)?;
        Ok(Conv2d {
            weight: Param::new("weight", w),
            bias: Some(Param::new("bias", b)),
            stride,
            padding,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        self.run(tape, x, false)
    }

    fn forward_relu(&self, tape: &Tape, x: Features) -> Option<Result<Features>> {
        Some(self.run(tape, x, true))
    }

    fn forward_relu_max_pool(
        &self,
        tape: &Tape,
        x: Features,
        pool: &MaxPool2d,
    ) -> Option<Result<Features>> {
        Some(self.run_pooled(tape, x, pool))
    }

    fn takes_16bit(&self) -> bool {
        true
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }

    fn kind(&self) -> &'static str {
        "conv"
    }
}

/// A convolution's operands on the tape: its input as one image batch, its weight `[M*O, C, k, k]`, its bias
/// `[M*O]` and the number of groups (members).
struct Operands {
    input: Var,
    weight: Var,
    bias: Option<Var>,
    groups: usize,
}

impl Conv2d {
    /// The convolution, then a ReLU in the same op when `relu` (under a 16-bit policy the output's cast, bias and
    /// ReLU are one kernel).
    fn run(&self, tape: &Tape, x: Features, relu: bool) -> Result<Features> {
        let o = self.operands(tape, x)?;
        let (b, s, p) = (o.bias.as_ref(), self.stride, self.padding);
        let y = if relu {
            o.input.conv2d_relu(&o.weight, b, s, p, o.groups)?
        } else {
            o.input.conv2d(&o.weight, b, s, p, o.groups)?
        };
        Ok(Features::packed(y))
    }

    /// The convolution, a ReLU and `pool` as the convolution without its bias, the pool, then the bias and the
    /// ReLU at the pooled size: the same values (see `Tensor::channel_bias_relu`) with no full-size pass after the
    /// convolution's own, forward or backward. With a bias, the pool, bias and ReLU are one op
    /// ([`Var::max_pool2d_bias_relu`]), and where the convolution too can join them (a first layer's few input
    /// channels on CUDA, [`Tensor::conv2d_max_pool_fuses`]) all four are ([`Var::conv2d_max_pool_bias_relu`]).
    fn run_pooled(&self, tape: &Tape, x: Features, pool: &MaxPool2d) -> Result<Features> {
        let o = self.operands(tape, x)?;
        let (kernel, stride) = pool.window();
        if let Some(bias) = &o.bias {
            let (x, w) = (o.input.value(), o.weight.value());
            if self.stride == 1
                && o.groups == 1
                && kernel == stride
                && x.conv2d_max_pool_fuses(w, self.padding, kernel)
            {
                let y = o
                    .input
                    .conv2d_max_pool_bias_relu(&o.weight, bias, self.padding, kernel)?;
                return Ok(Features::packed(y));
            }
        }
        let y = o
            .input
            .conv2d(&o.weight, None, self.stride, self.padding, o.groups)?;
        let Some(bias) = o.bias else {
            let pooled = pool.forward(tape, Features::packed(y))?;
            return Ok(Features::packed(pooled.var.channel_bias_relu(None)?));
        };
        Ok(Features::packed(
            y.max_pool2d_bias_relu(kernel, stride, &bias)?,
        ))
    }

    fn operands(&self, tape: &Tape, x: Features) -> Result<Operands> {
        let ws = self.weight.shape().to_vec();
        let (m, o, c, k) = (ws[0], ws[1], ws[2], ws[3]);
        let s = x.var.shape().to_vec();
        let bad = |why: String| Error::Shape {
            op: "conv2d",
            reason: format!("input {s:?} ({:?}) for weight {ws:?}: {why}", x.layout),
        };
        let (input, groups) = match x.layout {
            Layout::Shared if s.len() == 4 && s[1] == c => (x.var, 1),
            Layout::Packed if s.len() == 4 && s[1] == m * c => (x.var, m),
            Layout::Members if s.len() == 5 && s[0] == m && s[2] == c => {
                let v = x.var.swap_leading()?; // [B, M, C, H, W]
                (v.reshape(&[s[1], m * c, s[3], s[4]])?, m)
            }
            _ => return Err(bad(format!("expected {c} input channels per member"))),
        };
        let is = input.shape();
        if is[2] + 2 * self.padding < k || is[3] + 2 * self.padding < k {
            return Err(bad(format!("a {k}x{k} kernel does not fit")));
        }
        let bias = match &self.bias {
            Some(b) => Some(tape.param(b).reshape(&[m * o])?),
            None => None,
        };
        Ok(Operands {
            input,
            weight: tape.param(&self.weight).reshape(&[m * o, c, k, k])?,
            bias,
            groups,
        })
    }

    /// The same convolution without its bias (before a batch norm, whose shift makes a bias redundant).
    pub fn without_bias(mut self) -> Conv2d {
        self.bias = None;
        self
    }
}

/// Each example's features in a new shape `per` (of the same size): `[B, ..]` shared to `[B, ..per]`, `[M, B, ..]` to
/// `[M, B, ..per]`; packed convolution features are unpacked to the members.
fn reshape_examples(
    op: &'static str,
    x: Features,
    members: usize,
    per: &[usize],
) -> Result<Features> {
    let s = x.var.shape().to_vec();
    let n: usize = per.iter().product();
    let with = |lead: &[usize]| [lead, per].concat();
    let fits = |lead: usize| s.len() > lead && s[lead..].iter().product::<usize>() == n;
    match x.layout {
        Layout::Shared if fits(1) => Ok(Features::shared(x.var.reshape(&with(&s[..1]))?)),
        Layout::Members if fits(2) => Ok(Features::members(x.var.reshape(&with(&s[..2]))?)),
        Layout::Packed if s.len() == 4 && s[1] / members.max(1) * s[2] * s[3] == n => {
            let v = Features::packed(x.var).into_members(members)?;
            Ok(Features::members(v.reshape(&with(&[members, s[0]]))?))
        }
        _ => Err(Error::Shape {
            op,
            reason: format!("input {s:?} ({:?}) as examples of shape {per:?}", x.layout),
        }),
    }
}

/// Flattens each example's features: `[M, B, ..]` to `[M, B, F]` (packed convolution features unpacked).
#[derive(Debug)]
pub struct Flatten {
    members: usize,
}

impl Flatten {
    /// For a model of `members` members.
    pub fn new(members: usize) -> Flatten {
        Flatten { members }
    }
}

impl Module for Flatten {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        let s = x.var.shape();
        let f = match x.layout {
            Layout::Shared => s[1..].iter().product(),
            Layout::Members => s.get(2..).map_or(0, |d| d.iter().product()),
            Layout::Packed => s[1..].iter().product::<usize>() / self.members.max(1),
        };
        reshape_examples("flatten", x, self.members, &[f])
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "flatten"
    }
}

/// Each example's features as a sequence of `tokens` tokens: `[M, B, F]` (or an image of `F` values) to
/// `[M, B, tokens, F / tokens]`, e.g. a digit's 28 rows as 28 tokens of 28 pixels.
#[derive(Debug)]
pub struct Sequence {
    tokens: usize,
    width: usize,
    members: usize,
}

impl Sequence {
    /// `tokens` tokens of `width` values, for a model of `members` members.
    pub fn new(tokens: usize, width: usize, members: usize) -> Sequence {
        Sequence {
            tokens,
            width,
            members,
        }
    }
}

impl Module for Sequence {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        reshape_examples("sequence", x, self.members, &[self.tokens, self.width])
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "sequence"
    }
}

/// `{ sequence = L }`: each example's features (or image) read as `L` tokens of equal width.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SequenceSpec {
    /// Tokens per example.
    pub tokens: usize,
}

impl SequenceSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<SequenceSpec> {
        Ok(SequenceSpec {
            tokens: f.usize("sequence", 1)?.unwrap_or(1),
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        let n = input.elems();
        match input {
            Shape::Tokens(_) => Err("token ids are a sequence already; add an embedding".into()),
            _ if n % self.tokens != 0 => Err(format!(
                "{input} has {n} values, which do not split into {} tokens of equal width",
                self.tokens
            )),
            _ => Ok(Shape::Dense(vec![self.tokens, n / self.tokens])),
        }
    }
}

/// `{ conv = OUT, kernel = 3, stride = 1, padding = 0, act = "relu", bias = true }`: a 2-D convolution with square
/// kernels. `padding = "same"` pads by `kernel / 2`. The defaults are PyTorch's `Conv2d` defaults but for the kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvSpec {
    /// Output channels.
    pub out: usize,
    /// Kernel size (default 3).
    pub kernel: usize,
    /// Stride (default 1).
    pub stride: usize,
    /// Zero padding on each side (default 0).
    pub padding: usize,
    /// The activation after it.
    pub act: Option<ActivationKind>,
    /// Whether it adds a bias (default true).
    #[serde(skip_serializing_if = "crate::spec::is_true")]
    pub bias: bool,
}

impl ConvSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<ConvSpec> {
        let kernel = f.usize("kernel", 1)?.unwrap_or(3);
        let padding = match f.take("padding") {
            None => 0,
            Some(Value::String(s)) if s == "same" => kernel / 2,
            Some(Value::Integer(p)) if *p >= 0 => *p as usize,
            Some(v) => {
                return Err(f.error(
                    "padding",
                    format!("expected an integer ≥ 0 or \"same\", found {}", describe(v)),
                ));
            }
        };
        Ok(ConvSpec {
            out: f.usize("conv", 1)?.unwrap_or(1),
            kernel,
            stride: f.usize("stride", 1)?.unwrap_or(1),
            padding,
            act: ActivationKind::read(f)?,
            bias: f.bool("bias")?.unwrap_or(true),
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        let &Shape::Image {
            height: h,
            width: w,
            ..
        } = input
        else {
            return Err(format!(
                "needs an image [C, H, W], got {input} (give the data's shape as [C, H, W])"
            ));
        };
        let (k, p, s) = (self.kernel, self.padding, self.stride);
        if h + 2 * p < k || w + 2 * p < k {
            return Err(format!(
                "a {k}x{k} kernel does not fit the {h}x{w} input with padding {p}"
            ));
        }
        Ok(Shape::Image {
            channels: self.out,
            height: (h + 2 * p - k) / s + 1,
            width: (w + 2 * p - k) / s + 1,
        })
    }

    pub(crate) fn params(&self, input: &Shape) -> usize {
        let c = input.dims()[0];
        self.out * c * self.kernel * self.kernel + if self.bias { self.out } else { 0 }
    }

    /// The im2col buffer of its input beside its output.
    pub(crate) fn scratch(&self, input: &Shape, output: &Shape) -> usize {
        let c = input.dims()[0];
        c * self.kernel * self.kernel * output.elems() / self.out
    }

    pub(crate) fn build(&self, input: &Shape, ctx: &LayerCtx<'_>) -> Result<Conv2d> {
        let gain = self.act.map_or(1.0, ActivationKind::gain);
        let conv = Conv2d::new(
            input.dims()[0],
            self.out,
            self.kernel,
            self.stride,
            self.padding,
            gain,
            &ctx.seeds,
            ctx.dtype,
            ctx.device,
        )?;
        Ok(if self.bias { conv } else { conv.without_bias() })
    }
}
