//! `metrics.jsonl`: one JSON object per logged step of a member, the source of the plots.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::objective::Scores;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    /// Optimizer steps taken.
    pub step: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Seconds since the run started (across resumes: since this process started plus the time before).
    pub time: f64,
    /// Mean training loss since the previous record.
    pub loss: f64,
    /// Learning rate at this step.
    pub lr: f64,
    /// Current batch size.
    pub batch: usize,
    /// Training throughput since the previous record, optimizer steps per second.
    pub steps_per_s: f64,
    /// Bytes the member's tenant holds.
    pub mem_bytes: u64,
    /// Test accuracy, when evaluated at this step (also in `test`; kept for readers of cohort 0.1's records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    /// Validation scores, when evaluated at this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val: Option<Scores>,
    /// Test scores, at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<Scores>,
    /// An event at this step (OOM recovery, pause, batch change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// Appends records to a member's `metrics.jsonl`, each as it is written (one `write` per line, no buffer): a live
/// reader sees it at once and a crash loses nothing written.
#[derive(Debug)]
pub struct MetricsWriter {
    path: PathBuf,
    out: File,
}

impl MetricsWriter {
    /// Opens `dir/metrics.jsonl` for appending. When `keep_until` is given (a resume), records after that step,
    /// written by the interrupted run after its last checkpoint, are dropped first.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn open(dir: &Path, keep_until: Option<u64>) -> Result<MetricsWriter> {
        let path = dir.join("metrics.jsonl");
        if let Some(step) = keep_until {
            let kept: Vec<MetricRecord> = read(&path)?
                .into_iter()
                .filter(|r| r.step <= step)
                .collect();
            let mut text = String::new();
            for r in &kept {
                text.push_str(
                    &serde_json::to_string(r).map_err(|e| Error::json("metrics record", e))?,
                );
                text.push('\n');
            }
            fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        Ok(MetricsWriter { path, out: f })
    }

    /// Appends one record.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&mut self, r: &MetricRecord) -> Result<()> {
        let mut line = serde_json::to_string(r).map_err(|e| Error::json("metrics record", e))?;
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Makes what was written durable (`fsync`): a checkpoint's records survive a power cut with it.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn sync(&mut self) -> Result<()> {
        self.out.sync_data().map_err(|e| Error::io(&self.path, e))
    }
}

/// Reads a `metrics.jsonl` (missing file: no records; a torn last line from a crash is skipped).
///
/// # Errors
/// I/O errors naming the file.
pub fn read(path: &Path) -> Result<Vec<MetricRecord>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if let Ok(r) = serde_json::from_str::<MetricRecord>(&line) {
            out.push(r);
        }
    }
    Ok(out)
}
