//! Pooling: windows of an image (max, average), a whole image (global average), a sequence (mean, first).

use cohort_tensor::Tensor;
use serde::Serialize;

use super::{Features, Layout, Module};
use crate::spec::{Fields, Shape, SpecResult};
use crate::{Error, Param, Result, Tape, Var};

/// Runs `f` on the `[N, C, H, W]` planes of image features of any layout (members and channels independent),
/// refusing images smaller than a `k x k` window.
fn per_plane(
    op: &'static str,
    x: Features,
    k: usize,
    f: impl Fn(&Var) -> Result<Var>,
) -> Result<Features> {
    let s = x.var.shape().to_vec();
    let fits = |h: usize, w: usize| h >= k && w >= k && k > 0;
    match x.layout {
        Layout::Shared | Layout::Packed if s.len() == 4 && fits(s[2], s[3]) => {
            Ok(Features::new(f(&x.var)?, x.layout))
        }
        Layout::Members if s.len() == 5 && fits(s[3], s[4]) => {
            let y = f(&x.var.reshape(&[s[0] * s[1], s[2], s[3], s[4]])?)?;
            let ys = y.shape().to_vec();
            Ok(Features::members(
                y.reshape(&[s[0], s[1], ys[1], ys[2], ys[3]])?,
            ))
        }
        _ => Err(Error::Shape {
            op,
            reason: format!(
                "input {s:?} ({:?}) for a {k}x{k} window: expected images [B, C, H, W], [B, M*C, H, W] or \
                 [M, B, C, H, W] with H, W >= {k}",
                x.layout
            ),
        }),
    }
}

/// Max pooling over `kernel x kernel` windows every `stride` pixels, no padding (channels, hence members,
/// independent).
#[derive(Debug)]
pub struct MaxPool2d {
    kernel: usize,
    stride: usize,
}

impl MaxPool2d {
    /// A pool of windows `kernel x kernel`, `stride` apart (`stride = kernel`: windows that tile the image).
    pub fn new(kernel: usize, stride: usize) -> MaxPool2d {
        MaxPool2d { kernel, stride }
    }

    /// The window's size and the stride between windows.
    pub(crate) fn window(&self) -> (usize, usize) {
        (self.kernel, self.stride)
    }
}

impl Module for MaxPool2d {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        per_plane("maxpool", x, self.kernel, |v| {
            v.max_pool2d(self.kernel, self.stride)
        })
    }

    fn as_max_pool(&self) -> Option<&MaxPool2d> {
        Some(self)
    }

    fn takes_16bit(&self) -> bool {
        true
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "maxpool"
    }
}

/// Average pooling over `kernel x kernel` windows every `stride` pixels, no padding (floor of the output size, as
/// PyTorch's default).
///
/// Composed as a depthwise convolution with a constant `1 / k²` filter, so it runs and differentiates wherever
/// convolutions do.
#[derive(Debug)]
pub struct AvgPool2d {
    kernel: usize,
    stride: usize,
}

impl AvgPool2d {
    /// A pool of windows `kernel x kernel`, `stride` apart.
    pub fn new(kernel: usize, stride: usize) -> AvgPool2d {
        AvgPool2d { kernel, stride }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        let k = self.kernel;
        per_plane("avgpool", x, k, |v| {
            let t = v.value();
            let c = t.shape()[1];
            let w = Tensor::full(&[c, 1, k, k], 1.0 / (k * k) as f64, t.dtype(), &t.device())?;
            v.conv2d(&Var::constant(w), None, self.stride.max(1), 0, c)
        })
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "avgpool"
    }
}

/// The mean of each channel over the whole image: image features of any layout give dense per-member features
/// `[M, B, C]` (members layout), ready for a Linear head without a flatten.
#[derive(Debug)]
pub struct GlobalAvgPool {
    members: usize,
}

impl GlobalAvgPool {
    /// For a model of `members` members (a shared image is broadcast to them).
    pub fn new(members: usize) -> GlobalAvgPool {
        GlobalAvgPool { members }
    }
}

impl Module for GlobalAvgPool {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        let s = x.var.shape().to_vec();
        let m = self.members;
        let y = match x.layout {
            Layout::Shared if s.len() == 4 => {
                let y = x.var.reshape(&[s[0], s[1], s[2] * s[3]])?.mean(2, false)?;
                y.reshape(&[1, s[0], s[1]])?
                    .broadcast_to(&[m, s[0], s[1]])?
            }
            Layout::Packed if s.len() == 4 && m > 0 && s[1] % m == 0 => {
                let y = x.var.reshape(&[s[0], s[1], s[2] * s[3]])?.mean(2, false)?;
                y.reshape(&[s[0], m, s[1] / m])?.swap_leading()?
            }
            Layout::Members if s.len() == 5 && s[0] == m => x
                .var
                .reshape(&[s[0], s[1], s[2], s[3] * s[4]])?
                .mean(3, false)?,
            _ => {
                return Err(Error::Shape {
                    op: "global_avgpool",
                    reason: format!(
                        "input {s:?} ({:?}) for {m} members: expected images [B, C, H, W], [B, M*C, H, W] or \
                         [M, B, C, H, W]",
                        x.layout
                    ),
                });
            }
        };
        Ok(Features::members(y))
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "global_avgpool"
    }
}

/// How a [`SequencePool`] summarizes a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// The mean over the real (unpadded) positions.
    Mean,
    /// The first position (a class token).
    First,
}

/// Summarizes each sequence `[M, B, L, D]` (or shared `[B, L, D]`) to `[M, B, D]` (shared: `[B, D]`); the padding
/// mask is consumed.
#[derive(Debug)]
pub struct SequencePool {
    mode: PoolMode,
}

impl SequencePool {
    /// A pool in `mode`.
    pub fn new(mode: PoolMode) -> SequencePool {
        SequencePool { mode }
    }
}

impl Module for SequencePool {
    fn forward(&self, _tape: &Tape, x: Features) -> Result<Features> {
        let s = x.var.shape().to_vec();
        let seq = match (x.layout, s.len()) {
            (Layout::Shared, 3) => 1,
            (Layout::Members, 4) => 2,
            _ => {
                return Err(Error::Shape {
                    op: "sequence_pool",
                    reason: format!(
                        "input {s:?} ({:?}): expected a sequence [B, L, D] or [M, B, L, D]",
                        x.layout
                    ),
                });
            }
        };
        let (b, l, d) = (s[seq - 1], s[seq], s[seq + 1]);
        if self.mode == PoolMode::First {
            let mut out = s.clone();
            out.remove(seq);
            let y = x.var.narrow(seq, 0, 1)?.reshape(&out)?;
            return Ok(Features::new(y, x.layout));
        }
        let Some(mask) = x.member_mask(x.var.dtype())? else {
            return Ok(Features::new(x.var.mean(seq, false)?, x.layout));
        };
        let ms = mask.shape().to_vec();
        if ms[1..] != [b, l] || (x.layout == Layout::Members && ms[0] != 1 && ms[0] != s[0]) {
            return Err(Error::Shape {
                op: "sequence_pool",
                reason: format!("padding mask {ms:?} for a sequence {s:?}"),
            });
        }
        // Real positions' sum over their count (at least 1, so an all-padding sequence gives zeros, not NaN).
        let count = mask.sum(2, false)?; // [M', B]
        let one = Tensor::scalar(1.0, count.dtype(), &count.device())?;
        let count = count.maximum(&one)?.reshape(&[ms[0], b, 1])?;
        let mask = mask.reshape(&[ms[0], b, l, 1])?;
        let summed = x.var.mul(&Var::constant(mask))?.sum(2, false)?; // [M' or M, B, D]
        let y = summed.div(&Var::constant(count))?;
        if x.layout == Layout::Shared && ms[0] == 1 {
            // A shared sequence under a shared mask stays shared.
            return Ok(Features::shared(y.reshape(&[b, d])?));
        }
        Ok(Features::members(y))
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "sequence_pool"
    }
}
/// `{ maxpool = K, stride = K }` or `{ avgpool = K, stride = K }`: the maximum or mean of each `K x K` window
/// (stride defaults to the window, no padding).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolSpec {
    /// Window size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
}

impl PoolSpec {
    pub(crate) fn read(f: &Fields<'_>, key: &str) -> SpecResult<PoolSpec> {
        let kernel = f.usize(key, 1)?.unwrap_or(1);
        Ok(PoolSpec {
            kernel,
            stride: f.usize("stride", 1)?.unwrap_or(kernel),
        })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        let &Shape::Image {
            channels,
            height: h,
            width: w,
        } = input
        else {
            return Err(format!("needs an image [C, H, W], got {input}"));
        };
        let k = self.kernel;
        if k > h || k > w {
            return Err(format!("a {k}x{k} window does not fit the {h}x{w} input"));
        }
        Ok(Shape::Image {
            channels,
            height: (h - k) / self.stride + 1,
            width: (w - k) / self.stride + 1,
        })
    }
}

impl PoolSpec {
    /// Elements a max pool keeps for its backward pass: the argmax of each window.
    pub(crate) fn scratch(&self, output: &Shape) -> usize {
        output.elems()
    }
}

/// `{ global_avgpool = true }`: each channel's mean over the image, giving features `[C]`.
pub(crate) fn global_avgpool_output(input: &Shape) -> std::result::Result<Shape, String> {
    match input {
        &Shape::Image { channels, .. } => Ok(Shape::Dense(vec![channels])),
        _ => Err(format!("needs an image [C, H, W], got {input}")),
    }
}

/// `{ pool = "mean" }` or `{ pool = "first" }`: a sequence `[L, D]` summarized as one vector `[D]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SequencePoolSpec {
    /// `mean` (over the real positions) or `first`.
    pub mode: PoolMode,
}

impl SequencePoolSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<SequencePoolSpec> {
        let accepted = "\"mean\" or \"first\"";
        let mode = match f.str("pool", accepted)? {
            Some("mean") => PoolMode::Mean,
            Some("first") => PoolMode::First,
            Some(other) => {
                return Err(f.error("pool", format!("expected {accepted}, found \"{other}\"")));
            }
            None => unreachable!("the kind key is there"),
        };
        Ok(SequencePoolSpec { mode })
    }

    pub(crate) fn output(&self, input: &Shape) -> std::result::Result<Shape, String> {
        match input {
            Shape::Dense(d) if d.len() == 2 => Ok(Shape::Dense(vec![d[1]])),
            _ => Err(format!(
                "needs a sequence [L, D], got {input}; add an embedding or {{ sequence = L }} first"
            )),
        }
    }
}
