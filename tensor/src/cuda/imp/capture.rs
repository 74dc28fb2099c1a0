//! CUDA graphs: capture a step's work on the compute stream once, replay it with one launch.
//!
//! While a capture runs, every new storage on the device comes from a private pool that only the
//! graph uses (as PyTorch's graph pools), and a block of the shared allocator freed meanwhile is
//! kept out of the shared cache until the graph is dropped: replays write only blocks the graph
//! owns or that were live (parameters, optimizer state, static inputs) when it was captured.
//!
//! What a replay repeats: every kernel, cuBLAS call and host-to-device copy of the captured step,
//! with the same addresses and the same scalar arguments. The optimizer's step is the exception:
//! its number and a factor on its learning rates live on the device. The number advances by one
//! per replay, so Adam's bias correction follows the real step, and
//! [`CudaGraph::set_optimizer_step`] sets both before a replay (a schedule, eager steps between).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cohort_kernels::cuda::{DeviceBuffer, GpuGraph};
use cohort_kernels::optim::cuda::StepState;

use super::*;

/// The capture in progress (at most one per process).
struct Active {
    ordinal: usize,
    /// The capturing thread: other threads' storage never comes from the graph's pool.
    thread: std::thread::ThreadId,
    pool: Arc<dyn DeviceAllocator>,
    /// Blocks of other allocators freed during the capture, returned when the graph drops.
    deferred: Vec<(Arc<dyn DeviceAllocator>, Block)>,
    /// Optimizer step states ([`StepState`]) with the step they stood for at capture.
    states: Vec<(DeviceBuffer, u64)>,
    /// The state every SGD step of the capture shares ([`rate_state`]).
    rate_state: Option<u64>,
}

static CAPTURING: AtomicBool = AtomicBool::new(false);
/// Held for the whole of a capture: one at a time per process.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);

fn active() -> MutexGuard<'static, Option<Active>> {
    ACTIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn same_allocator(a: &Arc<dyn DeviceAllocator>, b: &Arc<dyn DeviceAllocator>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Whether `a` is this thread's capture on `ordinal`.
fn mine(a: &Active, ordinal: usize) -> bool {
    a.ordinal == ordinal && a.thread == std::thread::current().id()
}

/// The pool new storage on `ordinal` must come from, while this thread captures there.
pub(super) fn pool(ordinal: usize) -> Option<Arc<dyn DeviceAllocator>> {
    if !CAPTURING.load(Ordering::Acquire) {
        return None;
    }
    active()
        .as_ref()
        .filter(|a| mine(a, ordinal))
        .map(|a| a.pool.clone())
}

/// Keeps `block` (of `alloc`) for this thread's capture on `ordinal` if one runs and the block is
/// not the pool's own; gives it back otherwise, to be freed now.
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
        Some(a) if mine(a, ordinal) && !same_allocator(&a.pool, alloc) => {
            a.deferred.push((alloc.clone(), block));
            None
        }
        _ => Some(block),
    }
}

/// The device [`StepState`] of a captured optimizer step that stood for step `step`.
pub(super) fn step_state(gpu: &Arc<Gpu>, step: u64) -> Result<u64> {
    let mut guard = active();
    let a = capture_of(&mut guard, gpu)?;
    new_state(a, gpu, step)
}

/// The device [`StepState`] a captured SGD step scales its rates by: one per capture, shared by
/// every SGD launch in it (SGD's update does not depend on the step number).
pub(super) fn rate_state(gpu: &Arc<Gpu>) -> Result<u64> {
    let mut guard = active();
    let a = capture_of(&mut guard, gpu)?;
    if let Some(ptr) = a.rate_state {
        return Ok(ptr);
    }
    let ptr = new_state(a, gpu, 1)?;
    a.rate_state = Some(ptr);
    Ok(ptr)
}

fn capture_of<'a>(guard: &'a mut Option<Active>, gpu: &Gpu) -> Result<&'a mut Active> {
    guard
        .as_mut()
        .filter(|a| mine(a, gpu.ordinal()))
        .ok_or_else(|| capture_error("an optimizer step state outside a graph capture"))
}

fn new_state(a: &mut Active, gpu: &Gpu, step: u64) -> Result<u64> {
    // Its own allocation, not a pool block: the pool hands the blocks of the step's temporaries
    // out again within the same capture, and a kernel writing such a block on every replay would
    // overwrite the count.
    let state = gpu.alloc(std::mem::size_of::<StepState>())?;
    let ptr = state.ptr();
    a.states.push((state, step));
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
    states: Vec<DeviceBuffer>,
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

    /// Sets the captured optimizer steps' state for the next replay: it runs as step `next`
    /// (1-based, as [`Optimizer::steps`](../../cohort_optim) + 1) with every learning rate
    /// multiplied by `lr_scale` (the rates captured are those of the captured step). Queued on the
    /// compute stream, so it applies from the next replay on; replays after it advance the step.
    ///
    /// # Errors
    /// The driver rejects the copy.
    pub fn set_optimizer_step(&self, next: u64, lr_scale: f32) -> Result<()> {
        let words = [StepState::before(next, lr_scale)];
        for state in &self.states {
            // SAFETY: the buffer holds one StepState; the copy is ordered before later replays.
            unsafe { self.gpu.htod(state.ptr(), bytemuck::cast_slice(&words)) }?;
        }
        Ok(())
    }

    /// Whether the graph holds an optimizer step (whose state [`set_optimizer_step`] sets).
    ///
    /// [`set_optimizer_step`]: CudaGraph::set_optimizer_step
    pub fn has_optimizer_step(&self) -> bool {
        !self.states.is_empty()
    }

    /// Statistics of the graph's private pool (the memory its replays use beyond the tensors
    /// that were live at capture).
    pub fn pool_stats(&self) -> MemoryReport {
        self.pool.stats()
    }
}

/// Enqueues one replay of each graph (all of one device), spread over `lanes` streams that run
/// concurrently, after the work queued so far; later work waits for all of them. Separate models'
/// steps (disjoint parameters, shared read-only inputs) may replay together; graphs that write
/// what another reads may not.
///
/// # Errors
/// A dropped graph, graphs of different devices, or the driver rejects a launch.
pub fn replay_concurrently(graphs: &[&CudaGraph], lanes: usize) -> Result<()> {
    let Some(first) = graphs.first() else {
        return Ok(());
    };
    let inner = graphs
        .iter()
        .map(|g| {
            g.graph
                .as_ref()
                .ok_or_else(|| capture_error("replay of a dropped CUDA graph"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(first.gpu.replay_concurrently(&inner, lanes)?)
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // Replays still queued use the deferred blocks, the pool and the step states: let them
        // finish before those go back (after any other thread's capture: a synchronize would
        // break it).
        let finished = {
            let _turn = self.gpu.turn();
            !self.gpu.is_capturing() && self.gpu.compute_stream().synchronize().is_ok()
        };
        if !finished {
            // Freeing what a replay may still use is worse than keeping it.
            std::mem::forget(self.graph.take());
            std::mem::forget(std::mem::take(&mut self.deferred));
            std::mem::forget(std::mem::take(&mut self.states));
            std::mem::forget(self.pool.clone());
            return;
        }
        self.graph = None;
        for (alloc, block) in self.deferred.drain(..) {
            alloc.free(block);
        }
        self.states.clear();
    }
}

/// Captures the device work `f` queues on `device` into a [`CudaGraph`] and returns it with
/// `f`'s result. Nothing runs during the capture: `f` must not read tensors back to the host or
/// synchronize (that is an error), and should have run once eagerly before, so that lazily
/// created state (optimizer moments, kernel modules, scratch space) exists. Other threads' work on
/// the device waits while `f` runs (a capture would record it), and captures take turns; `f` must
/// not use tensors another thread may be writing (it would wait for that thread, which waits for
/// the capture).
///
/// # Errors
/// A CPU device, a capture inside a capture, `f`'s own error, or work the driver cannot capture.
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
    let me = std::thread::current().id();
    if active().as_ref().is_some_and(|a| a.thread == me) {
        return Err(capture_error("a CUDA graph capture inside another capture").into());
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    // Work queued before the capture (and its index checks) completes outside the graph.
    gpu.synchronize().map_err(Error::from)?;
    let pool = super::allocator::graph_pool(private_pool(ordinal)?, gpu.clone());
    {
        let mut guard = active();
        *guard = Some(Active {
            ordinal,
            thread: std::thread::current().id(),
            pool: pool.clone(),
            deferred: Vec::new(),
            states: Vec::new(),
            rate_state: None,
        });
    }
    CAPTURING.store(true, Ordering::Release);
    let begun = gpu.begin_capture();
    // A panic in `f` must still end the capture, or the device stays unusable.
    let out = match begun {
        Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)),
        Err(e) => Ok(Err(Error::from(e).into())),
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
        states: Vec::new(),
    };
    // On failure `built` drops here: the deferred blocks go back (nothing captured ever runs).
    let out = match out {
        Ok(r) => r?,
        Err(panic) => {
            drop(built);
            std::panic::resume_unwind(panic)
        }
    };
    built.graph = Some(graph?);
    for (buf, step) in state.states {
        let words = [StepState::before(step, 1.0)];
        // SAFETY: the buffer holds one StepState.
        unsafe { gpu.htod(buf.ptr(), bytemuck::cast_slice(&words)) }.map_err(Error::from)?;
        built.states.push(buf);
    }
    Ok((built, out))
}

/// A Bfc used by one graph only, over regions of the device's shared allocator charged to the
/// capturing thread's tenant: a graph's memory counts against its member's budget and the
/// device's pool limit, and goes back to the shared cache when the graph drops.
fn private_pool(ordinal: usize) -> Result<cohort_alloc::DeviceBfc> {
    let config = cohort_alloc::Config::builder()
        .device(cohort_alloc::DeviceSelector::Cuda(ordinal))
        .build()?;
    let shared = crate::memory::allocator(&Device::Cuda(ordinal))?;
    let source: Box<dyn cohort_alloc::MemorySource> = Box::new(SharedRegions {
        ordinal,
        tenant: crate::memory::current_tenant(),
        shared,
        held: Vec::new(),
    });
    Ok(cohort_alloc::Bfc::new(source, config)?)
}

/// Regions of the shared allocator, as a private pool's memory source.
#[derive(Debug)]
struct SharedRegions {
    ordinal: usize,
    tenant: TenantId,
    shared: Arc<dyn DeviceAllocator>,
    held: Vec<Block>,
}

impl cohort_alloc::MemorySource for SharedRegions {
    fn name(&self) -> String {
        format!("cuda:{} graph pool", self.ordinal)
    }
    fn capacity(&self) -> u64 {
        self.shared.stats().limit
    }
    fn device_free(&self) -> u64 {
        self.shared.stats().device_free
    }
    fn reserve(
        &mut self,
        bytes: u64,
    ) -> std::result::Result<cohort_alloc::Region, cohort_alloc::SourceError> {
        let size = usize::try_from(bytes)
            .map_err(|_| cohort_alloc::SourceError::OutOfMemory { requested: bytes })?;
        // It grows while the capture runs, when a synchronization would break the capture.
        let block = self
            .shared
            .alloc_without_sync(size, self.tenant)
            .map_err(|_| cohort_alloc::SourceError::OutOfMemory { requested: bytes })?;
        let region = cohort_alloc::Region {
            base: block.ptr,
            size: bytes,
        };
        self.held.push(block);
        Ok(region)
    }
    fn release(
        &mut self,
        region: cohort_alloc::Region,
    ) -> std::result::Result<(), cohort_alloc::SourceError> {
        let at = self
            .held
            .iter()
            .position(|b| b.ptr == region.base)
            .ok_or_else(|| {
                cohort_alloc::SourceError::Failed(cohort_alloc::Error::Source {
                    source_name: self.name(),
                    call: "release",
                    detail: format!("no region at {:#x} was reserved here", region.base),
                })
            })?;
        self.shared.free(self.held.swap_remove(at));
        Ok(())
    }
}

impl Drop for SharedRegions {
    fn drop(&mut self) {
        for block in self.held.drain(..) {
            self.shared.free(block);
        }
    }
}

fn capture_error(reason: &str) -> Error {
    Error::InvalidArgument {
        op: "capture",
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use crate::storage::Storage;
    use cohort_alloc::TenantLimits;

    const N: usize = 4096;

    /// A capture records everything queued on the compute stream, from any thread: the tests take turns.
    static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn exclusive() -> std::sync::MutexGuard<'static, ()> {
        DEVICE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ptr(t: &Tensor) -> u64 {
        match &*t.read() {
            Storage::Cuda(s) => s.device_ptr(),
            Storage::Cpu(_) => 0,
        }
    }

    fn input(k: u64, dev: &Device) -> Tensor {
        Tensor::rand_uniform(&[N], -1.0, 1.0, DType::F32, k, dev).unwrap()
    }

    /// One training-like step: a gradient from the input (host constants, an index op and
    /// temporaries inside), then Adam on `p`.
    fn step(p: &Tensor, m: &Tensor, v: &Tensor, x: &Tensor, t: u64) -> Result<()> {
        step_at(p, m, v, x, t, 1e-2)
    }

    fn step_at(p: &Tensor, m: &Tensor, v: &Tensor, x: &Tensor, t: u64, lr: f64) -> Result<()> {
        let dev = p.device();
        let scale = Tensor::from_vec(vec![0.5f32, 2.0], &[2], &dev)?;
        let pick = Tensor::from_vec(vec![1i32], &[1], &dev)?;
        let s = scale.reshape(&[1, 2])?.gather_last(&pick)?; // [1] = 2.0
        let g = x.mul(p)?.add(&x.square()?)?.mul(&s)?;
        Tensor::adam_step_(p, &g, m, v, &[lr], 0.9, 0.999, 1e-8, 0.0, false, t)
    }

    /// Replays whose optimizer step is set from the host (a schedule's factor, eager steps in
    /// between) match eager steps at those rates and step numbers.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn replays_follow_the_optimizer_step_set_before_them() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let inputs: Vec<Tensor> = (0..7).map(|k| input(400 + k, &dev)).collect();
        // Per step from the second on: the rate's factor, and whether the step runs eagerly.
        let plan = [
            (1.0, false),
            (0.5, false),
            (0.25, true),
            (0.125, false),
            (2.0, false),
        ];
        let fresh = || {
            let zeros = || Tensor::zeros(&[N], DType::F32, &dev).unwrap();
            (input(7, &dev), zeros(), zeros())
        };
        let (p, m, v) = fresh();
        step_at(&p, &m, &v, &inputs[0], 1, 1e-2).unwrap();
        for (k, &(scale, _)) in plan.iter().enumerate() {
            step_at(&p, &m, &v, &inputs[k + 1], k as u64 + 2, 1e-2 * scale).unwrap();
        }
        let eager = p.to_vec::<f32>().unwrap();

        let (p, m, v) = fresh();
        step_at(&p, &m, &v, &inputs[0], 1, 1e-2).unwrap();
        let x = inputs[1].copy().unwrap();
        let (graph, ()) = capture(&dev, || step_at(&p, &m, &v, &x, 2, 1e-2)).unwrap();
        assert!(graph.has_optimizer_step());
        for (k, &(scale, eagerly)) in plan.iter().enumerate() {
            let t = k as u64 + 2;
            if eagerly {
                step_at(&p, &m, &v, &inputs[k + 1], t, 1e-2 * scale).unwrap();
            } else {
                x.assign_(&inputs[k + 1]).unwrap();
                graph.set_optimizer_step(t, scale as f32).unwrap();
                graph.replay().unwrap();
            }
        }
        let replayed = p.to_vec::<f32>().unwrap();
        let worst = eager
            .iter()
            .zip(&replayed)
            .map(|(a, b)| (a - b).abs() / (1.0 + a.abs()))
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "relative difference {worst:e}");
    }

    /// A graph's private pool is taken from the shared allocator under the capturing tenant:
    /// it counts against that tenant's budget and goes back when the graph drops.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_graphs_memory_is_charged_to_the_capturing_tenant() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let alloc = crate::memory::allocator(&dev).unwrap();
        let tenant = alloc
            .add_tenant("graph-pool-test", TenantLimits::default())
            .unwrap();
        let in_use = || alloc.tenant_stats(tenant).map_or(0, |r| r.in_use);
        let a = crate::memory::with_tenant(tenant, || input(3, &dev));
        let before = in_use();
        let (graph, out) =
            crate::memory::with_tenant(tenant, || capture(&dev, || a.mul(&a)?.add(&a)?.exp()))
                .unwrap();
        let pool = graph.pool_stats().counters.reserved;
        assert!(pool > 0);
        assert_eq!(
            in_use(),
            before + pool,
            "the pool's regions are the tenant's"
        );
        graph.replay().unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap().len(), N);
        drop(out);
        drop(graph);
        assert_eq!(in_use(), before, "the regions go back with the graph");

        // A budget too small for the graph: the capture fails with the allocator's error and the
        // device stays usable.
        let small = alloc
            .add_tenant("graph-pool-small", TenantLimits::limit(1 << 20))
            .unwrap();
        let big = input(4, &dev).reshape(&[64, 64]).unwrap();
        let r = crate::memory::with_tenant(small, || {
            capture(&dev, || {
                let wide = big.broadcast_to(&[512, 64, 64])?;
                wide.add_scalar(1.0)
            })
        });
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("memory"), "{e}");
        assert_eq!(a.add_scalar(1.0).unwrap().to_vec::<f32>().unwrap().len(), N);
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn graph_replays_match_eager_steps() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let inputs: Vec<Tensor> = (0..6).map(|k| input(100 + k, &dev)).collect();
        let fresh = || {
            let p = input(7, &dev);
            let m = Tensor::zeros(&[N], DType::F32, &dev).unwrap();
            let v = Tensor::zeros(&[N], DType::F32, &dev).unwrap();
            (p, m, v)
        };
        let (p, m, v) = fresh();
        for (t, x) in inputs.iter().enumerate() {
            step(&p, &m, &v, x, t as u64 + 1).unwrap();
        }
        let eager = p.to_vec::<f32>().unwrap();

        let (p, m, v) = fresh();
        step(&p, &m, &v, &inputs[0], 1).unwrap();
        let x = inputs[1].copy().unwrap();
        let (graph, ()) = capture(&dev, || step(&p, &m, &v, &x, 2)).unwrap();
        for xi in &inputs[1..] {
            x.assign_(xi).unwrap();
            graph.replay().unwrap();
        }
        let replayed = p.to_vec::<f32>().unwrap();
        for (i, (a, b)) in eager.iter().zip(&replayed).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                "element {i}: eager {a} vs graph {b}"
            );
        }
        assert!(graph.pool_stats().to_string().contains("cuda"));
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn graphs_replayed_concurrently_match_eager_steps() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let inputs: Vec<Tensor> = (0..5).map(|k| input(200 + k, &dev)).collect();
        let fresh = |k: u64| {
            let zeros = || Tensor::zeros(&[N], DType::F32, &dev).unwrap();
            (input(10 + k, &dev), zeros(), zeros())
        };
        let models: Vec<u64> = (0..6).collect();
        let eager: Vec<Vec<f32>> = models
            .iter()
            .map(|&k| {
                let (p, m, v) = fresh(k);
                for (t, x) in inputs.iter().enumerate() {
                    step(&p, &m, &v, x, t as u64 + 1).unwrap();
                }
                p.to_vec::<f32>().unwrap()
            })
            .collect();
        let states: Vec<_> = models.iter().map(|&k| fresh(k)).collect();
        for (p, m, v) in &states {
            step(p, m, v, &inputs[0], 1).unwrap();
        }
        let x = inputs[1].copy().unwrap();
        let graphs: Vec<CudaGraph> = states
            .iter()
            .map(|(p, m, v)| capture(&dev, || step(p, m, v, &x, 2)).unwrap().0)
            .collect();
        let all: Vec<&CudaGraph> = graphs.iter().collect();
        for xi in &inputs[1..] {
            x.assign_(xi).unwrap();
            replay_concurrently(&all, 4).unwrap();
        }
        for (k, ((p, _, _), want)) in states.iter().zip(&eager).enumerate() {
            let got = p.to_vec::<f32>().unwrap();
            let worst = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                .fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "model {k}: relative difference {worst:e}");
        }
    }

    /// A linear layer's step whose weight and bias gradients run on the side stream beside its
    /// input's gradient (the graph forks and joins); SGD on all three (state-free, so eager and
    /// replayed steps compare directly).
    fn side_step(w: &Tensor, b: &Tensor, x: &Tensor) -> Result<()> {
        let xs = x.reshape(&[64, 64])?;
        let g = xs.linear(w, b, false)?;
        let ((gw, gb), gx) = xs.linear_grads_beside(&g, || g.matmul_t(w, false, true))?;
        let gw = gw.add(&gx.mul_scalar(1e-2)?)?;
        Tensor::sgd_step_(w, &gw, None, &[1e-3], 0.0, 0.0, 0.0, false)?;
        Tensor::sgd_step_(b, &gb, None, &[1e-3], 0.0, 0.0, 0.0, false)
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn graphs_with_a_side_stream_branch_match_eager_steps() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let inputs: Vec<Tensor> = (0..5).map(|k| input(300 + k, &dev)).collect();
        // One member (the column-sum epilogue), and three (a product and a reduction).
        for members in [1, 3] {
            side_graph_matches_eager(&dev, &inputs, members);
        }
    }

    fn side_graph_matches_eager(dev: &Device, inputs: &[Tensor], members: usize) {
        let fresh = || {
            let w = Tensor::rand_uniform(&[members, 64, 64], -0.1, 0.1, DType::F32, 8, dev);
            let b = Tensor::rand_uniform(&[members, 1, 64], -0.1, 0.1, DType::F32, 9, dev);
            (w.unwrap(), b.unwrap())
        };
        let (w, b) = fresh();
        for x in inputs {
            side_step(&w, &b, x).unwrap();
        }
        let eager = (w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        let (w, b) = fresh();
        side_step(&w, &b, &inputs[0]).unwrap();
        let x = inputs[1].copy().unwrap();
        let (graph, ()) = capture(dev, || side_step(&w, &b, &x)).unwrap();
        for xi in &inputs[1..] {
            x.assign_(xi).unwrap();
            graph.replay().unwrap();
        }
        for (what, got, want) in [
            ("weight", w.to_vec::<f32>().unwrap(), &eager.0),
            ("bias", b.to_vec::<f32>().unwrap(), &eager.1),
        ] {
            let worst = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-5,
                "{members} members, {what}: relative difference {worst:e}"
            );
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn blocks_freed_during_capture_stay_out_of_the_shared_cache() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let a = input(1, &dev);
        let doomed = Tensor::zeros(&[N], DType::F32, &dev).unwrap();
        let freed_at = ptr(&doomed);
        let (graph, kept) = capture(&dev, || -> Result<Tensor> {
            let out = a.add(&doomed)?;
            drop(doomed);
            Ok(out)
        })
        .unwrap();
        // the freed block is the graph's until it drops; the output lives in the graph's pool
        let later: Vec<Tensor> = (0..8)
            .map(|_| Tensor::zeros(&[N], DType::F32, &dev).unwrap())
            .collect();
        assert!(later.iter().all(|t| ptr(t) != freed_at));
        graph.replay().unwrap();
        assert_eq!(kept.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
        drop(graph);
        drop(kept);
        dev.synchronize().unwrap();
    }

    /// Another thread's work while a graph is captured waits for the capture instead of being
    /// recorded into it (or refused): both threads' results are right.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn other_threads_wait_while_a_graph_is_captured() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let stop = AtomicBool::new(false);
        let a = input(21, &dev);
        let b = input(22, &dev);
        let want_a: Vec<f32> = a.to_vec::<f32>().unwrap().iter().map(|v| v + 1.0).collect();
        let want_b: Vec<f32> = b.to_vec::<f32>().unwrap().iter().map(|v| v * 2.0).collect();
        std::thread::scope(|s| {
            let worker = s.spawn(|| -> Result<usize> {
                let mut rounds = 0;
                while !stop.load(Ordering::Acquire) || rounds == 0 {
                    assert_eq!(a.add_scalar(1.0)?.to_vec::<f32>()?, want_a);
                    rounds += 1;
                }
                Ok(rounds)
            });
            for _ in 0..20 {
                let (graph, out) = capture(&dev, || b.mul_scalar(2.0)).unwrap();
                graph.replay().unwrap();
                assert_eq!(out.to_vec::<f32>().unwrap(), want_b);
            }
            stop.store(true, Ordering::Release);
            let rounds = worker.join().unwrap().unwrap();
            assert!(rounds > 0);
        });
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_read_back_inside_a_capture_is_an_error_and_the_device_recovers() {
        let _turn = exclusive();
        let dev = Device::Cuda(0);
        let a = input(2, &dev);
        let r = capture(&dev, || a.add_scalar(1.0)?.to_vec::<f32>());
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("captured"), "{e}");
        let b = a.add_scalar(1.0).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(b.len(), N);
        assert!(capture(&Device::Cpu, || Ok::<_, Error>(())).is_err());
    }
}
