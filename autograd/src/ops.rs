//! Differentiable operations on [`Var`]: one per tensor op of cohort-tensor, recorded with its backward.

use cohort_tensor::{AttentionMask, DType, Precision, RunningStats, Tensor};

use crate::backward::Op;
use crate::{Error, Result, Var};

macro_rules! unary {
    ($(#[$doc:meta] $name:ident => |$x:ident, $y:ident| $op:expr;)*) => {$(
        #[$doc]
        ///
        /// # Errors
        /// When the tensor op fails (dtype, device).
        pub fn $name(&self) -> Result<Var> {
            let $x = self.value();
            let $y = $x.$name()?;
            let saved = $y.clone();
            Var::record(stringify!($name), $y, &[self], move || {
                #[allow(unused_variables)]
                let $y = saved;
                $op
            })
        }
    )*};
}

/// A product's operands as its backward keeps them: under a mixed policy on CUDA their 16-bit copies (cast once
/// for the forward and the backward, in half the memory), otherwise themselves.
pub(crate) fn kept_operands(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok(match Precision::current().math_for(a, b) {
        Some(m) if !m.f32_operands() => (a.as_operand(m)?, b.as_operand(m)?),
        _ => (a.clone(), b.clone()),
    })
}

impl Var {
    /// `self + other`, numpy broadcasting.
    ///
    /// # Errors
    /// When the shapes do not broadcast, or dtypes/devices differ.
    pub fn add(&self, other: &Var) -> Result<Var> {
        let out = self.value().add(other.value())?;
        Var::record("add", out, &[self, other], || Op::Add {
            lhs: self.shape().to_vec(),
            rhs: other.shape().to_vec(),
        })
    }

    /// `self - other`, numpy broadcasting.
    ///
    /// # Errors
    /// As [`Var::add`].
    pub fn sub(&self, other: &Var) -> Result<Var> {
        let out = self.value().sub(other.value())?;
        Var::record("sub", out, &[self, other], || Op::Sub {
            lhs: self.shape().to_vec(),
            rhs: other.shape().to_vec(),
        })
    }

    /// `self * other`, numpy broadcasting.
    ///
    /// # Errors
    /// As [`Var::add`].
    pub fn mul(&self, other: &Var) -> Result<Var> {
        let out = self.value().mul(other.value())?;
        Var::record("mul", out, &[self, other], || Op::Mul {
            lhs: self.value().clone(),
            rhs: other.value().clone(),
        })
    }

    /// `self / other`, numpy broadcasting.
    ///
    /// # Errors
    /// As [`Var::add`].
    pub fn div(&self, other: &Var) -> Result<Var> {
        let out = self.value().div(other.value())?;
        let saved = out.clone();
        Var::record("div", out, &[self, other], || Op::Div {
            rhs: other.value().clone(),
            out: saved,
            lhs_shape: self.shape().to_vec(),
        })
    }

    /// Element-wise maximum (ties send the gradient to `self`).
    ///
    /// # Errors
    /// As [`Var::add`].
    pub fn maximum(&self, other: &Var) -> Result<Var> {
        let out = self.value().maximum(other.value())?;
        Var::record("maximum", out, &[self, other], || Op::Maximum {
            lhs: self.value().clone(),
            rhs: other.value().clone(),
        })
    }

    /// `self + s`.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn add_scalar(&self, s: f64) -> Result<Var> {
        Var::record("add_scalar", self.value().add_scalar(s)?, &[self], || {
            Op::AddScalar
        })
    }

    /// `self * s`.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn mul_scalar(&self, s: f64) -> Result<Var> {
        Var::record("mul_scalar", self.value().mul_scalar(s)?, &[self], || {
            Op::MulScalar(s)
        })
    }

    /// `self ^ p`.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn powf(&self, p: f64) -> Result<Var> {
        Var::record("powf", self.value().powf(p)?, &[self], || Op::Powf {
            x: self.value().clone(),
            p,
        })
    }

    /// `max(self + bias, 0)` in one pass (a Linear layer's bias and ReLU); `bias` is `[C]`, or one row per leading
    /// index of `self` (`[M, 1, .., C]` for `self` `[M, .., C]`).
    ///
    /// # Errors
    /// When the bias does not fit or the tensor op fails.
    pub fn bias_relu(&self, bias: &Var) -> Result<Var> {
        let y = self.value().bias_relu(bias.value())?;
        Var::record("bias_relu", y.clone(), &[self, bias], || Op::BiasRelu {
            y,
            bias: bias.shape().to_vec(),
        })
    }

    /// `max(self + bias, 0)` with a bias per channel of image features (`[N, C, H, W]`, bias `[C]`, or none): a
    /// convolution's bias and ReLU after the max pool that follows it ([`Tensor::channel_bias_relu`]).
    ///
    /// # Errors
    /// When the bias does not fit or the tensor op fails.
    pub fn channel_bias_relu(&self, bias: Option<&Var>) -> Result<Var> {
        let y = self.value().channel_bias_relu(bias.map(Var::value))?;
        match bias {
            Some(b) => Var::record("channel_bias_relu", y.clone(), &[self, b], || {
                Op::ChannelBiasRelu { y }
            }),
            None => Var::record("relu", y.clone(), &[self], || Op::Relu { y }),
        }
    }

    /// `-self`.
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn neg(&self) -> Result<Var> {
        Var::record("neg", self.value().neg()?, &[self], || Op::Neg)
    }

    unary! {
        /// `max(x, 0)`.
        relu => |x, y| Op::Relu { y };
        /// Rectified linear unit's smooth cousin (tanh approximation, as JAX's default and PyTorch's `approximate="tanh"`).
        gelu => |x, y| Op::Gelu { x: x.clone() };
        /// Hyperbolic tangent.
        tanh => |x, y| Op::Tanh { y };
        /// Logistic sigmoid.
        sigmoid => |x, y| Op::Sigmoid { y };
        /// `e^x`.
        exp => |x, y| Op::Exp { y };
        /// Natural logarithm.
        log => |x, y| Op::Log { x: x.clone() };
        /// Square root.
        sqrt => |x, y| Op::Sqrt { y };
        /// Absolute value (gradient 0 at 0).
        abs => |x, y| Op::Abs { x: x.clone() };
        /// `x * x`.
        square => |x, y| Op::Square { x: x.clone() };
        /// Softmax over the last dimension.
        softmax_last => |x, y| Op::Softmax { y };
        /// Log-softmax over the last dimension (stable).
        log_softmax_last => |x, y| Op::LogSoftmax { y };
    }

    /// The same values in a new shape (shares storage).
    ///
    /// # Errors
    /// When the element counts differ.
    pub fn reshape(&self, shape: &[usize]) -> Result<Var> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Var::record("reshape", self.value().reshape(shape)?, &[self], || {
            Op::Reshape {
                shape: self.shape().to_vec(),
            }
        })
    }

    /// The value in another float dtype (the gradient comes back in this one).
    ///
    /// # Errors
    /// When the cast is not supported.
    pub fn to_dtype(&self, dtype: DType) -> Result<Var> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let (from, device) = (self.dtype(), self.value().device());
        Var::record("to_dtype", self.value().to_dtype(dtype)?, &[self], || {
            Op::Cast {
                dtype: from,
                device,
            }
        })
    }

    /// The value on another device (the gradient comes back to this one).
    ///
    /// # Errors
    /// When the device is not available.
    pub fn to_device(&self, device: &cohort_tensor::Device) -> Result<Var> {
        let (dtype, from) = (self.dtype(), self.value().device());
        if *device == from {
            return Ok(self.clone());
        }
        Var::record(
            "to_device",
            self.value().to_device(device)?,
            &[self],
            || Op::Cast {
                dtype,
                device: from,
            },
        )
    }

    /// Swaps the last two dimensions.
    ///
    /// # Errors
    /// When the rank is below 2.
    pub fn transpose(&self) -> Result<Var> {
        Var::record("transpose", self.value().transpose()?, &[self], || {
            Op::Transpose
        })
    }

    /// Swaps the first two dimensions (`[a, b, ...]` to `[b, a, ...]`).
    ///
    /// # Errors
    /// When the rank is below 2.
    pub fn swap_leading(&self) -> Result<Var> {
        self.swap_adjacent(0)
    }

    /// Swaps dimensions `dim` and `dim + 1` (`[.., a, b, ..]` to `[.., b, a, ..]`), built from reshapes and
    /// last-two-dims transposes (one when `dim + 1` is the last dimension, two otherwise), so that it runs and
    /// differentiates wherever those do.
    ///
    /// # Errors
    /// When `dim + 1` is not a dimension.
    pub fn swap_adjacent(&self, dim: usize) -> Result<Var> {
        let s = self.shape().to_vec();
        if dim + 1 >= s.len() {
            return Err(Error::Shape {
                op: "swap_adjacent",
                reason: format!(
                    "dims {dim} and {} of a rank-{} value {s:?}",
                    dim + 1,
                    s.len()
                ),
            });
        }
        let (a, b) = (s[dim], s[dim + 1]);
        let lead: usize = s[..dim].iter().product();
        let rest: usize = s[dim + 2..].iter().product();
        let mut out = s.clone();
        out.swap(dim, dim + 1);
        if a == 1 || b == 1 {
            return self.reshape(&out);
        }
        let t = self.reshape(&[lead, a, b * rest])?.transpose()?; // [lead, b*rest, a]
        let t = if rest == 1 {
            t
        } else {
            t.reshape(&[lead, b, rest, a])?.transpose()? // [lead, b, a, rest]
        };
        t.reshape(&out)
    }

    /// Broadcasts to `shape` (numpy rules).
    ///
    /// # Errors
    /// When the shapes do not broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Var> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Var::record(
            "broadcast_to",
            self.value().broadcast_to(shape)?,
            &[self],
            || Op::BroadcastTo {
                shape: self.shape().to_vec(),
            },
        )
    }

    /// Sums a broadcast value back to `shape`.
    ///
    /// # Errors
    /// When `shape` does not broadcast to this shape.
    pub fn sum_to(&self, shape: &[usize]) -> Result<Var> {
        Var::record("sum_to", self.value().sum_to(shape)?, &[self], || {
            Op::SumTo {
                shape: self.shape().to_vec(),
            }
        })
    }

    /// `len` entries of `dim` from `start`.
    ///
    /// # Errors
    /// When out of range.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Var> {
        Var::record(
            "narrow",
            self.value().narrow(dim, start, len)?,
            &[self],
            || Op::Narrow {
                dim,
                start,
                shape: self.shape().to_vec(),
            },
        )
    }

    /// Concatenates along `dim`.
    ///
    /// # Errors
    /// When the shapes differ outside `dim`, or `vars` is empty.
    pub fn cat(vars: &[&Var], dim: usize) -> Result<Var> {
        let ts: Vec<&Tensor> = vars.iter().map(|v| v.value()).collect();
        let out = Tensor::cat(&ts, dim)?;
        Var::record("cat", out, vars, || Op::Cat {
            dim,
            sizes: vars.iter().map(|v| v.shape()[dim]).collect(),
        })
    }

    /// Stacks along a new `dim`.
    ///
    /// # Errors
    /// When the shapes differ, or `vars` is empty.
    pub fn stack(vars: &[&Var], dim: usize) -> Result<Var> {
        let ts: Vec<&Tensor> = vars.iter().map(|v| v.value()).collect();
        let out = Tensor::stack(&ts, dim)?;
        Var::record("stack", out, vars, || Op::Stack {
            dim,
            shape: vars[0].shape().to_vec(),
        })
    }

    /// Rows of `self` along `dim` picked by I32 `indices` (embedding lookup).
    ///
    /// # Errors
    /// When an index is out of range or `indices` is not I32.
    pub fn index_select(&self, indices: &Tensor, dim: usize) -> Result<Var> {
        Var::record(
            "index_select",
            self.value().index_select(indices, dim)?,
            &[self],
            || Op::IndexSelect {
                indices: indices.clone(),
                dim,
                shape: self.shape().to_vec(),
            },
        )
    }

    /// The mean of each bag of `bag` rows of `self` (`[R, D]`) that consecutive I32 `indices` (`[N·bag]`) pick:
    /// `[N, D]`, an embedding bag's lookup. Its backward adds each bag's gradient (over `bag`) at its ids in one
    /// pass ([`Tensor::index_add_`]), with no copy of it per id.
    ///
    /// # Errors
    /// When `self` is not 2-D, `bag` does not divide the indices, or an index is out of range.
    pub fn bag_mean(&self, indices: &Tensor, bag: usize) -> Result<Var> {
        let out = self.value().bag_mean(indices, bag)?;
        Var::record("bag_mean", out, &[self], || Op::BagMean {
            indices: indices.clone(),
            bag,
            shape: self.shape().to_vec(),
        })
    }

    /// `self` with `src[i]` added at `indices[i]` along `dim`.
    ///
    /// # Errors
    /// When shapes or indices do not fit.
    pub fn index_add(&self, dim: usize, indices: &Tensor, src: &Var) -> Result<Var> {
        let out = self.value().index_add(dim, indices, src.value())?;
        Var::record("index_add", out, &[self, src], || Op::IndexAdd {
            indices: indices.clone(),
            dim,
        })
    }

    /// `out[..] = self[.., indices[..]]` over the last dimension.
    ///
    /// # Errors
    /// When the shapes do not fit or `indices` is not I32.
    pub fn gather_last(&self, indices: &Tensor) -> Result<Var> {
        let classes = *self.shape().last().unwrap_or(&0);
        Var::record(
            "gather_last",
            self.value().gather_last(indices)?,
            &[self],
            || Op::GatherLast {
                indices: indices.clone(),
                classes,
            },
        )
    }

    /// Sum over `dim`.
    ///
    /// # Errors
    /// When `dim` is out of range.
    pub fn sum(&self, dim: usize, keepdim: bool) -> Result<Var> {
        Var::record("sum", self.value().sum(dim, keepdim)?, &[self], || {
            Op::Sum {
                dim,
                keepdim,
                shape: self.shape().to_vec(),
            }
        })
    }

    /// Mean over `dim`.
    ///
    /// # Errors
    /// When `dim` is out of range.
    pub fn mean(&self, dim: usize, keepdim: bool) -> Result<Var> {
        Var::record("mean", self.value().mean(dim, keepdim)?, &[self], || {
            Op::Mean {
                dim,
                keepdim,
                shape: self.shape().to_vec(),
            }
        })
    }

    /// Maximum over `dim` (tied maxima share the gradient).
    ///
    /// # Errors
    /// When `dim` is out of range.
    pub fn max(&self, dim: usize, keepdim: bool) -> Result<Var> {
        let out = self.value().max(dim, keepdim)?;
        let saved = out.clone();
        Var::record("max", out, &[self], || Op::Max {
            x: self.value().clone(),
            y: saved,
            dim,
            keepdim,
        })
    }

    /// Sum of all elements (shape `[]`).
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn sum_all(&self) -> Result<Var> {
        Var::record("sum_all", self.value().sum_all()?, &[self], || Op::SumAll {
            shape: self.shape().to_vec(),
        })
    }

    /// Mean of all elements (shape `[]`).
    ///
    /// # Errors
    /// When the tensor op fails.
    pub fn mean_all(&self) -> Result<Var> {
        Var::record("mean_all", self.value().mean_all()?, &[self], || {
            Op::MeanAll {
                shape: self.shape().to_vec(),
            }
        })
    }

    /// Matrix product; a 2-D side broadcasts over the other's leading (member) dimension.
    ///
    /// # Errors
    /// When the inner dimensions differ.
    pub fn matmul(&self, other: &Var) -> Result<Var> {
        self.matmul_t(other, false, false)
    }

    /// Matrix product with either side's last two dimensions transposed (not materialized).
    ///
    /// # Errors
    /// When the inner dimensions differ.
    pub fn matmul_t(&self, other: &Var, trans_lhs: bool, trans_rhs: bool) -> Result<Var> {
        let (lhs, rhs) = kept_operands(self.value(), other.value())?;
        let out = lhs.matmul_t(&rhs, trans_lhs, trans_rhs)?;
        Var::record("matmul", out, &[self, other], || Op::Matmul {
            lhs,
            rhs,
            tl: trans_lhs,
            tr: trans_rhs,
        })
    }

    /// `self · w + bias`, then a ReLU when `relu`: a Linear layer in one op (one cuBLASLt call on
    /// CUDA; see [`Tensor::linear`]). `self` `[.., m, k]` or shared `[m, k]`, `w` `[.., k, n]`,
    /// `bias` `[n]` or one row per batch entry.
    ///
    /// # Errors
    /// When the shapes do not fit.
    pub fn linear(&self, w: &Var, bias: &Var, relu: bool) -> Result<Var> {
        let (x, wv) = kept_operands(self.value(), w.value())?;
        let y = x.linear(&wv, bias.value(), relu)?;
        Var::record("linear", y.clone(), &[self, w, bias], || Op::Linear {
            x,
            w: wv,
            relu_y: relu.then_some(y),
            bias: bias.shape().to_vec(),
        })
    }

    /// 2-D convolution, NCHW; weight `[O, C/groups, kh, kw]`, bias `[O]`.
    ///
    /// # Errors
    /// When the shapes do not fit.
    pub fn conv2d(
        &self,
        weight: &Var,
        bias: Option<&Var>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Var> {
        self.conv2d_act(weight, bias, (stride, padding, groups), false)
    }

    /// [`conv2d`](Var::conv2d) then a ReLU: forward as one op ([`Tensor::conv2d_relu`]: one kernel after the
    /// convolution under a 16-bit policy on CUDA), recorded as the two ops it replaces.
    ///
    /// # Errors
    /// When the shapes do not fit.
    pub fn conv2d_relu(
        &self,
        weight: &Var,
        bias: Option<&Var>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Var> {
        self.conv2d_act(weight, bias, (stride, padding, groups), true)
    }

    fn conv2d_act(
        &self,
        weight: &Var,
        bias: Option<&Var>,
        (stride, padding, groups): (usize, usize, usize),
        relu: bool,
    ) -> Result<Var> {
        let (x, w) = kept_operands(self.value(), weight.value())?;
        let b = bias.map(Var::value);
        let out = if relu {
            x.conv2d_relu(&w, b, stride, padding, groups)?
        } else {
            x.conv2d(&w, b, stride, padding, groups)?
        };
        let op = || Op::Conv2d {
            x,
            w,
            stride,
            padding,
            groups,
        };
        if !relu {
            return match bias {
                Some(b) => Var::record("conv2d", out.clone(), &[self, weight, b], op),
                None => Var::record("conv2d", out.clone(), &[self, weight], op),
            };
        }
        // The bias and ReLU ran inside the convolution's forward, but their backward is a node of its own, as
        // `channel_bias_relu`'s: one pass makes the ReLU's gradient and the bias's, and the incoming gradient is
        // freed before the convolution's backward runs, so no step holds it beside the ReLU's gradient and its
        // 16-bit copy. No backward reads the convolution node's value, which stands in for the pre-ReLU output.
        let conv = Var::record("conv2d", out.clone(), &[self, weight], op)?;
        match bias {
            Some(b) => Var::record("channel_bias_relu", out.clone(), &[&conv, b], || {
                Op::ChannelBiasRelu { y: out }
            }),
            None => Var::record("relu", out.clone(), &[&conv], || Op::Relu { y: out }),
        }
    }

    /// Fused self-attention of a packed projection `[n, L, 3·D]` into `[n, L, D]` ([`Tensor::attention`]): `heads`
    /// heads, with queries seeing earlier keys only when `causal`, and no padded key of `keys` (`[R, L]`, 1 a key).
    ///
    /// # Errors
    /// When the shapes do not fit (see [`Tensor::attention`]).
    pub fn attention(&self, heads: usize, causal: bool, keys: Option<&Tensor>) -> Result<Var> {
        let (out, lse) = self
            .value()
            .attention(heads, AttentionMask { causal, keys })?;
        let op = || Op::Attention {
            qkv: self.value().clone(),
            out: out.clone(),
            lse,
            heads,
            causal,
            keys: keys.cloned(),
        };
        Var::record("attention", out.clone(), &[self], op)
    }

    /// Batch normalization in training of `self`, `[outer, members, rows, channels, inner]`, by `weight` and `bias`
    /// `[members, channels]`, rectified when `relu` ([`Tensor::batch_norm`]); `running` moves in place, off the
    /// tape.
    ///
    /// # Errors
    /// When the shapes do not fit (see [`Tensor::batch_norm`]).
    pub fn batch_norm(
        &self,
        (weight, bias): (&Var, &Var),
        running: Option<RunningStats<'_>>,
        eps: f64,
        relu: bool,
    ) -> Result<Var> {
        let (out, mean, invstd) =
            self.value()
                .batch_norm((weight.value(), bias.value()), running, eps, relu)?;
        let op = || Op::BatchNorm {
            x: self.value().clone(),
            out: relu.then(|| out.clone()),
            mean,
            invstd,
            weight: weight.value().clone(),
        };
        Var::record("batch_norm", out.clone(), &[self, weight, bias], op)
    }

    /// Layer normalization of `self`, `[members, ..., dim]`, over its last dimension, by `weight` and `bias`
    /// `[members, dim]` ([`Tensor::layer_norm`]).
    ///
    /// # Errors
    /// When the shapes do not fit (see [`Tensor::layer_norm`]).
    pub fn layer_norm(&self, (weight, bias): (&Var, &Var), eps: f64) -> Result<Var> {
        let (out, mean, invstd) = self
            .value()
            .layer_norm((weight.value(), bias.value()), eps)?;
        let op = || Op::LayerNorm {
            x: self.value().clone(),
            mean,
            invstd,
            weight: weight.value().clone(),
        };
        Var::record("layer_norm", out.clone(), &[self, weight, bias], op)
    }

    /// Max pooling over `kernel x kernel` windows, NCHW.
    ///
    /// # Errors
    /// When the input is not 4-D or smaller than the window.
    pub fn max_pool2d(&self, kernel: usize, stride: usize) -> Result<Var> {
        let (out, indices) = self.value().max_pool2d(kernel, stride)?;
        Var::record("max_pool2d", out, &[self], || Op::MaxPool2d {
            indices,
            shape: self.shape().to_vec(),
            window: (kernel, stride),
        })
    }

    /// [`max_pool2d`](Var::max_pool2d) then [`channel_bias_relu`](Var::channel_bias_relu) with `bias`, forward in
    /// one pass where the windows tile ([`Tensor::max_pool2d_bias_relu`]); its backward makes the bias's gradient
    /// with the ReLU's in one pass, then routes the pool's.
    ///
    /// # Errors
    /// When the shapes do not fit.
    pub fn max_pool2d_bias_relu(&self, kernel: usize, stride: usize, bias: &Var) -> Result<Var> {
        let (y, indices) = self
            .value()
            .max_pool2d_bias_relu(kernel, stride, bias.value())?;
        Var::record("max_pool2d_bias_relu", y.clone(), &[self, bias], || {
            Op::MaxPool2dBiasRelu {
                indices,
                shape: self.shape().to_vec(),
                window: (kernel, stride),
                y,
            }
        })
    }

    /// A convolution of `self` (`[N, C, H, W]`) with `weight` (`[O, C, k, k]`; stride 1, one group), then
    /// [`max_pool2d_bias_relu`](Var::max_pool2d_bias_relu) over `pool` x `pool` windows with `bias`, as one op
    /// ([`Tensor::conv2d_max_pool_bias_relu`]): where it runs as one pass, the weight's gradient comes from the
    /// pooled gradient in one pass too, and no full-size tensor is made either way.
    ///
    /// # Errors
    /// When the shapes do not fit.
    pub fn conv2d_max_pool_bias_relu(
        &self,
        weight: &Var,
        bias: &Var,
        padding: usize,
        pool: usize,
    ) -> Result<Var> {
        let (x, w) = (self.value(), weight.value());
        let (y, indices) = x.conv2d_max_pool_bias_relu(w, bias.value(), padding, pool)?;
        let inputs = [self, weight, bias];
        Var::record("conv2d_max_pool_bias_relu", y.clone(), &inputs, || {
            Op::Conv2dMaxPoolBiasRelu {
                x: x.clone(),
                w: w.clone(),
                padding,
                pool,
                indices,
                y,
            }
        })
    }

    /// Picks `on_true` where `mask != 0`, else `on_false`.
    ///
    /// # Errors
    /// When the shapes do not broadcast.
    pub fn where_cond(mask: &Tensor, on_true: &Var, on_false: &Var) -> Result<Var> {
        let out = Tensor::where_cond(mask, on_true.value(), on_false.value())?;
        Var::record("where_cond", out, &[on_true, on_false], || Op::WhereCond {
            mask: mask.clone(),
            on_true: on_true.shape().to_vec(),
            on_false: on_false.shape().to_vec(),
        })
    }

    /// The value's dtype.
    pub fn dtype(&self) -> DType {
        self.value().dtype()
    }

    pub(crate) fn record_cross_entropy(loss: Tensor, logits: &Var, grad: Tensor) -> Result<Var> {
        Var::record("cross_entropy", loss, &[logits], || Op::CrossEntropy {
            grad,
        })
    }
}
