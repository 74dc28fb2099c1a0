//! CUDA graphs: capture a step's work on the compute stream once, replay it with one launch.
//!
//! While a capture runs, every new storage on the device comes from a private pool that only the
//! graph uses (as PyTorch's graph pools), and a block of the shared allocator freed meanwhile is
//! kept out of the shared cache until the graph is dropped: replays write only blocks the graph
//! owns or that were live (parameters, optimizer state, static inputs) when it was captured.
//!
//! What a replay repeats: every kernel, cuBLAS call and host-to-device copy of the captured step,
//! with the same addresses and the same scalar arguments (so learning rates are those at
//! capture). Adam's step number is the exception: it lives on the device and advances by one per
//! replay, so bias correction follows the real step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cohort_kernels::cuda::GpuGraph;

use super::*;

/// The capture in progress (at most one per process).
struct Active {
    ordinal: usize,
    pool: Arc<dyn DeviceAllocator>,
    /// Blocks of other allocators freed during the capture, returned when the graph drops.
    deferred: Vec<(Arc<dyn DeviceAllocator>, Block)>,
    /// Adam step counters (a u32 each, in the pool) with the step they stood for at capture.
    counters: Vec<(CudaStorage, u64)>,
}

static CAPTURING: AtomicBool = AtomicBool::new(false);
static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);

fn active() -> MutexGuard<'static, Option<Active>> {
    ACTIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn same_allocator(a: &Arc<dyn DeviceAllocator>, b: &Arc<dyn DeviceAllocator>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// The pool new storage on `ordinal` must come from, while a capture runs there.
pub(super) fn pool(ordinal: usize) -> Option<Arc<dyn DeviceAllocator>> {
    if !CAPTURING.load(Ordering::Acquire) {
        return None;
    }
    active()
        .as_ref()
        .filter(|a| a.ordinal == ordinal)
        .map(|a| a.pool.clone())
}

/// Keeps `block` (of `alloc`) for the capture on `ordinal` if one runs and the block is not the
/// pool's own; gives it back otherwise, to be freed now.
pub(super) fn defer_free(
    ordinal: usize,
    alloc: &Arc<dyn DeviceAllocator>,
    block: Block,
) -> Option<Block> {
    if !CAPTURING.load(Ordering::Acquire) {
        return Some(block);
    }
    let mut guard = active();
    match guard.as_mut() {
        Some(a) if a.ordinal == ordinal && !same_allocator(&a.pool, alloc) => {
            a.deferred.push((alloc.clone(), block));
            None
        }
        _ => Some(block),
    }
}

/// A device step counter for a captured Adam step that stood for step `step`.
pub(super) fn step_counter(gpu: &Arc<Gpu>, step: u64) -> Result<u64> {
    let pool = pool(gpu.ordinal())
        .ok_or_else(|| capture_error("a step counter outside a graph capture"))?;
    let counter = Ctx {
        gpu: gpu.clone(),
        alloc: pool,
        ordinal: gpu.ordinal(),
    }
    .storage(1, DType::I32)?;
    let ptr = counter.device_ptr();
    if let Some(a) = active().as_mut() {
        a.counters.push((counter, step));
    }
    Ok(ptr)
}

/// A captured, instantiated CUDA graph with its private memory pool. Replay it with
/// [`CudaGraph::replay`]; the tensors it reads and writes (parameters, optimizer state, the
/// static inputs it was captured with) must stay alive while it is replayed.
pub struct CudaGraph {
    graph: Option<GpuGraph>,
    gpu: Arc<Gpu>,
    pool: Arc<dyn DeviceAllocator>,
    deferred: Vec<(Arc<dyn DeviceAllocator>, Block)>,
    counters: Vec<CudaStorage>,
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph(cuda:{})", self.gpu.ordinal())
    }
}

impl CudaGraph {
    /// Enqueues one replay of the captured work on the compute stream.
    ///
    /// # Errors
    /// The driver rejects the launch.
    pub fn replay(&self) -> Result<()> {
        match &self.graph {
            Some(g) => Ok(g.launch()?),
            None => Err(capture_error("replay of a dropped CUDA graph")),
        }
    }

    /// Statistics of the graph's private pool (the memory its replays use beyond the tensors
    /// that were live at capture).
    pub fn pool_stats(&self) -> MemoryReport {
        self.pool.stats()
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // Replays still queued use the deferred blocks: let them finish before those go back.
        let _ = self.gpu.compute_stream().synchronize();
        self.graph = None;
        for (alloc, block) in self.deferred.drain(..) {
            alloc.free(block);
        }
        self.counters.clear();
    }
}

/// Captures the device work `f` queues on `device` into a [`CudaGraph`] and returns it with
/// `f`'s result. Nothing runs during the capture: `f` must not read tensors back to the host or
/// synchronize (that is an error), and should have run once eagerly before, so that lazily
/// created state (optimizer moments, kernel modules, scratch space) exists. No other thread may
/// use the device while `f` runs.
///
/// # Errors
/// A CPU device, a capture already running, `f`'s own error, or work the driver cannot capture.
pub fn capture<R, E: From<Error>>(
    device: &Device,
    f: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<(CudaGraph, R), E> {
    let Device::Cuda(ordinal) = *device else {
        return Err(Error::Unsupported {
            op: "capture",
            device: *device,
        }
        .into());
    };
    let gpu = gpu(ordinal)?;
    // Work queued before the capture (and its index checks) completes outside the graph.
    gpu.synchronize().map_err(Error::from)?;
    let pool: Arc<dyn DeviceAllocator> = Arc::new(GpuAllocator {
        bfc: private_pool(ordinal)?,
        gpu: gpu.clone(),
    });
    {
        let mut guard = active();
        if guard.is_some() {
            return Err(
                capture_error("a CUDA graph capture is already running in this process").into(),
            );
        }
        *guard = Some(Active {
            ordinal,
            pool: pool.clone(),
            deferred: Vec::new(),
            counters: Vec::new(),
        });
    }
    CAPTURING.store(true, Ordering::Release);
    let begun = gpu.begin_capture();
    let out = match begun {
        Ok(()) => f(),
        Err(e) => Err(Error::from(e).into()),
    };
    let graph = if gpu.is_capturing() {
        gpu.end_capture().map_err(Error::from)
    } else {
        Err(capture_error("the CUDA graph capture did not start"))
    };
    CAPTURING.store(false, Ordering::Release);
    let Some(state) = active().take() else {
        return Err(capture_error("the CUDA graph capture state vanished").into());
    };
    let mut built = CudaGraph {
        graph: None,
        gpu: gpu.clone(),
        pool,
        deferred: state.deferred,
        counters: Vec::new(),
    };
    // On failure `built` drops here: the deferred blocks go back (nothing captured ever runs).
    let out = out?;
    built.graph = Some(graph?);
    for (counter, step) in state.counters {
        let before = u32::try_from(step.saturating_sub(1)).unwrap_or(u32::MAX);
        // SAFETY: the counter holds one 4-byte element.
        unsafe { gpu.htod(counter.device_ptr(), &before.to_ne_bytes()) }.map_err(Error::from)?;
        built.counters.push(counter);
    }
    Ok((built, out))
}

/// A Bfc over plain `cuMemAlloc` segments, used by one graph only.
fn private_pool(ordinal: usize) -> Result<cohort_alloc::DeviceBfc> {
    let config = cohort_alloc::Config::builder()
        .device(cohort_alloc::DeviceSelector::Cuda(ordinal))
        .build()?;
    let source: Box<dyn cohort_alloc::MemorySource> =
        Box::new(cohort_alloc::CudaMemory::new(ordinal)?);
    Ok(cohort_alloc::Bfc::new(source, config)?)
}

fn capture_error(reason: &str) -> Error {
    Error::InvalidArgument {
        op: "capture",
        reason: reason.to_string(),
    }
}
