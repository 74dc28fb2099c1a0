//! The per-device context: the driver context, its streams, its error flags and the side stream. By concern beside
//! it: `memory` (device buffers, the arena they may come from, scratch areas), `launch` (kernel functions from their
//! modules, launches, per-kernel timing), `shape` (launch geometry, strides, element types), `copies` (host and
//! device copies, pinned memory), `blas` (the cuBLAS and cuBLASLt handles), `dnn` (the cuDNN handle, or why there is
//! none), `capture` (CUDA graphs, what a capture keeps for its graph, and the turns that keep other threads' work
//! out of a capture).

mod blas;
mod capture;
mod copies;
mod dnn;
mod launch;
mod memory;
mod shape;

pub use capture::{GpuGraph, Turn};
pub use copies::{CopyEvent, HostCopy, PinnedBuffer, pinned_host_bytes};
pub use memory::{DeviceArena, DeviceBuffer};
pub use shape::CudaType;
pub(crate) use shape::{
    FloatKernels, Launch, StridedShape, aligned16, broadcast_strides, contiguous_strides,
    float_kernel, float_kernels, kernel_args, unsupported,
};

use blas::Blas;
use capture::Capture;
use dnn::DnnSlot;

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::ThreadId;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, result as drv, sys,
};

use super::modules::{self, Target};
use super::profile::Profile;
use crate::matmul::lt::Lt;
use crate::{Error, Result};

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
const FLAG_OPS: [&str; 9] = [
    "index_select",
    "index_add",
    "gather_last",
    "one_hot",
    "max_pool2d_backward",
    "scatter_add_last",
    "cross_entropy",
    "bag_mean",
    "conv2d_max_pool_backward",
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
    compute_capability: (u32, u32),
    sm_count: u32,
    /// The most dynamic shared memory a block may opt in to, in bytes.
    shared_per_block: usize,
    name: String,
    blas: Mutex<Option<Blas>>,
    /// cuBLASLt and its tuned algorithms (f32 products), created on first use.
    lt: Mutex<Option<Lt>>,
    /// cuDNN and its tuned algorithms (convolutions), loaded on the first convolution.
    dnn: Mutex<DnnSlot>,
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
    /// Pinned buffers of finished [`HostCopy`]s, reused: pinning memory costs more than a step.
    host_copy_buffers: Mutex<Vec<PinnedBuffer>>,
    /// Whose work the device takes, and what a capture in progress keeps for its graph.
    capture: Capture,
    /// GPU time per kernel, when `COHORT_CUDA_PROFILE` asks for it.
    profile: Option<Profile>,
    /// Where [`Gpu::alloc`] takes memory from, once installed.
    arena: OnceLock<Arc<dyn DeviceArena>>,
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
        let shared_per_block = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| cuda_err("reading the shared memory per block", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
        let target = Target::of(cc);
        modules::prefetch(target);
        Ok(Gpu {
            ordinal,
            ctx,
            compute,
            copy,
            side,
            fork_join,
            target,
            compute_capability: (cc.0.max(0) as u32, cc.1.max(0) as u32),
            sm_count: sm_count.max(1) as u32,
            shared_per_block: shared_per_block.max(0) as usize,
            name,
            blas: Mutex::new(None),
            lt: Mutex::new(None),
            dnn: Mutex::new(DnnSlot::Untried),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            scratch: Mutex::new(None),
            flags: Mutex::new(HashMap::new()),
            side_scratch: Mutex::new(None),
            host_copy_buffers: Mutex::new(Vec::new()),
            capture: Capture::default(),
            profile: Profile::from_env(),
            arena: OnceLock::new(),
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

    /// The card's PCI address (`0000:19:00.0`), by which NVML and `nvidia-smi` know it.
    ///
    /// # Errors
    /// The driver refuses.
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer holds 32 bytes, as passed; the driver writes a NUL-terminated string into it.
        unsafe {
            sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, self.ctx.cu_device())
        }
        .result()
        .map_err(|e| cuda_err("cuDeviceGetPCIBusId", e))?;
        // SAFETY: NUL-terminated within the buffer (above).
        let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(id.to_string_lossy().into_owned())
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// The most dynamic shared memory one block may opt in to, in bytes (227 KiB on an H100).
    pub fn shared_per_block(&self) -> usize {
        self.shared_per_block
    }

    /// The compute capability (major, minor).
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
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
            return Ok(b.ptr());
        }
        self.bind()?;
        let flag = self.alloc(16)?;
        clear_flag(flag.ptr())?;
        let ptr = flag.ptr();
        flags.insert(thread, flag);
        Ok(ptr)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match Gpu::get(0) {
            Ok(g) => assert!(driver_present(), "got {g:?} without a driver"),
            Err(e) => assert!(e.to_string().contains("cuda"), "{e}"),
        }
    }
}
