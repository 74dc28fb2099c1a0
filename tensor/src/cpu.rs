//! The CPU backend: every op of [`crate::backend`] on [`CpuStorage`], dispatching on dtype to
//! cohort-kernels.
//!
//! Shapes are validated by [`crate::Tensor`] before these run; here only dtypes are checked.

use cohort_kernels::attention::{AttentionShape, cpu as attention_cpu};
use cohort_kernels::batchnorm::{BatchNormShape, Running, cpu as batchnorm_cpu};
use cohort_kernels::binary::{BinaryOp, cpu as binary_cpu};
use cohort_kernels::conv::{ConvParams, cpu as conv_cpu};
use cohort_kernels::copy::{Copy2d, cpu as copy_cpu};
use cohort_kernels::index::cpu as index_cpu;
use cohort_kernels::layernorm::{LayerNormShape, cpu as layernorm_cpu};
use cohort_kernels::matmul::{MatmulShape, cpu as matmul_cpu};
use cohort_kernels::optim::{AdamParams, SgdParams, cpu as optim_cpu};
use cohort_kernels::pool::{PoolParams, cpu as pool_cpu};
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cpu as reduce_cpu};
use cohort_kernels::softmax::cpu as softmax_cpu;
use cohort_kernels::unary::{UnaryOp, cpu as unary_cpu};
use cohort_kernels::{Float, Math};
use half::{bf16, f16};

use crate::backend::{
    Attention, Convolutions, Elementwise, Indexing, Layout, Normalization, OptimizerSteps,
    Products, Reductions,
};
use crate::storage::CpuStorage;
use crate::{DType, Element, Error, Result};

const HALF_HINT: &str = " (f16/bf16 are storage types: cast to f32 with to_dtype to compute)";

fn unsupported(op: &'static str, dtype: DType) -> Error {
    let hint = match dtype {
        DType::F16 | DType::BF16 => HALF_HINT,
        DType::I32 | DType::U8 => " (this op needs a float dtype: cast with to_dtype)",
        _ => "",
    };
    Error::UnsupportedDType { op, dtype, hint }
}

fn mismatch(op: &'static str, a: &CpuStorage, b: &CpuStorage) -> Error {
    Error::DTypeMismatch {
        op,
        lhs: a.dtype(),
        rhs: b.dtype(),
    }
}

/// Applies a generic expression to float storages (f32, f64), rewrapping the result.
macro_rules! float_map {
    ($op:expr, $s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            other => return Err(unsupported($op, other.dtype())),
        }
    };
}

/// Applies a generic expression to numeric storages (f32, f64, i32, u8), rewrapping the result.
macro_rules! num_map {
    ($op:expr, $s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            CpuStorage::I32($v) => CpuStorage::I32($e),
            CpuStorage::U8($v) => CpuStorage::U8($e),
            other => return Err(unsupported($op, other.dtype())),
        }
    };
}

/// Applies a generic expression to every storage type, rewrapping the result.
macro_rules! any_map {
    ($s:expr, |$v:ident| $e:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($e),
            CpuStorage::F64($v) => CpuStorage::F64($e),
            CpuStorage::F16($v) => CpuStorage::F16($e),
            CpuStorage::BF16($v) => CpuStorage::BF16($e),
            CpuStorage::I32($v) => CpuStorage::I32($e),
            CpuStorage::U8($v) => CpuStorage::U8($e),
        }
    };
}

fn indices<'a>(op: &'static str, idx: &'a CpuStorage) -> Result<&'a [i32]> {
    match idx {
        CpuStorage::I32(v) => Ok(v),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other.dtype(),
            hint: " (indices must be i32)",
        }),
    }
}

/// `len` elements of `value` (cast to `dtype`).
pub fn full(len: usize, value: f64, dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(vec![value as f32; len]),
        DType::F64 => CpuStorage::F64(vec![value; len]),
        DType::F16 => CpuStorage::F16(vec![f16::from_f64(value); len]),
        DType::BF16 => CpuStorage::BF16(vec![bf16::from_f64(value); len]),
        DType::I32 => CpuStorage::I32(vec![value as i32; len]),
        DType::U8 => CpuStorage::U8(vec![value as u8; len]),
    })
}

/// `len` zeros.
pub fn zeros(len: usize, dtype: DType) -> Result<CpuStorage> {
    full(len, 0.0, dtype)
}

fn to_f32(s: &CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v.clone(),
        CpuStorage::F64(v) => v.iter().map(|&x| x as f32).collect(),
        CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        CpuStorage::I32(v) => v.iter().map(|&x| x as f32).collect(),
        CpuStorage::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
    }
}

fn to_f64(s: &CpuStorage) -> Vec<f64> {
    match s {
        CpuStorage::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::F64(v) => v.clone(),
        CpuStorage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        CpuStorage::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
    }
}

/// The elements of `s`, which must have `first`'s type `T`.
fn like<'a, T: Element>(
    op: &'static str,
    first: &CpuStorage,
    s: &'a CpuStorage,
) -> Result<&'a [T]> {
    T::slice(s).ok_or_else(|| mismatch(op, first, s))
}

impl Layout for CpuStorage {
    /// `len` zeros (the CPU has one device).
    fn zeros_like(&self, len: usize, dtype: DType) -> Result<CpuStorage> {
        zeros(len, dtype)
    }

    /// Converts to `dtype`: floats round to nearest, float to integer truncates toward zero and
    /// saturates (NaN gives 0).
    fn cast(&self, dtype: DType) -> Result<CpuStorage> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(to_f32(self)),
            DType::F64 => CpuStorage::F64(to_f64(self)),
            DType::F16 => CpuStorage::F16(match self {
                CpuStorage::F64(v) => v.iter().map(|&x| f16::from_f64(x)).collect(),
                _ => to_f32(self).into_iter().map(f16::from_f32).collect(),
            }),
            DType::BF16 => CpuStorage::BF16(match self {
                CpuStorage::F64(v) => v.iter().map(|&x| bf16::from_f64(x)).collect(),
                _ => to_f32(self).into_iter().map(bf16::from_f32).collect(),
            }),
            DType::I32 => CpuStorage::I32(match self {
                CpuStorage::U8(v) => v.iter().map(|&x| i32::from(x)).collect(),
                _ => to_f64(self).into_iter().map(|x| x as i32).collect(),
            }),
            DType::U8 => CpuStorage::U8(to_f64(self).into_iter().map(|x| x as u8).collect()),
        })
    }

    /// Block copy from `src` into `dst` (same dtype).
    fn copy2d(&self, dst: &mut CpuStorage, c: &Copy2d) -> Result<()> {
        match (self, dst) {
            (CpuStorage::F32(s), CpuStorage::F32(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::F64(s), CpuStorage::F64(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::F16(s), CpuStorage::F16(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::BF16(s), CpuStorage::BF16(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::I32(s), CpuStorage::I32(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::U8(s), CpuStorage::U8(d)) => copy_cpu::copy2d(s, d, c),
            (s, d) => return Err(mismatch("copy", d, s)),
        }
        Ok(())
    }

    /// Transposes the last two dims of `[batch, rows, cols]`.
    fn transpose(&self, batch: usize, rows: usize, cols: usize) -> Result<CpuStorage> {
        Ok(any_map!(self, |v| copy_cpu::transpose(
            v, batch, rows, cols
        )))
    }

    /// Materializes a broadcast of `s` from `src_shape` to `out_shape`.
    fn broadcast(&self, src_shape: &[usize], out_shape: &[usize]) -> Result<CpuStorage> {
        Ok(any_map!(self, |v| copy_cpu::broadcast(
            v, src_shape, out_shape
        )))
    }

    /// Sets every element to `value`.
    fn fill(&mut self, value: f64) -> Result<()> {
        match self {
            CpuStorage::F32(v) => v.fill(value as f32),
            CpuStorage::F64(v) => v.fill(value),
            CpuStorage::F16(v) => v.fill(f16::from_f64(value)),
            CpuStorage::BF16(v) => v.fill(bf16::from_f64(value)),
            CpuStorage::I32(v) => v.fill(value as i32),
            CpuStorage::U8(v) => v.fill(value as u8),
        }
        Ok(())
    }
}

impl Elementwise for CpuStorage {
    /// Broadcast binary op (numeric dtypes).
    fn binary(
        &self,
        op: BinaryOp,
        lhs_shape: &[usize],
        rhs: &CpuStorage,
        rhs_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<CpuStorage> {
        macro_rules! go {
            ($a:expr, $b:expr) => {
                binary_cpu::binary(op, $a, lhs_shape, $b, rhs_shape, out_shape)
            };
        }
        Ok(match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(go!(a, b)),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(go!(a, b)),
            (CpuStorage::I32(a), CpuStorage::I32(b)) => CpuStorage::I32(go!(a, b)),
            (CpuStorage::U8(a), CpuStorage::U8(b)) => CpuStorage::U8(go!(a, b)),
            (a, b) if a.dtype() == b.dtype() => return Err(unsupported(op.name(), a.dtype())),
            (a, b) => return Err(mismatch(op.name(), a, b)),
        })
    }

    /// `dst = dst (op) src`, `src` broadcast to `dst_shape`.
    fn binary_assign(
        &mut self,
        op: BinaryOp,
        dst_shape: &[usize],
        src: &CpuStorage,
        src_shape: &[usize],
    ) -> Result<()> {
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::U8(d), CpuStorage::U8(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (d, s) if d.dtype() == s.dtype() => return Err(unsupported(op.name(), d.dtype())),
            (d, s) => return Err(mismatch(op.name(), d, s)),
        }
        Ok(())
    }

    /// Unary float op.
    fn unary(&self, op: UnaryOp) -> Result<CpuStorage> {
        Ok(float_map!(op.name(), self, |v| unary_cpu::unary(op, v)))
    }

    /// Picks `on_true` where `mask != 0`, else `on_false` (all the same length; mask of any numeric
    /// dtype).
    fn where_cond(&self, on_true: &CpuStorage, on_false: &CpuStorage) -> Result<CpuStorage> {
        if on_true.dtype() != on_false.dtype() {
            return Err(mismatch("where_cond", on_true, on_false));
        }
        macro_rules! pick {
            ($m:expr) => {
                match (on_true, on_false) {
                    (CpuStorage::F32(t), CpuStorage::F32(f)) => {
                        CpuStorage::F32(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::F64(t), CpuStorage::F64(f)) => {
                        CpuStorage::F64(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::F16(t), CpuStorage::F16(f)) => {
                        CpuStorage::F16(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::BF16(t), CpuStorage::BF16(f)) => {
                        CpuStorage::BF16(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::I32(t), CpuStorage::I32(f)) => {
                        CpuStorage::I32(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::U8(t), CpuStorage::U8(f)) => {
                        CpuStorage::U8(copy_cpu::where_cond($m, t, f))
                    }
                    (t, f) => return Err(mismatch("where_cond", t, f)),
                }
            };
        }
        Ok(match self {
            CpuStorage::F32(m) => pick!(m),
            CpuStorage::F64(m) => pick!(m),
            CpuStorage::I32(m) => pick!(m),
            CpuStorage::U8(m) => pick!(m),
            other => return Err(unsupported("where_cond (mask)", other.dtype())),
        })
    }

    /// `max(x + b, 0)` with `b` `[groups, cols]` broadcast over `group`-element blocks of `x`.
    fn bias_relu(&self, b: &CpuStorage, cols: usize, group: usize) -> Result<CpuStorage> {
        let x = self;
        Ok(match (x, b) {
            (CpuStorage::F32(x), CpuStorage::F32(b)) => {
                CpuStorage::F32(unary_cpu::bias_relu(x, b, cols, group))
            }
            (CpuStorage::F64(x), CpuStorage::F64(b)) => {
                CpuStorage::F64(unary_cpu::bias_relu(x, b, cols, group))
            }
            (x, b) if x.dtype() != b.dtype() => return Err(mismatch("bias_relu", x, b)),
            (x, _) => return Err(unsupported("bias_relu", x.dtype())),
        })
    }

    /// ReLU's backward from its output: `dy` where `y > 0`, else 0.
    fn relu_backward(&self, y: &CpuStorage) -> Result<CpuStorage> {
        Ok(match (self, y) {
            (CpuStorage::F32(g), CpuStorage::F32(y)) => {
                CpuStorage::F32(unary_cpu::relu_backward(g, y))
            }
            (CpuStorage::F64(g), CpuStorage::F64(y)) => {
                CpuStorage::F64(unary_cpu::relu_backward(g, y))
            }
            (g, y) if g.dtype() != y.dtype() => return Err(mismatch("relu_backward", g, y)),
            (g, _) => return Err(unsupported("relu_backward", g.dtype())),
        })
    }
}

impl Reductions for CpuStorage {
    /// Reduction along the middle dim of `[outer, dim, inner]`.
    fn reduce(&self, op: ReduceOp, shape: ReduceShape) -> Result<CpuStorage> {
        Ok(num_map!(op.name(), self, |v| reduce_cpu::reduce(
            op, v, shape
        )))
    }

    /// Index of the maximum along the middle dim of `[outer, dim, inner]`, as i32.
    fn argmax(&self, shape: ReduceShape) -> Result<CpuStorage> {
        Ok(CpuStorage::I32(match self {
            CpuStorage::F32(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::F64(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::I32(v) => reduce_cpu::argmax(v, shape),
            CpuStorage::U8(v) => reduce_cpu::argmax(v, shape),
            other => return Err(unsupported("argmax", other.dtype())),
        }))
    }

    /// Softmax or log-softmax of each row of `cols` elements.
    fn softmax_last(&self, cols: usize, log: bool) -> Result<CpuStorage> {
        let op = if log {
            "log_softmax_last"
        } else {
            "softmax_last"
        };
        Ok(float_map!(op, self, |v| softmax_cpu::softmax_last(
            v, cols, log
        )))
    }

    /// Softmax cross-entropy of rows of `cols` logits against i32 labels (row `r` takes label
    /// `r % labels`): each row's loss and the gradient `(softmax - onehot) · scale`.
    fn cross_entropy(
        &self,
        labels: &CpuStorage,
        cols: usize,
        scale: f64,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let l = indices("cross_entropy", labels)?;
        Ok(match self {
            CpuStorage::F32(x) => {
                let (loss, grad) = softmax_cpu::cross_entropy(x, cols, l, scale as f32)?;
                (CpuStorage::F32(loss), CpuStorage::F32(grad))
            }
            CpuStorage::F64(x) => {
                let (loss, grad) = softmax_cpu::cross_entropy(x, cols, l, scale)?;
                (CpuStorage::F64(loss), CpuStorage::F64(grad))
            }
            other => return Err(unsupported("cross_entropy", other.dtype())),
        })
    }
}

impl Products for CpuStorage {
    /// (Batched) matrix product.
    fn matmul(&self, rhs: &CpuStorage, shape: &MatmulShape) -> Result<CpuStorage> {
        Ok(match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(matmul_cpu::matmul(a, b, shape))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                CpuStorage::F64(matmul_cpu::matmul(a, b, shape))
            }
            (a, b) if a.dtype() == b.dtype() => return Err(unsupported("matmul", a.dtype())),
            (a, b) => return Err(mismatch("matmul", a, b)),
        })
    }

    /// A Linear layer's forward: `lhs · rhs + bias`, then a ReLU when `relu` (see the kernel's `linear`).
    fn linear(
        &self,
        rhs: &CpuStorage,
        bias: &CpuStorage,
        shape: &MatmulShape,
        bias_stride: usize,
        relu: bool,
    ) -> Result<Option<CpuStorage>> {
        Ok(Some(match (self, rhs, bias) {
            (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(c)) => {
                CpuStorage::F32(matmul_cpu::linear(a, b, c, bias_stride, relu, shape))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(c)) => {
                CpuStorage::F64(matmul_cpu::linear(a, b, c, bias_stride, relu, shape))
            }
            (a, b, _) if a.dtype() != b.dtype() => return Err(mismatch("linear", a, b)),
            (a, _, c) if a.dtype() != c.dtype() => return Err(mismatch("linear", a, c)),
            (a, _, _) => return Err(unsupported("linear", a.dtype())),
        }))
    }
}

impl Convolutions for CpuStorage {
    /// Forward 2-D convolution.
    fn conv2d(
        &self,
        weight: &CpuStorage,
        bias: Option<&CpuStorage>,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, weight, bias) {
            (CpuStorage::F32(x), CpuStorage::F32(w), None) => {
                CpuStorage::F32(conv_cpu::conv2d(x, w, None, p))
            }
            (CpuStorage::F32(x), CpuStorage::F32(w), Some(CpuStorage::F32(b))) => {
                CpuStorage::F32(conv_cpu::conv2d(x, w, Some(b), p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), None) => {
                CpuStorage::F64(conv_cpu::conv2d(x, w, None, p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), Some(CpuStorage::F64(b))) => {
                CpuStorage::F64(conv_cpu::conv2d(x, w, Some(b), p))
            }
            (x, w, _) if x.dtype() != w.dtype() => return Err(mismatch("conv2d", x, w)),
            (x, _, Some(b)) if x.dtype() != b.dtype() => {
                return Err(mismatch("conv2d (bias)", x, b));
            }
            (x, _, _) => return Err(unsupported("conv2d", x.dtype())),
        })
    }

    /// Gradient of a convolution with respect to its input.
    fn conv2d_backward_input(
        &self,
        weight: &CpuStorage,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, weight) {
            (CpuStorage::F32(g), CpuStorage::F32(w)) => {
                CpuStorage::F32(conv_cpu::conv2d_backward_input(g, w, p))
            }
            (CpuStorage::F64(g), CpuStorage::F64(w)) => {
                CpuStorage::F64(conv_cpu::conv2d_backward_input(g, w, p))
            }
            (a, b) if a.dtype() == b.dtype() => {
                return Err(unsupported("conv2d_backward_input", a.dtype()));
            }
            (a, b) => return Err(mismatch("conv2d_backward_input", a, b)),
        })
    }

    /// Gradient of a convolution with respect to its weight.
    fn conv2d_backward_weight(
        &self,
        grad_out: &CpuStorage,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, grad_out) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(conv_cpu::conv2d_backward_weight(x, g, p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(conv_cpu::conv2d_backward_weight(x, g, p))
            }
            (a, b) if a.dtype() == b.dtype() => {
                return Err(unsupported("conv2d_backward_weight", a.dtype()));
            }
            (a, b) => return Err(mismatch("conv2d_backward_weight", a, b)),
        })
    }

    /// Max pool; returns the values and the i32 argmax indices.
    fn max_pool2d(&self, p: &PoolParams) -> Result<(CpuStorage, CpuStorage)> {
        Ok(match self {
            CpuStorage::F32(v) => {
                let (o, i) = pool_cpu::max_pool2d(v, p);
                (CpuStorage::F32(o), CpuStorage::I32(i))
            }
            CpuStorage::F64(v) => {
                let (o, i) = pool_cpu::max_pool2d(v, p);
                (CpuStorage::F64(o), CpuStorage::I32(i))
            }
            other => return Err(unsupported("max_pool2d", other.dtype())),
        })
    }

    /// Backward of [`Convolutions::max_pool2d`].
    fn max_pool2d_backward(
        &self,
        indices: &CpuStorage,
        planes: usize,
        plane_in: usize,
        plane_out: usize,
    ) -> Result<CpuStorage> {
        let idx = self::indices("max_pool2d_backward", indices)?;
        Ok(float_map!("max_pool2d_backward", self, |g| {
            pool_cpu::max_pool2d_backward(g, idx, planes, plane_in, plane_out)?
        }))
    }
}

impl Indexing for CpuStorage {
    /// Selects rows along the middle dim of `[outer, dim, inner]`.
    fn index_select(
        &self,
        idx: &CpuStorage,
        outer: usize,
        dim: usize,
        inner: usize,
    ) -> Result<CpuStorage> {
        let idx = indices("index_select", idx)?;
        Ok(any_map!(self, |v| index_cpu::index_select(
            v, outer, dim, inner, idx
        )?))
    }

    /// `dst[o, idx[i], :] += src[o, i, :]`.
    fn index_add(
        &mut self,
        idx: &CpuStorage,
        src: &CpuStorage,
        outer: usize,
        dim: usize,
        inner: usize,
    ) -> Result<()> {
        let idx = indices("index_add", idx)?;
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                index_cpu::index_add(d, outer, dim, inner, idx, s)?
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                index_cpu::index_add(d, outer, dim, inner, idx, s)?
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                index_cpu::index_add(d, outer, dim, inner, idx, s)?
            }
            (CpuStorage::U8(d), CpuStorage::U8(s)) => {
                index_cpu::index_add(d, outer, dim, inner, idx, s)?
            }
            (d, s) if d.dtype() == s.dtype() => return Err(unsupported("index_add", d.dtype())),
            (d, s) => return Err(mismatch("index_add", d, s)),
        }
        Ok(())
    }

    /// `out[r] = src[r, idx[r]]` for `[rows, cols]` sources.
    fn gather_last(&self, idx: &CpuStorage, cols: usize) -> Result<CpuStorage> {
        let idx = indices("gather_last", idx)?;
        Ok(any_map!(self, |v| index_cpu::gather_last(v, cols, idx)?))
    }

    /// `dst[r, idx[r]] += src[r]`.
    fn scatter_add_last(&mut self, idx: &CpuStorage, src: &CpuStorage, cols: usize) -> Result<()> {
        let idx = indices("scatter_add_last", idx)?;
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (d, s) if d.dtype() == s.dtype() => {
                return Err(unsupported("scatter_add_last", d.dtype()));
            }
            (d, s) => return Err(mismatch("scatter_add_last", d, s)),
        }
        Ok(())
    }

    /// One-hot rows of `classes` columns.
    fn one_hot(&self, classes: usize, dtype: DType) -> Result<CpuStorage> {
        let l = indices("one_hot", self)?;
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(index_cpu::one_hot(l, classes)?),
            DType::F64 => CpuStorage::F64(index_cpu::one_hot(l, classes)?),
            DType::I32 => CpuStorage::I32(index_cpu::one_hot(l, classes)?),
            DType::U8 => CpuStorage::U8(index_cpu::one_hot(l, classes)?),
            other => return Err(unsupported("one_hot", other)),
        })
    }
}

impl Normalization for CpuStorage {
    /// Batch normalization in training of `x` (see [`cohort_kernels::batchnorm`]): `(out, mean, invstd)`, moving
    /// the running `(mean, var, momentum)` in place when given; all of one float dtype.
    fn batch_norm(
        &self,
        (weight, bias): (&CpuStorage, &CpuStorage),
        (shape, eps): (&BatchNormShape, f64),
        relu: bool,
        running: Option<(&mut CpuStorage, &mut CpuStorage, f64)>,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let x = self;
        const OP: &str = "batch_norm";
        type Stats<'a> = Option<(&'a mut CpuStorage, &'a mut CpuStorage, f64)>;
        fn on<T: Element + Float>(
            x: &CpuStorage,
            [w, b]: [&CpuStorage; 2],
            shape: (&BatchNormShape, f64),
            relu: bool,
            running: Stats<'_>,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let running = match running {
                Some((m, v, momentum)) => {
                    let bad = |rhs: DType| Error::DTypeMismatch {
                        op: OP,
                        lhs: x.dtype(),
                        rhs,
                    };
                    let (dm, dv) = (m.dtype(), v.dtype());
                    Some(Running {
                        mean: T::slice_mut(m).ok_or_else(|| bad(dm))?,
                        var: T::slice_mut(v).ok_or_else(|| bad(dv))?,
                        momentum,
                    })
                }
                None => None,
            };
            let wb = (like::<T>(OP, x, w)?, like::<T>(OP, x, b)?);
            let (y, m, i) = batchnorm_cpu::forward(like::<T>(OP, x, x)?, wb, shape, relu, running);
            Ok((T::into_storage(y), T::into_storage(m), T::into_storage(i)))
        }
        match x.dtype() {
            DType::F32 => on::<f32>(x, [weight, bias], (shape, eps), relu, running),
            DType::F64 => on::<f64>(x, [weight, bias], (shape, eps), relu, running),
            other => Err(unsupported(OP, other)),
        }
    }

    /// The gradients `(dx, dweight, dbias)` of [`Normalization::batch_norm`] from its input `x`, its output `out` when it rectified,
    /// the output's gradient `dout`, and its `mean`, `invstd` and `weight`.
    fn batch_norm_backward(
        &self,
        out: Option<&CpuStorage>,
        dout: &CpuStorage,
        (mean, invstd, weight): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &BatchNormShape,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let x = self;
        const OP: &str = "batch_norm_backward";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            out: Option<&CpuStorage>,
            [dout, mean, invstd, weight]: [&CpuStorage; 4],
            shape: &BatchNormShape,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let out = out.map(|o| like::<T>(OP, x, o)).transpose()?;
            let [g, m, i, w] = [dout, mean, invstd, weight].map(|s| like::<T>(OP, x, s));
            let (dx, dw, db) =
                batchnorm_cpu::backward(like::<T>(OP, x, x)?, out, g?, (m?, i?, w?), shape);
            Ok((
                T::into_storage(dx),
                T::into_storage(dw),
                T::into_storage(db),
            ))
        }
        let rest = [dout, mean, invstd, weight];
        match x.dtype() {
            DType::F32 => on::<f32>(x, out, rest, shape),
            DType::F64 => on::<f64>(x, out, rest, shape),
            other => Err(unsupported(OP, other)),
        }
    }

    /// Layer normalization of `x` over its last dimension (see [`cohort_kernels::layernorm`]): `(out, mean, invstd)`.
    fn layer_norm(
        &self,
        (weight, bias): (&CpuStorage, &CpuStorage),
        shape: (&LayerNormShape, f64),
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let x = self;
        const OP: &str = "layer_norm";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            [w, b]: [&CpuStorage; 2],
            shape: (&LayerNormShape, f64),
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let wb = (like::<T>(OP, x, w)?, like::<T>(OP, x, b)?);
            let (y, m, i) = layernorm_cpu::forward(like::<T>(OP, x, x)?, wb, shape);
            Ok((T::into_storage(y), T::into_storage(m), T::into_storage(i)))
        }
        match x.dtype() {
            DType::F32 => on::<f32>(x, [weight, bias], shape),
            DType::F64 => on::<f64>(x, [weight, bias], shape),
            other => Err(unsupported(OP, other)),
        }
    }

    /// The gradients `(dx, dweight, dbias)` of [`Normalization::layer_norm`] from its input `x`, the output's gradient `dout`, and
    /// its `mean`, `invstd` and `weight`.
    fn layer_norm_backward(
        &self,
        dout: &CpuStorage,
        (mean, invstd, weight): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &LayerNormShape,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        let x = self;
        const OP: &str = "layer_norm_backward";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            rest: [&CpuStorage; 4],
            shape: &LayerNormShape,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let [g, m, i, w] = rest.map(|s| like::<T>(OP, x, s));
            let (dx, dw, db) =
                layernorm_cpu::backward(like::<T>(OP, x, x)?, g?, (m?, i?, w?), shape);
            Ok((
                T::into_storage(dx),
                T::into_storage(dw),
                T::into_storage(db),
            ))
        }
        let rest = [dout, mean, invstd, weight];
        match x.dtype() {
            DType::F32 => on::<f32>(x, rest, shape),
            DType::F64 => on::<f64>(x, rest, shape),
            other => Err(unsupported(OP, other)),
        }
    }
}

impl Attention for CpuStorage {
    /// Fused self-attention of a packed `qkv` with an optional key-padding mask of its dtype: the output and each
    /// query's log-sum-exp (see [`cohort_kernels::attention`]).
    fn attention(
        &self,
        mask: Option<&CpuStorage>,
        shape: &AttentionShape,
    ) -> Result<(CpuStorage, CpuStorage)> {
        let qkv = self;
        fn on<T: Element + Float>(
            qkv: &CpuStorage,
            mask: Option<&CpuStorage>,
            shape: &AttentionShape,
        ) -> Result<(CpuStorage, CpuStorage)> {
            let m = mask.map_or(Ok(&[][..]), |m| like::<T>("attention", qkv, m))?;
            let (out, lse) = attention_cpu::forward(like::<T>("attention", qkv, qkv)?, m, shape);
            Ok((T::into_storage(out), T::into_storage(lse)))
        }
        match qkv.dtype() {
            DType::F32 => on::<f32>(qkv, mask, shape),
            DType::F64 => on::<f64>(qkv, mask, shape),
            other => Err(unsupported("attention", other)),
        }
    }

    /// The gradient of [`Attention::attention`]'s `qkv`, given its output `out`, log-sum-exps `lse` and the output's gradient
    /// `dout` (all of `qkv`'s dtype).
    fn attention_backward(
        &self,
        mask: Option<&CpuStorage>,
        (out, lse, dout): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &AttentionShape,
    ) -> Result<CpuStorage> {
        let qkv = self;
        const OP: &str = "attention_backward";
        fn on<T: Element + Float>(
            qkv: &CpuStorage,
            mask: Option<&CpuStorage>,
            [out, lse, dout]: [&CpuStorage; 3],
            shape: &AttentionShape,
        ) -> Result<CpuStorage> {
            let m = mask.map_or(Ok(&[][..]), |m| like::<T>(OP, qkv, m))?;
            let [x, o, l, g] = [qkv, out, lse, dout].map(|s| like::<T>(OP, qkv, s));
            Ok(T::into_storage(attention_cpu::backward(
                x?,
                m,
                (o?, l?),
                g?,
                shape,
            )))
        }
        match qkv.dtype() {
            DType::F32 => on::<f32>(qkv, mask, [out, lse, dout], shape),
            DType::F64 => on::<f64>(qkv, mask, [out, lse, dout], shape),
            other => Err(unsupported(OP, other)),
        }
    }
}

impl OptimizerSteps for CpuStorage {
    /// One fused SGD step.
    fn sgd_step(
        &mut self,
        grad: &CpuStorage,
        momentum_buf: Option<&mut CpuStorage>,
        h: &SgdParams<'_>,
    ) -> Result<()> {
        let param = self;
        match (param, grad, momentum_buf) {
            (CpuStorage::F32(p), CpuStorage::F32(g), None) => optim_cpu::sgd_step(p, g, None, h),
            (CpuStorage::F32(p), CpuStorage::F32(g), Some(CpuStorage::F32(b))) => {
                optim_cpu::sgd_step(p, g, Some(b), h)
            }
            (CpuStorage::F64(p), CpuStorage::F64(g), None) => optim_cpu::sgd_step(p, g, None, h),
            (CpuStorage::F64(p), CpuStorage::F64(g), Some(CpuStorage::F64(b))) => {
                optim_cpu::sgd_step(p, g, Some(b), h)
            }
            (p, g, _) if p.dtype() != g.dtype() => return Err(mismatch("sgd_step", p, g)),
            (p, _, Some(b)) if p.dtype() != b.dtype() => {
                return Err(mismatch("sgd_step (momentum buffer)", p, b));
            }
            (p, _, _) => return Err(unsupported("sgd_step", p.dtype())),
        }
        Ok(())
    }

    /// One fused Adam / AdamW step.
    fn adam_step(
        &mut self,
        grad: &CpuStorage,
        m: &mut CpuStorage,
        v: &mut CpuStorage,
        h: &AdamParams<'_>,
    ) -> Result<()> {
        let param = self;
        match (param, grad, m, v) {
            (CpuStorage::F32(p), CpuStorage::F32(g), CpuStorage::F32(m), CpuStorage::F32(v)) => {
                optim_cpu::adam_step(p, g, m, v, h)
            }
            (CpuStorage::F64(p), CpuStorage::F64(g), CpuStorage::F64(m), CpuStorage::F64(v)) => {
                optim_cpu::adam_step(p, g, m, v, h)
            }
            (p, g, m, v) => {
                for (name, o) in [
                    ("adam_step (grad)", g),
                    ("adam_step (m)", &*m),
                    ("adam_step (v)", &*v),
                ] {
                    if o.dtype() != p.dtype() {
                        return Err(mismatch(name, p, o));
                    }
                }
                return Err(unsupported("adam_step", p.dtype()));
            }
        }
        Ok(())
    }
}
