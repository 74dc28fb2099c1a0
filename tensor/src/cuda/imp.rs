//! The CUDA backend: every op of [`crate::cpu`] on [`CudaStorage`], through cohort-kernels' CUDA
//! kernels. Each function mirrors the CPU one of the same name; all of them enqueue on the
//! device's compute stream and return without waiting (reading back with [`to_host`] waits).
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
use cohort_kernels::Math;
use cohort_kernels::binary::{BinaryOp, cuda as binary_cuda};
use cohort_kernels::conv::{ConvParams, ConvPass, cuda as conv_cuda};
use cohort_kernels::copy::{Copy2d, cuda as copy_cuda};
use cohort_kernels::cuda::{CudaType, Gpu};
use cohort_kernels::index::cuda as index_cuda;
use cohort_kernels::matmul::{GemmChoices, MatmulShape, cuda as matmul_cuda};
use cohort_kernels::optim::{AdamParams, SgdParams, cuda as optim_cuda};
use cohort_kernels::pool::{PoolParams, cuda as pool_cuda};
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cuda as reduce_cuda};
use cohort_kernels::softmax::cuda as softmax_cuda;
use cohort_kernels::unary::{UnaryOp, cuda as unary_cuda};

use crate::memory::{self, DeviceAllocator};
use crate::products::operand_type;
use crate::storage::CpuStorage;
use crate::{DType, Device, Error, Result};

mod allocator;
mod attention;
mod batchnorm;
mod capture;
mod layernorm;
mod staging;

pub use allocator::create_allocator;
pub use attention::{attention, attention_backward};
pub use batchnorm::{batch_norm, batch_norm_backward};
pub use capture::{CudaGraph, capture, replay_concurrently};
pub use layernorm::{layer_norm, layer_norm_backward};
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
            " on CUDA (f16/bf16 are storage types: cast to f32 with to_dtype to compute)"
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

/// `len` elements of `value` on device `ordinal`.
///
/// # Errors
/// No such device, f64, or out of memory.
pub fn full(len: usize, value: f64, dtype: DType, ordinal: usize) -> Result<CudaStorage> {
    let t = ty("full", dtype)?;
    let out = Ctx::of(ordinal)?.storage(len, dtype)?;
    // SAFETY: out holds len elements of dtype.
    unsafe { copy_cuda::fill(&out.gpu, t, out.device_ptr(), len, value)? };
    Ok(out)
}

/// `len` zeros on device `ordinal`.
///
/// # Errors
/// As [`full`].
pub fn zeros(len: usize, dtype: DType, ordinal: usize) -> Result<CudaStorage> {
    full(len, 0.0, dtype, ordinal)
}

/// Copies a host buffer to device `ordinal`.
///
/// # Errors
/// No such device, f64, or out of memory.
pub fn from_host(src: &CpuStorage, ordinal: usize) -> Result<CudaStorage> {
    ty("to_device", src.dtype())?;
    let out = Ctx::of(ordinal)?.storage(src.len(), src.dtype())?;
    // SAFETY: out holds exactly src's bytes.
    unsafe { out.gpu.htod(out.device_ptr(), src.as_bytes())? };
    Ok(out)
}

fn download<T: bytemuck::Pod>(src: &CudaStorage) -> Result<Vec<T>> {
    let mut v = vec![T::zeroed(); src.len];
    // SAFETY: the storage holds len elements of T.
    unsafe {
        src.gpu
            .dtoh(src.device_ptr(), bytemuck::cast_slice_mut(&mut v))?
    };
    Ok(v)
}

/// Copies device memory back to the host (waits for the queued work that writes it).
///
/// # Errors
/// A failed kernel, or an index error flagged by one.
pub fn to_host(src: &CudaStorage) -> Result<CpuStorage> {
    Ok(match src.dtype {
        DType::F32 => CpuStorage::F32(download(src)?),
        DType::F16 => CpuStorage::F16(download(src)?),
        DType::BF16 => CpuStorage::BF16(download(src)?),
        DType::I32 => CpuStorage::I32(download(src)?),
        DType::U8 => CpuStorage::U8(download(src)?),
        DType::F64 => CpuStorage::F64(download(src)?),
    })
}

/// Device memory on its way to the host ([`to_host_later`]).
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

/// Queues a copy of device memory to the host behind the work queued so far, without waiting.
///
/// # Errors
/// During a capture; the driver rejects the copy.
pub fn to_host_later(src: &CudaStorage) -> Result<PendingHost> {
    let bytes = src.len * src.dtype.size_in_bytes();
    // SAFETY: the storage holds `bytes` bytes; a block freed after this is reused in stream order,
    // after the copy.
    let copy = unsafe { src.gpu.dtoh_later(src.device_ptr(), bytes)? };
    Ok(PendingHost {
        copy,
        dtype: src.dtype,
    })
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

/// See [`crate::cpu::cast`].
///
/// # Errors
/// f64 on either side, out of memory, or a launch failure.
pub fn cast(s: &CudaStorage, dtype: DType) -> Result<CudaStorage> {
    let from = ty("to_dtype", s.dtype)?;
    let to = ty("to_dtype", dtype)?;
    let out = s.sibling(s.len, dtype)?;
    // SAFETY: s holds len elements of `from`, out len of `to`.
    unsafe { copy_cuda::cast(&s.gpu, from, to, s.device_ptr(), out.device_ptr(), s.len)? };
    Ok(out)
}

/// See [`crate::cpu::copy2d`].
///
/// # Errors
/// Different dtypes or devices, or a launch failure.
pub fn copy2d(src: &CudaStorage, dst: &mut CudaStorage, c: &Copy2d) -> Result<()> {
    if src.dtype != dst.dtype {
        return Err(mismatch("copy", dst.dtype, src.dtype));
    }
    same_device("copy", dst, src)?;
    check_block("copy", c.rows, c.cols, c.src_stride, c.src_offset, src.len)?;
    check_block("copy", c.rows, c.cols, c.dst_stride, c.dst_offset, dst.len)?;
    // SAFETY: both block geometries were checked against the buffers.
    unsafe {
        copy_cuda::copy2d(
            &src.gpu,
            src.dtype.size_in_bytes(),
            src.device_ptr(),
            dst.device_ptr(),
            c,
        )?
    };
    Ok(())
}

/// A block copy must stay inside its buffer: the kernels do not check.
fn check_block(
    op: &'static str,
    rows: usize,
    cols: usize,
    stride: usize,
    offset: usize,
    len: usize,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let end = offset + (rows - 1) * stride + cols;
    if end > len {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "a block copy of {rows}x{cols} (stride {stride}, offset {offset}) reaches element {end} of a buffer of {len}"
            ),
        });
    }
    Ok(())
}

/// See [`crate::cpu::transpose`].
///
/// # Errors
/// f64, out of memory, or a launch failure.
pub fn transpose(s: &CudaStorage, batch: usize, rows: usize, cols: usize) -> Result<CudaStorage> {
    ty("transpose", s.dtype)?;
    let out = s.sibling(s.len, s.dtype)?;
    // SAFETY: both hold batch·rows·cols elements (the tensor validated the shape).
    unsafe {
        copy_cuda::transpose(
            &s.gpu,
            s.dtype.size_in_bytes(),
            s.device_ptr(),
            out.device_ptr(),
            batch,
            rows,
            cols,
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::broadcast`].
///
/// # Errors
/// f64, shapes that do not broadcast, out of memory, or a launch failure.
pub fn broadcast(s: &CudaStorage, src_shape: &[usize], out_shape: &[usize]) -> Result<CudaStorage> {
    ty("broadcast_to", s.dtype)?;
    let out = s.sibling(out_shape.iter().product(), s.dtype)?;
    // SAFETY: s holds src_shape's elements, out out_shape's.
    unsafe {
        copy_cuda::broadcast(
            &s.gpu,
            s.dtype.size_in_bytes(),
            s.device_ptr(),
            src_shape,
            out.device_ptr(),
            out_shape,
        )?
    };
    Ok(out)
}

const BINARY_TYPES: [DType; 2] = [DType::F32, DType::I32];

/// See [`crate::cpu::binary`].
///
/// # Errors
/// Different dtypes or devices, a dtype without kernels (f32 and i32 have them), shapes that do
/// not broadcast, out of memory, or a launch failure.
pub fn binary(
    op: BinaryOp,
    lhs: &CudaStorage,
    lhs_shape: &[usize],
    rhs: &CudaStorage,
    rhs_shape: &[usize],
    out_shape: &[usize],
) -> Result<CudaStorage> {
    if lhs.dtype != rhs.dtype {
        return Err(mismatch(op.name(), lhs.dtype, rhs.dtype));
    }
    same_device(op.name(), lhs, rhs)?;
    let t = want(op.name(), lhs, &BINARY_TYPES)?;
    let out = lhs.sibling(out_shape.iter().product(), lhs.dtype)?;
    // SAFETY: each buffer holds its shape's elements.
    unsafe {
        binary_cuda::binary(
            &lhs.gpu,
            op,
            t,
            lhs.device_ptr(),
            lhs_shape,
            rhs.device_ptr(),
            rhs_shape,
            out.device_ptr(),
            out_shape,
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::binary_assign`].
///
/// # Errors
/// As [`binary`].
pub fn binary_assign(
    op: BinaryOp,
    dst: &mut CudaStorage,
    dst_shape: &[usize],
    src: &CudaStorage,
    src_shape: &[usize],
) -> Result<()> {
    if dst.dtype != src.dtype {
        return Err(mismatch(op.name(), dst.dtype, src.dtype));
    }
    same_device(op.name(), dst, src)?;
    let t = want(op.name(), dst, &BINARY_TYPES)?;
    let d = dst.device_ptr();
    // SAFETY: element i of dst is read and written by the same thread only (the output has
    // dst's shape and layout), so updating in place is sound.
    unsafe {
        binary_cuda::binary(
            &dst.gpu,
            op,
            t,
            d,
            dst_shape,
            src.device_ptr(),
            src_shape,
            d,
            dst_shape,
        )?
    };
    Ok(())
}

/// See [`crate::cpu::unary`].
///
/// # Errors
/// Not f32, out of memory, or a launch failure.
pub fn unary(op: UnaryOp, s: &CudaStorage) -> Result<CudaStorage> {
    want(op.name(), s, &[DType::F32])?;
    let out = s.sibling(s.len, s.dtype)?;
    // SAFETY: both hold len f32.
    unsafe { unary_cuda::unary(&s.gpu, op, s.device_ptr(), out.device_ptr(), s.len)? };
    Ok(out)
}

/// See [`crate::cpu::bias_relu`].
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn bias_relu(
    x: &CudaStorage,
    b: &CudaStorage,
    cols: usize,
    group: usize,
) -> Result<CudaStorage> {
    want("bias_relu", x, &[DType::F32])?;
    want("bias_relu", b, &[DType::F32])?;
    same_device("bias_relu", x, b)?;
    let y = x.sibling(x.len, DType::F32)?;
    // SAFETY: x and y hold len f32, b len / group · cols (checked by the caller's shapes).
    unsafe {
        unary_cuda::bias_relu(
            &x.gpu,
            x.device_ptr(),
            b.device_ptr(),
            y.device_ptr(),
            x.len,
            cols,
            group,
        )?
    };
    Ok(y)
}

/// See [`crate::cpu::relu_backward`].
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn relu_backward(dy: &CudaStorage, y: &CudaStorage) -> Result<CudaStorage> {
    want("relu_backward", dy, &[DType::F32])?;
    want("relu_backward", y, &[DType::F32])?;
    same_device("relu_backward", dy, y)?;
    let dx = dy.sibling(dy.len, DType::F32)?;
    // SAFETY: all three hold len f32 (same shapes, checked by the caller).
    unsafe {
        unary_cuda::relu_backward(
            &dy.gpu,
            dy.device_ptr(),
            y.device_ptr(),
            dx.device_ptr(),
            dy.len,
        )?
    };
    Ok(dx)
}

/// ReLU's backward and the gradient of the bias before it, in one kernel: `dy` and `y` hold
/// `groups · rows · cols` f32; returns `dx` and `db` (`groups · cols`, summed over the rows).
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn relu_backward_bias(
    dy: &CudaStorage,
    y: &CudaStorage,
    groups: usize,
    cols: usize,
) -> Result<(CudaStorage, CudaStorage)> {
    want("relu_backward_bias", dy, &[DType::F32])?;
    want("relu_backward_bias", y, &[DType::F32])?;
    same_device("relu_backward_bias", dy, y)?;
    let rows = dy.len.checked_div(groups * cols).unwrap_or(0);
    let dx = dy.sibling(dy.len, DType::F32)?;
    let db = dy.sibling(groups * cols, DType::F32)?;
    // SAFETY: dy, y and dx hold groups·rows·cols f32 (same shapes, checked by the caller), db
    // groups·cols.
    unsafe {
        unary_cuda::relu_backward_bias(
            &dy.gpu,
            dy.device_ptr(),
            y.device_ptr(),
            dx.device_ptr(),
            db.device_ptr(),
            [groups, rows, cols],
        )?
    };
    Ok((dx, db))
}

/// See [`crate::cpu::where_cond`].
///
/// # Errors
/// Different value dtypes, unsupported dtypes (masks f32/i32/u8, values f32/i32), different
/// lengths or devices, out of memory, or a launch failure.
pub fn where_cond(
    mask: &CudaStorage,
    on_true: &CudaStorage,
    on_false: &CudaStorage,
) -> Result<CudaStorage> {
    if on_true.dtype != on_false.dtype {
        return Err(mismatch("where_cond", on_true.dtype, on_false.dtype));
    }
    same_device("where_cond", mask, on_true)?;
    same_device("where_cond", mask, on_false)?;
    let mt = want(
        "where_cond (mask)",
        mask,
        &[DType::F32, DType::I32, DType::U8],
    )?;
    let vt = want("where_cond", on_true, &BINARY_TYPES)?;
    let n = mask.len;
    if on_true.len != n || on_false.len != n {
        return Err(Error::InvalidArgument {
            op: "where_cond",
            reason: format!(
                "mask, on_true and on_false hold {n}, {} and {} elements; broadcast them first",
                on_true.len, on_false.len
            ),
        });
    }
    let out = mask.sibling(n, on_true.dtype)?;
    // SAFETY: all four hold n elements.
    unsafe {
        binary_cuda::where_cond(
            &mask.gpu,
            mt,
            vt,
            mask.device_ptr(),
            &[n],
            on_true.device_ptr(),
            &[n],
            on_false.device_ptr(),
            &[n],
            out.device_ptr(),
            &[n],
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::reduce`].
///
/// # Errors
/// A dtype without kernels (f32: all; i32: sum, max, min), out of memory, or a launch failure.
pub fn reduce(op: ReduceOp, s: &CudaStorage, shape: ReduceShape) -> Result<CudaStorage> {
    let allowed: &[DType] = if op == ReduceOp::Mean {
        &[DType::F32]
    } else {
        &BINARY_TYPES
    };
    let t = want(op.name(), s, allowed)?;
    let out = s.sibling(shape.outer * shape.inner, s.dtype)?;
    // SAFETY: s holds outer·dim·inner elements, out outer·inner.
    unsafe { reduce_cuda::reduce(&s.gpu, op, t, s.device_ptr(), out.device_ptr(), shape)? };
    Ok(out)
}

/// See [`crate::cpu::argmax`].
///
/// # Errors
/// Not f32 or i32, out of memory, or a launch failure.
pub fn argmax(s: &CudaStorage, shape: ReduceShape) -> Result<CudaStorage> {
    let t = want("argmax", s, &BINARY_TYPES)?;
    let out = s.sibling(shape.outer * shape.inner, DType::I32)?;
    // SAFETY: as in reduce; out holds i32.
    unsafe { reduce_cuda::argmax(&s.gpu, t, s.device_ptr(), out.device_ptr(), shape)? };
    Ok(out)
}

/// See [`crate::cpu::softmax_last`].
///
/// # Errors
/// Not f32, out of memory, or a launch failure.
pub fn softmax_last(s: &CudaStorage, cols: usize, log: bool) -> Result<CudaStorage> {
    let op = if log {
        "log_softmax_last"
    } else {
        "softmax_last"
    };
    want(op, s, &[DType::F32])?;
    let out = s.sibling(s.len, s.dtype)?;
    let rows = s.len.checked_div(cols).unwrap_or(0);
    // SAFETY: both hold rows·cols f32.
    unsafe {
        softmax_cuda::softmax_last(&s.gpu, s.device_ptr(), out.device_ptr(), rows, cols, log)?
    };
    Ok(out)
}

/// See [`crate::cpu::matmul`]; f16 and bf16 also run here (GemmEx, fp32 accumulation).
///
/// # Errors
/// Different dtypes or devices, i32 / u8 / f64, out of memory, or a cuBLAS failure.
pub fn matmul(lhs: &CudaStorage, rhs: &CudaStorage, shape: &MatmulShape) -> Result<CudaStorage> {
    if lhs.dtype != rhs.dtype {
        return Err(mismatch("matmul", lhs.dtype, rhs.dtype));
    }
    same_device("matmul", lhs, rhs)?;
    let t = want("matmul", lhs, &[DType::F32, DType::F16, DType::BF16])?;
    let out = lhs.sibling(shape.batch * shape.m * shape.n, lhs.dtype)?;
    // SAFETY: the tensor validated that lhs and rhs hold what `shape` describes.
    unsafe {
        matmul_cuda::matmul(
            &lhs.gpu,
            t,
            lhs.device_ptr(),
            rhs.device_ptr(),
            out.device_ptr(),
            shape,
        )?
    };
    Ok(out)
}

/// `lhs · rhs` under `math` (operands of its type), into f32: a product under a precision policy.
///
/// # Errors
/// Operands of another type or on different devices, out of memory, or a cuBLAS failure.
pub fn matmul_as(
    lhs: &CudaStorage,
    rhs: &CudaStorage,
    shape: &MatmulShape,
    math: Math,
) -> Result<CudaStorage> {
    let t = operand_type(math);
    if lhs.dtype != t || rhs.dtype != t {
        return Err(mismatch("matmul", lhs.dtype, rhs.dtype));
    }
    same_device("matmul", lhs, rhs)?;
    let out = lhs.sibling(shape.batch * shape.m * shape.n, DType::F32)?;
    let ptrs = (lhs.device_ptr(), rhs.device_ptr(), out.device_ptr());
    // SAFETY: the tensor validated that lhs and rhs hold what `shape` describes, in `t`.
    unsafe { matmul_cuda::matmul_as(&lhs.gpu, math, CudaType::F32, ptrs, shape)? };
    Ok(out)
}

/// `x · w + bias` (then a ReLU) in one cuBLASLt call, the bias and ReLU in its epilogue;
/// `None` where the epilogue cannot run (see [`matmul_cuda::matmul_bias`]).
///
/// # Errors
/// Different dtypes or devices, out of memory, or a cuBLASLt failure.
pub fn linear(
    x: &CudaStorage,
    w: &CudaStorage,
    bias: &CudaStorage,
    shape: &MatmulShape,
    bias_batch_stride: usize,
    relu: bool,
) -> Result<Option<CudaStorage>> {
    if x.dtype != w.dtype || x.dtype != bias.dtype {
        return Err(mismatch("linear", x.dtype, w.dtype));
    }
    same_device("linear", x, w)?;
    same_device("linear", x, bias)?;
    let t = want("linear", x, &[DType::F32, DType::F16, DType::BF16])?;
    let out = x.sibling(shape.batch * shape.m * shape.n, x.dtype)?;
    let ptrs = (
        x.device_ptr(),
        w.device_ptr(),
        out.device_ptr(),
        bias.device_ptr(),
    );
    // SAFETY: the tensor validated that x and w hold what `shape` describes and that the bias
    // holds n elements per product at the given stride.
    let done =
        unsafe { matmul_cuda::matmul_bias(&x.gpu, t, ptrs, shape, bias_batch_stride, relu)? };
    Ok(done.then_some(out))
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

/// `xᵀ · g` and the sums of `g`'s rows per product, queued on the side stream (the compute
/// stream's next work runs alongside it; inline for small products outside a capture, see
/// [`BESIDE_MIN_MACS`]): one cuBLASLt call where its column-sum epilogue runs
/// (see [`matmul_cuda::matmul_rhs_sums`]), else the product and a reduction. `None`, queuing
/// nothing, for a dtype other than f32. `x` and `g` must stay alive until [`SideGrads::join`].
///
/// # Errors
/// Different dtypes or devices, out of memory, or a cuBLASLt failure.
pub fn linear_grads_on_side(
    x: &CudaStorage,
    g: &CudaStorage,
    shape: &MatmulShape,
) -> Result<Option<SideGrads>> {
    if x.dtype != g.dtype {
        return Err(mismatch("linear_grads", x.dtype, g.dtype));
    }
    same_device("linear_grads", x, g)?;
    // Half-precision gradients run as before, after `main` on the compute stream.
    if x.dtype != DType::F32 {
        return Ok(None);
    }
    let t = CudaType::F32;
    // Allocated before the fork, and kept until the join.
    let gw = x.sibling(shape.batch * shape.m * shape.n, x.dtype)?;
    let gb = x.sibling(shape.batch * shape.n, x.dtype)?;
    let ptrs = (
        x.device_ptr(),
        g.device_ptr(),
        gw.device_ptr(),
        gb.device_ptr(),
    );
    let (gpu, (xp, gp, wp, bp)) = (&x.gpu, ptrs);
    let beside = gpu.is_capturing() || shape.batch * shape.m * shape.n * shape.k >= BESIDE_MIN_MACS;
    let work = || {
        // SAFETY: the tensor validated that x and g hold what `shape` describes; gw holds the
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

fn conv_check(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(mismatch(op, a.dtype, b.dtype));
    }
    same_device(op, a, b)?;
    want(op, a, &[DType::F32])?;
    Ok(())
}

/// A convolution's workspace as its kernels ask for it ([`conv_cuda::Workspace`]): a block of the device's
/// allocator charged to the current tenant (during a capture, of the graph's pool), replaced by a larger one when
/// more is asked for, and given back when the op returns, stream-ordered after the work that uses it.
struct ConvWorkspace<'a> {
    like: &'a CudaStorage,
    block: Option<CudaStorage>,
}

impl<'a> ConvWorkspace<'a> {
    fn new(like: &'a CudaStorage) -> Self {
        ConvWorkspace { like, block: None }
    }

    fn get(&mut self, bytes: usize) -> cohort_kernels::Result<u64> {
        if let Some(b) = &self.block {
            if b.len() * 4 >= bytes {
                return Ok(b.device_ptr());
            }
        }
        let block = self
            .like
            .sibling(bytes.div_ceil(4), DType::F32)
            .map_err(|e| match e {
                // The allocator's error travels inside the kernels' one, and comes out as itself again
                // (`From<cohort_kernels::Error>`): an out-of-memory stays one for the member's recovery.
                Error::Alloc(source) => cohort_kernels::Error::DeviceMemory {
                    what: format!("{bytes} bytes of convolution workspace"),
                    source: Box::new(source),
                },
                Error::Kernel(e) => e,
                other => cohort_kernels::Error::Cuda(other.to_string()),
            })?;
        let ptr = block.device_ptr();
        self.block = Some(block);
        Ok(ptr)
    }
}

/// See [`crate::cpu::conv2d`].
///
/// # Errors
/// Not f32, different dtypes or devices, out of memory (output or workspace), or a failure.
pub fn conv2d(
    input: &CudaStorage,
    weight: &CudaStorage,
    bias: Option<&CudaStorage>,
    p: &ConvParams,
    math: Math,
) -> Result<CudaStorage> {
    conv_check("conv2d", input, weight)?;
    if let Some(b) = bias {
        if b.dtype != input.dtype {
            return Err(mismatch("conv2d (bias)", input.dtype, b.dtype));
        }
        same_device("conv2d (bias)", input, b)?;
    }
    let out = input.sibling(p.output_len(), DType::F32)?;
    let mut ws = ConvWorkspace::new(input);
    // SAFETY: sizes from p (validated by the tensor); the workspace is this device's.
    unsafe {
        conv_cuda::conv2d(
            &input.gpu,
            math,
            p,
            (input.device_ptr(), weight.device_ptr()),
            bias.map(CudaStorage::device_ptr),
            out.device_ptr(),
            &mut |bytes| ws.get(bytes),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::conv2d_backward_input`].
///
/// # Errors
/// As [`conv2d`].
pub fn conv2d_backward_input(
    grad_out: &CudaStorage,
    weight: &CudaStorage,
    p: &ConvParams,
    math: Math,
) -> Result<CudaStorage> {
    conv_check("conv2d_backward_input", grad_out, weight)?;
    let out = grad_out.sibling(p.input_len(), DType::F32)?;
    let mut ws = ConvWorkspace::new(grad_out);
    // SAFETY: as in conv2d.
    unsafe {
        conv_cuda::conv2d_backward_input(
            &grad_out.gpu,
            math,
            p,
            grad_out.device_ptr(),
            weight.device_ptr(),
            out.device_ptr(),
            &mut |bytes| ws.get(bytes),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::conv2d_backward_weight`].
///
/// # Errors
/// As [`conv2d`].
pub fn conv2d_backward_weight(
    input: &CudaStorage,
    grad_out: &CudaStorage,
    p: &ConvParams,
    math: Math,
) -> Result<CudaStorage> {
    conv_check("conv2d_backward_weight", input, grad_out)?;
    let out = input.sibling(p.weight_len(), DType::F32)?;
    let mut ws = ConvWorkspace::new(input);
    // SAFETY: as in conv2d.
    unsafe {
        conv_cuda::conv2d_backward_weight(
            &input.gpu,
            math,
            p,
            input.device_ptr(),
            grad_out.device_ptr(),
            out.device_ptr(),
            &mut |bytes| ws.get(bytes),
        )?
    };
    Ok(out)
}

/// One pass of a convolution with 16-bit operands through cuDNN (`math` `Bf16` or `F16`): the forward from the
/// input and the weight, the input's gradient from the output's and the weight, or the weight's gradient from the
/// input and the output's, as `a` and `b`, both of the math's type; the result is of that type too. `None` where
/// cuDNN is not in use or has no algorithm for it (the caller runs the pass in f32).
///
/// # Errors
/// Operands of another type or on different devices, out of memory (result or workspace), or a failure.
pub fn conv_pass_16bit(
    (pass, math): (ConvPass, Math),
    a: &CudaStorage,
    b: &CudaStorage,
    p: &ConvParams,
) -> Result<Option<CudaStorage>> {
    let t = operand_type(math);
    if a.dtype != t || b.dtype != t {
        return Err(mismatch("conv2d", a.dtype, b.dtype));
    }
    same_device("conv2d", a, b)?;
    let len = match pass {
        ConvPass::Forward { .. } => p.output_len(),
        ConvPass::BackwardData => p.input_len(),
        ConvPass::BackwardFilter => p.weight_len(),
    };
    let out = a.sibling(len, t)?;
    let (a, b, o) = (a.device_ptr(), b.device_ptr(), out.device_ptr());
    // cuDNN's operands by role: input (or its gradient), weight (or its gradient), output (or its gradient).
    let roles = match pass {
        ConvPass::Forward { .. } => (a, b, o),
        ConvPass::BackwardData => (o, b, a),
        ConvPass::BackwardFilter => (a, o, b),
    };
    let mut ws = ConvWorkspace::new(&out);
    // SAFETY: sizes from p (validated by the tensor), operands of `t`; the workspace is this device's.
    let ran = unsafe {
        conv_cuda::conv_pass_16bit(&out.gpu, (pass, math), p, roles, &mut |bytes| ws.get(bytes))?
    };
    drop(ws);
    Ok(ran.then_some(out))
}

/// See [`crate::cpu::max_pool2d`].
///
/// # Errors
/// Not f32, out of memory, or a launch failure.
pub fn max_pool2d(s: &CudaStorage, p: &PoolParams) -> Result<(CudaStorage, CudaStorage)> {
    want("max_pool2d", s, &[DType::F32])?;
    let n = p.planes * p.out_h() * p.out_w();
    let out = s.sibling(n, DType::F32)?;
    let idx = s.sibling(n, DType::I32)?;
    // SAFETY: s holds planes·h·w f32; out and idx n elements.
    unsafe {
        pool_cuda::max_pool2d(
            &s.gpu,
            p,
            s.device_ptr(),
            out.device_ptr(),
            idx.device_ptr(),
        )?
    };
    Ok((out, idx))
}

/// See [`crate::cpu::max_pool2d_backward`].
///
/// # Errors
/// Not f32, indices not i32, out of memory, or a launch failure (an index outside its plane is
/// reported later, see the module docs).
pub fn max_pool2d_backward(
    grad_out: &CudaStorage,
    indices: &CudaStorage,
    planes: usize,
    plane_in: usize,
    plane_out: usize,
) -> Result<CudaStorage> {
    self::indices("max_pool2d_backward", indices)?;
    want("max_pool2d_backward", grad_out, &[DType::F32])?;
    same_device("max_pool2d_backward", grad_out, indices)?;
    let out = grad_out.sibling(planes * plane_in, DType::F32)?;
    // SAFETY: grad_out and indices hold planes·plane_out elements, out planes·plane_in.
    unsafe {
        pool_cuda::max_pool2d_backward(
            &grad_out.gpu,
            planes,
            plane_in,
            plane_out,
            grad_out.device_ptr(),
            indices.device_ptr(),
            out.device_ptr(),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::index_select`].
///
/// # Errors
/// Indices not i32, f64, out of memory, or a launch failure (an index outside `0..dim` is
/// reported later, see the module docs).
pub fn index_select(
    src: &CudaStorage,
    idx: &CudaStorage,
    outer: usize,
    dim: usize,
    inner: usize,
) -> Result<CudaStorage> {
    indices("index_select", idx)?;
    let t = ty("index_select", src.dtype)?;
    same_device("index_select", src, idx)?;
    let out = src.sibling(outer * idx.len * inner, src.dtype)?;
    // SAFETY: src holds outer·dim·inner elements, idx idx.len i32, out outer·idx.len·inner.
    unsafe {
        index_cuda::index_select(
            &src.gpu,
            t,
            src.device_ptr(),
            outer,
            dim,
            inner,
            idx.device_ptr(),
            idx.len,
            out.device_ptr(),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::index_add`].
///
/// # Errors
/// Indices not i32, dtypes other than f32 / i32 or different, or a launch failure.
pub fn index_add(
    dst: &mut CudaStorage,
    idx: &CudaStorage,
    src: &CudaStorage,
    outer: usize,
    dim: usize,
    inner: usize,
) -> Result<()> {
    indices("index_add", idx)?;
    if dst.dtype != src.dtype {
        return Err(mismatch("index_add", dst.dtype, src.dtype));
    }
    same_device("index_add", dst, src)?;
    same_device("index_add", dst, idx)?;
    let t = want("index_add", dst, &BINARY_TYPES)?;
    // SAFETY: dst holds outer·dim·inner elements, src outer·idx.len·inner.
    unsafe {
        index_cuda::index_add(
            &dst.gpu,
            t,
            dst.device_ptr(),
            outer,
            dim,
            inner,
            idx.device_ptr(),
            idx.len,
            src.device_ptr(),
        )?
    };
    Ok(())
}

/// See [`crate::cpu::gather_last`].
///
/// # Errors
/// Indices not i32, a source other than f32 / i32, out of memory, or a launch failure.
pub fn gather_last(src: &CudaStorage, idx: &CudaStorage, cols: usize) -> Result<CudaStorage> {
    indices("gather_last", idx)?;
    let t = want("gather_last", src, &BINARY_TYPES)?;
    same_device("gather_last", src, idx)?;
    let out = src.sibling(idx.len, src.dtype)?;
    // SAFETY: src holds idx.len·cols elements, idx and out idx.len.
    unsafe {
        index_cuda::gather_last(
            &src.gpu,
            t,
            src.device_ptr(),
            idx.len,
            cols,
            idx.device_ptr(),
            out.device_ptr(),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::scatter_add_last`].
///
/// # Errors
/// Indices not i32, dtypes other than f32 or different, or a launch failure.
pub fn scatter_add_last(
    dst: &mut CudaStorage,
    idx: &CudaStorage,
    src: &CudaStorage,
    cols: usize,
) -> Result<()> {
    indices("scatter_add_last", idx)?;
    if dst.dtype != src.dtype {
        return Err(mismatch("scatter_add_last", dst.dtype, src.dtype));
    }
    want("scatter_add_last", dst, &[DType::F32])?;
    same_device("scatter_add_last", dst, src)?;
    // SAFETY: dst holds idx.len·cols f32, idx and src idx.len elements.
    unsafe {
        index_cuda::scatter_add_last(
            &dst.gpu,
            dst.device_ptr(),
            idx.len,
            cols,
            idx.device_ptr(),
            src.device_ptr(),
        )?
    };
    Ok(())
}

/// See [`crate::cpu::one_hot`].
///
/// # Errors
/// Labels not i32, a dtype other than f32 / i32 / u8, out of memory, or a launch failure.
pub fn one_hot(labels: &CudaStorage, classes: usize, dtype: DType) -> Result<CudaStorage> {
    indices("one_hot", labels)?;
    let t = match dtype {
        DType::F32 | DType::I32 | DType::U8 => ty("one_hot", dtype)?,
        other => return Err(unsupported("one_hot", other)),
    };
    let out = labels.sibling(labels.len * classes, dtype)?;
    // SAFETY: labels holds len i32, out len·classes elements.
    unsafe {
        index_cuda::one_hot(
            &labels.gpu,
            t,
            labels.device_ptr(),
            labels.len,
            classes,
            out.device_ptr(),
        )?
    };
    Ok(out)
}

/// See [`crate::cpu::cross_entropy`]; an out-of-range label is reported at the next read-back.
///
/// # Errors
/// Not f32, labels not i32, out of memory, or a launch failure.
pub fn cross_entropy(
    logits: &CudaStorage,
    labels: &CudaStorage,
    cols: usize,
    scale: f64,
) -> Result<(CudaStorage, CudaStorage)> {
    indices("cross_entropy", labels)?;
    want("cross_entropy", logits, &[DType::F32])?;
    same_device("cross_entropy", logits, labels)?;
    let rows = logits.len.checked_div(cols).unwrap_or(0);
    let loss = logits.sibling(rows, DType::F32)?;
    let grad = logits.sibling(logits.len, DType::F32)?;
    // SAFETY: logits and grad hold rows·cols f32, loss rows f32, labels labels.len i32 (the
    // caller checked that it divides rows).
    unsafe {
        softmax_cuda::cross_entropy(
            &logits.gpu,
            logits.device_ptr(),
            labels.device_ptr(),
            rows,
            cols,
            labels.len,
            scale as f32,
            loss.device_ptr(),
            grad.device_ptr(),
        )?
    };
    Ok((loss, grad))
}

/// Cross-entropy averaged over each group of `batch` rows in one kernel; `None` where that
/// kernel does not apply (see [`softmax_cuda::cross_entropy_mean`]).
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn cross_entropy_mean(
    logits: &CudaStorage,
    labels: &CudaStorage,
    cols: usize,
    batch: usize,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    indices("cross_entropy", labels)?;
    want("cross_entropy", logits, &[DType::F32])?;
    same_device("cross_entropy", logits, labels)?;
    let rows = logits.len.checked_div(cols).unwrap_or(0);
    let loss = logits.sibling(rows.checked_div(batch).unwrap_or(0), DType::F32)?;
    let grad = logits.sibling(logits.len, DType::F32)?;
    // SAFETY: logits and grad hold rows·cols f32, loss rows / batch f32, labels labels.len i32
    // (the caller checked that it divides rows).
    let done = unsafe {
        softmax_cuda::cross_entropy_mean(
            &logits.gpu,
            logits.device_ptr(),
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

/// See [`crate::cpu::fill`].
///
/// # Errors
/// f64, or a driver failure.
pub fn fill(dst: &mut CudaStorage, value: f64) -> Result<()> {
    let t = ty("fill", dst.dtype)?;
    // SAFETY: dst holds len elements of its dtype.
    unsafe { copy_cuda::fill(&dst.gpu, t, dst.device_ptr(), dst.len, value)? };
    Ok(())
}

fn optim_check(op: &'static str, p: &CudaStorage, others: &[&CudaStorage]) -> Result<()> {
    want(op, p, &[DType::F32])?;
    for o in others {
        if o.dtype != p.dtype {
            return Err(mismatch(op, p.dtype, o.dtype));
        }
        if o.len != p.len {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "the parameter has {} elements but its gradient or state has {}",
                    p.len, o.len
                ),
            });
        }
        same_device(op, p, o)?;
    }
    Ok(())
}

/// See [`crate::cpu::sgd_step`].
///
/// # Errors
/// Not f32, mismatched buffers, a missing momentum buffer, or a launch failure.
pub fn sgd_step(
    param: &mut CudaStorage,
    grad: &CudaStorage,
    momentum_buf: Option<&mut CudaStorage>,
    h: &SgdParams<'_>,
) -> Result<()> {
    let buf = momentum_buf.map(|b| &*b);
    let mut others = vec![grad];
    others.extend(buf);
    optim_check("sgd_step", param, &others)?;
    let pb = optim_cuda::ParamBuffers {
        param: param.device_ptr(),
        grad: grad.device_ptr(),
        state1: buf.map_or(0, CudaStorage::device_ptr),
        state2: 0,
        len: param.len,
        lrs: h.lrs,
    };
    sgd_launch(&param.gpu, &[pb], h)
}

/// Launches SGD over checked buffers; during a graph capture, with a device factor on the rates
/// that the host sets before each replay (see [`capture`]).
fn sgd_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &SgdParams<'_>,
) -> Result<()> {
    let state = if gpu.is_capturing() {
        Some(capture::rate_state(gpu)?)
    } else {
        None
    };
    // SAFETY: every buffer was checked to hold len f32 on this device; a state lives as long as
    // the graph.
    unsafe { optim_cuda::sgd_step(gpu, bufs, h, state)? };
    Ok(())
}

/// See [`crate::cpu::adam_step`].
///
/// # Errors
/// Not f32, mismatched buffers, or a launch failure.
pub fn adam_step(
    param: &mut CudaStorage,
    grad: &CudaStorage,
    m: &mut CudaStorage,
    v: &mut CudaStorage,
    h: &AdamParams<'_>,
) -> Result<()> {
    optim_check("adam_step", param, &[grad, &*m, &*v])?;
    let pb = optim_cuda::ParamBuffers {
        param: param.device_ptr(),
        grad: grad.device_ptr(),
        state1: m.device_ptr(),
        state2: v.device_ptr(),
        len: param.len,
        lrs: h.lrs,
    };
    adam_launch(&param.gpu, &[pb], h)
}

/// Launches Adam over checked buffers; during a graph capture, with the step number and a factor
/// on the rates in device memory: every replay advances the step (see [`capture`]).
fn adam_launch(
    gpu: &Arc<Gpu>,
    bufs: &[optim_cuda::ParamBuffers<'_>],
    h: &AdamParams<'_>,
) -> Result<()> {
    let state = if gpu.is_capturing() {
        Some(capture::step_state(gpu, h.step)?)
    } else {
        None
    };
    // SAFETY: every buffer was checked to hold len f32 on this device; a state lives as long as
    // the graph.
    unsafe { optim_cuda::adam_step(gpu, bufs, h, state)? };
    Ok(())
}

/// One Adam / AdamW step over many parameters at once: one kernel launch per 24 parameters
/// (per-parameter learning rates in each entry's `lrs`; `h.lrs` is ignored). Each entry is
/// (param, grad, m, v, lrs).
///
/// # Errors
/// As [`adam_step`], for any entry; nothing is updated then.
#[allow(clippy::type_complexity)]
pub fn adam_step_many(
    params: &mut [(
        &mut CudaStorage,
        &CudaStorage,
        &mut CudaStorage,
        &mut CudaStorage,
        &[f64],
    )],
    h: &AdamParams<'_>,
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
    adam_launch(&gpu, &bufs, h)
}

/// One SGD step over many parameters at once: one kernel launch per 24 parameters (per-parameter
/// learning rates in each entry's `lrs`; `h.lrs` is ignored). Each entry is (param, grad,
/// momentum buffer, lrs); the buffer is required when `h.momentum != 0`.
///
/// # Errors
/// As [`sgd_step`], for any entry; nothing is updated then.
#[allow(clippy::type_complexity)]
pub fn sgd_step_many(
    params: &mut [(
        &mut CudaStorage,
        &CudaStorage,
        Option<&mut CudaStorage>,
        &[f64],
    )],
    h: &SgdParams<'_>,
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
    sgd_launch(&gpu, &bufs, h)
}
