//! Tensor ops: element-wise, reductions, matrix products and indexing (convolution and pooling in
//! `conv.rs`, optimizer steps in `optim.rs`). Each validates shapes, dtypes and devices, then dispatches
//! to the CPU or CUDA backend.

use cohort_kernels::binary::BinaryOp;
use cohort_kernels::matmul::MatmulShape;
use cohort_kernels::reduce::{ReduceOp, ReduceShape};
use cohort_kernels::unary::UnaryOp;

use crate::backend::{CudaBackend, Elementwise, Indexing, Products, Reductions};
use crate::storage::{OfBackend, Storage};
use crate::tensor::{elem_count, map1, map2, mutate2};
use crate::{DType, Error, Precision, Result, Tensor};

/// The numpy broadcast of two shapes.
///
/// # Errors
/// [`Error::ShapeMismatch`] naming `op` when a pair of dims differs and neither is 1.
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::ShapeMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
            });
        };
    }
    Ok(out)
}

impl Tensor {
    fn binary_op(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let name = op.name();
        self.same_dtype(name, rhs)?;
        let out = broadcast_shape(name, &self.shape, &rhs.shape)?;
        let (ls, rs) = (self.shape.clone(), rhs.shape.clone());
        map2!(self, name, rhs, out.clone(), |a, b| a
            .binary(op, &ls, b, &rs, &out))
    }

    fn unary_op(&self, op: UnaryOp) -> Result<Tensor> {
        self.require_float(op.name())?;
        map1!(self, self.shape.clone(), |s| s.unary(op))
    }

    /// `self + rhs`, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Add, rhs)
    }

    /// `self + rhs` for gradient accumulation: written over the elements of whichever of the two no other tensor
    /// shares (a view, a saved value), so that summing two gradients makes no third buffer of their size; into a
    /// new tensor where both are shared or their shapes differ. The same bits as [`Tensor::add`] either way.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn accumulate(self, rhs: Tensor) -> Result<Tensor> {
        let alone = |t: &Tensor| std::sync::Arc::strong_count(&t.storage) == 1;
        let same = self.shape == rhs.shape && self.dtype == rhs.dtype && self.device == rhs.device;
        match (alone(&self), alone(&rhs)) {
            (true, _) if same => self.add_assign_(&rhs).map(|()| self),
            (_, true) if same => rhs.add_assign_(&self).map(|()| rhs),
            _ => self.add(&rhs),
        }
    }

    /// `self - rhs`, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Sub, rhs)
    }

    /// `self * rhs`, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Mul, rhs)
    }

    /// `self / rhs`, broadcasting (integer division by zero gives 0).
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Div, rhs)
    }

    /// Element-wise maximum, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Maximum, rhs)
    }

    /// Element-wise minimum, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Minimum, rhs)
    }

    /// 1 where `self > rhs`, else 0 (in this tensor's dtype), broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Gt, rhs)
    }

    /// 1 where `self >= rhs`, else 0, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Ge, rhs)
    }

    /// 1 where `self < rhs`, else 0, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Lt, rhs)
    }

    /// 1 where `self <= rhs`, else 0, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Le, rhs)
    }

    /// 1 where `self == rhs`, else 0, broadcasting.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Eq, rhs)
    }

    /// `self + c`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn add_scalar(&self, c: f64) -> Result<Tensor> {
        self.unary_op(UnaryOp::AddScalar(c))
    }

    /// `self * c`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn mul_scalar(&self, c: f64) -> Result<Tensor> {
        self.unary_op(UnaryOp::MulScalar(c))
    }

    /// `self ^ e`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn powf(&self, e: f64) -> Result<Tensor> {
        self.unary_op(UnaryOp::Powf(e))
    }

    /// 1 where `self > c`, else 0.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn gt_scalar(&self, c: f64) -> Result<Tensor> {
        self.unary_op(UnaryOp::GtScalar(c))
    }

    /// 1 where `self < c`, else 0.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn lt_scalar(&self, c: f64) -> Result<Tensor> {
        self.unary_op(UnaryOp::LtScalar(c))
    }

    /// `-self`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Neg)
    }

    /// `max(self, 0)`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Relu)
    }

    /// GELU, tanh approximation.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Gelu)
    }

    /// Hyperbolic tangent.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Tanh)
    }

    /// Logistic sigmoid.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sigmoid)
    }

    /// e^self.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Exp)
    }

    /// Natural logarithm.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn log(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Log)
    }

    /// Square root.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sqrt)
    }

    /// Absolute value.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Abs)
    }

    /// `self²`.
    ///
    /// # Errors
    /// Non-float dtypes; device errors.
    pub fn square(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Square)
    }

    /// Picks `on_true` where `mask != 0`, else `on_false`; all three broadcast together.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn where_cond(mask: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        const OP: &str = "where_cond";
        on_true.same_dtype(OP, on_false)?;
        mask.same_device(OP, on_true)?;
        mask.same_device(OP, on_false)?;
        let s = broadcast_shape(OP, &mask.shape, &on_true.shape)?;
        let s = broadcast_shape(OP, &s, &on_false.shape)?;
        let (m, t, f) = (
            mask.broadcast_to(&s)?,
            on_true.broadcast_to(&s)?,
            on_false.broadcast_to(&s)?,
        );
        // Distinct storages only: a second read lock on one storage could deadlock behind a writer.
        let t = if t.same_storage(&m) { t.copy()? } else { t };
        let f = if f.same_storage(&m) || f.same_storage(&t) {
            f.copy()?
        } else {
            f
        };
        let (mg, tg, fg) = (m.read(), t.read(), f.read());
        let out = match (&*mg, &*tg, &*fg) {
            (Storage::Cpu(m), Storage::Cpu(t), Storage::Cpu(f)) => {
                Storage::Cpu(m.where_cond(t, f)?)
            }
            (Storage::Cuda(m), Storage::Cuda(t), Storage::Cuda(f)) => {
                Storage::Cuda(m.where_cond(t, f)?)
            }
            _ => return Err(mask.device_mismatch(OP, on_true)),
        };
        Ok(Tensor::from_storage(out, s))
    }

    // ---------------------------------------------------------------- reductions

    /// Sum along `dim`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; unsupported dtypes.
    pub fn sum(&self, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Sum, dim, keepdim)
    }

    /// Mean along `dim` (float dtypes).
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; non-float dtypes.
    pub fn mean(&self, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Mean, dim, keepdim)
    }

    /// Maximum along `dim`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; unsupported dtypes.
    pub fn max(&self, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Max, dim, keepdim)
    }

    /// Minimum along `dim`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; unsupported dtypes.
    pub fn min(&self, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Min, dim, keepdim)
    }

    /// Index of the maximum along `dim` (the first on ties), i32, `dim` removed.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; unsupported dtypes.
    pub fn argmax(&self, dim: usize) -> Result<Tensor> {
        self.check_dim("argmax", dim)?;
        let rs = self.split_at_dim(dim);
        let mut shape = self.shape.clone();
        shape.remove(dim);
        map1!(self, shape, |s| s.argmax(rs))
    }

    /// Sum of all elements, shape `[]`.
    ///
    /// # Errors
    /// Unsupported dtypes.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reshape(&[self.elem_count()])?.sum(0, false)
    }

    /// Mean of all elements, shape `[]`.
    ///
    /// # Errors
    /// Non-float dtypes.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.reshape(&[self.elem_count()])?.mean(0, false)
    }

    fn softmax_impl(&self, log: bool) -> Result<Tensor> {
        let op = if log {
            "log_softmax_last"
        } else {
            "softmax_last"
        };
        self.require_float(op)?;
        let Some(&cols) = self.shape.last() else {
            return Err(Error::InvalidShape {
                op,
                shape: vec![],
                reason: "needs rank >= 1".into(),
            });
        };
        map1!(self, self.shape.clone(), |s| s.softmax_last(cols, log))
    }

    /// Softmax along the last dim.
    ///
    /// # Errors
    /// Non-float dtypes; rank 0.
    pub fn softmax_last(&self) -> Result<Tensor> {
        self.softmax_impl(false)
    }

    /// Log-softmax along the last dim (computed stably, not as log(softmax)).
    ///
    /// # Errors
    /// Non-float dtypes; rank 0.
    pub fn log_softmax_last(&self) -> Result<Tensor> {
        self.softmax_impl(true)
    }

    // ---------------------------------------------------------------- matrix products

    /// Matrix product: `[m,k]·[k,n]`, `[b,m,k]·[b,k,n]` (any equal leading dims), and the
    /// broadcast forms `[m,k]·[b,k,n]` and `[b,m,k]·[k,n]`.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; non-float dtypes.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_t(rhs, false, false)
    }

    /// [`Tensor::matmul`] with the last two dims of either operand taken transposed (no copy is
    /// made: the kernel reads them strided). Under a precision policy on CUDA the product runs in
    /// its math (see [`Precision`]): on TF32 tensor cores, or with operands cast to the low type
    /// (either may be of it already) and an f32 result.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; non-float dtypes.
    pub fn matmul_t(&self, rhs: &Tensor, trans_lhs: bool, trans_rhs: bool) -> Result<Tensor> {
        const OP: &str = "matmul";
        if let Some(math) = Precision::current().math_for(self, rhs) {
            return self.matmul_under(rhs, (trans_lhs, trans_rhs), math);
        }
        let (shape, out) = self.matmul_shape(rhs, trans_lhs, trans_rhs)?;
        map2!(self, OP, rhs, out, |a, b| a.matmul(b, &shape))
    }

    /// `self · w + bias`, then a ReLU when `relu`: a Linear layer's forward. `self` `[.., m, k]`
    /// (or `[m, k]` shared by every batch entry), `w` `[.., k, n]`, `bias` `[n]` or one row per
    /// batch entry (`[G, 1, n]` for an output `[G, m, n]`). On CUDA (f32) one cuBLASLt call with
    /// the bias and ReLU in its epilogue where it can; otherwise the product, then
    /// [`bias_relu`](Tensor::bias_relu) or [`add`](Tensor::add).
    ///
    /// # Errors
    /// Another bias shape, or as [`matmul`](Tensor::matmul).
    pub fn linear(&self, w: &Tensor, bias: &Tensor, relu: bool) -> Result<Tensor> {
        if Precision::current().math_for(self, w).is_some() {
            // The product in the policy's math (cuBLAS GemmEx), then the bias and ReLU in f32, in one pass.
            let y = self.matmul(w)?;
            return match (relu, bias_groups(&y.shape, &bias.shape)) {
                (false, None) => y.add(bias),
                _ => y.bias_act(bias, relu),
            };
        }
        let (shape, out) = self.matmul_shape(w, false, false)?;
        let n = out.last().copied().unwrap_or(0);
        let groups = match bias_groups(&out, &bias.shape) {
            Some(g) if bias.rank() == 1 || bias.rank() == 3 => g,
            _ => {
                return Err(Error::InvalidArgument {
                    op: "linear",
                    reason: format!(
                        "bias {:?} for an output {out:?}: expected [{n}] or [{}, 1, {n}]",
                        bias.shape, out[0]
                    ),
                });
            }
        };
        // One bias for all products, or one per product (the epilogue's stride); not one per
        // member where the members' products were merged into one (a weight shared by all).
        let stride = match groups {
            1 => Some(0),
            g if g == shape.batch => Some(n),
            _ => None,
        };
        if let (Some(stride), false) = (stride, self.device().is_cuda()) {
            // One CPU kernel: each product finished (bias, product, ReLU) while its output is in cache.
            let y = Tensor::read_all(&[self, w, bias], |st| match (st[0], st[1], st[2]) {
                (Storage::Cpu(x), Storage::Cpu(w), Storage::Cpu(b)) => {
                    x.linear(w, b, &shape, stride, relu)
                }
                _ => Err(self.device_mismatch("linear", bias)),
            })?;
            // The CPU always has the fused kernel (`None` is CUDA's answer only).
            if let Some(y) = y {
                return Ok(Tensor::from_storage(Storage::Cpu(y), out));
            }
        }
        if let Some(stride) = stride
            && bias.dtype == self.dtype
        {
            let y = Tensor::read_all(&[self, w, bias], |st| match (st[0], st[1], st[2]) {
                (Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(b)) => {
                    x.linear(w, b, &shape, stride, relu)
                }
                _ => Ok(None),
            })?;
            if let Some(y) = y {
                return Ok(Tensor::from_storage(Storage::Cuda(y), out));
            }
        }
        self.matmul(w)?.bias_act(bias, relu)
    }

    /// A Linear layer's weight and bias gradients from its input `self` (`[.., m, k]`, or `[m, k]`
    /// shared by every member) and its output's gradient `g` (`[G, m, n]`): `selfᵀ · g` and the
    /// sums of `g` over its rows, shaped `[G, 1, n]`, alongside `main` (the input's gradient,
    /// say). On CUDA (f32) where it can, one cuBLASLt call on the side stream, running
    /// concurrently with `main`'s work (see `Gpu::on_side`); otherwise after `main`.
    ///
    /// # Errors
    /// `g` not of rank 3, as [`matmul_t`](Tensor::matmul_t), or `main`'s error.
    pub fn linear_grads_beside<T, E: From<Error>>(
        &self,
        g: &Tensor,
        main: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<((Tensor, Tensor), T), E> {
        if g.rank() != 3 {
            return Err(Error::InvalidArgument {
                op: "linear_grads",
                reason: format!("the output's gradient {:?} must be [G, m, n]", g.shape),
            }
            .into());
        }
        if Precision::current().math_for(self, g).is_some() {
            let t = main();
            let grads = (self.matmul_t(g, true, false)?, g.sum(1, true)?);
            return Ok((grads, t?));
        }
        let (shape, out) = self.matmul_shape(g, true, false)?;
        let sums_shape = vec![g.shape[0], 1, g.shape[2]];
        let side = if self.device().is_cuda() {
            Tensor::read_all(&[self, g], |st| match (st[0], st[1]) {
                (Storage::Cuda(x), Storage::Cuda(gv)) => x.linear_grads_on_side(gv, &shape),
                _ => Ok(None),
            })?
        } else {
            None
        };
        // `self` and `g` stay alive (borrowed) until the join.
        let t = main();
        let grads = match side {
            Some(side) => {
                let (gw, gb) = side.join()?;
                (
                    Tensor::from_storage(Storage::Cuda(gw), out),
                    Tensor::from_storage(Storage::Cuda(gb), sums_shape),
                )
            }
            None => (self.matmul_t(g, true, false)?, g.sum(1, true)?),
        };
        Ok((grads, t?))
    }

    /// The product's geometry and output shape (see [`matmul_t`](Tensor::matmul_t)).
    pub(crate) fn matmul_shape(
        &self,
        rhs: &Tensor,
        trans_lhs: bool,
        trans_rhs: bool,
    ) -> Result<(MatmulShape, Vec<usize>)> {
        const OP: &str = "matmul";
        self.same_dtype(OP, rhs)?;
        self.same_device(OP, rhs)?;
        // f16/bf16 run on CUDA (GemmEx); the CPU backend refuses them with a dtype error.
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            self.require_float(OP)?;
        }
        let (lr, rr) = (self.rank(), rhs.rank());
        if lr < 2 || rr < 2 {
            return Err(self.shape_mismatch(OP, rhs));
        }
        let (mut m, mut k) = (self.shape[lr - 2], self.shape[lr - 1]);
        if trans_lhs {
            std::mem::swap(&mut m, &mut k);
        }
        let (mut k2, mut n) = (rhs.shape[rr - 2], rhs.shape[rr - 1]);
        if trans_rhs {
            std::mem::swap(&mut k2, &mut n);
        }
        if k != k2 {
            return Err(self.shape_mismatch(OP, rhs));
        }
        let (lb, rb) = (&self.shape[..lr - 2], &rhs.shape[..rr - 2]);
        let batch_dims: Vec<usize> = match (lb.is_empty(), rb.is_empty()) {
            (true, _) => rb.to_vec(),
            (false, true) => lb.to_vec(),
            (false, false) if lb == rb => lb.to_vec(),
            _ => return Err(self.shape_mismatch(OP, rhs)),
        };
        let batch = elem_count(&batch_dims);
        let mut shape = MatmulShape {
            batch,
            m,
            n,
            k,
            lhs_batch_stride: if lb.is_empty() { 0 } else { m * k },
            rhs_batch_stride: if rb.is_empty() { 0 } else { k * n },
            trans_lhs,
            trans_rhs,
        };
        // [b,m,k]·[k,n] is one [b·m,k]·[k,n] product: a single larger gemm is faster.
        if rb.is_empty() && !lb.is_empty() && !trans_lhs {
            shape = MatmulShape {
                batch: 1,
                m: batch * m,
                lhs_batch_stride: 0,
                ..shape
            };
        }
        let mut out = batch_dims;
        out.extend([m, n]);
        Ok((shape, out))
    }

    // ---------------------------------------------------------------- indexing

    /// Selects entries along `dim` by i32 `indices` of any shape; the result has `indices`' dims
    /// in place of `dim` (embeddings: `table[V, D].index_select(ids[B, T], 0)` is `[B, T, D]`).
    ///
    /// # Errors
    /// Non-i32 indices; a dim out of range; an index out of range.
    pub fn index_select(&self, indices: &Tensor, dim: usize) -> Result<Tensor> {
        const OP: &str = "index_select";
        self.check_dim(OP, dim)?;
        indices.require_i32(OP)?;
        let ReduceShape {
            outer,
            dim: d,
            inner,
        } = self.split_at_dim(dim);
        let mut shape = self.shape[..dim].to_vec();
        shape.extend_from_slice(&indices.shape);
        shape.extend_from_slice(&self.shape[dim + 1..]);
        map2!(self, OP, indices, shape, |s, i| s
            .index_select(i, outer, d, inner))
    }

    /// The mean of each bag of `bag` consecutive ids' rows of the table `self` (`[R, D]`): `[n / bag, D]` for
    /// `n` indices, an embedding bag's lookup. One kernel for an f32 table on CUDA, with no looked-up row written
    /// out; elsewhere an [`index_select`](Tensor::index_select) and a [`mean`](Tensor::mean).
    ///
    /// # Errors
    /// `self` not 2-D; `bag` 0 or not dividing the indices; indices not i32; an index out of range (on CUDA
    /// reported at the next read-back).
    pub fn bag_mean(&self, indices: &Tensor, bag: usize) -> Result<Tensor> {
        const OP: &str = "bag_mean";
        indices.require_i32(OP)?;
        self.same_device(OP, indices)?;
        let n = indices.elem_count();
        let &[rows, cols] = &self.shape[..] else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: self.shape.clone(),
                reason: "needs a table [R, D]".into(),
            });
        };
        if bag == 0 || n % bag != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("{n} indices do not make bags of {bag}"),
            });
        }
        if self.device().is_cuda() && self.dtype == DType::F32 {
            let out = Tensor::read_all(&[self, indices], |st| match st {
                [Storage::Cuda(t), Storage::Cuda(i)] => t.bag_mean(i, bag, [rows, cols]),
                _ => Err(self.device_mismatch(OP, indices)),
            })?;
            return Ok(Tensor::from_storage(
                Storage::Cuda(out),
                vec![n / bag, cols],
            ));
        }
        self.index_select(&indices.reshape(&[n])?, 0)?
            .reshape(&[n / bag, bag, cols])?
            .mean(1, false)
    }

    /// A copy of `self` with `src` rows added at `indices` along `dim` (repeats accumulate): the
    /// backward of [`Tensor::index_select`]. `src` has `indices`' dims in place of `dim`.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; an index out of range.
    pub fn index_add(&self, dim: usize, indices: &Tensor, src: &Tensor) -> Result<Tensor> {
        let out = self.copy()?;
        out.index_add_(dim, indices, src)?;
        Ok(out)
    }

    /// Adds `src` rows at `indices` along `dim` of `self`, in place (repeats accumulate). `src` has `indices`' dims
    /// in place of `dim`, or, for indices `[n]`, `n / k` rows there: each of those rows is added at `k` consecutive
    /// indices (an embedding bag's gradient, one row per bag of `k` ids, needs no copy per id).
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; an index out of range (`self` is then unchanged on the CPU; on a GPU the
    /// error comes with the next synchronisation).
    pub fn index_add_(&self, dim: usize, indices: &Tensor, src: &Tensor) -> Result<()> {
        const OP: &str = "index_add_";
        self.check_dim(OP, dim)?;
        indices.require_i32(OP)?;
        self.same_dtype(OP, src)?;
        self.same_device(OP, indices)?;
        let with = |rows: &[usize]| {
            let mut s = self.shape[..dim].to_vec();
            s.extend_from_slice(rows);
            s.extend_from_slice(&self.shape[dim + 1..]);
            s
        };
        let n = indices.elem_count();
        let groups = src.shape.get(dim).copied().unwrap_or(0);
        let repeat = if src.shape == with(&indices.shape) {
            1
        } else if indices.shape.len() == 1
            && groups > 0
            && n % groups == 0
            && src.shape == with(&[groups])
        {
            n / groups
        } else {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: with(&indices.shape),
                rhs: src.shape.clone(),
            });
        };
        let ReduceShape {
            outer,
            dim: d,
            inner,
        } = self.split_at_dim(dim);
        // Indices that are this very tensor (i32) are read from a copy: it is written meanwhile.
        let own;
        let indices = if self.same_storage(indices) {
            own = indices.copy()?;
            &own
        } else {
            indices
        };
        let ig = indices.read();
        mutate2!(self, OP, src, |dst, s| match OfBackend::of(&ig) {
            Some(i) => dst.index_add(i, s, (outer, d, inner), repeat),
            None => Err(indices.device_mismatch(OP, src)),
        })
    }

    /// `out[..] = self[.., indices[..]]`: one entry of the last dim per row; `indices` (i32) has
    /// the shape of `self` without its last dim.
    ///
    /// # Errors
    /// Shape or device mismatches; non-i32 indices; an index out of range.
    pub fn gather_last(&self, indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather_last";
        indices.require_i32(OP)?;
        let Some((&cols, lead)) = self.shape.split_last() else {
            return Err(self.shape_mismatch(OP, indices));
        };
        if indices.shape != lead {
            return Err(self.shape_mismatch(OP, indices));
        }
        map2!(self, OP, indices, lead.to_vec(), |s, i| s
            .gather_last(i, cols))
    }

    /// A copy of `self` with `src[..]` added at `[.., indices[..]]`: the backward of
    /// [`Tensor::gather_last`]. `indices` and `src` have the shape of `self` without its last dim.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; an index out of range.
    pub fn scatter_add_last(&self, indices: &Tensor, src: &Tensor) -> Result<Tensor> {
        const OP: &str = "scatter_add_last";
        indices.require_i32(OP)?;
        self.same_dtype(OP, src)?;
        self.same_device(OP, indices)?;
        let Some((&cols, lead)) = self.shape.split_last() else {
            return Err(self.shape_mismatch(OP, indices));
        };
        if indices.shape != lead || src.shape != lead {
            return Err(indices.shape_mismatch(OP, src));
        }
        let out = self.copy()?;
        let ig = indices.read();
        mutate2!(&out, OP, src, |dst, s| match OfBackend::of(&ig) {
            Some(i) => dst.scatter_add_last(i, s, cols),
            None => Err(indices.device_mismatch(OP, src)),
        })?;
        Ok(out)
    }

    /// `[.., classes]` rows with a 1 at each i32 label, on the labels' device.
    ///
    /// # Errors
    /// Non-i32 labels; a label outside `0..classes`.
    pub fn one_hot(labels: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
        labels.require_i32("one_hot")?;
        let mut shape = labels.shape.clone();
        shape.push(classes);
        map1!(labels, shape, |s| s.one_hot(classes, dtype))
    }

    /// `max(self + bias, 0)` in one pass (a Linear layer's bias and ReLU): `self` `[G, .., C]` with `bias`
    /// `[G, 1, .., 1, C]` (a bias row per leading index, e.g. per member) or `[C]`.
    ///
    /// # Errors
    /// Other bias shapes; dtype or device mismatches; non-float dtypes.
    pub fn bias_relu(&self, bias: &Tensor) -> Result<Tensor> {
        self.bias_act(bias, true)
    }

    /// `self + bias` for a Linear layer's bias (shapes as [`bias_relu`](Tensor::bias_relu)'s): one pass that reads
    /// each bias row in place of a general broadcast's per-element strides.
    ///
    /// # Errors
    /// As [`bias_relu`](Tensor::bias_relu).
    pub fn bias_add(&self, bias: &Tensor) -> Result<Tensor> {
        self.bias_act(bias, false)
    }

    fn bias_act(&self, bias: &Tensor, relu: bool) -> Result<Tensor> {
        let op = if relu { "bias_relu" } else { "bias_add" };
        self.same_dtype(op, bias)?;
        self.require_float(op)?;
        let Some(groups) = bias_groups(&self.shape, &bias.shape) else {
            return Err(self.shape_mismatch(op, bias));
        };
        let c = self.shape.last().copied().unwrap_or(0);
        let group = self.elem_count().checked_div(groups).unwrap_or(0);
        map2!(self, op, bias, self.shape.clone(), |x, b| x
            .bias_act(b, c, group, relu))
    }

    /// ReLU's backward from its output `y`: `self` (the incoming gradient) where `y > 0`, else 0.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn relu_backward(&self, y: &Tensor) -> Result<Tensor> {
        const OP: &str = "relu_backward";
        self.same_shape(OP, y)?;
        self.same_dtype(OP, y)?;
        map2!(self, OP, y, self.shape.clone(), |a, b| a.relu_backward(b))
    }

    /// GELU's (tanh form, as [`gelu`](Tensor::gelu)) backward from its input `x`: `self` (the incoming gradient)
    /// times GELU's derivative at `x`, in one pass.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn gelu_backward(&self, x: &Tensor) -> Result<Tensor> {
        const OP: &str = "gelu_backward";
        self.same_shape(OP, x)?;
        self.same_dtype(OP, x)?;
        map2!(self, OP, x, self.shape.clone(), |a, b| a.gelu_backward(b))
    }

    /// [`relu_backward`](Tensor::relu_backward) with the gradient of the bias of the
    /// [`bias_relu`](Tensor::bias_relu) that made `y`: for `self` and `y` `[G, .., C]` and a bias
    /// `[C]` or `[G, 1, .., 1, C]`, returns `dx` and `db` (the bias's shape), `db` summing `dx`
    /// over every dimension the bias does not have. One kernel on CUDA, where the two apart cost
    /// two or three.
    ///
    /// # Errors
    /// Another bias shape; shape, dtype or device mismatches.
    pub fn relu_backward_bias(&self, y: &Tensor, bias_shape: &[usize]) -> Result<(Tensor, Tensor)> {
        const OP: &str = "relu_backward_bias";
        self.same_shape(OP, y)?;
        self.same_dtype(OP, y)?;
        self.same_device(OP, y)?;
        let Some(groups) = bias_groups(&self.shape, bias_shape) else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "bias {bias_shape:?} for a gradient {:?}: expected [C] or [G, 1, .., 1, C] with G \
                     and C the gradient's first and last dimensions",
                    self.shape
                ),
            });
        };
        let cols = self.shape.last().copied().unwrap_or(0);
        if self.device().is_cuda() {
            let (dx, db) = Tensor::read_all(&[self, y], |st| match (st[0], st[1]) {
                (Storage::Cuda(g), Storage::Cuda(v)) => g.relu_backward_bias(v, groups, cols),
                _ => Err(self.device_mismatch(OP, y)),
            })?;
            return Ok((
                Tensor::from_storage(Storage::Cuda(dx), self.shape.clone()),
                Tensor::from_storage(Storage::Cuda(db), bias_shape.to_vec()),
            ));
        }
        let dx = self.relu_backward(y)?;
        let db = dx.sum_to(bias_shape)?;
        Ok((dx, db))
    }

    /// Softmax cross-entropy of logits `[.., B, C]` against i32 labels, in one pass: each row's
    /// loss (`logsumexp - logit[label]`, shape `[.., B]`) and the gradient of the logits,
    /// `(softmax - onehot) · grad_scale`. The labels have the rows' shape, or `[B]` shared by
    /// every member.
    ///
    /// # Errors
    /// Labels that are not i32 or do not fit the rows; a label outside `0..C` (on CUDA reported at
    /// the next read-back, see the crate docs).
    pub fn cross_entropy_rows(&self, labels: &Tensor, grad_scale: f64) -> Result<(Tensor, Tensor)> {
        const OP: &str = "cross_entropy";
        self.check_labels(labels)?;
        let r = self.rank();
        let rows = &self.shape[..r - 1];
        let cols = self.shape[r - 1];
        let (x, l) = (self.read(), labels.read());
        let (loss, grad) = match (&*x, &*l) {
            (Storage::Cpu(x), Storage::Cpu(l)) => {
                let (loss, grad) = x.cross_entropy(l, cols, grad_scale)?;
                (Storage::Cpu(loss), Storage::Cpu(grad))
            }
            (Storage::Cuda(x), Storage::Cuda(l)) => {
                let (loss, grad) = x.cross_entropy(l, cols, grad_scale)?;
                (Storage::Cuda(loss), Storage::Cuda(grad))
            }
            _ => return Err(self.device_mismatch(OP, labels)),
        };
        Ok((
            Tensor::from_storage(loss, rows.to_vec()),
            Tensor::from_storage(grad, self.shape.clone()),
        ))
    }

    /// [`cross_entropy_rows`](Tensor::cross_entropy_rows) averaged over the batch (the
    /// second-to-last dimension): the mean loss of each member (shape `[..]`) and the gradient
    /// of the logits with `grad_scale = 1 / B`. One kernel on CUDA for heads of at most 32
    /// classes and batches of at most 1,024 rows.
    ///
    /// # Errors
    /// As [`cross_entropy_rows`](Tensor::cross_entropy_rows).
    pub fn cross_entropy_mean(&self, labels: &Tensor) -> Result<(Tensor, Tensor)> {
        self.check_labels(labels)?;
        let r = self.rank();
        let (batch, cols) = (self.shape[r - 2], self.shape[r - 1]);
        let groups = &self.shape[..r - 2];
        {
            let (x, l) = (self.read(), labels.read());
            if let (Storage::Cuda(x), Storage::Cuda(l)) = (&*x, &*l)
                && let Some((loss, grad)) = x.cross_entropy_mean(l, cols, batch)?
            {
                return Ok((
                    Tensor::from_storage(Storage::Cuda(loss), groups.to_vec()),
                    Tensor::from_storage(Storage::Cuda(grad), self.shape.clone()),
                ));
            }
        }
        let (rows, grad) = self.cross_entropy_rows(labels, 1.0 / batch.max(1) as f64)?;
        Ok((rows.mean(r - 2, false)?, grad))
    }

    /// Labels that are i32, on the logits' device, and shaped like the logits' rows (or `[B]`).
    fn check_labels(&self, labels: &Tensor) -> Result<()> {
        const OP: &str = "cross_entropy";
        labels.require_i32(OP)?;
        self.require_float(OP)?;
        self.same_device(OP, labels)?;
        let r = self.rank();
        let rows = &self.shape[..r.saturating_sub(1)];
        if r < 2 || labels.rank() == 0 || labels.elem_count() == 0 || !rows.ends_with(&labels.shape)
        {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "labels {:?} do not fit logits {:?}: expected labels shaped like the logits' rows, or [B] \
                     shared by every member",
                    labels.shape, self.shape
                ),
            });
        }
        Ok(())
    }
}

/// How many bias rows a per-feature bias of shape `bias` holds for a tensor `[G, .., C]` of shape
/// `shape`: 1 for `[C]` (one for all), `G` for `[G, 1, .., 1, C]` (one per leading index, e.g. per
/// member); `None` for any other shape.
fn bias_groups(shape: &[usize], bias: &[usize]) -> Option<usize> {
    let r = shape.len();
    let c = shape.last().copied().unwrap_or(0);
    if bias == [c] {
        Some(1)
    } else if r >= 2
        && bias.len() == r
        && bias[0] == shape[0]
        && bias[r - 1] == c
        && bias[1..r - 1].iter().all(|&d| d == 1)
    {
        Some(shape[0])
    } else {
        None
    }
}
