//! The CUDA backend: every op of [`crate::backend`] on [`CudaStorage`], through cohort-kernels' CUDA
//! kernels, one module per concern; all of them enqueue on the device's compute stream and return
//! without waiting (reading back with [`CudaBackend::to_host`](crate::backend::CudaBackend::to_host)
//! waits).
//!
//! Index ops (index_select, index_add, gather_last, scatter_add_last, one_hot, max_pool2d_backward,
//! cross_entropy) do not wait for their kernel: an out-of-range index is reported by the next
//! read-back or synchronize of the thread that queued the op (see the crate docs).
//!
//! Storage is a block of the device's caching allocator, charged to the thread's current tenant
//! and given back when the storage drops. The allocator may hand that block to the next op at
//! once: every op runs on the one compute stream, so the next op's kernels start only after the
//! kernels still reading the block are done.

use std::fmt;
use std::sync::Arc;

use cohort_alloc::{Block, MemoryReport, TenantId};
use cohort_kernels::cuda::{CudaType, Gpu};
use cohort_kernels::matmul::GemmChoices;

use crate::memory::{self, DeviceAllocator};
use crate::{DType, Device, Error, Result};

mod allocator;
mod attention;
mod capture;
mod conv;
mod cuda_backend;
mod elementwise;
mod index;
mod layout;
mod norm;
mod optim;
mod products;
mod reductions;
mod staging;

pub use allocator::create_allocator;
pub use capture::{CudaGraph, capture, replay_concurrently};
pub use cuda_backend::{PendingHost, SideGrads};
pub use staging::{CopyReady, Uploader};

/// Elements on a CUDA device: a block of that device's allocator.
pub struct CudaStorage {
    block: Option<Block>,
    len: usize,
    dtype: DType,
    ordinal: usize,
    gpu: Arc<Gpu>,
    alloc: Arc<dyn DeviceAllocator>,
}

impl fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaStorage(cuda:{}, {} x {}, {:#x})",
            self.ordinal,
            self.len,
            self.dtype,
            self.device_ptr()
        )
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            // A block freed during a graph capture may be used by the graph's replays: it stays
            // out of the shared cache until the graph is dropped (blocks of the graph's own pool
            // go back to that pool, which only the graph uses).
            if let Some(b) = capture::defer_free(self.ordinal, &self.alloc, b) {
                // Stream-ordered: a later op reusing the block runs after every op queued so far.
                // A free may synchronize (the direct backend): not while another thread captures.
                let _turn = self.gpu.turn();
                self.alloc.free(b);
            }
        }
    }
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
        self.block.as_ref().map_or(0, |b| b.ptr)
    }

    /// The device's kernel context.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A new, uninitialised storage on the same device.
    fn sibling(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        Ctx {
            gpu: self.gpu.clone(),
            alloc: memory::allocator(&Device::Cuda(self.ordinal))?,
            ordinal: self.ordinal,
        }
        .storage(len, dtype)
    }
}

/// A device's kernel context and allocator.
struct Ctx {
    gpu: Arc<Gpu>,
    alloc: Arc<dyn DeviceAllocator>,
    ordinal: usize,
}

impl Ctx {
    fn of(ordinal: usize) -> Result<Ctx> {
        Ok(Ctx {
            gpu: gpu(ordinal)?,
            alloc: memory::allocator(&Device::Cuda(ordinal))?,
            ordinal,
        })
    }

    /// Uninitialised storage of `len` elements, charged to the current tenant; during a graph
    /// capture on this device, a block of the graph's private pool.
    fn storage(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        let bytes = (len * dtype.size_in_bytes()).max(4);
        let (alloc, block) = match capture::pool(self.ordinal) {
            // A capture may not synchronize: the pool neither trims nor moves pages to make room
            // (a trim would also give back regions the captured work still uses).
            Some(pool) => {
                let block = pool.alloc_without_sync(bytes, TenantId::DEFAULT)?;
                (pool, block)
            }
            None => {
                // Growing may move pages or trim, which synchronize: not while another thread
                // captures.
                let _turn = self.gpu.turn();
                let block = self.alloc.alloc(bytes, memory::current_tenant())?;
                (self.alloc.clone(), block)
            }
        };
        Ok(CudaStorage {
            block: Some(block),
            len,
            dtype,
            ordinal: self.ordinal,
            gpu: self.gpu.clone(),
            alloc,
        })
    }
}

fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    Gpu::get(ordinal).map_err(|e| Error::DeviceUnavailable {
        device: Device::Cuda(ordinal),
        reason: e.to_string(),
    })
}

fn unsupported(op: &'static str, dtype: DType) -> Error {
    let hint = match dtype {
        DType::F64 => " on CUDA (f64 is CPU-only: cast to f32 with to_dtype)",
        DType::F16 | DType::BF16 => {
            " on CUDA (f16/bf16 compute only in the ops a mixed policy keeps activations in: convolutions, \
             ReLU, add, max pooling, batch norm; cast to f32 with to_dtype)"
        }
        DType::I32 | DType::U8 => " on CUDA (cast to f32 with to_dtype)",
        DType::F32 => " on CUDA",
    };
    Error::UnsupportedDType { op, dtype, hint }
}

fn mismatch(op: &'static str, a: DType, b: DType) -> Error {
    Error::DTypeMismatch { op, lhs: a, rhs: b }
}

/// `x` and each of `others` f32 on one device.
fn f32_on_one_device(op: &'static str, x: &CudaStorage, others: &[&CudaStorage]) -> Result<()> {
    want(op, x, &[DType::F32])?;
    for s in others {
        want(op, s, &[DType::F32])?;
        same_device(op, x, s)?;
    }
    Ok(())
}

/// The address of a per-channel bias for `x`'s epilogue (f32, on `x`'s device), or 0 for none.
fn channel_bias_ptr(op: &'static str, x: &CudaStorage, bias: Option<&CudaStorage>) -> Result<u64> {
    let Some(b) = bias else { return Ok(0) };
    want(op, b, &[DType::F32])?;
    same_device(op, x, b)?;
    Ok(b.device_ptr())
}

fn same_device(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.ordinal == b.ordinal {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            op,
            lhs: Device::Cuda(a.ordinal),
            rhs: Device::Cuda(b.ordinal),
        })
    }
}

/// The kernels' name for a dtype; f64 has no CUDA kernels.
fn ty(op: &'static str, dtype: DType) -> Result<CudaType> {
    Ok(match dtype {
        DType::F32 => CudaType::F32,
        DType::F16 => CudaType::F16,
        DType::BF16 => CudaType::BF16,
        DType::I32 => CudaType::I32,
        DType::U8 => CudaType::U8,
        DType::F64 => return Err(unsupported(op, dtype)),
    })
}

fn want(op: &'static str, s: &CudaStorage, allowed: &[DType]) -> Result<CudaType> {
    if allowed.contains(&s.dtype) {
        ty(op, s.dtype)
    } else {
        Err(unsupported(op, s.dtype))
    }
}

fn indices(op: &'static str, idx: &CudaStorage) -> Result<()> {
    if idx.dtype == DType::I32 {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype: idx.dtype,
            hint: " (indices must be i32)",
        })
    }
}

/// Number of CUDA devices the driver reports; 0 without a driver (never panics).
///
/// # Errors
/// When the driver is present but fails to initialize.
pub fn device_count() -> Result<usize> {
    cohort_kernels::cuda::device_count().map_err(|e| Error::DeviceUnavailable {
        device: Device::Cuda(0),
        reason: e.to_string(),
    })
}

/// Opens device `ordinal` (its context; the kernels nearly every job uses start compiling in the background).
///
/// # Errors
/// No such device, or the driver failed.
pub fn open(ordinal: usize) -> Result<()> {
    gpu(ordinal).map(drop)
}

/// Waits for all work queued on the device; reports an index error a kernel flagged meanwhile.
///
/// # Errors
/// No such device, a failed kernel, or an out-of-range index met by an index kernel.
pub fn synchronize(ordinal: usize) -> Result<()> {
    Ok(gpu(ordinal)?.synchronize()?)
}

/// GPU time per kernel on device `ordinal` since the last call, the most expensive first (waits
/// for the work); empty unless the process runs with `COHORT_CUDA_PROFILE=1`.
///
/// # Errors
/// No such device, or a timing event failed.
pub fn kernel_profile(ordinal: usize) -> Result<Vec<cohort_kernels::cuda::KernelTime>> {
    Ok(gpu(ordinal)?.kernel_profile()?)
}

/// The f32 product geometries device `ordinal` tuned since the last call (see
/// [`Gpu::gemm_tuning`](cohort_kernels::cuda::Gpu::gemm_tuning)).
///
/// # Errors
/// No such device.
pub fn gemm_tuning(ordinal: usize) -> Result<Vec<cohort_kernels::cuda::GemmTuning>> {
    Ok(gpu(ordinal)?.gemm_tuning())
}

/// Every f32 product geometry device `ordinal` decided on so far and how it runs, to save with a
/// run (see [`Gpu::gemm_choices`](cohort_kernels::cuda::Gpu::gemm_choices)).
///
/// # Errors
/// No such device.
pub fn gemm_choices(ordinal: usize) -> Result<GemmChoices> {
    Ok(gpu(ordinal)?.gemm_choices())
}

/// Makes device `ordinal` run the geometries of saved `choices` it has not decided on yet as they
/// say, without timing them; returns how many entries it took (see
/// [`Gpu::adopt_gemm_choices`](cohort_kernels::cuda::Gpu::adopt_gemm_choices)).
///
/// # Errors
/// No such device, no cuBLASLt, or choices made on another device or cuBLASLt
/// ([`cohort_kernels::Error::ForeignGemmChoices`]: nothing adopted, the products are chosen afresh).
pub fn adopt_gemm_choices(ordinal: usize, choices: &GemmChoices) -> Result<usize> {
    Ok(gpu(ordinal)?.adopt_gemm_choices(choices)?)
}

/// A count that grows whenever device `ordinal` decides on (or adopts) a product geometry: save
/// [`gemm_choices`] again only when it changed (see
/// [`Gpu::gemm_choice_count`](cohort_kernels::cuda::Gpu::gemm_choice_count)).
///
/// # Errors
/// No such device.
pub fn gemm_choice_count(ordinal: usize) -> Result<u64> {
    Ok(gpu(ordinal)?.gemm_choice_count())
}

/// The cuDNN device `ordinal`'s convolutions run through (`cudnnGetVersion()`, 91400 for 9.14.0); `None` where
/// it is switched off or absent, and the own kernels run them (16-bit convolutions then run in f32).
///
/// # Errors
/// No such device.
pub fn cudnn_version(ordinal: usize) -> Result<Option<usize>> {
    Ok(gpu(ordinal)?.cudnn_version())
}

/// A point in the device's compute stream, timed when the GPU reaches it.
#[derive(Debug)]
pub struct StreamMark(cudarc::driver::CudaEvent);

impl StreamMark {
    /// Milliseconds of GPU time from this mark to `later` (waits for both to be reached).
    ///
    /// # Errors
    /// A failed kernel before either mark, or marks of different devices.
    pub fn elapsed_ms(&self, later: &StreamMark) -> Result<f64> {
        self.0.elapsed_ms(&later.0).map(f64::from).map_err(|e| {
            Error::Kernel(cohort_kernels::Error::Cuda(format!(
                "timing between two stream marks failed: {e:?}"
            )))
        })
    }
}

/// Marks the current end of device `ordinal`'s compute stream (no waiting): the difference of two
/// marks is the GPU time between them, idle gaps included.
///
/// # Errors
/// No such device, or the driver rejects the event.
pub fn mark(ordinal: usize) -> Result<StreamMark> {
    Ok(StreamMark(gpu(ordinal)?.mark()?))
}

const BINARY_TYPES: [DType; 4] = [DType::F32, DType::I32, DType::BF16, DType::F16];
/// The float types with element-wise kernels: f32 for every op, bf16 and f16 (activations a mixed policy keeps in
/// the low type) for some; the kernels name what they lack.
const FLOAT_TYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
