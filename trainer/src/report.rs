//! The end-of-run summary: a table for people and `summary.json` for programs.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::objective::Scores;

/// How a member (a sweep's trial) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It trained to its end: its epochs or steps, an early stop, or a stop through the control file.
    #[default]
    Completed,
    /// A sweep's scheduler (ASHA, median stopping) ended it at a rung for its validation metric.
    Pruned,
    /// An error ended it: out of memory, a loss that stopped being finite, a failed step.
    Failed,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Completed => "completed",
            Status::Pruned => "pruned",
            Status::Failed => "failed",
        })
    }
}

/// One member's line of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberSummary {
    /// The member's name.
    pub name: String,
    /// How it ended.
    #[serde(default)]
    pub status: Status,
    /// Its index in the sweep (`[search]`), for a sampled trial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<usize>,
    /// The values that set it apart from its siblings: a trial's sampled values and grid values, by the short
    /// name of their key (`lr`, `width`, `dropout`, `batch`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
    /// The best value of the sweep's metric over its validations (the one it is ranked by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_metric: Option<f64>,
    /// The sweep's best trial.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub best: bool,
    /// Its checkpoint of its best validation, relative to the run directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_checkpoint: Option<String>,
    /// The data set it trained on.
    #[serde(default)]
    pub data: String,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Epochs completed.
    pub epochs: u64,
    /// Mean training loss over the last logged interval.
    pub final_loss: f64,
    /// Accuracy on the test split at the end.
    pub test_accuracy: Option<f64>,
    /// Accuracy on the validation split at its last evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// Loss on the validation split at its last evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Every validation score at its last evaluation (top-k, perplexity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val: Option<Scores>,
    /// Every test score at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<Scores>,
    /// Peak bytes held by the member's allocator tenant.
    pub peak_memory_bytes: u64,
    /// Optimizer steps per second of training time (warm-up excluded).
    pub model_steps_per_s: f64,
    /// Out-of-memory events the member recovered from (or died of).
    pub oom_events: u64,
    /// Its precision policy (`fp32`, `tf32`, `bf16`, `f16`); `fp32` in summaries of earlier versions.
    #[serde(default = "fp32")]
    pub precision: String,
    /// Under `f16`: the steps whose update the loss scaler skipped (gradients not finite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<u64>,
    /// Batch size at the end (smaller than configured after OOM shrinking).
    pub batch: usize,
    /// The device it ended on.
    pub device: String,
    /// The fused group it trained in, if any (the other members' names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused_with: Vec<String>,
    /// Why it stopped early, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

fn fp32() -> String {
    "fp32".into()
}

/// A search dimension as the sweep's report shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dimension {
    /// The hyper-parameter's short name (a key of [`MemberSummary::hyperparameters`]).
    pub name: String,
    /// `loguniform`, `uniform`, `int`, `loguniform-int`, `choice` or `grid`: a plot's axis is logarithmic for the
    /// log forms.
    pub kind: String,
}

/// A sweep's part of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    /// The validation metric trials are ranked by (`val_accuracy`, `val_loss`, …).
    pub metric: String,
    /// `max` or `min`.
    pub mode: String,
    /// `asha`, `median` or `none`.
    pub scheduler: String,
    /// The dimensions searched.
    pub dimensions: Vec<Dimension>,
    /// Trials by how they ended.
    pub completed: usize,
    /// Pruned trials.
    pub pruned: usize,
    /// Failed trials.
    pub failed: usize,
    /// The best trial's name.
    pub best: Option<String>,
}

/// The whole run's summary (`runs/<run>/summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The run directory.
    pub run_dir: String,
    /// The device.
    pub device: String,
    /// The schedule.
    pub schedule: String,
    /// Wall-clock seconds of this process's run.
    pub wall_seconds: f64,
    /// Each member.
    pub members: Vec<MemberSummary>,
    /// On a GPU, everything the process held on it at the end: the pool and what lies outside it.
    #[serde(default)]
    pub process_memory: Option<cohort_tensor::memory::ProcessMemory>,
    /// The most the driver saw the process hold on the GPU while it trained (sampled once a second).
    #[serde(default)]
    pub peak_process_bytes: Option<u64>,
    /// The sweep, for a run with a `[search]` table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepSummary>,
}

/// `1,880`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `3.1 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Summary {
    /// The members that ended on a failure (an error, out of memory, a loss that stopped being finite), with
    /// the reason; a member stopped through the control file, early or by a sweep's scheduler did not fail.
    pub fn failures(&self) -> Vec<(&str, &str)> {
        self.members
            .iter()
            .filter(|m| m.status == Status::Failed)
            .map(|m| (m.name.as_str(), m.stopped.as_deref().unwrap_or("failed")))
            .collect()
    }

    /// Writes `summary.json` atomically.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::json("summary", e))?;
        crate::checkpoint::write_atomic(path, &json)
    }

    /// Reads a `summary.json`.
    ///
    /// # Errors
    /// I/O or JSON errors naming the file.
    pub fn read(path: &Path) -> Result<Summary> {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&text).map_err(|e| Error::json(path.display().to_string(), e))
    }

    /// The member of those on `data` with the best validation scores (highest accuracy, or lowest loss where
    /// there is none): never chosen on the test split, which would make its test figure optimistic. `None`
    /// without validation scores.
    pub fn best(&self, data: &str) -> Option<&MemberSummary> {
        self.members
            .iter()
            .filter(|m| m.data == data)
            .filter_map(|m| m.val.as_ref().map(|v| (m, v)))
            .reduce(|best, m| if m.1.better_than(best.1) { m } else { best })
            .map(|(m, _)| m)
    }
}

impl fmt::Display for Summary {
    /// The table: member, steps, final loss, test accuracy, peak memory, model-steps/s, OOM events, and the device
    /// with the precision policy where it is not fp32.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self
            .members
            .iter()
            .map(|m| m.name.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<w$}  {:>7}  {:>10}  {:>11}  {:>11}  {:>10}  {:>8}  {:>10}  device",
            "member", "steps", "final loss", "val", "test", "peak mem", "steps/s", "OOM events",
        );
        for m in &self.members {
            let score = |s: &Option<Scores>| s.as_ref().map_or("-".to_string(), Scores::headline);
            let mut device = m.device.clone();
            // The policy where it is not the default, as compact as the column is.
            if m.precision != "fp32" {
                let _ = write!(device, " {}", m.precision);
            }
            if let Some(n) = m.skipped_steps.filter(|&n| n > 0) {
                let _ = write!(device, " ({n} skipped)");
            }
            if let Some(s) = &m.stopped {
                let _ = write!(device, " ({s})");
            }
            if !m.fused_with.is_empty() {
                let _ = write!(device, " fused×{}", m.fused_with.len() + 1);
            }
            let _ = writeln!(
                out,
                "{:<w$}  {:>7}  {:>10.4}  {:>11}  {:>11}  {:>10}  {:>8}  {:>10}  {}",
                m.name,
                thousands(m.steps),
                m.final_loss,
                score(&m.val),
                score(&m.test),
                bytes(m.peak_memory_bytes),
                thousands(m.model_steps_per_s.round() as u64),
                m.oom_events,
                device
            );
        }
        if let Some(p) = &self.process_memory {
            let held = p.process.map_or("-".to_string(), bytes);
            let peak = self.peak_process_bytes.map_or("-".to_string(), bytes);
            let _ = writeln!(
                out,
                "{}: the process held {held} at the end (peak {peak}, sampled once a second): pool {} (limit {}), \
                 outside it {} (the CUDA context and what is loaded into it)",
                p.device,
                bytes(p.pool_reserved),
                bytes(p.pool_limit),
                p.outside_pool.map_or("-".to_string(), bytes),
            );
        }
        f.write_str(out.trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(1880), "1,880");
        assert_eq!(thousands(250), "250");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(bytes(3 * 1024 * 1024 + 100 * 1024), "3.1 MiB");
        assert_eq!(bytes(512), "512 B");
    }
}
