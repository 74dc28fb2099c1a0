//! The CUDA backend of a build without the `cuda` feature: the same traits of [`crate::backend`] and the
//! same device functions as `imp.rs`, each returning [`Error::NotCompiledWithCuda`]. No [`CudaStorage`]
//! can be created.

use cohort_kernels::Math;
use cohort_kernels::attention::AttentionShape;
use cohort_kernels::batchnorm::BatchNormShape;
use cohort_kernels::binary::BinaryOp;
use cohort_kernels::conv::pooled::PooledConv;
use cohort_kernels::conv::{ConvParams, ConvPass};
use cohort_kernels::copy::Copy2d;
use cohort_kernels::layernorm::LayerNormShape;
use cohort_kernels::matmul::{GemmChoices, MatmulShape};
use cohort_kernels::optim::{AdamParams, SgdParams};
use cohort_kernels::pool::PoolParams;
use cohort_kernels::reduce::{ReduceOp, ReduceShape};
use cohort_kernels::unary::UnaryOp;

use crate::backend::{
    AdamEntry, Attention, Convolutions, CudaBackend, Elementwise, Indexing, Layout, Normalization,
    OptimizerSteps, Products, Reductions, SgdEntry,
};
use crate::storage::CpuStorage;
use crate::{DType, Device, Error, Result};

/// Elements on a CUDA device: a block of that device's allocator.
#[derive(Debug)]
pub struct CudaStorage {
    ptr: u64,
    len: usize,
    dtype: DType,
    ordinal: usize,
}

impl CudaStorage {
    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the storage holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

fn unavailable(op: &'static str, ordinal: usize) -> Error {
    Error::NotCompiledWithCuda {
        op,
        device: Device::Cuda(ordinal),
    }
}

impl Layout for CudaStorage {
    fn zeros_like(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        CudaStorage::zeros(len, dtype, self.ordinal)
    }

    fn cast(&self, dtype: DType) -> Result<CudaStorage> {
        let _ = dtype;
        Err(unavailable("to_dtype", self.ordinal))
    }

    fn copy2d(&self, dst: &mut CudaStorage, c: &Copy2d) -> Result<()> {
        let _ = (dst, c);
        Err(unavailable("copy", self.ordinal))
    }

    fn transpose(&self, batch: usize, rows: usize, cols: usize) -> Result<CudaStorage> {
        let _ = (batch, rows, cols);
        Err(unavailable("transpose", self.ordinal))
    }

    fn broadcast(&self, src_shape: &[usize], out_shape: &[usize]) -> Result<CudaStorage> {
        let _ = (src_shape, out_shape);
        Err(unavailable("broadcast_to", self.ordinal))
    }

    fn fill(&mut self, value: f64) -> Result<()> {
        let _ = value;
        Err(unavailable("fill", self.ordinal))
    }
}

impl Elementwise for CudaStorage {
    fn binary(
        &self,
        op: BinaryOp,
        lhs_shape: &[usize],
        rhs: &CudaStorage,
        rhs_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<CudaStorage> {
        let _ = (lhs_shape, rhs, rhs_shape, out_shape);
        Err(unavailable(op.name(), self.ordinal))
    }

    fn binary_assign(
        &mut self,
        op: BinaryOp,
        dst_shape: &[usize],
        src: &CudaStorage,
        src_shape: &[usize],
    ) -> Result<()> {
        let _ = (dst_shape, src, src_shape);
        Err(unavailable(op.name(), self.ordinal))
    }

    fn unary(&self, op: UnaryOp) -> Result<CudaStorage> {
        Err(unavailable(op.name(), self.ordinal))
    }

    fn where_cond(&self, on_true: &CudaStorage, on_false: &CudaStorage) -> Result<CudaStorage> {
        let _ = (on_true, on_false);
        Err(unavailable("where_cond", self.ordinal))
    }

    fn bias_act(
        &self,
        b: &CudaStorage,
        cols: usize,
        group: usize,
        relu: bool,
    ) -> Result<CudaStorage> {
        let _ = (b, cols, group, relu);
        Err(unavailable("bias_act", self.ordinal))
    }

    fn relu_backward(&self, y: &CudaStorage) -> Result<CudaStorage> {
        let _ = y;
        Err(unavailable("relu_backward", self.ordinal))
    }

    fn gelu_backward(&self, x: &CudaStorage) -> Result<CudaStorage> {
        let _ = x;
        Err(unavailable("gelu_backward", self.ordinal))
    }
}

impl Reductions for CudaStorage {
    fn reduce(&self, op: ReduceOp, shape: ReduceShape) -> Result<CudaStorage> {
        let _ = shape;
        Err(unavailable(op.name(), self.ordinal))
    }

    fn argmax(&self, shape: ReduceShape) -> Result<CudaStorage> {
        let _ = shape;
        Err(unavailable("argmax", self.ordinal))
    }

    fn softmax_last(&self, cols: usize, log: bool) -> Result<CudaStorage> {
        let _ = (cols, log);
        Err(unavailable("softmax_last", self.ordinal))
    }

    fn cross_entropy(
        &self,
        labels: &CudaStorage,
        cols: usize,
        scale: f64,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (labels, cols, scale);
        Err(unavailable("cross_entropy", self.ordinal))
    }
}

impl Products for CudaStorage {
    fn matmul(&self, rhs: &CudaStorage, shape: &MatmulShape) -> Result<CudaStorage> {
        let _ = (rhs, shape);
        Err(unavailable("matmul", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn linear(
        &self,
        w: &CudaStorage,
        bias: &CudaStorage,
        shape: &MatmulShape,
        bias_batch_stride: usize,
        relu: bool,
    ) -> Result<Option<CudaStorage>> {
        let _ = (w, bias, shape, bias_batch_stride, relu);
        Err(unavailable("linear", self.ordinal))
    }
}

impl Convolutions for CudaStorage {
    fn conv2d(
        &self,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        let _ = (weight, bias, p, math);
        Err(unavailable("conv2d", self.ordinal))
    }

    fn conv2d_backward_input(
        &self,
        weight: &CudaStorage,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        let _ = (weight, p, math);
        Err(unavailable("conv2d_backward_input", self.ordinal))
    }

    fn conv2d_backward_weight(
        &self,
        grad_out: &CudaStorage,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        let _ = (grad_out, p, math);
        Err(unavailable("conv2d_backward_weight", self.ordinal))
    }

    fn max_pool2d(&self, p: &PoolParams) -> Result<(CudaStorage, CudaStorage)> {
        let _ = p;
        Err(unavailable("max_pool2d", self.ordinal))
    }

    fn max_pool2d_backward(&self, indices: &CudaStorage, p: &PoolParams) -> Result<CudaStorage> {
        let _ = (indices, p);
        Err(unavailable("max_pool2d_backward", self.ordinal))
    }
}

impl Indexing for CudaStorage {
    fn index_select(
        &self,
        idx: &CudaStorage,
        outer: usize,
        dim: usize,
        inner: usize,
    ) -> Result<CudaStorage> {
        let _ = (idx, outer, dim, inner);
        Err(unavailable("index_select", self.ordinal))
    }

    fn index_add(
        &mut self,
        idx: &CudaStorage,
        src: &CudaStorage,
        shape: (usize, usize, usize),
        repeat: usize,
    ) -> Result<()> {
        let _ = (idx, src, shape, repeat);
        Err(unavailable("index_add", self.ordinal))
    }

    fn gather_last(&self, idx: &CudaStorage, cols: usize) -> Result<CudaStorage> {
        let _ = (idx, cols);
        Err(unavailable("gather_last", self.ordinal))
    }

    fn scatter_add_last(
        &mut self,
        idx: &CudaStorage,
        src: &CudaStorage,
        cols: usize,
    ) -> Result<()> {
        let _ = (idx, src, cols);
        Err(unavailable("scatter_add_last", self.ordinal))
    }

    fn one_hot(&self, classes: usize, dtype: DType) -> Result<CudaStorage> {
        let _ = (classes, dtype);
        Err(unavailable("one_hot", self.ordinal))
    }
}

impl Normalization for CudaStorage {
    fn batch_norm(
        &self,
        params: (&CudaStorage, &CudaStorage),
        shape: (&BatchNormShape, f64),
        relu: bool,
        running: Option<(&mut CudaStorage, &mut CudaStorage, f64)>,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let _ = (params, shape, relu, running);
        Err(unavailable("batch_norm", self.ordinal))
    }

    fn batch_norm_backward(
        &self,
        out: Option<&CudaStorage>,
        dout: &CudaStorage,
        saved: (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &BatchNormShape,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let _ = (out, dout, saved, shape);
        Err(unavailable("batch_norm_backward", self.ordinal))
    }

    fn layer_norm(
        &self,
        params: (&CudaStorage, &CudaStorage),
        shape: (&LayerNormShape, f64),
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let _ = (params, shape);
        Err(unavailable("layer_norm", self.ordinal))
    }

    fn layer_norm_backward(
        &self,
        dout: &CudaStorage,
        saved: (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &LayerNormShape,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        let _ = (dout, saved, shape);
        Err(unavailable("layer_norm_backward", self.ordinal))
    }
}

impl Attention for CudaStorage {
    fn attention(
        &self,
        mask: Option<&CudaStorage>,
        shape: &AttentionShape,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (mask, shape);
        Err(unavailable("attention", self.ordinal))
    }

    fn attention_backward(
        &self,
        mask: Option<&CudaStorage>,
        saved: (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &AttentionShape,
    ) -> Result<CudaStorage> {
        let _ = (mask, saved, shape);
        Err(unavailable("attention_backward", self.ordinal))
    }
}

impl OptimizerSteps for CudaStorage {
    fn sgd_step(
        &mut self,
        grad: &CudaStorage,
        momentum_buf: Option<&mut CudaStorage>,
        h: &SgdParams<'_>,
    ) -> Result<()> {
        let _ = (grad, momentum_buf, h);
        Err(unavailable("sgd_step", self.ordinal))
    }

    fn adam_step(
        &mut self,
        grad: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        h: &AdamParams<'_>,
    ) -> Result<()> {
        let _ = (grad, m, v, h);
        Err(unavailable("adam_step", self.ordinal))
    }
}

impl CudaBackend for CudaStorage {
    /// `len` elements of `value` on device `ordinal`.
    fn full(len: usize, value: f64, dtype: DType, ordinal: usize) -> Result<CudaStorage> {
        let _ = (len, value, dtype);
        Err(unavailable("full", ordinal))
    }

    /// Copies a host buffer to device `ordinal`.
    fn from_host(src: &CpuStorage, ordinal: usize) -> Result<CudaStorage> {
        let _ = src;
        Err(unavailable("to_device", ordinal))
    }

    /// Copies device memory back to the host.
    fn to_host(&self) -> Result<CpuStorage> {
        Err(unavailable("to_host", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn to_host_later(&self) -> Result<PendingHost> {
        Err(unavailable("to_host_later", self.ordinal))
    }

    /// A product under a precision policy (see the CUDA build's `matmul_as`).
    fn matmul_as(&self, rhs: &CudaStorage, shape: &MatmulShape, math: Math) -> Result<CudaStorage> {
        let _ = (rhs, shape, math);
        Err(unavailable("matmul", self.ordinal))
    }

    /// A convolution pass with 16-bit operands (see the CUDA build's `conv_pass_16bit`).
    fn conv_pass_16bit(
        &self,
        pass: (ConvPass, Math),
        b: &CudaStorage,
        p: &ConvParams,
    ) -> Result<Option<CudaStorage>> {
        let _ = (pass, b, p);
        Err(unavailable("conv2d", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// Always [`Error::NotCompiledWithCuda`].
    fn conv_epilogue(
        self,
        bias: Option<&CudaStorage>,
        p: &ConvParams,
        act: (bool, bool),
    ) -> Result<CudaStorage> {
        let _ = (bias, p, act);
        Err(unavailable("conv2d", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn channel_bias_relu(
        &self,
        bias: Option<&CudaStorage>,
        dims: [usize; 2],
    ) -> Result<CudaStorage> {
        let _ = (bias, dims);
        Err(unavailable("channel_bias_relu", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn conv_bias_grad(&self, dims: [usize; 3]) -> Result<CudaStorage> {
        let _ = dims;
        Err(unavailable("conv2d_backward_bias", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn conv2d_max_pool_bias_relu(
        &self,
        weight: &CudaStorage,
        bias: &CudaStorage,
        p: &PooledConv,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (weight, bias, p);
        Err(unavailable("conv2d_max_pool_bias_relu", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn conv2d_max_pool_backward(
        &self,
        y: &CudaStorage,
        idx: &CudaStorage,
        x: &CudaStorage,
        p: &PooledConv,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (y, idx, x, p);
        Err(unavailable("conv2d_max_pool_backward", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn max_pool2d_bias_relu(
        &self,
        bias: &CudaStorage,
        channels: usize,
        p: &PoolParams,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (bias, channels, p);
        Err(unavailable("max_pool2d_bias_relu", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn bag_mean(&self, idx: &CudaStorage, bag: usize, dims: [usize; 2]) -> Result<CudaStorage> {
        let _ = (idx, bag, dims);
        Err(unavailable("bag_mean", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn relu_backward_channel_bias(
        &self,
        y: &CudaStorage,
        dims: [usize; 3],
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (y, dims);
        Err(unavailable("relu_backward_channel_bias", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn relu_backward_bias(
        &self,
        y: &CudaStorage,
        groups: usize,
        cols: usize,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let _ = (y, groups, cols);
        Err(unavailable("relu_backward_bias", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn linear_grads_on_side(
        &self,
        g: &CudaStorage,
        shape: &MatmulShape,
    ) -> Result<Option<SideGrads>> {
        let _ = (g, shape);
        Err(unavailable("linear_grads", self.ordinal))
    }

    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    fn cross_entropy_mean(
        &self,
        labels: &CudaStorage,
        cols: usize,
        batch: usize,
    ) -> Result<Option<(CudaStorage, CudaStorage)>> {
        let _ = (labels, cols, batch);
        Err(unavailable("cross_entropy", self.ordinal))
    }

    fn adam_step_many(
        params: &mut [AdamEntry<'_, Self>],
        h: &AdamParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()> {
        let _ = (h, skip);
        match params.first() {
            Some(e) => Err(unavailable("adam_step", e.0.ordinal)),
            None => Ok(()),
        }
    }

    fn sgd_step_many(
        params: &mut [SgdEntry<'_, Self>],
        h: &SgdParams<'_>,
        skip: Option<&Self>,
    ) -> Result<()> {
        let _ = (h, skip);
        match params.first() {
            Some(e) => Err(unavailable("sgd_step", e.0.ordinal)),
            None => Ok(()),
        }
    }

    fn unscale_grads(grads: &mut [&mut Self], state: &mut Self) -> Result<()> {
        let _ = grads;
        Err(unavailable("unscale_grads", state.ordinal))
    }

    fn update_loss_scale(
        state: &mut Self,
        interval: u64,
        min_scale: f32,
        max_scale: f32,
    ) -> Result<()> {
        let _ = (interval, min_scale, max_scale);
        Err(unavailable("update_loss_scale", state.ordinal))
    }
}

/// Always 0: this build has no CUDA support.
///
/// # Errors
/// Never; the signature matches the CUDA build.
pub fn device_count() -> Result<usize> {
    Ok(0)
}

/// Opens the device.
pub fn open(ordinal: usize) -> Result<()> {
    Err(unavailable("open", ordinal))
}

/// Waits for all work queued on the device.
pub fn synchronize(ordinal: usize) -> Result<()> {
    Err(unavailable("synchronize", ordinal))
}

/// Device memory on its way to the host. This build has no CUDA support, so no value of it can
/// exist.
#[derive(Debug)]
pub struct PendingHost {
    never: std::convert::Infallible,
}

impl PendingHost {
    /// Never called: no value exists in this build.
    pub fn is_done(&self) -> bool {
        match self.never {}
    }

    /// Never called: no value exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn wait(&self) -> Result<CpuStorage> {
        match self.never {}
    }
}

/// Never made: this build has no CUDA support.
#[derive(Debug)]
pub struct SideGrads;

impl SideGrads {
    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    pub fn join(self) -> Result<(CudaStorage, CudaStorage)> {
        Err(unavailable("linear_grads", 0))
    }
}

/// Creates the allocator of device `ordinal` from the environment's configuration.
pub fn create_allocator(
    ordinal: usize,
) -> Result<std::sync::Arc<dyn crate::memory::DeviceAllocator>> {
    Err(unavailable("allocator", ordinal))
}

/// A captured CUDA graph. This build has no CUDA support, so no value of it can exist.
#[derive(Debug)]
pub struct CudaGraph {
    never: std::convert::Infallible,
}

impl CudaGraph {
    /// Never called: no graph exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn replay(&self) -> Result<()> {
        match self.never {}
    }

    /// Never called: no graph exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn set_optimizer_step(&self, next: u64, lr_scale: f32) -> Result<()> {
        let _ = (next, lr_scale);
        match self.never {}
    }

    /// Never called: no graph exists in this build.
    pub fn has_optimizer_step(&self) -> bool {
        match self.never {}
    }

    /// Never called: no graph exists in this build.
    pub fn pool_stats(&self) -> cohort_alloc::MemoryReport {
        match self.never {}
    }
}

/// Never called: no graph exists in this build.
///
/// # Errors
/// Never.
pub fn replay_concurrently(graphs: &[&CudaGraph], lanes: usize) -> Result<()> {
    let _ = lanes;
    match graphs.first() {
        Some(g) => match g.never {},
        None => Ok(()),
    }
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`] (or [`Error::Unsupported`] for the CPU).
pub fn capture<R, E: From<Error>>(
    device: &Device,
    _f: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<(CudaGraph, R), E> {
    Err(match device {
        Device::Cpu => Error::Unsupported {
            op: "capture",
            device: *device,
        },
        Device::Cuda(_) => Error::NotCompiledWithCuda {
            op: "capture",
            device: *device,
        },
    }
    .into())
}

/// The copies of one upload. This build has no CUDA support, so no value of it can exist.
#[derive(Clone, Debug)]
pub struct CopyReady {
    never: std::convert::Infallible,
}

impl CopyReady {
    /// Never called: no upload exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn wait_on_compute(&self) -> Result<()> {
        match self.never {}
    }

    /// Never called: no upload exists in this build.
    pub fn is_done(&self) -> bool {
        match self.never {}
    }
}

/// Pinned-buffer uploads to a GPU. This build has no CUDA support, so no value of it can exist.
#[derive(Debug)]
pub struct Uploader {
    never: std::convert::Infallible,
}

impl Uploader {
    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`] (or [`Error::Unsupported`] for the CPU).
    pub fn new(device: &Device, _slots: usize) -> Result<Uploader> {
        Err(match device {
            Device::Cpu => Error::Unsupported {
                op: "Uploader::new",
                device: *device,
            },
            Device::Cuda(_) => Error::NotCompiledWithCuda {
                op: "Uploader::new",
                device: *device,
            },
        })
    }

    /// Never called: no uploader exists in this build.
    pub fn device(&self) -> Device {
        match self.never {}
    }

    /// Never called: no uploader exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn upload(
        &mut self,
        _tensors: &[&crate::Tensor],
    ) -> Result<(Vec<crate::Tensor>, CopyReady)> {
        match self.never {}
    }
}

/// A point in a compute stream. This build has no CUDA support, so no value of it can exist.
#[derive(Debug)]
pub struct StreamMark {
    never: std::convert::Infallible,
}

impl StreamMark {
    /// Never called: no mark exists in this build.
    ///
    /// # Errors
    /// Never.
    pub fn elapsed_ms(&self, _later: &StreamMark) -> Result<f64> {
        match self.never {}
    }
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn mark(ordinal: usize) -> Result<StreamMark> {
    Err(unavailable("mark", ordinal))
}

/// GPU time per kernel since the last call (with `COHORT_CUDA_PROFILE=1`).
pub fn kernel_profile(ordinal: usize) -> Result<Vec<cohort_kernels::cuda::KernelTime>> {
    Err(unavailable("kernel_profile", ordinal))
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn gemm_tuning(ordinal: usize) -> Result<Vec<cohort_kernels::cuda::GemmTuning>> {
    Err(unavailable("gemm_tuning", ordinal))
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn gemm_choices(ordinal: usize) -> Result<GemmChoices> {
    Err(unavailable("gemm_choices", ordinal))
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn adopt_gemm_choices(ordinal: usize, _choices: &GemmChoices) -> Result<usize> {
    Err(unavailable("adopt_gemm_choices", ordinal))
}

/// Always fails: this build has no CUDA support.
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn gemm_choice_count(ordinal: usize) -> Result<u64> {
    Err(unavailable("gemm_choice_count", ordinal))
}

/// The cuDNN in use (none without CUDA support).
///
/// # Errors
/// [`Error::NotCompiledWithCuda`].
pub fn cudnn_version(ordinal: usize) -> Result<Option<usize>> {
    Err(unavailable("cudnn_version", ordinal))
}
