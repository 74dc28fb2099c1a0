//! The recorded operations and their derivatives.

use cohort_tensor::{AttentionMask, Tensor};

use crate::Result;
use crate::ops::kept_operands;

/// One recorded operation with what its derivative needs.
pub(crate) enum Op {
    Add {
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    Sub {
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    Mul {
        lhs: Tensor,
        rhs: Tensor,
    },
    Div {
        rhs: Tensor,
        out: Tensor,
        lhs_shape: Vec<usize>,
    },
    Maximum {
        lhs: Tensor,
        rhs: Tensor,
    },
    AddScalar,
    MulScalar(f64),
    Powf {
        x: Tensor,
        p: f64,
    },
    Neg,
    Relu {
        y: Tensor,
    },
    BiasRelu {
        y: Tensor,
        bias: Vec<usize>,
    },
    /// A bias per channel of image features `[N, C, H, W]`, then a ReLU (the output `y` is kept for it).
    ChannelBiasRelu {
        y: Tensor,
    },
    /// A max pool (as `MaxPool2d`), then a bias per channel and a ReLU (as `ChannelBiasRelu`).
    MaxPool2dBiasRelu {
        indices: Tensor,
        shape: Vec<usize>,
        window: (usize, usize),
        y: Tensor,
    },
    /// A convolution (stride 1, one group, no bias) of `x` with `w`, then a max pool of `pool` x `pool` windows
    /// of stride `pool`, a bias per channel and a ReLU (as `MaxPool2dBiasRelu`).
    Conv2dMaxPoolBiasRelu {
        x: Tensor,
        w: Tensor,
        padding: usize,
        pool: usize,
        indices: Tensor,
        y: Tensor,
    },
    /// `x · w + bias`, then a ReLU when `relu` (the output `y` is kept for it).
    Linear {
        x: Tensor,
        w: Tensor,
        /// The output, kept for the ReLU's backward (`None`: no ReLU).
        relu_y: Option<Tensor>,
        bias: Vec<usize>,
    },
    Gelu {
        x: Tensor,
    },
    Tanh {
        y: Tensor,
    },
    Sigmoid {
        y: Tensor,
    },
    Exp {
        y: Tensor,
    },
    Log {
        x: Tensor,
    },
    Sqrt {
        y: Tensor,
    },
    Abs {
        x: Tensor,
    },
    Square {
        x: Tensor,
    },
    Reshape {
        shape: Vec<usize>,
    },
    Transpose,
    Cast {
        dtype: cohort_tensor::DType,
        device: cohort_tensor::Device,
    },
    BroadcastTo {
        shape: Vec<usize>,
    },
    SumTo {
        shape: Vec<usize>,
    },
    Narrow {
        dim: usize,
        start: usize,
        shape: Vec<usize>,
    },
    Cat {
        dim: usize,
        sizes: Vec<usize>,
    },
    Stack {
        dim: usize,
        shape: Vec<usize>,
    },
    IndexSelect {
        indices: Tensor,
        dim: usize,
        shape: Vec<usize>,
    },
    IndexAdd {
        indices: Tensor,
        dim: usize,
    },
    BagMean {
        indices: Tensor,
        bag: usize,
        shape: Vec<usize>,
    },
    GatherLast {
        indices: Tensor,
        classes: usize,
    },
    Sum {
        dim: usize,
        keepdim: bool,
        shape: Vec<usize>,
    },
    Mean {
        dim: usize,
        keepdim: bool,
        shape: Vec<usize>,
    },
    Max {
        x: Tensor,
        y: Tensor,
        dim: usize,
        keepdim: bool,
    },
    SumAll {
        shape: Vec<usize>,
    },
    MeanAll {
        shape: Vec<usize>,
    },
    Softmax {
        y: Tensor,
    },
    LogSoftmax {
        y: Tensor,
    },
    Matmul {
        lhs: Tensor,
        rhs: Tensor,
        tl: bool,
        tr: bool,
    },
    Conv2d {
        x: Tensor,
        w: Tensor,
        stride: usize,
        padding: usize,
        groups: usize,
    },
    MaxPool2d {
        indices: Tensor,
        shape: Vec<usize>,
        /// Kernel and stride.
        window: (usize, usize),
    },
    /// Fused self-attention: its input, output and log-sum-exps, and the mask it ran under.
    Attention {
        qkv: Tensor,
        out: Tensor,
        lse: Tensor,
        heads: usize,
        causal: bool,
        keys: Option<Tensor>,
    },
    BatchNorm {
        x: Tensor,
        /// The output, kept when it was rectified.
        out: Option<Tensor>,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor,
    },
    LayerNorm {
        x: Tensor,
        mean: Tensor,
        invstd: Tensor,
        weight: Tensor,
    },
    WhereCond {
        mask: Tensor,
        on_true: Vec<usize>,
        on_false: Vec<usize>,
    },
    /// Softmax cross-entropy: `(softmax - onehot) / B` from the forward pass, scaled by the incoming gradient.
    CrossEntropy {
        grad: Tensor,
    },
}

/// `g` summed back to `shape` when broadcasting widened it.
fn reduce_to(g: Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        Ok(g)
    } else {
        Ok(g.sum_to(shape)?)
    }
}

/// `g` of a reduction over `dim` widened back to `shape`.
fn unreduce(g: &Tensor, dim: usize, keepdim: bool, shape: &[usize]) -> Result<Tensor> {
    let g = if keepdim {
        g.clone()
    } else {
        let mut kept = shape.to_vec();
        kept[dim] = 1;
        g.reshape(&kept)?
    };
    Ok(g.broadcast_to(shape)?)
}

/// Zeros of `shape` with `src`'s rows added at `indices` along `dim`, in place: the gradient of a lookup.
fn added_at(shape: &[usize], dim: usize, indices: &Tensor, src: &Tensor) -> Result<Tensor> {
    let z = Tensor::zeros(shape, src.dtype(), &src.device())?;
    z.index_add_(dim, indices, src)?;
    Ok(z)
}

fn zeros_like(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::zeros(t.shape(), t.dtype(), &t.device())?)
}

/// Which inputs want a gradient, and their gradients.
type Grads = Vec<Option<Tensor>>;

fn one(need: &[bool], f: impl FnOnce() -> Result<Tensor>) -> Result<Grads> {
    Ok(vec![if need[0] { Some(f()?) } else { None }])
}

fn two(
    need: &[bool],
    a: impl FnOnce() -> Result<Tensor>,
    b: impl FnOnce() -> Result<Tensor>,
) -> Result<Grads> {
    let ga = if need[0] { Some(a()?) } else { None };
    let gb = if need.get(1) == Some(&true) {
        Some(b()?)
    } else {
        None
    };
    Ok(vec![ga, gb])
}

impl Op {
    /// The inputs' gradients for an output gradient of ones, where the op has them without arithmetic (the
    /// cross-entropy's, computed in its forward pass); `None` for the others.
    pub(crate) fn backward_of_ones(&self, need: &[bool]) -> Option<Result<Grads>> {
        match self {
            Op::CrossEntropy { grad } => Some(one(need, || Ok(grad.clone()))),
            _ => None,
        }
    }

    /// Gradients of the inputs (those marked in `need`) given the output's gradient `g`.
    pub(crate) fn backward(&self, g: &Tensor, need: &[bool]) -> Result<Grads> {
        match self {
            Op::Add { lhs, rhs } => two(
                need,
                || reduce_to(g.clone(), lhs),
                || reduce_to(g.clone(), rhs),
            ),
            Op::Sub { lhs, rhs } => two(
                need,
                || reduce_to(g.clone(), lhs),
                || reduce_to(g.neg()?, rhs),
            ),
            Op::Mul { lhs, rhs } => two(
                need,
                || reduce_to(g.mul(rhs)?, lhs.shape()),
                || reduce_to(g.mul(lhs)?, rhs.shape()),
            ),
            Op::Div {
                rhs,
                out,
                lhs_shape,
            } => two(
                need,
                || reduce_to(g.div(rhs)?, lhs_shape),
                || reduce_to(g.mul(out)?.div(rhs)?.neg()?, rhs.shape()),
            ),
            Op::Maximum { lhs, rhs } => {
                let mask = lhs.ge(rhs)?;
                let gl = g.mul(&mask)?;
                two(
                    need,
                    || reduce_to(gl.clone(), lhs.shape()),
                    || reduce_to(g.sub(&gl)?, rhs.shape()),
                )
            }
            Op::AddScalar => one(need, || Ok(g.clone())),
            Op::MulScalar(s) => one(need, || Ok(g.mul_scalar(*s)?)),
            Op::Powf { x, p } => one(need, || Ok(g.mul(&x.powf(p - 1.0)?.mul_scalar(*p)?)?)),
            Op::Neg => one(need, || Ok(g.neg()?)),
            Op::Relu { y } => one(need, || Ok(g.relu_backward(y)?)),
            Op::BiasRelu { y, bias } => {
                if need[1] {
                    let (gx, gb) = g.relu_backward_bias(y, bias)?;
                    two(need, || Ok(gx), || Ok(gb))
                } else {
                    one(need, || Ok(g.relu_backward(y)?))
                }
            }
            Op::ChannelBiasRelu { y } => {
                if need[1] {
                    let (gx, gb) = g.relu_backward_channel_bias(y)?;
                    Ok(vec![need[0].then_some(gx), Some(gb)])
                } else {
                    one(need, || Ok(g.relu_backward(y)?))
                }
            }
            Op::MaxPool2dBiasRelu {
                indices,
                shape,
                window,
                y,
            } => {
                let (gp, gb) = g.relu_backward_channel_bias(y)?;
                let gx = need[0]
                    .then(|| Tensor::max_pool2d_backward(&gp, indices, shape, *window))
                    .transpose()?;
                Ok(vec![gx, need[1].then_some(gb)])
            }
            Op::Conv2dMaxPoolBiasRelu {
                x,
                w,
                padding,
                pool,
                indices,
                y,
            } => {
                let (gx, gw, gb) = Tensor::conv2d_max_pool_backward(
                    x,
                    w,
                    (g, y, indices),
                    (*padding, *pool),
                    (need[0], need[1]),
                )?;
                Ok(vec![gx, gw, need[2].then_some(gb)])
            }
            Op::Gelu { x } => one(need, || Ok(g.gelu_backward(x)?)),
            Op::Tanh { y } => one(need, || Ok(g.mul(&y.square()?.neg()?.add_scalar(1.0)?)?)),
            Op::Sigmoid { y } => one(need, || Ok(g.mul(&y.mul(&y.neg()?.add_scalar(1.0)?)?)?)),
            Op::Exp { y } => one(need, || Ok(g.mul(y)?)),
            Op::Log { x } => one(need, || Ok(g.div(x)?)),
            Op::Sqrt { y } => one(need, || Ok(g.div(y)?.mul_scalar(0.5)?)),
            Op::Abs { x } => one(need, || {
                Ok(g.mul(&x.gt_scalar(0.0)?.sub(&x.lt_scalar(0.0)?)?)?)
            }),
            Op::Square { x } => one(need, || Ok(g.mul(x)?.mul_scalar(2.0)?)),
            Op::Reshape { shape } => one(need, || Ok(g.reshape(shape)?)),
            Op::Transpose => one(need, || Ok(g.transpose()?)),
            Op::Cast { dtype, device } => {
                one(need, || Ok(g.to_device(device)?.to_dtype(*dtype)?))
            }
            Op::BroadcastTo { shape } => one(need, || Ok(g.sum_to(shape)?)),
            Op::SumTo { shape } => one(need, || Ok(g.broadcast_to(shape)?)),
            Op::Narrow { dim, start, shape } => one(need, || {
                let z = Tensor::zeros(shape, g.dtype(), &g.device())?;
                z.narrow_assign_(*dim, *start, g)?;
                Ok(z)
            }),
            Op::Cat { dim, sizes } => {
                let mut out = Vec::with_capacity(sizes.len());
                let mut start = 0;
                for (i, &len) in sizes.iter().enumerate() {
                    out.push(if need[i] {
                        Some(g.narrow(*dim, start, len)?)
                    } else {
                        None
                    });
                    start += len;
                }
                Ok(out)
            }
            Op::Stack { dim, shape } => {
                let mut out = Vec::with_capacity(need.len());
                for (i, &n) in need.iter().enumerate() {
                    out.push(if n {
                        Some(g.narrow(*dim, i, 1)?.reshape(shape)?)
                    } else {
                        None
                    });
                }
                Ok(out)
            }
            Op::IndexSelect {
                indices,
                dim,
                shape,
            } => one(need, || added_at(shape, *dim, indices, g)),
            Op::BagMean {
                indices,
                bag,
                shape,
            } => one(need, || {
                added_at(shape, 0, indices, &g.mul_scalar(1.0 / *bag as f64)?)
            }),
            Op::IndexAdd { indices, dim } => two(
                need,
                || Ok(g.clone()),
                || Ok(g.index_select(indices, *dim)?),
            ),
            Op::GatherLast { indices, classes } => one(need, || {
                let mut s = g.shape().to_vec();
                s.push(*classes);
                Ok(Tensor::zeros(&s, g.dtype(), &g.device())?.scatter_add_last(indices, g)?)
            }),
            Op::Sum {
                dim,
                keepdim,
                shape,
            } => one(need, || unreduce(g, *dim, *keepdim, shape)),
            Op::Mean {
                dim,
                keepdim,
                shape,
            } => one(need, || {
                // Scaled before it is widened: the same bits, one multiply per output instead of per input.
                let g = g.mul_scalar(1.0 / shape[*dim] as f64)?;
                unreduce(&g, *dim, *keepdim, shape)
            }),
            Op::Max { x, y, dim, keepdim } => one(need, || {
                let yk = unreduce(y, *dim, *keepdim, x.shape())?;
                let mask = x.eq(&yk)?;
                let count = mask.sum(*dim, true)?;
                let gk = unreduce(g, *dim, *keepdim, x.shape())?;
                Ok(gk.mul(&mask)?.div(&count)?)
            }),
            Op::SumAll { shape } => one(need, || Ok(g.broadcast_to(shape)?)),
            Op::MeanAll { shape } => {
                let n: usize = shape.iter().product();
                one(need, || {
                    Ok(g.mul_scalar(1.0 / n.max(1) as f64)?.broadcast_to(shape)?)
                })
            }
            Op::Softmax { y } => one(need, || {
                let last = y.rank() - 1;
                let dot = g.mul(y)?.sum(last, true)?;
                Ok(y.mul(&g.sub(&dot)?)?)
            }),
            Op::LogSoftmax { y } => one(need, || {
                let last = y.rank() - 1;
                let total = g.sum(last, true)?;
                Ok(g.sub(&y.exp()?.mul(&total)?)?)
            }),
            Op::Linear { x, w, relu_y, bias } => {
                // The bias's shape was checked by the forward: [n], or [G, 1, n] per product.
                let per_product = bias.len() == 3;
                // Both products take the gradient before the bias as an operand: under a 16-bit policy, cast
                // it once (the bias's gradient sums the f32 one).
                let operand = |gz: &Tensor| -> Result<Tensor> {
                    Ok(match need[..2] {
                        [true, true] => kept_operands(gz, w)?.0,
                        _ => gz.clone(),
                    })
                };
                // Without a ReLU, the weight's and bias's gradients come from one product, which
                // runs alongside the input's gradient (in f32 and TF32; a 16-bit policy has no such product).
                if relu_y.is_none() && need[1] && need[2] && per_product {
                    let g16 = operand(g)?;
                    if g16.dtype() == g.dtype() {
                        let ((gw, gb), gx) = x.linear_grads_beside(g, || {
                            need[0]
                                .then(|| reduce_to(g.matmul_t(w, false, true)?, x.shape()))
                                .transpose()
                        })?;
                        return Ok(vec![gx, Some(reduce_to(gw, w.shape())?), Some(gb)]);
                    }
                    let gx = need[0]
                        .then(|| reduce_to(g16.matmul_t(w, false, true)?, x.shape()))
                        .transpose()?;
                    let gw = reduce_to(x.matmul_t(&g16, true, false)?, w.shape())?;
                    return Ok(vec![gx, Some(gw), Some(g.sum(1, true)?)]);
                }
                // The gradient before the bias (and ReLU), and the bias's.
                let (gz, gb) = match (relu_y, need[2]) {
                    (Some(y), true) => {
                        let (gz, gb) = g.relu_backward_bias(y, bias)?;
                        (gz, Some(gb))
                    }
                    (Some(y), false) => (g.relu_backward(y)?, None),
                    (None, need_b) => (
                        g.clone(),
                        need_b.then(|| reduce_to(g.clone(), bias)).transpose()?,
                    ),
                };
                let gz = operand(&gz)?;
                let gx = need[0]
                    .then(|| reduce_to(gz.matmul_t(w, false, true)?, x.shape()))
                    .transpose()?;
                let gw = need[1]
                    .then(|| reduce_to(x.matmul_t(&gz, true, false)?, w.shape()))
                    .transpose()?;
                Ok(vec![gx, gw, gb])
            }
            Op::Matmul { lhs, rhs, tl, tr } => {
                let (tl, tr) = (*tl, *tr);
                // Both products take the gradient as an operand: under a 16-bit policy, cast it once.
                let g = &match need[..2] {
                    [true, true] => kept_operands(g, rhs)?.0,
                    _ => g.clone(),
                };
                two(
                    need,
                    || {
                        let ga = match (tl, tr) {
                            (false, false) => g.matmul_t(rhs, false, true)?,
                            (false, true) => g.matmul_t(rhs, false, false)?,
                            (true, false) => rhs.matmul_t(g, false, true)?,
                            (true, true) => rhs.matmul_t(g, true, true)?,
                        };
                        reduce_to(ga, lhs.shape())
                    },
                    || {
                        let gb = match (tl, tr) {
                            (false, false) => lhs.matmul_t(g, true, false)?,
                            (false, true) => g.matmul_t(lhs, true, false)?,
                            (true, false) => lhs.matmul_t(g, false, false)?,
                            (true, true) => g.matmul_t(lhs, true, true)?,
                        };
                        reduce_to(gb, rhs.shape())
                    },
                )
            }
            Op::Conv2d {
                x,
                w,
                stride,
                padding,
                groups,
            } => {
                // Both passes take the output's gradient as an operand: under a 16-bit policy, cast it once.
                let g_operand = match need[..2] {
                    [true, true] => kept_operands(g, w)?.0,
                    _ => g.clone(),
                };
                let gx = if need[0] {
                    Some(Tensor::conv2d_backward_input(
                        &g_operand,
                        w,
                        x.shape(),
                        *stride,
                        *padding,
                        *groups,
                    )?)
                } else {
                    None
                };
                let gw = if need[1] {
                    Some(Tensor::conv2d_backward_weight(
                        x,
                        &g_operand,
                        w.shape(),
                        *stride,
                        *padding,
                        *groups,
                    )?)
                } else {
                    None
                };
                let gb = if need.get(2) == Some(&true) {
                    Some(Tensor::conv2d_backward_bias(g)?)
                } else {
                    None
                };
                Ok(vec![gx, gw, gb])
            }
            Op::MaxPool2d {
                indices,
                shape,
                window,
            } => one(need, || {
                Ok(Tensor::max_pool2d_backward(g, indices, shape, *window)?)
            }),
            Op::Attention {
                qkv,
                out,
                lse,
                heads,
                causal,
                keys,
            } => one(need, || {
                let mask = AttentionMask {
                    causal: *causal,
                    keys: keys.as_ref(),
                };
                Ok(qkv.attention_backward(*heads, mask, (out, lse), g)?)
            }),
            Op::BatchNorm {
                x,
                out,
                mean,
                invstd,
                weight,
            } => {
                let (gx, gw, gb) =
                    x.batch_norm_backward(out.as_ref(), g, (mean, invstd, weight))?;
                let keep = |i: usize, t: Tensor| need.get(i).copied().unwrap_or(false).then_some(t);
                Ok(vec![keep(0, gx), keep(1, gw), keep(2, gb)])
            }
            Op::LayerNorm {
                x,
                mean,
                invstd,
                weight,
            } => {
                let (gx, gw, gb) = x.layer_norm_backward(g, (mean, invstd, weight))?;
                let keep = |i: usize, t: Tensor| need.get(i).copied().unwrap_or(false).then_some(t);
                Ok(vec![keep(0, gx), keep(1, gw), keep(2, gb)])
            }
            Op::WhereCond {
                mask,
                on_true,
                on_false,
            } => {
                let z = zeros_like(g)?;
                two(
                    need,
                    || reduce_to(Tensor::where_cond(mask, g, &z)?, on_true),
                    || reduce_to(Tensor::where_cond(mask, &z, g)?, on_false),
                )
            }
            Op::CrossEntropy { grad } => one(need, || {
                let mut s = g.shape().to_vec();
                s.extend([1, 1]);
                Ok(grad.mul(&g.reshape(&s)?)?)
            }),
        }
    }
}
