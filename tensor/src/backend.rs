//! The ops a storage runs, as traits that the CPU storage, the CUDA storage and the no-CUDA stand-in all
//! implement (candle's `BackendStorage` and its dummy CUDA backend).
//!
//! They exist so that the compiler keeps the three in step: the stand-in of a build without the `cuda`
//! feature (`cuda/absent.rs`) implements the same traits as the real CUDA storage (`cuda/imp/`), so a
//! signature that changes in one and not the other fails to compile in one of the two builds, and an op
//! added to the CPU and CUDA storages must be added to the stand-in too. They also let [`crate::Tensor`]
//! dispatch an op once for both devices (see `storage.rs`'s `map1!`, `map2!` and `mutate2!`): the same
//! method call compiles against either storage.
//!
//! The op set is split by concern, one trait each ([`Layout`], [`Elementwise`], [`Reductions`],
//! [`Products`], [`Convolutions`], [`Indexing`], [`Normalization`], [`Attention`], [`OptimizerSteps`]),
//! so that each backend keeps one file per concern; [`BackendStorage`] names them all. The receiver is an
//! op's first operand (the destination for in-place ops). Shapes are validated by [`crate::Tensor`] before
//! these run; the storages check dtypes and devices.
//!
//! Where the CPU differs it takes the same signature and documents the difference rather than leave the
//! trait:
//! - the convolutions take the [`Math`] a precision policy chose; the CPU computes in its operands' own
//!   type whatever it says ([`crate::Precision::math_for`] names a math on CUDA only, so the CPU only
//!   ever sees `Fp32`);
//! - [`Products::linear`] answers `None` where a backend has no fused kernel for the case (CUDA's cuBLASLt
//!   epilogue cannot run it); the CPU always has one.
//!
//! What only the CUDA storage has (16-bit products, fused gradient epilogues, the side stream, optimizer
//! steps over many parameters at once, host transfers) is [`CudaBackend`], which the real CUDA storage and
//! the stand-in implement and the CPU does not. Device-wide things that involve no storage (graph capture,
//! uploads, the allocator's creation, profiling, GEMM tuning) stay free functions in [`crate::cuda`].

use std::fmt;

use cohort_kernels::Math;
use cohort_kernels::attention::AttentionShape;
use cohort_kernels::batchnorm::BatchNormShape;
use cohort_kernels::binary::BinaryOp;
use cohort_kernels::conv::pooled::PooledConv;
use cohort_kernels::conv::{ConvParams, ConvPass};
use cohort_kernels::copy::Copy2d;
use cohort_kernels::layernorm::LayerNormShape;
use cohort_kernels::matmul::MatmulShape;
use cohort_kernels::optim::{AdamParams, SgdParams};
use cohort_kernels::pool::PoolParams;
use cohort_kernels::reduce::{ReduceOp, ReduceShape};
use cohort_kernels::unary::UnaryOp;

use crate::cuda::{CudaStorage, PendingHost, SideGrads};
use crate::storage::CpuStorage;
use crate::{DType, Result};

/// Every op a storage runs: what the CPU storage, the CUDA storage and the no-CUDA stand-in share.
pub trait BackendStorage:
    Sized
    + fmt::Debug
    + Layout
    + Elementwise
    + Reductions
    + Products
    + Convolutions
    + Indexing
    + Normalization
    + Attention
    + OptimizerSteps
{
}

impl<S> BackendStorage for S where
    S: Sized
        + fmt::Debug
        + Layout
        + Elementwise
        + Reductions
        + Products
        + Convolutions
        + Indexing
        + Normalization
        + Attention
        + OptimizerSteps
{
}

/// Both storages of this build implement every op: a missing one fails here, naming the trait.
const _: fn() = || {
    fn backend<S: BackendStorage>() {}
    fn cuda<S: CudaBackend>() {}
    backend::<CpuStorage>();
    backend::<CudaStorage>();
    cuda::<CudaStorage>();
};

/// Creating, converting and moving elements.
pub trait Layout: Sized {
    /// `len` zeros of `dtype` on this storage's device.
    ///
    /// # Errors
    /// A dtype the device cannot hold, out of memory, or a device failure.
    fn zeros_like(&self, len: usize, dtype: DType) -> Result<Self>;

    /// The elements converted to `dtype`: floats round to nearest, float to integer truncates toward
    /// zero and saturates (NaN gives 0).
    ///
    /// # Errors
    /// A dtype the device cannot convert, out of memory, or a device failure.
    fn cast(&self, dtype: DType) -> Result<Self>;

    /// Block copy from `self` into `dst` (same dtype).
    ///
    /// # Errors
    /// Different dtypes or devices, a block outside a buffer, or a device failure.
    fn copy2d(&self, dst: &mut Self, c: &Copy2d) -> Result<()>;

    /// Transposes the last two dims of `[batch, rows, cols]`.
    ///
    /// # Errors
    /// A dtype the device cannot move, out of memory, or a device failure.
    fn transpose(&self, batch: usize, rows: usize, cols: usize) -> Result<Self>;

    /// Materializes a broadcast from `src_shape` to `out_shape`.
    ///
    /// # Errors
    /// A dtype the device cannot move, out of memory, or a device failure.
    fn broadcast(&self, src_shape: &[usize], out_shape: &[usize]) -> Result<Self>;

    /// Sets every element to `value`.
    ///
    /// # Errors
    /// A dtype the device cannot fill, or a device failure.
    fn fill(&mut self, value: f64) -> Result<()>;
}

/// Element-wise ops.
pub trait Elementwise: Sized {
    /// Broadcast binary op `self (op) rhs`.
    ///
    /// # Errors
    /// Different dtypes or devices, a dtype without kernels, out of memory, or a device failure.
    fn binary(
        &self,
        op: BinaryOp,
        lhs_shape: &[usize],
        rhs: &Self,
        rhs_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<Self>;

    /// `self = self (op) src`, `src` broadcast to `dst_shape`.
    ///
    /// # Errors
    /// As [`Elementwise::binary`].
    fn binary_assign(
        &mut self,
        op: BinaryOp,
        dst_shape: &[usize],
        src: &Self,
        src_shape: &[usize],
    ) -> Result<()>;

    /// A unary float op.
    ///
    /// # Errors
    /// A dtype without kernels, out of memory, or a device failure.
    fn unary(&self, op: UnaryOp) -> Result<Self>;

    /// Picks `on_true` where the mask `self` is not 0, else `on_false` (all the same length).
    ///
    /// # Errors
    /// Different value dtypes or devices, unsupported dtypes, different lengths, out of memory, or a
    /// device failure.
    fn where_cond(&self, on_true: &Self, on_false: &Self) -> Result<Self>;

    /// `self + b`, then a ReLU when `relu`, with `b` `[groups, cols]` broadcast over `group`-element blocks of
    /// `self`.
    ///
    /// # Errors
    /// Different dtypes or devices, a dtype without kernels, out of memory, or a device failure.
    fn bias_act(&self, b: &Self, cols: usize, group: usize, relu: bool) -> Result<Self>;

    /// ReLU's backward from its output: the gradient `self` where `y > 0`, else 0.
    ///
    /// # Errors
    /// As [`Elementwise::bias_act`].
    fn relu_backward(&self, y: &Self) -> Result<Self>;

    /// GELU's (tanh form) backward from its input: the gradient `self` times GELU's derivative at `x`, in one pass.
    ///
    /// # Errors
    /// As [`Elementwise::bias_act`].
    fn gelu_backward(&self, x: &Self) -> Result<Self>;
}

/// Reductions along a dim, and the row-wise softmax family.
pub trait Reductions: Sized {
    /// Reduction along the middle dim of `[outer, dim, inner]`.
    ///
    /// # Errors
    /// A dtype without kernels, out of memory, or a device failure.
    fn reduce(&self, op: ReduceOp, shape: ReduceShape) -> Result<Self>;

    /// Index of the maximum along the middle dim of `[outer, dim, inner]`, as i32.
    ///
    /// # Errors
    /// As [`Reductions::reduce`].
    fn argmax(&self, shape: ReduceShape) -> Result<Self>;

    /// Softmax or log-softmax of each row of `cols` elements.
    ///
    /// # Errors
    /// As [`Reductions::reduce`].
    fn softmax_last(&self, cols: usize, log: bool) -> Result<Self>;

    /// Softmax cross-entropy of the logits `self` (rows of `cols`) against i32 `labels`: each row's loss
    /// and the logits' gradient times `scale`.
    ///
    /// # Errors
    /// Labels not i32, a dtype without kernels, different devices, a label out of range (on CUDA reported
    /// later, see the crate docs), out of memory, or a device failure.
    fn cross_entropy(&self, labels: &Self, cols: usize, scale: f64) -> Result<(Self, Self)>;
}

/// Matrix products.
pub trait Products: Sized {
    /// (Batched) matrix product `self · rhs`.
    ///
    /// # Errors
    /// Different dtypes or devices, a dtype without kernels, out of memory, or a device failure.
    fn matmul(&self, rhs: &Self, shape: &MatmulShape) -> Result<Self>;

    /// A Linear layer's forward in one kernel: `self · w + bias` (the bias `bias_batch_stride` apart per
    /// product), then a ReLU when `relu`. `None` where this backend has no fused kernel for the case (on
    /// CUDA, where cuBLASLt's epilogue cannot run it); the CPU always runs it.
    ///
    /// # Errors
    /// As [`Products::matmul`].
    fn linear(
        &self,
        w: &Self,
        bias: &Self,
        shape: &MatmulShape,
        bias_batch_stride: usize,
        relu: bool,
    ) -> Result<Option<Self>>;
}

/// 2-D convolutions and max pooling. `math` is what a precision policy chose for the convolution; the
/// CPU computes in its operands' type whatever it says (see the module docs).
pub trait Convolutions: Sized {
    /// Forward 2-D convolution of the input `self`.
    ///
    /// # Errors
    /// Different dtypes or devices, a dtype without kernels, out of memory (output or workspace), or a
    /// device failure.
    fn conv2d(
        &self,
        weight: &Self,
        bias: Option<&Self>,
        p: &ConvParams,
        math: Math,
    ) -> Result<Self>;

    /// Gradient of a convolution with respect to its input, from the output's gradient `self`.
    ///
    /// # Errors
    /// As [`Convolutions::conv2d`].
    fn conv2d_backward_input(&self, weight: &Self, p: &ConvParams, math: Math) -> Result<Self>;

    /// Gradient of a convolution with respect to its weight, from its input `self`.
    ///
    /// # Errors
    /// As [`Convolutions::conv2d`].
    fn conv2d_backward_weight(&self, grad_out: &Self, p: &ConvParams, math: Math) -> Result<Self>;

    /// Max pool; returns the values and the i32 argmax indices.
    ///
    /// # Errors
    /// A dtype without kernels, out of memory, or a device failure.
    fn max_pool2d(&self, p: &PoolParams) -> Result<(Self, Self)>;

    /// Backward of [`Convolutions::max_pool2d`] from the output's gradient `self`.
    ///
    /// # Errors
    /// Indices not i32 or outside their plane, a dtype without kernels, different devices, out of
    /// memory, or a device failure.
    fn max_pool2d_backward(&self, indices: &Self, p: &PoolParams) -> Result<Self>;
}

/// Ops addressed by i32 indices. On CUDA an index out of range is reported by the next read-back or
/// synchronize (see the crate docs); on the CPU by the op.
pub trait Indexing: Sized {
    /// Selects rows along the middle dim of `[outer, dim, inner]`.
    ///
    /// # Errors
    /// Indices not i32 or out of range, a dtype without kernels, out of memory, or a device failure.
    fn index_select(&self, idx: &Self, outer: usize, dim: usize, inner: usize) -> Result<Self>;

    /// `self[o, idx[i], :] += src[o, i / repeat, :]`, `self` `[outer, dim, inner]` (`shape`) and `src`
    /// `[outer, idx.len / repeat, inner]`: `repeat` consecutive indices share a row of `src`.
    ///
    /// # Errors
    /// As [`Indexing::index_select`], and different dtypes.
    fn index_add(
        &mut self,
        idx: &Self,
        src: &Self,
        shape: (usize, usize, usize),
        repeat: usize,
    ) -> Result<()>;

    /// `out[r] = self[r, idx[r]]` over rows of `cols`.
    ///
    /// # Errors
    /// As [`Indexing::index_select`].
    fn gather_last(&self, idx: &Self, cols: usize) -> Result<Self>;

    /// `self[r, idx[r]] += src[r]` over rows of `cols`.
    ///
    /// # Errors
    /// As [`Indexing::index_add`].
    fn scatter_add_last(&mut self, idx: &Self, src: &Self, cols: usize) -> Result<()>;

    /// Rows of `classes` with a 1 at each i32 label of `self`.
    ///
    /// # Errors
    /// As [`Indexing::index_select`].
    fn one_hot(&self, classes: usize, dtype: DType) -> Result<Self>;
}

/// Fused batch and layer normalization.
pub trait Normalization: Sized {
    /// Batch normalization in training of `self`: the output, the batch's mean and `1 / √(var + eps)`;
    /// `running` (mean, variance, momentum) moves in place.
    ///
    /// # Errors
    /// A dtype without kernels, different devices, out of memory, or a device failure.
    fn batch_norm(
        &self,
        params: (&Self, &Self),
        shape: (&BatchNormShape, f64),
        relu: bool,
        running: Option<(&mut Self, &mut Self, f64)>,
    ) -> Result<(Self, Self, Self)>;

    /// The gradients (of `self`, the weight, the bias) of [`Normalization::batch_norm`], given its output
    /// when it rectified, the output's gradient and the saved (mean, invstd, weight).
    ///
    /// # Errors
    /// As [`Normalization::batch_norm`].
    fn batch_norm_backward(
        &self,
        out: Option<&Self>,
        dout: &Self,
        saved: (&Self, &Self, &Self),
        shape: &BatchNormShape,
    ) -> Result<(Self, Self, Self)>;

    /// Layer normalization of `self`'s rows: the output, each row's mean and `1 / √(var + eps)`.
    ///
    /// # Errors
    /// As [`Normalization::batch_norm`].
    fn layer_norm(
        &self,
        params: (&Self, &Self),
        shape: (&LayerNormShape, f64),
    ) -> Result<(Self, Self, Self)>;

    /// The gradients (of `self`, the weight, the bias) of [`Normalization::layer_norm`], given the
    /// output's gradient and the saved (mean, invstd, weight).
    ///
    /// # Errors
    /// As [`Normalization::batch_norm`].
    fn layer_norm_backward(
        &self,
        dout: &Self,
        saved: (&Self, &Self, &Self),
        shape: &LayerNormShape,
    ) -> Result<(Self, Self, Self)>;
}

/// Fused scaled dot-product self-attention.
pub trait Attention: Sized {
    /// Attention of the packed projection `self` under an optional key-padding mask: the output and each
    /// query's log-sum-exp.
    ///
    /// # Errors
    /// A dtype without kernels, a head wider than the kernels take, different devices, out of memory, or
    /// a device failure.
    fn attention(&self, mask: Option<&Self>, shape: &AttentionShape) -> Result<(Self, Self)>;

    /// The gradient of `self` given the forward's saved (output, log-sum-exp, output's gradient).
    ///
    /// # Errors
    /// As [`Attention::attention`].
    fn attention_backward(
        &self,
        mask: Option<&Self>,
        saved: (&Self, &Self, &Self),
        shape: &AttentionShape,
    ) -> Result<Self>;
}

/// Optimizer updates of a parameter `self`, in place.
pub trait OptimizerSteps: Sized {
    /// One SGD step; the momentum buffer is required when `h.momentum != 0`.
    ///
    /// # Errors
    /// A dtype without kernels, mismatched buffers, a missing momentum buffer, or a device failure.
    fn sgd_step(
        &mut self,
        grad: &Self,
        momentum_buf: Option<&mut Self>,
        h: &SgdParams<'_>,
    ) -> Result<()>;

    /// One Adam / AdamW step.
    ///
    /// # Errors
    /// A dtype without kernels, mismatched buffers, or a device failure.
    fn adam_step(
        &mut self,
        grad: &Self,
        m: &mut Self,
        v: &mut Self,
        h: &AdamParams<'_>,
    ) -> Result<()>;
}

/// One Adam entry of [`CudaBackend::adam_step_many`]: (param, grad, m, v, learning rates).
pub type AdamEntry<'a, S> = (&'a mut S, &'a S, &'a mut S, &'a mut S, &'a [f64]);

/// One SGD entry of [`CudaBackend::sgd_step_many`]: (param, grad, momentum buffer, learning rates).
pub type SgdEntry<'a, S> = (&'a mut S, &'a S, Option<&'a mut S>, &'a [f64]);

/// What only the CUDA storage runs, beyond [`BackendStorage`]: host transfers, products and convolutions in
/// 16-bit math, fused gradient epilogues, the side stream, and optimizer steps over many parameters in one
/// launch. The real CUDA storage and the no-CUDA stand-in implement it, so the two stay in step; the CPU
/// runs the unfused forms of these ops through [`crate::Tensor`].
pub trait CudaBackend: BackendStorage {
    /// `len` elements of `value` on device `ordinal`.
    ///
    /// # Errors
    /// No such device, f64, or out of memory.
    fn full(len: usize, value: f64, dtype: DType, ordinal: usize) -> Result<Self>;

    /// `len` zeros on device `ordinal`.
    ///
    /// # Errors
    /// As [`CudaBackend::full`].
    fn zeros(len: usize, dtype: DType, ordinal: usize) -> Result<Self> {
        Self::full(len, 0.0, dtype, ordinal)
    }

    /// Copies a host buffer to device `ordinal`.
    ///
    /// # Errors
    /// No such device, f64, or out of memory.
    fn from_host(src: &CpuStorage, ordinal: usize) -> Result<Self>;

    /// Copies device memory back to the host (waits for the queued work that writes it).
    ///
    /// # Errors
    /// A failed kernel, or an index error flagged by one.
    fn to_host(&self) -> Result<CpuStorage>;

    /// Queues a copy of device memory to the host behind the work queued so far, without waiting.
    ///
    /// # Errors
    /// During a capture; the driver rejects the copy.
    fn to_host_later(&self) -> Result<PendingHost>;

    /// `self · rhs` under `math` (operands of its type), into f32: a product under a precision policy.
    ///
    /// # Errors
    /// Operands of another type or on different devices, out of memory, or a cuBLAS failure.
    fn matmul_as(&self, rhs: &Self, shape: &MatmulShape, math: Math) -> Result<Self>;

    /// One pass of a convolution with 16-bit operands `self` and `b` through cuDNN; `None` where cuDNN is
    /// not in use or has no algorithm for it (the caller runs the pass in f32).
    ///
    /// # Errors
    /// Operands of another type or on different devices, out of memory (result or workspace), or a
    /// failure.
    fn conv_pass_16bit(
        &self,
        pass: (ConvPass, Math),
        b: &Self,
        p: &ConvParams,
    ) -> Result<Option<Self>>;

    /// A 16-bit forward pass's output `self` (`[N, O, OH, OW]`, bf16 or f16) in one pass, with the bias of each
    /// channel (`[O]` f32) added and a ReLU applied when `relu`: into f32, or kept in its own type when `keep`
    /// (activations a mixed policy keeps in the low type; then in place).
    ///
    /// # Errors
    /// `self` not 16-bit or `bias` not f32, different devices, out of memory, or a launch failure.
    fn conv_epilogue(self, bias: Option<&Self>, p: &ConvParams, act: (bool, bool)) -> Result<Self>;

    /// `max(self + bias, 0)` for image features `self` (`dims` `[C, H·W]` of an NCHW tensor, any float type) and
    /// a bias per channel (`[C]` f32, or none), into a new tensor of `self`'s type in one pass: the bias and ReLU
    /// of a convolution that a max pool came between.
    ///
    /// # Errors
    /// `bias` not f32, different devices, out of memory, or a launch failure.
    fn channel_bias_relu(&self, bias: Option<&Self>, dims: [usize; 2]) -> Result<Self>;

    /// A convolution's bias gradient from its output's 16-bit gradient `self` (`dims` `[N, O, OH·OW]`, bf16 or
    /// f16): each channel's sum, in f32 (`[O]`). An f32 gradient's runs through [`Reductions`].
    ///
    /// # Errors
    /// Not bf16 or f16, out of memory, or a launch failure.
    fn conv_bias_grad(&self, dims: [usize; 3]) -> Result<Self>;

    /// Max pooling over windows that tile the planes (`p`'s stride its kernel, dividing h and w), each max then
    /// given its channel's `bias` (f32, `channels` of them, the planes cycling through them) and a ReLU, in one
    /// pass: the pooled output in `self`'s type and the maxima's indices (i32).
    ///
    /// # Errors
    /// Not f32, bf16 or f16, a bias not f32, windows that do not tile, different devices, out of memory, or a
    /// launch failure.
    fn max_pool2d_bias_relu(
        &self,
        bias: &Self,
        channels: usize,
        p: &PoolParams,
    ) -> Result<(Self, Self)>;

    /// A convolution of few input channels, then its max pool, bias and ReLU, in one pass ([`PooledConv::fuses`]):
    /// `self` the input (`[n, c, h, w]`, f32, bf16 or f16), `weight` and `bias` f32; the pooled output in `self`'s
    /// type and the maxima's indices in the convolution's planes (i32), as `max_pool2d` records them.
    ///
    /// # Errors
    /// A geometry the kernel does not take, another type, different devices, out of memory, or a launch failure.
    fn conv2d_max_pool_bias_relu(
        &self,
        weight: &Self,
        bias: &Self,
        p: &PooledConv,
    ) -> Result<(Self, Self)>;

    /// The weight's and the bias's gradients of
    /// [`conv2d_max_pool_bias_relu`](CudaBackend::conv2d_max_pool_bias_relu) (f32) from the pooled output's
    /// gradient `self` and the output `y` (the input's type), the forward's `idx` and its input `x`.
    ///
    /// # Errors
    /// As the forward; an index outside its window is reported at the next synchronisation.
    fn conv2d_max_pool_backward(
        &self,
        y: &Self,
        idx: &Self,
        x: &Self,
        p: &PooledConv,
    ) -> Result<(Self, Self)>;

    /// The mean of each bag of `bag` consecutive ids' rows of the f32 table `self` (`[rows, cols]`): an
    /// embedding bag's lookup in one pass, `[idx.len / bag, cols]`.
    ///
    /// # Errors
    /// Not f32, indices not i32, different devices, out of memory, or a launch failure (an id outside the table
    /// is reported at the next synchronisation).
    fn bag_mean(&self, idx: &Self, bag: usize, dims: [usize; 2]) -> Result<Self>;

    /// ReLU's backward from the gradient `self` and the output `y` of a convolution's bias and ReLU (`dims`
    /// `[N, O, OH·OW]`, f32, bf16 or f16), with the bias's gradient, in one pass: `dx` in `self`'s type and each
    /// channel's sum of it in f32 (`[O]`).
    ///
    /// # Errors
    /// Another type or a type mismatch, different devices, out of memory, or a launch failure.
    fn relu_backward_channel_bias(&self, y: &Self, dims: [usize; 3]) -> Result<(Self, Self)>;

    /// ReLU's backward from the gradient `self` and the output `y` with the gradient of the bias before
    /// it, in one kernel: `dx` and `db` (`groups · cols`, summed over the rows).
    ///
    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn relu_backward_bias(&self, y: &Self, groups: usize, cols: usize) -> Result<(Self, Self)>;

    /// A Linear layer's weight and bias gradients from its input `self` and its output's gradient `g`,
    /// queued on the side stream; `None`, queuing nothing, where they do not run there.
    ///
    /// # Errors
    /// Different dtypes or devices, out of memory, or a cuBLASLt failure.
    fn linear_grads_on_side(&self, g: &Self, shape: &MatmulShape) -> Result<Option<SideGrads>>;

    /// Cross-entropy of the logits `self` averaged over each group of `batch` rows in one kernel; `None`
    /// where that kernel does not apply.
    ///
    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn cross_entropy_mean(
        &self,
        labels: &Self,
        cols: usize,
        batch: usize,
    ) -> Result<Option<(Self, Self)>>;

    /// One Adam / AdamW step over many parameters at once (per-parameter learning rates in each entry;
    /// `h.lrs` is ignored), none where `skip`'s overflow flag (a loss scale state) is raised when it runs.
    ///
    /// # Errors
    /// As [`OptimizerSteps::adam_step`], for any entry; nothing is updated then.
    fn adam_step_many(
        params: &mut [AdamEntry<'_, Self>],
        h: &AdamParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()>;

    /// One SGD step over many parameters at once (per-parameter learning rates in each entry; `h.lrs`
    /// is ignored), none where `skip`'s overflow flag (a loss scale state) is raised when it runs.
    ///
    /// # Errors
    /// As [`OptimizerSteps::sgd_step`], for any entry; nothing is updated then.
    fn sgd_step_many(
        params: &mut [SgdEntry<'_, Self>],
        h: &SgdParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()>;

    /// Divides every f32 gradient by the scale in the loss scale `state` (four f32: overflow flag, scale,
    /// clean steps, skipped steps) and raises its flag where a quotient is not finite, reading nothing back.
    ///
    /// # Errors
    /// Not f32, different devices, or a launch failure.
    fn unscale_grads(grads: &mut [&mut Self], state: &mut Self) -> Result<()>;

    /// Moves the loss scale `state` on after a step (GradScaler's update), on the device.
    ///
    /// # Errors
    /// A launch failure.
    fn update_loss_scale(
        state: &mut Self,
        interval: u64,
        min_scale: f32,
        max_scale: f32,
    ) -> Result<()>;
}
