//! The simulated device's stream: how far the device has got through the work the host queued on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The lag of a device that catches up only when told to or waited for.
const HELD: u64 = u64::MAX;

/// A handle on a [`SimMemory`](super::SimMemory)'s stream, shared by its clones: the host's clock (ticks of
/// queued work) and how far behind it the device runs. Tests and trace replay drive it to say whether the device
/// has passed the point that recorded a page's last use.
///
/// By default the device keeps up (lag 0): a point is passed as soon as it is recorded, as on host memory.
#[derive(Clone, Debug, Default)]
pub struct SimStream {
    clock: Arc<Clock>,
}

#[derive(Debug, Default)]
struct Clock {
    /// Ticks of work the host has queued.
    now: AtomicU64,
    /// The device has finished all work queued before this tick, whatever its lag.
    done: AtomicU64,
    /// The device finishes work this many ticks after it was queued.
    lag: AtomicU64,
}

impl SimStream {
    /// The host queues one more piece of work (trace replay ticks once per operation).
    pub fn tick(&self) {
        self.clock.now.fetch_add(1, Ordering::Relaxed);
    }

    /// The device finishes work `ticks` ticks after the host queued it (0: at once), from the next tick on: what
    /// it finished stays finished.
    pub fn set_lag(&self, ticks: u64) {
        self.clock
            .done
            .fetch_max(self.frontier(), Ordering::Relaxed);
        self.clock.lag.store(ticks, Ordering::Relaxed);
        self.tick();
    }

    /// The device stops: from now on it passes a point only when [`catch_up`](Self::catch_up) says so or the
    /// allocator waits for it.
    pub fn hold(&self) {
        self.set_lag(HELD);
    }

    /// The device finishes everything queued so far (what a device synchronisation does).
    pub fn catch_up(&self) {
        self.finish(self.now());
    }

    /// Ticks queued so far.
    pub fn now(&self) -> u64 {
        self.clock.now.load(Ordering::Relaxed)
    }

    /// Whether the device has finished the work queued up to and including `tick`.
    pub fn passed(&self, tick: u64) -> bool {
        tick < self.frontier()
    }

    /// The first tick whose work the device has not finished.
    fn frontier(&self) -> u64 {
        let c = &self.clock;
        let lag = c.lag.load(Ordering::Relaxed);
        let by_lag = if lag == HELD {
            0
        } else {
            (self.now() + 1).saturating_sub(lag)
        };
        by_lag.max(c.done.load(Ordering::Relaxed))
    }

    /// The host waited until the device finished the work queued up to and including `tick`.
    pub(crate) fn finish(&self, tick: u64) {
        self.clock.done.fetch_max(tick + 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::SimStream;

    #[test]
    fn a_lagging_device_passes_work_lag_ticks_after_it_was_queued() {
        let s = SimStream::default();
        assert!(s.passed(0), "lag 0: done at once");
        s.set_lag(3);
        let t = s.now();
        for _ in 0..2 {
            s.tick();
            assert!(!s.passed(t));
        }
        s.tick();
        assert!(s.passed(t) && !s.passed(t + 1));
        s.hold();
        s.tick();
        s.tick();
        assert!(s.passed(t), "what was finished stays finished");
        assert!(!s.passed(t + 1), "held: nothing more finishes by itself");
        s.finish(t + 1);
        assert!(s.passed(t + 1) && !s.passed(t + 2));
        s.catch_up();
        assert!(s.passed(s.now()));
    }
}
