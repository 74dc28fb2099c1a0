//! Opt-in GPU time per kernel: with `COHORT_CUDA_PROFILE=1` in the environment, every launch and
//! cuBLAS call on the compute stream is bracketed by a pair of timing events, and
//! [`Gpu::kernel_profile`](super::Gpu::kernel_profile) sums their elapsed times by kernel. Off by
//! default: two events per launch cost host time a training step cannot spare.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::{KernelTime, cuda_err};
use crate::Result;

struct Span {
    label: String,
    start: CudaEvent,
    end: CudaEvent,
}

pub(super) struct Profile {
    spans: Mutex<Vec<Span>>,
}

impl Profile {
    pub(super) fn from_env() -> Option<Profile> {
        std::env::var_os("COHORT_CUDA_PROFILE")
            .filter(|v| !v.is_empty() && v != "0")
            .map(|_| Profile {
                spans: Mutex::new(Vec::new()),
            })
    }

    /// Runs `f` (which queues work on `stream`) between two timing events.
    pub(super) fn span<R>(
        &self,
        stream: &Arc<CudaStream>,
        label: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream
            .record_event(timed)
            .map_err(|e| cuda_err("recording a profile event", e))?;
        let out = f()?;
        let end = stream
            .record_event(timed)
            .map_err(|e| cuda_err("recording a profile event", e))?;
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Span {
                label: label(),
                start,
                end,
            });
        Ok(out)
    }

    /// Sums and forgets the spans recorded so far (waiting for them), the most expensive first.
    pub(super) fn drain(&self) -> Result<Vec<KernelTime>> {
        let spans = std::mem::take(&mut *self.spans.lock().unwrap_or_else(PoisonError::into_inner));
        let mut by_label: HashMap<String, (usize, f64)> = HashMap::new();
        for s in spans {
            let ms = s
                .start
                .elapsed_ms(&s.end)
                .map_err(|e| cuda_err("reading a profile event", e))?;
            let e = by_label.entry(s.label).or_default();
            e.0 += 1;
            e.1 += f64::from(ms);
        }
        let mut out: Vec<KernelTime> = by_label
            .into_iter()
            .map(|(label, (calls, total_ms))| KernelTime {
                label,
                calls,
                total_ms,
            })
            .collect();
        out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        Ok(out)
    }
}
