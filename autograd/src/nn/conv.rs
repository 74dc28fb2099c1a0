use cohort_tensor::{DType, Device};

use super::{Features, Layout, Module, init_full, init_normal};
use crate::{Error, Param, Result, Tape};

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
        let w = tape.param(&self.weight).reshape(&[m * o, c, k, k])?;
        let b = match &self.bias {
            Some(b) => Some(tape.param(b).reshape(&[m * o])?),
            None => None,
        };
        let y = input.conv2d(&w, b.as_ref(), self.stride, self.padding, groups)?;
        Ok(Features::packed(y))
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
        let s = x.var.shape().to_vec();
        match x.layout {
            Layout::Shared if !s.is_empty() => {
                let f: usize = s[1..].iter().product();
                Ok(Features::shared(x.var.reshape(&[s[0], f])?))
            }
            Layout::Members if s.len() >= 2 => {
                let f: usize = s[2..].iter().product();
                Ok(Features::members(x.var.reshape(&[s[0], s[1], f])?))
            }
            Layout::Packed if s.len() == 4 => {
                let f = s[1] / self.members.max(1) * s[2] * s[3];
                let v = Features::packed(x.var).into_members(self.members)?;
                Ok(Features::members(v.reshape(&[self.members, s[0], f])?))
            }
            _ => Err(Error::Shape {
                op: "flatten",
                reason: format!("input {s:?} ({:?})", x.layout),
            }),
        }
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "flatten"
    }
}
