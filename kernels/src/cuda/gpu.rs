//! The per-device context: driver context, streams, cuBLAS handle, NVRTC module cache.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::ThreadId;

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaStream, result as drv, sys,
};

use super::modules::{self, KernelSource, Origin, Target};
use super::profile::Profile;
use super::{GemmTuning, KernelTime};
use crate::matmul::lt::Lt;
use crate::{Error, Result};

/// Most dimensions a strided or broadcasting kernel handles (matches `MAX_RANK` in `common.cuh`).
pub(crate) const MAX_RANK: usize = 8;

/// Wraps a driver, NVRTC or cuBLAS failure into the crate's error, naming what was attempted.
pub(crate) fn cuda_err(what: &str, e: impl fmt::Debug) -> Error {
    Error::Cuda(format!("{what} failed: {e:?}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the protected maps inconsistent
    // (each insert is one call), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded on this machine.
///
/// Checked once per process; no driver function is called.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the shared library; no symbol of it is called.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn init_driver() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_present() {
            return Err(
                "no CUDA driver found (libcuda.so could not be loaded): install the NVIDIA \
                        driver or use the CPU device"
                    .to_string(),
            );
        }
        drv::init().map_err(|e| {
            format!(
                "cuInit failed ({e:?}): the driver is installed but no usable GPU was found; check \
                     nvidia-smi and CUDA_VISIBLE_DEVICES"
            )
        })
    })
    .clone()
    .map_err(Error::Cuda)
}

/// Number of CUDA devices the driver sees; 0 where no driver is installed.
///
/// # Errors
/// The driver is present but fails to initialise or to count its devices.
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Ok(0);
    }
    init_driver()?;
    let n = drv::device::get_count().map_err(|e| cuda_err("cuDeviceGetCount", e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A kernel launch geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared: u32,
}

/// Shape and up to three stride sets of a strided or broadcasting kernel (`Strided` in `common.cuh`).
///
/// Strides are in elements; a stride of 0 broadcasts that dimension.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct StridedShape {
    pub rank: u32,
    /// Bit 0: every operand is contiguous with the output shape (no index arithmetic needed).
    pub flags: u32,
    pub shape: [u64; MAX_RANK],
    pub strides: [[u64; MAX_RANK]; 3],
}

impl StridedShape {
    /// Builds the descriptor for an iteration over `shape` (row-major), one stride set per operand.
    ///
    /// # Errors
    /// More than [`MAX_RANK`] dimensions, or a stride set of another length.
    pub(crate) fn new(shape: &[usize], strides: &[&[usize]]) -> Result<Self> {
        if shape.len() > MAX_RANK {
            return Err(Error::Cuda(format!(
                "strided kernels handle at most {MAX_RANK} dimensions, got shape {shape:?}"
            )));
        }
        let mut s = StridedShape {
            rank: shape.len() as u32,
            flags: 0,
            shape: [1; MAX_RANK],
            strides: [[0; MAX_RANK]; 3],
        };
        for (d, &n) in shape.iter().enumerate() {
            s.shape[d] = n as u64;
        }
        let contiguous = contiguous_strides(shape);
        let mut all_contiguous = true;
        for (k, st) in strides.iter().enumerate().take(3) {
            if st.len() != shape.len() {
                return Err(Error::Cuda(format!(
                    "stride set {st:?} does not match shape {shape:?}"
                )));
            }
            for (d, &v) in st.iter().enumerate() {
                s.strides[k][d] = v as u64;
                if shape[d] > 1 && v != contiguous[d] {
                    all_contiguous = false;
                }
            }
        }
        if all_contiguous {
            s.flags |= 1;
        }
        Ok(s)
    }
}

/// Row-major strides of a contiguous tensor of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1];
    }
    st
}

/// Strides of an operand of `src_shape` broadcast (numpy rules, aligned at the right) to `out_shape`.
pub(crate) fn broadcast_strides(src_shape: &[usize], out_shape: &[usize]) -> Result<Vec<usize>> {
    if src_shape.len() > out_shape.len() {
        return Err(Error::Cuda(format!(
            "cannot broadcast {src_shape:?} to {out_shape:?}"
        )));
    }
    let own = contiguous_strides(src_shape);
    let lead = out_shape.len() - src_shape.len();
    let mut st = vec![0; out_shape.len()];
    for (d, &n) in src_shape.iter().enumerate() {
        if n == out_shape[lead + d] {
            st[lead + d] = if n == 1 { 0 } else { own[d] };
        } else if n != 1 {
            return Err(Error::Cuda(format!(
                "cannot broadcast {src_shape:?} to {out_shape:?}"
            )));
        }
    }
    Ok(st)
}

/// A cuBLAS handle with its own workspace (as PyTorch gives each handle: without one, cuBLAS
/// manages a workspace itself on every call).
struct Blas(blas_sys::cublasHandle_t, DeviceBuffer);

/// Bytes of the cuBLAS workspace (PyTorch's default on Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;
/// Bytes of the cuBLAS workspace of work on the side stream or in a graph (a scratch area each).
const SIDE_BLAS_WORKSPACE: usize = 4 << 20;

// SAFETY: the handle is only used under the Gpu's mutex, one thread at a time.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by cublasCreate and is destroyed once.
        let _ = unsafe { blas_result::destroy_handle(self.0) };
    }
}

/// A device allocation owned outright (cuMemAlloc / cuMemFree): scratch space, tests, benches.
///
/// Tensors do not use it: their storage comes from the caching allocator.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from cuMemAlloc in this context and is freed once; cuMemFree
            // waits for work still using it.
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

thread_local! {
    /// This thread's work goes to the side stream (inside [`Gpu::on_side`]).
    static ON_SIDE: Cell<bool> = const { Cell::new(false) };
}

/// Zeroes a 4-word flag and waits for it. The memset runs on the legacy stream, which the
/// (non-blocking) compute stream does not wait for; waiting for that stream alone is allowed while
/// another stream is being captured.
fn clear_flag(flag: u64) -> Result<()> {
    // SAFETY: `flag` addresses 16 bytes of device memory in the bound context; the null stream
    // is the legacy stream.
    unsafe {
        drv::memset_d8_sync(flag, 0, 16)
            .and_then(|()| drv::stream::synchronize(std::ptr::null_mut()))
    }
    .map_err(|e| cuda_err("clearing the kernel error flag", e))
}

/// Names of the ops that can report an index error through the device flag (`OP_*` in `common.cuh`).
const FLAG_OPS: [&str; 7] = [
    "index_select",
    "index_add",
    "gather_last",
    "one_hot",
    "max_pool2d_backward",
    "scatter_add_last",
    "cross_entropy",
];

/// One CUDA device as the kernels see it.
///
/// Everything is enqueued on [`Gpu::compute_stream`]; [`Gpu::htod_prefetch`] uses the copy
/// stream and orders it against the compute stream with events.
pub struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    /// Where [`Gpu::on_side`] runs work off the compute stream's critical path.
    side: Arc<CudaStream>,
    /// The events that fork the side stream from the compute stream and join it back, reused:
    /// a wait already queued keeps the state the event had when it was queued.
    fork_join: (CudaEvent, CudaEvent),
    target: Target,
    sm_count: u32,
    name: String,
    blas: Mutex<Option<Blas>>,
    /// cuBLASLt and its tuned algorithms (f32 products), created on first use.
    lt: Mutex<Option<Lt>>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    scratch: Mutex<Option<DeviceBuffer>>,
    /// Each thread's index-error flag (4 words: set, op, index, size). Index kernels write the
    /// flag of the thread that queued them, so a bad index is reported by that thread's next
    /// read-back or synchronize, never by another thread's. Owned by the device, not the thread:
    /// a graph captured by a thread keeps writing its flag after the thread ends.
    flags: Mutex<HashMap<ThreadId, DeviceBuffer>>,
    /// The side stream's scratch area (see [`Gpu::with_scratch`]).
    side_scratch: Mutex<Option<DeviceBuffer>>,
    /// A CUDA graph is being captured on the compute stream (by `turns.owner`).
    capturing: AtomicBool,
    /// Whose work the device takes: every thread's, or only the capturing thread's while a capture
    /// runs (a capture records whatever is queued on the compute stream, by any thread).
    turns: Mutex<Turns>,
    turn_changed: Condvar,
    /// Host bytes copied to the device during a capture, kept (pinned) for the graph's replays.
    captured_host: Mutex<Vec<PinnedBuffer>>,
    /// Pinned buffers of finished [`HostCopy`]s, reused: pinning memory costs more than a step.
    host_copy_buffers: Mutex<Vec<PinnedBuffer>>,
    /// Scratch areas of ops captured meanwhile: each graph owns its own, so graphs may replay concurrently.
    captured_scratch: Mutex<Vec<DeviceBuffer>>,
    /// Those of ops captured on the side stream, whose nodes run alongside the compute stream's.
    captured_side_scratch: Mutex<Vec<DeviceBuffer>>,
    /// Side streams for replaying graphs concurrently ([`Gpu::replay_concurrently`]), created on first use.
    lanes: Mutex<Lanes>,
    /// GPU time per kernel, when `COHORT_CUDA_PROFILE` asks for it.
    profile: Option<Profile>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("target", &self.target)
            .field("sm_count", &self.sm_count)
            .finish()
    }
}

impl Gpu {
    /// The context of device `ordinal`, created on first use and shared by the whole process.
    ///
    /// # Errors
    /// No driver (`libcuda.so` missing), no such device, or the driver refused a context.
    pub fn get(ordinal: usize) -> Result<Arc<Gpu>> {
        static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let gpus = GPUS.get_or_init(Default::default);
        let mut map = lock(gpus);
        if let Some(g) = map.get(&ordinal) {
            return Ok(g.clone());
        }
        init_driver()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Cuda(format!(
                "cuda:{ordinal} does not exist: the driver sees {count} device(s)"
            )));
        }
        let gpu = Arc::new(Gpu::create(ordinal)?);
        map.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    fn create(ordinal: usize) -> Result<Gpu> {
        let ctx =
            CudaContext::new(ordinal).map_err(|e| cuda_err("creating the CUDA context", e))?;
        let compute = ctx
            .new_stream()
            .map_err(|e| cuda_err("creating the compute stream", e))?;
        let copy = ctx
            .new_stream()
            .map_err(|e| cuda_err("creating the copy stream", e))?;
        let side = ctx
            .new_stream()
            .map_err(|e| cuda_err("creating the side stream", e))?;
        let event = || {
            ctx.new_event(None)
                .map_err(|e| cuda_err("creating an event", e))
        };
        let fork_join = (event()?, event()?);
        let cc = ctx
            .compute_capability()
            .map_err(|e| cuda_err("reading the compute capability", e))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| cuda_err("reading the multiprocessor count", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
        Ok(Gpu {
            ordinal,
            ctx,
            compute,
            copy,
            side,
            fork_join,
            target: Target::of(cc),
            sm_count: sm_count.max(1) as u32,
            name,
            blas: Mutex::new(None),
            lt: Mutex::new(None),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            scratch: Mutex::new(None),
            flags: Mutex::new(HashMap::new()),
            side_scratch: Mutex::new(None),
            capturing: AtomicBool::new(false),
            turns: Mutex::new(Turns::default()),
            turn_changed: Condvar::new(),
            captured_host: Mutex::new(Vec::new()),
            host_copy_buffers: Mutex::new(Vec::new()),
            captured_scratch: Mutex::new(Vec::new()),
            captured_side_scratch: Mutex::new(Vec::new()),
            lanes: Mutex::new(Lanes::default()),
            profile: Profile::from_env(),
        })
    }

    /// The device's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every op runs on.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The stream host-to-device prefetches run on.
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy
    }

    /// Makes this device's context current on the calling thread.
    ///
    /// # Errors
    /// The driver refuses (a previous asynchronous error is reported here too).
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the CUDA context", e))
    }

    /// Waits for all work on both streams, then reports an index error a kernel may have flagged.
    ///
    /// # Errors
    /// A kernel failed, or an index kernel met an out-of-range index.
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture("synchronize")?;
        let _turn = self.turn();
        self.bind()?;
        self.copy
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the copy stream", e))?;
        self.compute
            .synchronize()
            .map_err(|e| cuda_err("synchronizing the compute stream", e))?;
        self.check_flag()
    }

    /// Reads (and clears) the calling thread's index-error flag; the caller has waited for the compute stream.
    fn check_flag(&self) -> Result<()> {
        let flag = lock(&self.flags)
            .get(&std::thread::current().id())
            .map(DeviceBuffer::ptr);
        let Some(flag) = flag else {
            return Ok(()); // this thread never launched an index kernel here
        };
        let mut words = [0i32; 4];
        // SAFETY: the flag buffer holds 4 words; the compute stream is idle (caller synchronized).
        unsafe { drv::memcpy_dtoh_sync(&mut words, flag) }
            .map_err(|e| cuda_err("reading the kernel error flag", e))?;
        if words[0] == 0 {
            return Ok(());
        }
        clear_flag(flag)?;
        Err(Error::IndexOutOfRange {
            op: FLAG_OPS.get(words[1] as usize).copied().unwrap_or("index"),
            index: i64::from(words[2]),
            size: usize::try_from(words[3]).unwrap_or(0),
        })
    }

    /// Address of the calling thread's 4-word flag, which index kernels set on an out-of-range index (created
    /// on the thread's first index kernel on this device).
    pub(crate) fn flag_ptr(&self) -> Result<u64> {
        let mut flags = lock(&self.flags);
        let thread = std::thread::current().id();
        if let Some(b) = flags.get(&thread) {
            return Ok(b.ptr);
        }
        self.bind()?;
        let flag = self.alloc(16)?;
        clear_flag(flag.ptr)?;
        let ptr = flag.ptr;
        flags.insert(thread, flag);
        Ok(ptr)
    }

    /// Allocates `bytes` (at least 1) of device memory owned by the returned buffer.
    ///
    /// # Errors
    /// The device is out of memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { drv::malloc_sync(bytes.max(1)) }
            .map_err(|e| cuda_err(&format!("cuMemAlloc of {bytes} bytes"), e))?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Runs `f` with a device scratch area of at least `bytes`, owned by this device and reused
    /// by every op of the stream the work goes to (safe because all of them are ordered on it).
    /// During a capture the area is the graph's own.
    pub(crate) fn with_scratch<R>(
        &self,
        bytes: usize,
        f: impl FnOnce(u64) -> Result<R>,
    ) -> Result<R> {
        // Growing the area synchronizes the stream, which another thread's capture must not see.
        let _turn = self.turn();
        let side = ON_SIDE.get();
        if self.is_capturing() {
            // The graph's nodes on one stream run one after another, so they share the graph's
            // area like eager ops share the stream's; a larger need gets a new area (earlier
            // nodes keep theirs).
            let list = if side {
                &self.captured_side_scratch
            } else {
                &self.captured_scratch
            };
            let mut areas = lock(list);
            if areas.last().is_none_or(|a| a.bytes < bytes) {
                areas.push(self.alloc(bytes.next_power_of_two().max(1 << 16))?);
            }
            let ptr = areas.last().map(|a| a.ptr).unwrap_or_default();
            drop(areas);
            return f(ptr);
        }
        let (area, stream) = if side {
            (&self.side_scratch, &self.side)
        } else {
            (&self.scratch, &self.compute)
        };
        let mut guard = lock(area);
        let big_enough = guard.as_ref().is_some_and(|b| b.bytes >= bytes);
        if !big_enough {
            // Work still queued may read the old area: let it finish before the area is freed.
            if guard.is_some() {
                stream
                    .synchronize()
                    .map_err(|e| cuda_err("synchronizing before growing the scratch area", e))?;
            }
            guard.take();
            *guard = Some(self.alloc(bytes.next_power_of_two().max(1 << 16))?);
        }
        let ptr = guard.as_ref().map(|b| b.ptr).unwrap_or_default();
        f(ptr)
    }

    /// Copies host bytes to device address `dst`, ordered on the compute stream.
    ///
    /// # Safety
    /// `dst` must address at least `src.len()` bytes of this device's memory.
    ///
    /// # Errors
    /// The driver rejects the copy.
    pub unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        if self.is_capturing() {
            // A graph replays the copy long after `src` is gone: copy from pinned bytes it keeps.
            let mut keep = self.alloc_pinned(src.len())?;
            keep.as_mut_slice().copy_from_slice(src);
            // SAFETY: caller guarantees dst; `keep` lives as long as the graph (captured_host).
            unsafe { drv::memcpy_htod_async(dst, keep.as_slice(), self.compute.cu_stream()) }
                .map_err(|e| cuda_err("copying host to device", e))?;
            lock(&self.captured_host).push(keep);
            return Ok(());
        }
        // SAFETY: caller guarantees dst; a pageable source is staged before the call returns,
        // so `src` may be dropped right after.
        unsafe { drv::memcpy_htod_async(dst, src, self.compute.cu_stream()) }
            .map_err(|e| cuda_err("copying host to device", e))
    }

    /// Copies host bytes to `dst` on the copy stream: it starts after the compute stream's work
    /// queued so far (the block may have just been freed by it) and the compute stream's later
    /// work waits for it.
    ///
    /// # Safety
    /// As [`Gpu::htod`].
    ///
    /// # Errors
    /// The driver rejects the copy or an event.
    pub unsafe fn htod_prefetch(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        self.copy_after_compute()?;
        // SAFETY: caller guarantees dst; see `htod` for the source.
        unsafe { drv::memcpy_htod_async(dst, src, self.copy.cu_stream()) }
            .map_err(|e| cuda_err("copying host to device", e))?;
        let after = self
            .copy
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        self.compute
            .wait(&after)
            .map_err(|e| cuda_err("ordering the compute stream", e))
    }

    /// Orders the copy stream after the compute stream's work queued so far: the block a copy
    /// writes may just have been freed there.
    fn copy_after_compute(&self) -> Result<()> {
        let before = self
            .compute
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        self.copy
            .wait(&before)
            .map_err(|e| cuda_err("ordering the copy stream", e))
    }

    /// Copies device bytes at `src` to the host, waiting for all queued work first.
    ///
    /// # Safety
    /// `src` must address at least `dst.len()` bytes of this device's memory.
    ///
    /// # Errors
    /// A queued kernel failed or flagged a bad index, or the copy failed.
    pub unsafe fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.refuse_in_capture("reading a tensor back to the host")?;
        let _turn = self.turn();
        self.bind()?;
        if !dst.is_empty() {
            // SAFETY: caller guarantees src.
            unsafe { drv::memcpy_dtoh_async(dst, src, self.compute.cu_stream()) }
                .map_err(|e| cuda_err("copying device to host", e))?;
        }
        self.compute
            .synchronize()
            .map_err(|e| cuda_err("waiting for the compute stream", e))?;
        self.check_flag()
    }

    /// Queues a copy of `bytes` bytes at `src` to the host behind the compute stream's work so far,
    /// without waiting for it: the host goes on queueing work and reads the bytes once the copy is
    /// done ([`HostCopy::wait`]). An index error flagged meanwhile is reported by the next
    /// [`Gpu::dtoh`] or [`Gpu::synchronize`].
    ///
    /// # Safety
    /// `src` must address at least `bytes` bytes of this device's memory, not freed before the
    /// copy runs (the caching allocator keeps stream order, so freeing a tensor after this is fine).
    ///
    /// # Errors
    /// During a capture; the driver rejects the copy or its event; no pinned memory.
    pub unsafe fn dtoh_later(self: &Arc<Self>, src: u64, bytes: usize) -> Result<HostCopy> {
        self.refuse_in_capture("reading a tensor back to the host")?;
        let _turn = self.turn();
        self.bind()?;
        let reused = {
            let mut free = lock(&self.host_copy_buffers);
            free.iter()
                .position(|b| b.bytes >= bytes)
                .map(|i| free.swap_remove(i))
        };
        let mut buf = match reused {
            Some(b) => b,
            None => self.alloc_pinned(bytes.max(64))?,
        };
        if bytes > 0 {
            // SAFETY: caller guarantees src; the pinned buffer outlives the copy (HostCopy keeps
            // it until the copy's event is done).
            unsafe {
                drv::memcpy_dtoh_async(
                    &mut buf.as_mut_slice()[..bytes],
                    src,
                    self.compute.cu_stream(),
                )
            }
            .map_err(|e| cuda_err("copying device to host", e))?;
        }
        let event = self
            .compute
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        Ok(HostCopy {
            buf: Some(buf),
            bytes,
            event,
            gpu: self.clone(),
        })
    }

    /// Copies `bytes` bytes from `src` to `dst` on the device.
    ///
    /// # Safety
    /// Both addresses must hold `bytes` bytes of this device's memory.
    ///
    /// # Errors
    /// The driver rejects the copy.
    pub unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        // SAFETY: caller guarantees both ranges.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.stream().cu_stream()) }
            .map_err(|e| cuda_err("copying device to device", e))
    }

    /// Fills `count` elements of `elem_bytes` (1, 2, 4) bytes at `dst` with the bit pattern `bits`.
    ///
    /// # Safety
    /// `dst` must hold `count * elem_bytes` bytes and be aligned to `elem_bytes`.
    ///
    /// # Errors
    /// Another element size, or the driver rejects the fill.
    pub unsafe fn fill(&self, dst: u64, bits: u32, elem_bytes: usize, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        let s = self.stream().cu_stream();
        // SAFETY: caller guarantees the range and alignment.
        let r = unsafe {
            match elem_bytes {
                1 => sys::cuMemsetD8Async(dst, bits as u8, count, s),
                2 => sys::cuMemsetD16Async(dst, bits as u16, count, s),
                4 => sys::cuMemsetD32Async(dst, bits, count, s),
                8 if bits == 0 => sys::cuMemsetD32Async(dst, 0, count * 2, s),
                _ => {
                    return Err(Error::Cuda(format!(
                        "fill: elements of {elem_bytes} bytes are not supported (1, 2 or 4)"
                    )));
                }
            }
        };
        r.result().map_err(|e| cuda_err("cuMemset", e))
    }

    /// Zeroes `bytes` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must hold `bytes` bytes.
    ///
    /// # Errors
    /// The driver rejects the fill.
    pub unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.fill(dst, 0, 1, bytes) }
    }

    /// A kernel of `src`, loading (and on first use in the process, compiling) its module.
    pub(crate) fn function(
        &self,
        src: &'static KernelSource,
        name: &'static str,
    ) -> Result<CudaFunction> {
        if let Some(f) = lock(&self.functions).get(name) {
            return Ok(f.clone());
        }
        let module = {
            let cached = lock(&self.modules).get(src.name).cloned();
            match cached {
                Some(m) => m,
                None => {
                    let m = self.load_module(src)?;
                    lock(&self.modules).insert(src.name, m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| cuda_err(&format!("finding kernel {name} in {}.cu", src.name), e))?;
        lock(&self.functions).insert(name, f.clone());
        Ok(f)
    }

    /// Loads `src`'s module; a cached cubin that the driver refuses is compiled again once.
    fn load_module(&self, src: &'static KernelSource) -> Result<Arc<CudaModule>> {
        let load = |ptx| {
            self.ctx
                .load_module(ptx)
                .map_err(|e| cuda_err(&format!("loading module {}.cu", src.name), e))
        };
        let (ptx, origin) = modules::image(src, self.target)?;
        match load(ptx) {
            Err(e) if origin == Origin::Disk => {
                tracing::warn!("kernel cache: {e}; compiling {}.cu again", src.name);
                load(modules::recompile(src, self.target)?)
            }
            loaded => loaded,
        }
    }

    /// A 1-D grid-stride launch over `n` items with `block` threads per block.
    pub(crate) fn grid(&self, n: usize, block: u32) -> Launch {
        let blocks = n
            .div_ceil(block as usize)
            .clamp(1, self.sm_count as usize * 16) as u32;
        Launch {
            grid: (blocks, 1, 1),
            block: (block, 1, 1),
            shared: 0,
        }
    }

    /// Launches kernel `name` of `src` on the compute stream (the side stream inside
    /// [`Gpu::on_side`]).
    ///
    /// # Safety
    /// `args` must point at values whose types and order match the kernel's parameters, and
    /// every device address among them must be valid for what the kernel reads and writes.
    pub(crate) unsafe fn launch(
        &self,
        src: &'static KernelSource,
        name: &'static str,
        cfg: Launch,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(src, name)?;
        let _turn = self.turn();
        self.bind()?;
        self.timed(
            || name.to_string(),
            || {
                // SAFETY: forwarded to the caller.
                unsafe {
                    drv::launch_kernel(
                        f.cu_function(),
                        cfg.grid,
                        cfg.block,
                        cfg.shared,
                        self.stream().cu_stream(),
                        args,
                    )
                }
                .map_err(|e| cuda_err(&format!("launching {name}"), e))
            },
        )
    }

    /// Runs `f`, which queues work on the compute stream, timed under `label` when profiling.
    pub(crate) fn timed<R>(
        &self,
        label: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        match &self.profile {
            Some(p) if !self.is_capturing() => p.span(self.stream(), label, f),
            _ => f(),
        }
    }

    /// GPU time per kernel since the last call (waiting for it), the most expensive first; empty
    /// unless the process runs with `COHORT_CUDA_PROFILE=1`.
    ///
    /// # Errors
    /// A timing event failed.
    pub fn kernel_profile(&self) -> Result<Vec<KernelTime>> {
        let _turn = self.turn();
        self.bind()?;
        self.profile.as_ref().map_or(Ok(Vec::new()), Profile::drain)
    }

    /// The stream this thread's work goes to: the compute stream, or the side stream inside
    /// [`Gpu::on_side`].
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        if ON_SIDE.get() {
            &self.side
        } else {
            &self.compute
        }
    }

    /// Queues `f`'s work on the side stream, after all the work queued so far, and returns: the
    /// compute stream's next work runs alongside it until [`Gpu::join_side`]. In a capture this
    /// forks the graph into two branches.
    ///
    /// Until the join, the memory the side work uses must stay allocated: the caching allocator
    /// would hand freed memory to the compute stream's work while the side stream may still use it.
    ///
    /// # Errors
    /// `f`'s error, or the driver refusing an event.
    pub fn on_side<A>(&self, f: impl FnOnce() -> Result<A>) -> Result<A> {
        let _turn = self.turn();
        self.bind()?;
        let fork = &self.fork_join.0;
        fork.record(&self.compute)
            .map_err(|e| cuda_err("recording a stream event", e))?;
        self.side
            .wait(fork)
            .map_err(|e| cuda_err("ordering the side stream", e))?;
        /// Sends this thread's work back to the compute stream when dropped, even on a panic.
        struct Side;
        impl Drop for Side {
            fn drop(&mut self) {
                ON_SIDE.set(false);
            }
        }
        ON_SIDE.set(true);
        let _side = Side;
        f()
    }

    /// Makes the compute stream wait for the side stream's work (see [`Gpu::on_side`]); in a
    /// capture, joins the two branches.
    ///
    /// # Errors
    /// The driver refusing an event.
    pub fn join_side(&self) -> Result<()> {
        let _turn = self.turn();
        self.bind()?;
        let join = &self.fork_join.1;
        join.record(&self.side)
            .map_err(|e| cuda_err("recording a stream event", e))?;
        self.compute
            .wait(join)
            .map_err(|e| cuda_err("joining the side stream", e))
    }

    /// Runs `f` with the device's cuBLASLt state (created on first use).
    pub(crate) fn with_lt<R>(&self, f: impl FnOnce(&mut Lt) -> Result<R>) -> Result<R> {
        let _turn = self.turn();
        self.bind()?;
        let mut guard = lock(&self.lt);
        let lt = match &mut *guard {
            Some(lt) => lt,
            empty => empty.insert(Lt::new()?),
        };
        f(lt)
    }

    /// The f32 product geometries tuned since the last call: each one's candidates, the
    /// heuristic's pick and the fastest, timed on the device.
    pub fn gemm_tuning(&self) -> Vec<GemmTuning> {
        lock(&self.lt)
            .as_mut()
            .map(Lt::take_report)
            .unwrap_or_default()
    }

    /// Runs `f` with the device's cuBLAS handle (created on first use), bound to the stream this
    /// thread's work goes to and to a workspace no other stream or graph uses meanwhile.
    pub(crate) fn with_blas<R>(
        &self,
        f: impl FnOnce(blas_sys::cublasHandle_t) -> Result<R>,
    ) -> Result<R> {
        let _turn = self.turn();
        self.bind()?;
        let mut guard = lock(&self.blas);
        let blas = match &mut *guard {
            Some(b) => b,
            empty => {
                // SAFETY: only tries to open the shared library.
                if !unsafe { blas_sys::is_culib_present() } {
                    return Err(Error::Cuda(
                        "cuBLAS (libcublas.so.13) was not found: install the CUDA 13 toolkit's \
                         cuBLAS or put its lib folder on LD_LIBRARY_PATH"
                            .to_string(),
                    ));
                }
                let workspace = self.alloc(BLAS_WORKSPACE)?;
                let handle =
                    blas_result::create_handle().map_err(|e| cuda_err("cublasCreate", e))?;
                empty.insert(Blas(handle, workspace))
            }
        };
        let (handle, own) = (blas.0, blas.1.ptr());
        // SAFETY: the handle is live; every stream of this Gpu outlives it.
        unsafe { blas_result::set_stream(handle, self.stream().cu_stream() as _) }
            .map_err(|e| cuda_err("cublasSetStream", e))?;
        let set_workspace = |ws: u64, bytes: usize| {
            // SAFETY: the handle is live; `ws` holds `bytes` bytes for the work queued next.
            unsafe { blas_sys::cublasSetWorkspace_v2(handle, ws as *mut c_void, bytes) }
                .result()
                .map_err(|e| cuda_err("cublasSetWorkspace", e))
        };
        if !ON_SIDE.get() && !self.is_capturing() {
            set_workspace(own, BLAS_WORKSPACE)?;
            return f(handle);
        }
        // The side stream's work, and a graph's (whose replays may run beside other graphs'),
        // must not share the compute stream's workspace: they take their own scratch area.
        self.with_scratch(SIDE_BLAS_WORKSPACE, |ws| {
            set_workspace(ws, SIDE_BLAS_WORKSPACE)?;
            f(handle)
        })
    }
}

/// Page-locked host memory (`cuMemHostAlloc`): the copy engine reads it directly, so a copy from
/// it runs asynchronously and overlaps kernels. Freed with `cuMemFreeHost` when dropped.
pub struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes through &self/&mut self.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for PinnedBuffer {}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.bytes)
    }
}

impl PinnedBuffer {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr holds `bytes` bytes owned by self (a null ptr only for 0 bytes is never made).
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The bytes, writable. A copy still reading them must have finished (see [`CopyEvent`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from cuMemHostAlloc and is freed once.
            let _ = unsafe { drv::free_host(self.ptr.cast()) };
        }
    }
}

/// Device bytes on their way to the host ([`Gpu::dtoh_later`]).
pub struct HostCopy {
    buf: Option<PinnedBuffer>,
    bytes: usize,
    event: CudaEvent,
    gpu: Arc<Gpu>,
}

impl fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostCopy({} bytes, done: {})",
            self.bytes,
            self.is_done()
        )
    }
}

impl HostCopy {
    /// Whether the bytes have arrived (without waiting).
    pub fn is_done(&self) -> bool {
        self.event.is_complete()
    }

    /// The bytes, once the copy (and the work queued before it) is done.
    ///
    /// # Errors
    /// A queued kernel or the copy failed.
    pub fn wait(&self) -> Result<&[u8]> {
        self.event
            .synchronize()
            .map_err(|e| cuda_err("waiting for a copy to the host", e))?;
        Ok(self
            .buf
            .as_ref()
            .map_or(&[][..], |b| &b.as_slice()[..self.bytes]))
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // A copy still running writes the buffer: only a finished one goes back for reuse.
        if let Some(buf) = self.buf.take()
            && self.event.synchronize().is_ok()
        {
            lock(&self.gpu.host_copy_buffers).push(buf);
        }
    }
}

/// The end of copies queued on the copy stream: the compute stream waits on it before using
/// their data ([`CopyEvent::wait_on_compute`]); the host waits on it before reusing their pinned
/// source ([`CopyEvent::synchronize`]).
#[derive(Debug)]
pub struct CopyEvent {
    event: CudaEvent,
    gpu: Arc<Gpu>,
}

impl CopyEvent {
    /// Makes the device's compute stream wait for the copies (without blocking the host): work
    /// queued on it from now on sees their data.
    ///
    /// # Errors
    /// The driver rejects the wait.
    pub fn wait_on_compute(&self) -> Result<()> {
        let _turn = self.gpu.turn();
        self.gpu.bind()?;
        self.gpu
            .compute
            .wait(&self.event)
            .map_err(|e| cuda_err("ordering the compute stream after a copy", e))
    }

    /// Blocks the host until the copies are done.
    ///
    /// # Errors
    /// A copy failed.
    pub fn synchronize(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(|e| cuda_err("waiting for a copy", e))
    }

    /// Whether the copies are done (without waiting).
    pub fn is_done(&self) -> bool {
        self.event.is_complete()
    }
}

/// Side streams for concurrent replays, each with the event its last replay recorded, and the event they start from
/// (reused: creating events per replay costs host time a small model's step cannot spare).
#[derive(Default)]
struct Lanes {
    start: Option<CudaEvent>,
    streams: Vec<(Arc<CudaStream>, CudaEvent)>,
}

/// A CUDA graph captured from the compute stream, instantiated and ready to replay.
pub struct GpuGraph {
    graph: CudaGraph,
    /// Pinned host bytes the graph's copies read (host constants of the captured work).
    _host: Vec<PinnedBuffer>,
    /// Scratch areas the graph's ops use.
    _scratch: Vec<DeviceBuffer>,
    gpu: Arc<Gpu>,
}

// SAFETY: the graph and its instantiation are driver objects of the device's context, usable from
// any thread; `launch` binds the context first, and `&self` methods never run concurrently with
// drop. A unit that owns a graph may move to another thread between steps.
unsafe impl Send for GpuGraph {}

impl fmt::Debug for GpuGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuGraph(cuda:{})", self.gpu.ordinal)
    }
}

impl GpuGraph {
    /// Enqueues one replay on the compute stream (one launch, whatever the number of kernels).
    ///
    /// # Errors
    /// The driver rejects the launch.
    pub fn launch(&self) -> Result<()> {
        let _turn = self.gpu.turn();
        self.gpu.bind()?;
        self.graph
            .launch()
            .map_err(|e| cuda_err("launching a CUDA graph", e))
    }
}

impl Gpu {
    /// Enqueues one replay of each graph, spread over `lanes` side streams that run concurrently: all start after
    /// the compute stream's work queued so far, and the compute stream's later work waits for all of them.
    /// Graphs replayed together must not write what another of them reads or writes (separate models' steps on
    /// shared, read-only inputs do not).
    ///
    /// # Errors
    /// A graph of another device, or the driver rejects a launch or an event.
    pub fn replay_concurrently(&self, graphs: &[&GpuGraph], lanes: usize) -> Result<()> {
        if let Some(g) = graphs.iter().find(|g| g.gpu.ordinal != self.ordinal) {
            return Err(Error::Cuda(format!(
                "a CUDA graph of cuda:{} replayed on cuda:{}",
                g.gpu.ordinal, self.ordinal
            )));
        }
        let lanes = lanes.clamp(1, graphs.len().max(1));
        if lanes == 1 {
            // One stream: the compute stream itself, no events to order it.
            return graphs.iter().try_for_each(|g| g.launch());
        }
        let _turn = self.turn();
        self.bind()?;
        let mut guard = lock(&self.lanes);
        let l = &mut *guard;
        while l.streams.len() < lanes {
            let stream = self
                .ctx
                .new_stream()
                .map_err(|e| cuda_err("creating a replay stream", e))?;
            let done = self
                .ctx
                .new_event(None)
                .map_err(|e| cuda_err("creating an event", e))?;
            l.streams.push((stream, done));
        }
        let start = match l.start.take() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(None)
                .map_err(|e| cuda_err("creating an event", e))?,
        };
        start
            .record(&self.compute)
            .map_err(|e| cuda_err("recording an event", e))?;
        for (s, _) in &l.streams[..lanes] {
            s.wait(&start)
                .map_err(|e| cuda_err("ordering a replay stream", e))?;
        }
        l.start = Some(start);
        for (k, g) in graphs.iter().enumerate() {
            let s = &l.streams[k % lanes].0;
            // SAFETY: the graph's executable is live (owned by `g`), and the stream belongs to its context.
            unsafe { drv::graph::launch(g.graph.cu_graph_exec(), s.cu_stream()) }
                .map_err(|e| cuda_err("launching a CUDA graph", e))?;
        }
        for (s, done) in &l.streams[..lanes] {
            done.record(s)
                .map_err(|e| cuda_err("recording an event", e))?;
            self.compute
                .wait(done)
                .map_err(|e| cuda_err("ordering the compute stream after replays", e))?;
        }
        Ok(())
    }

    /// Allocates `bytes` (at least 1) of page-locked host memory.
    ///
    /// # Errors
    /// The driver cannot pin that much memory.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        self.bind()?;
        // SAFETY: plain allocation in the bound context; flags 0 = cacheable, this context only.
        let ptr = unsafe { drv::malloc_host(bytes.max(1), 0) }
            .map_err(|e| cuda_err(&format!("cuMemHostAlloc of {bytes} bytes"), e))?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Copies pinned host bytes to the device on the copy stream. `parts` are (destination,
    /// offset into `src`, bytes). The copies start after the compute stream's work queued so far
    /// (the destinations may be blocks it has just freed); nothing on the compute stream waits
    /// for them until the returned event's [`CopyEvent::wait_on_compute`], so they overlap the
    /// kernels queued meanwhile. `src` must not be rewritten before the event is done.
    ///
    /// # Safety
    /// Each destination must address its `bytes` of this device's memory.
    ///
    /// # Errors
    /// A part outside `src`, or the driver rejects a copy or an event.
    pub unsafe fn upload_pinned(
        self: &Arc<Self>,
        src: &PinnedBuffer,
        parts: &[(u64, usize, usize)],
    ) -> Result<CopyEvent> {
        self.refuse_in_capture("a copy-stream upload")?;
        let _turn = self.turn();
        self.bind()?;
        self.copy_after_compute()?;
        for &(dst, offset, bytes) in parts {
            let Some(bytes_src) = src.as_slice().get(offset..offset + bytes) else {
                return Err(Error::Cuda(format!(
                    "upload: bytes {offset}..{} are outside the {}-byte staging buffer",
                    offset + bytes,
                    src.bytes
                )));
            };
            if bytes == 0 {
                continue;
            }
            // SAFETY: caller guarantees dst; the source is pinned and outlives the copy (caller
            // waits on the event before rewriting it).
            unsafe { drv::memcpy_htod_async(dst, bytes_src, self.copy.cu_stream()) }
                .map_err(|e| cuda_err("copying host to device", e))?;
        }
        let event = self
            .copy
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        Ok(CopyEvent {
            event,
            gpu: self.clone(),
        })
    }

    /// Records a timing event on the compute stream (the side stream inside [`Gpu::on_side`]): it
    /// completes when the GPU reaches this point of the queued work (see
    /// [`CudaEvent::elapsed_ms`]).
    ///
    /// # Errors
    /// The driver rejects the event.
    pub fn mark(&self) -> Result<CudaEvent> {
        let _turn = self.turn();
        self.bind()?;
        self.stream()
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| cuda_err("recording a timing event", e))
    }

    /// Whether a CUDA graph is being captured on the compute stream.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
            && lock(&self.turns).owner == Some(std::thread::current().id())
    }

    /// This thread's turn to use the device (queue work, or allocate and free where that may
    /// synchronize): waits while another thread captures a graph here, and keeps a capture from
    /// beginning until the returned guard drops.
    pub fn turn(&self) -> Turn<'_> {
        let mut t = lock(&self.turns);
        while let Some(owner) = t.owner {
            if owner == std::thread::current().id() {
                return Turn {
                    gpu: self,
                    counted: false,
                };
            }
            t = self.wait_for_turns(t);
        }
        t.active += 1;
        TURNS_HELD.set(TURNS_HELD.get() + 1);
        Turn {
            gpu: self,
            counted: true,
        }
    }

    fn refuse_in_capture(&self, what: &str) -> Result<()> {
        if self.is_capturing() {
            Err(Error::Cuda(format!(
                "{what} is not possible while a CUDA graph is being captured (nothing runs during \
                 a capture): keep host reads and synchronization out of the captured step"
            )))
        } else {
            Ok(())
        }
    }

    /// Starts capturing the compute stream's work into a graph (relaxed mode: allocations may
    /// grow a memory pool meanwhile). Work this thread queues from now on is recorded, not run,
    /// until [`Gpu::end_capture`]. It waits for other threads' work in progress; their later work
    /// waits for the capture to end. One capture per device at a time.
    ///
    /// # Errors
    /// This thread is capturing already, or the driver refuses.
    pub fn begin_capture(&self) -> Result<()> {
        let me = std::thread::current().id();
        if TURNS_HELD.get() > 0 {
            // It would wait for its own turn to end.
            return Err(Error::Cuda(
                "a CUDA graph capture cannot begin inside another call on the device".into(),
            ));
        }
        {
            let mut t = lock(&self.turns);
            if t.owner == Some(me) {
                return Err(Error::Cuda(format!(
                    "cuda:{} is already capturing a CUDA graph: finish that capture first",
                    self.ordinal
                )));
            }
            while t.owner.is_some() || t.active > 0 {
                t = self.wait_for_turns(t);
            }
            t.owner = Some(me);
        }
        self.capturing.store(true, Ordering::Release);
        let r = self.bind().and_then(|()| {
            self.compute
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(|e| cuda_err("cuStreamBeginCapture", e))
        });
        if r.is_err() {
            self.release_turns();
        }
        r
    }

    /// Ends a capture's hold on the device: other threads may queue work again.
    fn release_turns(&self) {
        self.capturing.store(false, Ordering::Release);
        let mut t = lock(&self.turns);
        t.owner = None;
        t.wake(&self.turn_changed);
    }

    /// Waits (counted as waiting) until the turns change.
    fn wait_for_turns<'a>(&self, mut t: MutexGuard<'a, Turns>) -> MutexGuard<'a, Turns> {
        t.waiting += 1;
        let mut t = self
            .turn_changed
            .wait(t)
            .unwrap_or_else(PoisonError::into_inner);
        t.waiting -= 1;
        t
    }

    /// Ends the capture begun by [`Gpu::begin_capture`] and instantiates the graph.
    ///
    /// # Errors
    /// No capture is running, the captured work used something a graph cannot hold (the driver
    /// invalidates the capture), or instantiation failed.
    pub fn end_capture(self: &Arc<Self>) -> Result<GpuGraph> {
        if !self.is_capturing() {
            return Err(Error::Cuda(
                "end_capture without begin_capture: no CUDA graph is being captured".into(),
            ));
        }
        let host = std::mem::take(&mut *lock(&self.captured_host));
        let mut scratch = std::mem::take(&mut *lock(&self.captured_scratch));
        scratch.append(&mut lock(&self.captured_side_scratch));
        let r = self.compute.end_capture(sys::CUgraphInstantiate_flags(0));
        self.release_turns();
        match r {
            Ok(Some(graph)) => Ok(GpuGraph {
                graph,
                _host: host,
                _scratch: scratch,
                gpu: self.clone(),
            }),
            Ok(None) => Err(Error::Cuda(
                "the CUDA graph capture recorded no work".into(),
            )),
            Err(e) => Err(cuda_err(
                "ending the CUDA graph capture (an op in the step cannot be captured)",
                e,
            )),
        }
    }
}

/// Who may queue work on a device ([`Gpu::turn`]).
#[derive(Debug, Default)]
struct Turns {
    /// The thread capturing a graph, if one is.
    owner: Option<ThreadId>,
    /// Other threads' calls queueing work now.
    active: usize,
    /// Threads waiting for the turns to change.
    waiting: usize,
}

impl Turns {
    /// Wakes the waiting threads, if any: a wake is a system call, and every turn ends here.
    fn wake(&self, changed: &Condvar) {
        if self.waiting > 0 {
            changed.notify_all();
        }
    }
}

/// A thread's turn to use a device ([`Gpu::turn`]); ends on drop.
#[derive(Debug)]
pub struct Turn<'a> {
    gpu: &'a Gpu,
    counted: bool,
}

thread_local! {
    /// Counted turns this thread holds (a capture may not begin inside one).
    static TURNS_HELD: Cell<u32> = const { Cell::new(0) };
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.counted {
            TURNS_HELD.set(TURNS_HELD.get().saturating_sub(1));
            let mut t = lock(&self.gpu.turns);
            t.active -= 1;
            t.wake(&self.gpu.turn_changed);
        }
    }
}

/// Builds the argument array of a kernel launch from local variables (each one is borrowed, so
/// it must outlive the launch call).
macro_rules! kernel_args {
    ($($a:ident),* $(,)?) => {
        [$( (&$a) as *const _ as *mut ::std::ffi::c_void ),*]
    };
}
pub(crate) use kernel_args;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides_follow_numpy() {
        assert_eq!(broadcast_strides(&[3], &[2, 3]).unwrap(), vec![0, 1]);
        assert_eq!(broadcast_strides(&[2, 1], &[2, 3]).unwrap(), vec![1, 0]);
        assert_eq!(broadcast_strides(&[2, 3], &[2, 3]).unwrap(), vec![3, 1]);
        assert!(broadcast_strides(&[4], &[2, 3]).is_err());
    }

    #[test]
    fn strided_shape_detects_contiguous_operands() {
        let s = StridedShape::new(&[2, 3], &[&[3, 1], &[3, 1]]).unwrap();
        assert_eq!(s.flags & 1, 1);
        let s = StridedShape::new(&[2, 3], &[&[3, 1], &[0, 1]]).unwrap();
        assert_eq!(s.flags & 1, 0);
        assert!(StridedShape::new(&[1; 9], &[]).is_err());
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match Gpu::get(0) {
            Ok(g) => assert!(driver_present(), "got {g:?} without a driver"),
            Err(e) => assert!(e.to_string().contains("cuda"), "{e}"),
        }
    }
}

/// Element types the CUDA kernels know (the tensor crate maps its `DType` onto these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer (labels, indices).
    I32,
    /// Byte (masks).
    U8,
}

impl CudaType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            CudaType::F32 | CudaType::I32 => 4,
            CudaType::F16 | CudaType::BF16 => 2,
            CudaType::U8 => 1,
        }
    }

    /// The name used in kernel names (`add_f32`).
    pub fn name(self) -> &'static str {
        match self {
            CudaType::F32 => "f32",
            CudaType::F16 => "f16",
            CudaType::BF16 => "bf16",
            CudaType::I32 => "i32",
            CudaType::U8 => "u8",
        }
    }
}

/// The error for an op asked of a type it has no kernel for.
pub(crate) fn unsupported(op: &str, ty: CudaType) -> Error {
    Error::Cuda(format!(
        "{op} has no CUDA kernel for {}: cast to f32 first",
        ty.name()
    ))
}

/// Whether every address is 16-byte aligned (four-wide float loads).
pub(crate) fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p % 16 == 0)
}
