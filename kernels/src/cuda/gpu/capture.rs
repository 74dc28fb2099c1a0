//! CUDA graphs: capture of the compute stream, replays (alone or side by side), and the turns that keep other
//! threads' work out of a capture in progress.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, result as drv, sys};

use super::memory::scratch_bytes;
use super::{DeviceBuffer, Gpu, PinnedBuffer, cuda_err, lock};
use crate::{Error, Result};

/// Side streams for concurrent replays, each with the event its last replay recorded, and the event they start from
/// (reused: creating events per replay costs host time a small model's step cannot spare).
#[derive(Default)]
pub(super) struct Lanes {
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
        let mut guard = lock(&self.capture.lanes);
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
        self.capture.capturing.load(Ordering::Acquire)
            && lock(&self.capture.turns).owner == Some(std::thread::current().id())
    }

    /// This thread's turn to use the device (queue work, or allocate and free where that may
    /// synchronize): waits while another thread captures a graph here, and keeps a capture from
    /// beginning until the returned guard drops.
    pub fn turn(&self) -> Turn<'_> {
        let mut t = lock(&self.capture.turns);
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

    pub(super) fn refuse_in_capture(&self, what: &str) -> Result<()> {
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
            let mut t = lock(&self.capture.turns);
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
        self.capture.capturing.store(true, Ordering::Release);
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
        self.capture.capturing.store(false, Ordering::Release);
        let mut t = lock(&self.capture.turns);
        t.owner = None;
        t.wake(&self.capture.turn_changed);
    }

    /// Waits (counted as waiting) until the turns change.
    fn wait_for_turns<'a>(&self, mut t: MutexGuard<'a, Turns>) -> MutexGuard<'a, Turns> {
        t.waiting += 1;
        let mut t = self
            .capture
            .turn_changed
            .wait(t)
            .unwrap_or_else(PoisonError::into_inner);
        t.waiting -= 1;
        t
    }

    /// Keeps `host` (the pinned source of a captured copy) for the graph being captured: its replays copy from it.
    pub(super) fn keep_for_graph(&self, host: PinnedBuffer) {
        lock(&self.capture.host).push(host);
    }

    /// The address of a scratch area of at least `bytes` for an op being captured (on the side stream where `side`),
    /// the graph's own. The graph's nodes on one stream run one after another, so they share the graph's area as
    /// eager ops share the stream's; a larger need gets a new area (earlier nodes keep theirs).
    pub(super) fn graph_scratch(&self, side: bool, bytes: usize) -> Result<u64> {
        let list = if side {
            &self.capture.side_scratch
        } else {
            &self.capture.scratch
        };
        let mut areas = lock(list);
        if areas.last().is_none_or(|a| a.bytes() < bytes) {
            areas.push(self.alloc(scratch_bytes(bytes))?);
        }
        Ok(areas.last().map(DeviceBuffer::ptr).unwrap_or_default())
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
        let host = std::mem::take(&mut *lock(&self.capture.host));
        let mut scratch = std::mem::take(&mut *lock(&self.capture.scratch));
        scratch.append(&mut lock(&self.capture.side_scratch));
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

/// A device's capture state: whose work the device takes, and what a capture in progress keeps for its graph.
#[derive(Default)]
pub(super) struct Capture {
    /// A CUDA graph is being captured on the compute stream (by `turns.owner`).
    capturing: AtomicBool,
    /// Whose work the device takes: every thread's, or only the capturing thread's while a capture
    /// runs (a capture records whatever is queued on the compute stream, by any thread).
    turns: Mutex<Turns>,
    turn_changed: Condvar,
    /// Host bytes copied to the device during the capture, kept (pinned) for the graph's replays.
    host: Mutex<Vec<PinnedBuffer>>,
    /// Scratch areas of ops captured meanwhile: each graph owns its own, so graphs may replay concurrently.
    scratch: Mutex<Vec<DeviceBuffer>>,
    /// Those of ops captured on the side stream, whose nodes run alongside the compute stream's.
    side_scratch: Mutex<Vec<DeviceBuffer>>,
    /// Side streams for replaying graphs concurrently ([`Gpu::replay_concurrently`]), created on first use.
    lanes: Mutex<Lanes>,
}

/// Who may queue work on a device ([`Gpu::turn`]).
#[derive(Debug, Default)]
pub(super) struct Turns {
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
            let mut t = lock(&self.gpu.capture.turns);
            t.active -= 1;
            t.wake(&self.gpu.capture.turn_changed);
        }
    }
}
