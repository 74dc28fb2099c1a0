//! What only the CUDA storage runs ([`CudaBackend`]): host transfers, 16-bit products and convolutions, fused
//! gradient epilogues, the side stream, and optimizer steps over many parameters in one launch.

use cohort_kernels::Math;
use cohort_kernels::batchnorm::{BatchNormShape, cuda as batchnorm_cuda};
use cohort_kernels::conv::pooled::{PooledConv, cuda as pooled_cuda};
use cohort_kernels::conv::{ConvParams, ConvPass, cuda as conv_cuda};
use cohort_kernels::copy::cuda as copy_cuda;
use cohort_kernels::cuda::CudaType;
use cohort_kernels::index::cuda as index_cuda;
use cohort_kernels::matmul::{MatmulShape, cuda as matmul_cuda};
use cohort_kernels::optim::{AdamParams, SgdParams, cuda as optim_cuda};
use cohort_kernels::pool::PoolParams;
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cuda as reduce_cuda};
use cohort_kernels::softmax::cuda as softmax_cuda;
use cohort_kernels::unary::cuda as unary_cuda;

use super::conv::ConvWorkspace;
use super::optim::{adam_launch, optim_check, sgd_launch, unscale_grads, update_loss_scale};
use super::{Ctx, CudaStorage, channel_bias_ptr, indices, mismatch, same_device, ty, want};
use crate::backend::{AdamEntry, CudaBackend, SgdEntry};
use crate::products::operand_type;
use crate::storage::CpuStorage;
use crate::{DType, Device, Error, Result};

fn download<T: bytemuck::Pod>(src: &CudaStorage) -> Result<Vec<T>> {
    let mut v = vec![T::zeroed(); src.len];
    // SAFETY: the storage holds len elements of T.
    unsafe {
        src.gpu
            .dtoh(src.device_ptr(), bytemuck::cast_slice_mut(&mut v))?
    };
    Ok(v)
}

/// Device memory on its way to the host ([`CudaBackend::to_host_later`]).
#[derive(Debug)]
pub struct PendingHost {
    copy: cohort_kernels::cuda::HostCopy,
    dtype: DType,
}

impl PendingHost {
    /// Whether the copy is done (without waiting).
    pub fn is_done(&self) -> bool {
        self.copy.is_done()
    }

    /// The elements, once the copy is done.
    ///
    /// # Errors
    /// A queued kernel or the copy failed.
    pub fn wait(&self) -> Result<CpuStorage> {
        let b = self.copy.wait()?;
        Ok(match self.dtype {
            DType::F32 => CpuStorage::F32(bytemuck::pod_collect_to_vec(b)),
            DType::F16 => CpuStorage::F16(bytemuck::pod_collect_to_vec(b)),
            DType::BF16 => CpuStorage::BF16(bytemuck::pod_collect_to_vec(b)),
            DType::I32 => CpuStorage::I32(bytemuck::pod_collect_to_vec(b)),
            DType::U8 => CpuStorage::U8(b.to_vec()),
            DType::F64 => CpuStorage::F64(bytemuck::pod_collect_to_vec(b)),
        })
    }
}

/// Gradients queued on the side stream: [`SideGrads::join`] makes the compute stream wait for
/// them before handing them out.
#[derive(Debug)]
pub struct SideGrads {
    gw: CudaStorage,
    gb: CudaStorage,
    /// Queued on the side stream (else inline, on the compute stream).
    beside: bool,
}

impl SideGrads {
    /// The weight and bias gradients, once the compute stream waits for the side stream.
    ///
    /// # Errors
    /// The driver refusing an event.
    pub fn join(self) -> Result<(CudaStorage, CudaStorage)> {
        if self.beside {
            self.gw.gpu.join_side()?;
        }
        Ok((self.gw, self.gb))
    }
}

/// Multiply-adds below which a Linear layer's weight and bias gradients run inline outside a
/// capture: a small model's eager step is bound by the host, whose two event calls per layer for
/// the side stream cost more than the overlap saves. A graph forks for free at replay.
const BESIDE_MIN_MACS: usize = 1 << 27;

impl CudaBackend for CudaStorage {
    /// `len` elements of `value` on device `ordinal`.
    ///
    /// # Errors
    /// No such device, f64, or out of memory.
    fn full(len: usize, value: f64, dtype: DType, ordinal: usize) -> Result<CudaStorage> {
        let t = ty("full", dtype)?;
        let out = Ctx::of(ordinal)?.storage(len, dtype)?;
        // SAFETY: out holds len elements of dtype.
        unsafe { copy_cuda::fill(&out.gpu, t, out.device_ptr(), len, value)? };
        Ok(out)
    }

    /// Copies a host buffer to device `ordinal`.
    ///
    /// # Errors
    /// No such device, f64, or out of memory.
    fn from_host(src: &CpuStorage, ordinal: usize) -> Result<CudaStorage> {
        ty("to_device", src.dtype())?;
        let out = Ctx::of(ordinal)?.storage(src.len(), src.dtype())?;
        // SAFETY: out holds exactly src's bytes.
        unsafe { out.gpu.htod(out.device_ptr(), src.as_bytes())? };
        Ok(out)
    }

    /// Copies device memory back to the host (waits for the queued work that writes it).
    ///
    /// # Errors
    /// A failed kernel, or an index error flagged by one.
    fn to_host(&self) -> Result<CpuStorage> {
        Ok(match self.dtype {
            DType::F32 => CpuStorage::F32(download(self)?),
            DType::F16 => CpuStorage::F16(download(self)?),
            DType::BF16 => CpuStorage::BF16(download(self)?),
            DType::I32 => CpuStorage::I32(download(self)?),
            DType::U8 => CpuStorage::U8(download(self)?),
            DType::F64 => CpuStorage::F64(download(self)?),
        })
    }

    /// Queues a copy of device memory to the host behind the work queued so far, without waiting.
    ///
    /// # Errors
    /// During a capture; the driver rejects the copy.
    fn to_host_later(&self) -> Result<PendingHost> {
        let bytes = self.len * self.dtype.size_in_bytes();
        // SAFETY: the storage holds `bytes` bytes; a block freed after this is reused in stream order,
        // after the copy.
        let copy = unsafe { self.gpu.dtoh_later(self.device_ptr(), bytes)? };
        Ok(PendingHost {
            copy,
            dtype: self.dtype,
        })
    }

    /// `lhs · rhs` under `math` (operands of its type), into f32: a product under a precision policy.
    ///
    /// # Errors
    /// Operands of another type or on different devices, out of memory, or a cuBLAS failure.
    fn matmul_as(&self, rhs: &CudaStorage, shape: &MatmulShape, math: Math) -> Result<CudaStorage> {
        let t = operand_type(math);
        if self.dtype != t || rhs.dtype != t {
            return Err(mismatch("matmul", self.dtype, rhs.dtype));
        }
        same_device("matmul", self, rhs)?;
        let out = self.sibling(shape.batch * shape.m * shape.n, DType::F32)?;
        let ptrs = (self.device_ptr(), rhs.device_ptr(), out.device_ptr());
        // SAFETY: the tensor validated that self and rhs hold what `shape` describes, in `t`.
        unsafe { matmul_cuda::matmul_as(&self.gpu, math, CudaType::F32, ptrs, shape)? };
        Ok(out)
    }

    /// One pass of a convolution with 16-bit operands through cuDNN (`math` `Bf16` or `F16`): the forward from the
    /// input and the weight, the input's gradient from the output's and the weight, or the weight's gradient from the
    /// input and the output's, as `a` and `b`, both of the math's type; the result is of that type too. `None` where
    /// cuDNN is not in use or has no algorithm for it (the caller runs the pass in f32).
    ///
    /// # Errors
    /// Operands of another type or on different devices, out of memory (result or workspace), or a failure.
    fn conv_pass_16bit(
        &self,
        (pass, math): (ConvPass, Math),
        b: &CudaStorage,
        p: &ConvParams,
    ) -> Result<Option<CudaStorage>> {
        let t = operand_type(math);
        if self.dtype != t || b.dtype != t {
            return Err(mismatch("conv2d", self.dtype, b.dtype));
        }
        same_device("conv2d", self, b)?;
        let len = match pass {
            ConvPass::Forward { .. } => p.output_len(),
            ConvPass::BackwardData => p.input_len(),
            ConvPass::BackwardFilter => p.weight_len(),
        };
        let out = self.sibling(len, t)?;
        let (a, b, o) = (self.device_ptr(), b.device_ptr(), out.device_ptr());
        // cuDNN's operands by role: input (or its gradient), weight (or its gradient), output (or its gradient).
        let roles = match pass {
            ConvPass::Forward { .. } => (a, b, o),
            ConvPass::BackwardData => (o, b, a),
            ConvPass::BackwardFilter => (a, o, b),
        };
        let mut ws = ConvWorkspace::new(&out);
        // SAFETY: sizes from p (validated by the tensor), operands of `t`; the workspace is this device's.
        let ran = unsafe {
            conv_cuda::conv_pass_16bit(&out.gpu, (pass, math), p, roles, &mut |bytes| {
                ws.get(bytes)
            })?
        };
        drop(ws);
        Ok(ran.then_some(out))
    }

    /// A 16-bit forward pass's output into f32, or kept in its type (in place), with its bias and ReLU, in one
    /// kernel.
    ///
    /// # Errors
    /// `self` not 16-bit or `bias` not f32, different devices, out of memory, or a launch failure.
    fn conv_epilogue(
        self,
        bias: Option<&CudaStorage>,
        p: &ConvParams,
        (relu, keep): (bool, bool),
    ) -> Result<CudaStorage> {
        const OP: &str = "conv2d";
        let from = want(OP, &self, &[DType::BF16, DType::F16])?;
        let b = channel_bias_ptr(OP, &self, bias)?;
        if keep && b == 0 && !relu {
            return Ok(self);
        }
        let out = if keep {
            None
        } else {
            Some(self.sibling(self.len, DType::F32)?)
        };
        let (to, out_ptr) = match &out {
            Some(o) => (CudaType::F32, o.device_ptr()),
            None => (from, self.device_ptr()),
        };
        let inner = p.out_h() * p.out_w();
        // SAFETY: `self` holds the pass's output, `out` (or `self` again, element by element in place) as many
        // elements of `to`, `bias` (validated by the tensor) `c_out` f32.
        unsafe {
            conv_cuda::conv_epilogue(
                &self.gpu,
                (from, to),
                (self.device_ptr(), b, out_ptr),
                (p.c_out, inner),
                self.len,
                relu,
            )?;
        }
        Ok(out.unwrap_or(self))
    }

    /// The bias and ReLU of a convolution after the max pool that came between, in one kernel.
    ///
    /// # Errors
    /// `self` not a float type or `bias` not f32, different devices, out of memory, or a launch failure.
    fn channel_bias_relu(
        &self,
        bias: Option<&CudaStorage>,
        [channels, inner]: [usize; 2],
    ) -> Result<CudaStorage> {
        const OP: &str = "channel_bias_relu";
        let ty = want(OP, self, &[DType::F32, DType::BF16, DType::F16])?;
        let b = channel_bias_ptr(OP, self, bias)?;
        let out = self.sibling(self.len, self.dtype)?;
        // SAFETY: `self` and `out` hold `len` elements of `ty`, `bias` (validated by the tensor) `channels` f32.
        unsafe {
            conv_cuda::conv_epilogue(
                &self.gpu,
                (ty, ty),
                (self.device_ptr(), b, out.device_ptr()),
                (channels, inner),
                self.len,
                true,
            )?;
        }
        Ok(out)
    }

    /// Each channel's sum of the 16-bit output gradient `self`, in f32.
    ///
    /// # Errors
    /// Not bf16 or f16, out of memory, or a launch failure.
    fn conv_bias_grad(&self, [batch, channels, inner]: [usize; 3]) -> Result<CudaStorage> {
        let ty = want("conv2d_backward_bias", self, &[DType::BF16, DType::F16])?;
        let out = self.sibling(channels, DType::F32)?;
        let shape = BatchNormShape {
            outer: batch,
            members: 1,
            rows: 1,
            channels,
            inner,
        };
        // SAFETY: self holds batch·channels·inner elements (checked by the tensor), out channels f32.
        unsafe {
            batchnorm_cuda::channel_sums(
                &self.gpu,
                ty,
                &shape,
                self.device_ptr(),
                out.device_ptr(),
            )?
        };
        Ok(out)
    }

    /// Max pooling with each max's channel bias and ReLU in the same kernel, over windows that tile.
    ///
    /// # Errors
    /// Not f32, bf16 or f16, a bias not f32, windows that do not tile, different devices, out of memory, or a
    /// launch failure.
    fn max_pool2d_bias_relu(
        &self,
        bias: &CudaStorage,
        channels: usize,
        p: &PoolParams,
    ) -> Result<(CudaStorage, CudaStorage)> {
        self.max_pool("max_pool2d_bias_relu", p, Some((bias, channels)))
    }

    /// A few-channel convolution, its max pool, bias and ReLU in one kernel.
    ///
    /// # Errors
    /// A geometry the kernel does not take, the input not f32, bf16 or f16, a weight or bias not f32, different
    /// devices, out of memory, or a launch failure.
    fn conv2d_max_pool_bias_relu(
        &self,
        weight: &CudaStorage,
        bias: &CudaStorage,
        p: &PooledConv,
    ) -> Result<(CudaStorage, CudaStorage)> {
        const OP: &str = "conv2d_max_pool_bias_relu";
        let ty = want(OP, self, &[DType::F32, DType::BF16, DType::F16])?;
        for s in [weight, bias] {
            want(OP, s, &[DType::F32])?;
            same_device(OP, self, s)?;
        }
        let n = p.conv.batch * p.conv.c_out * p.out_h() * p.out_w();
        let out = self.sibling(n, self.dtype)?;
        let idx = self.sibling(n, DType::I32)?;
        let ptrs = [self, weight, bias].map(CudaStorage::device_ptr);
        // SAFETY: the tensor checked every shape against `p`; out and idx hold n elements.
        unsafe {
            pooled_cuda::forward(&self.gpu, ty, p, ptrs, [out.device_ptr(), idx.device_ptr()])?
        };
        Ok((out, idx))
    }

    /// The pooled convolution's weight and bias gradients in one kernel and an ordered sum of its partials.
    ///
    /// # Errors
    /// A geometry the kernel does not take, the gradient, output and input of different types or not float,
    /// indices not i32, different devices, out of memory, or a launch failure.
    fn conv2d_max_pool_backward(
        &self,
        y: &CudaStorage,
        idx: &CudaStorage,
        x: &CudaStorage,
        p: &PooledConv,
    ) -> Result<(CudaStorage, CudaStorage)> {
        const OP: &str = "conv2d_max_pool_backward";
        let ty = want(OP, self, &[DType::F32, DType::BF16, DType::F16])?;
        for s in [y, x] {
            if s.dtype != self.dtype {
                return Err(mismatch(OP, self.dtype, s.dtype));
            }
            same_device(OP, self, s)?;
        }
        indices(OP, idx)?;
        same_device(OP, self, idx)?;
        let dw = self.sibling(p.conv.weight_len(), DType::F32)?;
        let db = self.sibling(p.conv.c_out, DType::F32)?;
        let ptrs = [self, y, idx, x].map(CudaStorage::device_ptr);
        // SAFETY: the tensor checked every shape against `p`; dw and db hold the weight's and the bias's elements.
        unsafe {
            pooled_cuda::backward(&self.gpu, ty, p, ptrs, [dw.device_ptr(), db.device_ptr()])?
        };
        Ok((dw, db))
    }

    /// The mean of each bag of `bag` consecutive ids' rows of the f32 table `self`, in one kernel.
    ///
    /// # Errors
    /// Not f32, indices not i32, different devices, out of memory, or a launch failure.
    fn bag_mean(
        &self,
        idx: &CudaStorage,
        bag: usize,
        [rows, cols]: [usize; 2],
    ) -> Result<CudaStorage> {
        const OP: &str = "bag_mean";
        want(OP, self, &[DType::F32])?;
        want(OP, idx, &[DType::I32])?;
        same_device(OP, self, idx)?;
        let out = self.sibling(idx.len / bag * cols, DType::F32)?;
        // SAFETY: self holds rows·cols f32 (checked by the tensor), idx idx.len i32 in bags of `bag`, out a row
        // of `cols` per bag.
        unsafe {
            index_cuda::bag_mean(
                &self.gpu,
                (self.device_ptr(), rows, cols),
                (idx.device_ptr(), idx.len, bag),
                out.device_ptr(),
            )?
        };
        Ok(out)
    }

    /// ReLU's backward from the output `y` of a convolution's bias and ReLU, and the bias's gradient in
    /// f32, in one pass over image features `[batch, channels, inner]`.
    ///
    /// # Errors
    /// Not f32, bf16 or f16, `y` of another type or device, out of memory, or a launch failure.
    fn relu_backward_channel_bias(
        &self,
        y: &CudaStorage,
        [batch, channels, inner]: [usize; 3],
    ) -> Result<(CudaStorage, CudaStorage)> {
        const OP: &str = "relu_backward_channel_bias";
        let ty = want(OP, self, &[DType::F32, DType::BF16, DType::F16])?;
        want(OP, y, &[self.dtype])?;
        same_device(OP, self, y)?;
        let dx = self.sibling(self.len, self.dtype)?;
        let db = self.sibling(channels, DType::F32)?;
        // SAFETY: self, y and dx hold batch·channels·inner elements of `ty` (same shapes, checked by the
        // tensor), db `channels` f32.
        unsafe {
            batchnorm_cuda::relu_channel_sums(
                &self.gpu,
                ty,
                [batch, channels, inner],
                (self.device_ptr(), y.device_ptr()),
                (dx.device_ptr(), db.device_ptr()),
            )?
        };
        Ok((dx, db))
    }

    /// ReLU's backward and the gradient of the bias before it, in one kernel: `dy` and `y` hold
    /// `groups · rows · cols` f32; returns `dx` and `db` (`groups · cols`, summed over the rows).
    ///
    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn relu_backward_bias(
        &self,
        y: &CudaStorage,
        groups: usize,
        cols: usize,
    ) -> Result<(CudaStorage, CudaStorage)> {
        want("relu_backward_bias", self, &[DType::F32])?;
        want("relu_backward_bias", y, &[DType::F32])?;
        same_device("relu_backward_bias", self, y)?;
        let rows = self.len.checked_div(groups * cols).unwrap_or(0);
        let dx = self.sibling(self.len, DType::F32)?;
        let db = self.sibling(groups * cols, DType::F32)?;
        // SAFETY: self, y and dx hold groups·rows·cols f32 (same shapes, checked by the caller), db
        // groups·cols.
        unsafe {
            unary_cuda::relu_backward_bias(
                &self.gpu,
                self.device_ptr(),
                y.device_ptr(),
                dx.device_ptr(),
                db.device_ptr(),
                [groups, rows, cols],
            )?
        };
        Ok((dx, db))
    }

    /// `xᵀ · g` and the sums of `g`'s rows per product, queued on the side stream (the compute
    /// stream's next work runs alongside it; inline for small products outside a capture, see
    /// [`BESIDE_MIN_MACS`]): one cuBLASLt call where its column-sum epilogue runs
    /// (see [`matmul_cuda::matmul_rhs_sums`]), else the product and a reduction. `None`, queuing
    /// nothing, for a dtype other than f32. `x` and `g` must stay alive until [`SideGrads::join`].
    ///
    /// # Errors
    /// Different dtypes or devices, out of memory, or a cuBLASLt failure.
    fn linear_grads_on_side(
        &self,
        g: &CudaStorage,
        shape: &MatmulShape,
    ) -> Result<Option<SideGrads>> {
        if self.dtype != g.dtype {
            return Err(mismatch("linear_grads", self.dtype, g.dtype));
        }
        same_device("linear_grads", self, g)?;
        // Half-precision gradients run as before, after `main` on the compute stream.
        if self.dtype != DType::F32 {
            return Ok(None);
        }
        let t = CudaType::F32;
        // Allocated before the fork, and kept until the join.
        let gw = self.sibling(shape.batch * shape.m * shape.n, self.dtype)?;
        let gb = self.sibling(shape.batch * shape.n, self.dtype)?;
        let ptrs = (
            self.device_ptr(),
            g.device_ptr(),
            gw.device_ptr(),
            gb.device_ptr(),
        );
        let (gpu, (xp, gp, wp, bp)) = (&self.gpu, ptrs);
        let beside =
            gpu.is_capturing() || shape.batch * shape.m * shape.n * shape.k >= BESIDE_MIN_MACS;
        let work = || {
            // SAFETY: the tensor validated that self and g hold what `shape` describes; gw holds the
            // product, gb n sums per product (g is [batch, k, n]).
            unsafe {
                if !matmul_cuda::matmul_rhs_sums(gpu, t, ptrs, shape, shape.n)? {
                    matmul_cuda::matmul(gpu, t, xp, gp, wp, shape)?;
                    let rows = ReduceShape {
                        outer: shape.batch,
                        dim: shape.k,
                        inner: shape.n,
                    };
                    reduce_cuda::reduce(gpu, ReduceOp::Sum, t, gp, bp, rows)?;
                }
                Ok(())
            }
        };
        if !beside {
            work()?;
            return Ok(Some(SideGrads { gw, gb, beside }));
        }
        match gpu.on_side(work) {
            Ok(()) => Ok(Some(SideGrads { gw, gb, beside })),
            Err(e) => {
                gpu.join_side()?;
                Err(e.into())
            }
        }
    }

    /// Cross-entropy averaged over each group of `batch` rows in one kernel; `None` where that
    /// kernel does not apply (see [`softmax_cuda::cross_entropy_mean`]).
    ///
    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn cross_entropy_mean(
        &self,
        labels: &CudaStorage,
        cols: usize,
        batch: usize,
    ) -> Result<Option<(CudaStorage, CudaStorage)>> {
        indices("cross_entropy", labels)?;
        want("cross_entropy", self, &[DType::F32])?;
        same_device("cross_entropy", self, labels)?;
        let rows = self.len.checked_div(cols).unwrap_or(0);
        let loss = self.sibling(rows.checked_div(batch).unwrap_or(0), DType::F32)?;
        let grad = self.sibling(self.len, DType::F32)?;
        // SAFETY: self and grad hold rows·cols f32, loss rows / batch f32, labels labels.len i32
        // (the caller checked that it divides rows).
        let done = unsafe {
            softmax_cuda::cross_entropy_mean(
                &self.gpu,
                self.device_ptr(),
                labels.device_ptr(),
                rows,
                cols,
                batch,
                labels.len,
                loss.device_ptr(),
                grad.device_ptr(),
            )?
        };
        Ok(done.then_some((loss, grad)))
    }

    /// One Adam / AdamW step over many parameters at once: one kernel launch per 24 parameters
    /// (per-parameter learning rates in each entry's `lrs`; `h.lrs` is ignored). Each entry is
    /// (param, grad, m, v, lrs).
    ///
    /// # Errors
    /// As [`OptimizerSteps::adam_step`](crate::backend::OptimizerSteps::adam_step), for any entry; nothing is updated then.
    fn adam_step_many(
        params: &mut [AdamEntry<'_, Self>],
        h: &AdamParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()> {
        let Some(first) = params.first() else {
            return Ok(());
        };
        let gpu = first.0.gpu.clone();
        let mut bufs = Vec::with_capacity(params.len());
        for (p, g, m, v, lrs) in params.iter() {
            optim_check("adam_step", p, &[g, &**m, &**v])?;
            same_device("adam_step", &*params[0].0, p)?;
            bufs.push(optim_cuda::ParamBuffers {
                param: p.device_ptr(),
                grad: g.device_ptr(),
                state1: m.device_ptr(),
                state2: v.device_ptr(),
                len: p.len,
                lrs,
            });
        }
        adam_launch(&gpu, &bufs, h, skip)
    }

    /// One SGD step over many parameters at once: one kernel launch per 24 parameters (per-parameter
    /// learning rates in each entry's `lrs`; `h.lrs` is ignored). Each entry is (param, grad,
    /// momentum buffer, lrs); the buffer is required when `h.momentum != 0`.
    ///
    /// # Errors
    /// As [`OptimizerSteps::sgd_step`](crate::backend::OptimizerSteps::sgd_step), for any entry; nothing is updated then.
    fn sgd_step_many(
        params: &mut [SgdEntry<'_, Self>],
        h: &SgdParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()> {
        let Some(first) = params.first() else {
            return Ok(());
        };
        let gpu = first.0.gpu.clone();
        let ordinal = first.0.ordinal;
        let mut bufs = Vec::with_capacity(params.len());
        for (p, g, b, lrs) in params.iter() {
            let b = b.as_deref();
            let mut others = vec![*g];
            others.extend(b);
            optim_check("sgd_step", p, &others)?;
            if p.ordinal != ordinal {
                return Err(Error::DeviceMismatch {
                    op: "sgd_step",
                    lhs: Device::Cuda(ordinal),
                    rhs: Device::Cuda(p.ordinal),
                });
            }
            bufs.push(optim_cuda::ParamBuffers {
                param: p.device_ptr(),
                grad: g.device_ptr(),
                state1: b.map_or(0, CudaStorage::device_ptr),
                state2: 0,
                len: p.len,
                lrs,
            });
        }
        sgd_launch(&gpu, &bufs, h, skip)
    }

    fn unscale_grads(grads: &mut [&mut Self], state: &mut Self) -> Result<()> {
        unscale_grads(grads, state)
    }

    fn update_loss_scale(
        state: &mut Self,
        interval: u64,
        min_scale: f32,
        max_scale: f32,
    ) -> Result<()> {
        update_loss_scale(state, interval, min_scale, max_scale)
    }
}
