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
    /// Bytes the member's tenant holds ("live"): at the height of its latest step (its share, in a fused group).
    pub mem_bytes: u64,
    /// The tenant's high-water mark since the member's previous logged record (its share, in a fused group): what
    /// the pool grew to hold on its behalf, and keeps cached for it unless trimmed. Logged records only; absent from
    /// those of older runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_peak_bytes: Option<u64>,
    /// The member's guaranteed reserve (`[member.memory] reserve`), when it has one: the pool keeps it available for
    /// the member even while it uses less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_reserve_bytes: Option<u64>,
    /// The member's limit at this record (it changes through the control file), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit_bytes: Option<u64>,
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

impl MetricRecord {
    /// What the pool holds on the member's behalf over the interval this record closes ("reserved"): its
    /// high-water mark or its guaranteed reserve, whichever is larger, and never less than what it holds. `None` for
    /// events and for records written before cohort kept the figure.
    pub fn reserved_bytes(&self) -> Option<u64> {
        self.mem_peak_bytes.map(|high_water| {
            crate::memory::MemberUsage {
                live: self.mem_bytes,
                high_water,
                limit: self.mem_limit_bytes,
                reserve: self.mem_reserve_bytes.unwrap_or(0),
            }
            .reserved()
        })
    }
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

/// The records of each of `members` of the run in `root`, in their order.
///
/// # Errors
/// As [`read`].
pub fn read_members<'a>(
    root: &Path,
    members: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<Vec<MetricRecord>>> {
    members
        .into_iter()
        .map(|name| read(&root.join(name).join("metrics.jsonl")))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_without_the_memory_figures_still_parse() {
        // A logged record of cohort 0.1: no peak, reserve or limit.
        let old = r#"{"step":20,"epoch":0,"time":1.5,"loss":0.7,"lr":0.001,"batch":32,"steps_per_s":900.0,"mem_bytes":4096}"#;
        let r: MetricRecord = serde_json::from_str(old).unwrap();
        assert_eq!(
            (r.mem_bytes, r.mem_peak_bytes, r.mem_limit_bytes),
            (4096, None, None)
        );
        assert_eq!(r.reserved_bytes(), None, "unknown, not guessed");

        let new = MetricRecord {
            mem_peak_bytes: Some(6000),
            mem_reserve_bytes: Some(8192),
            mem_limit_bytes: Some(1 << 20),
            ..r.clone()
        };
        let line = serde_json::to_string(&new).unwrap();
        assert!(line.contains(r#""mem_peak_bytes":6000"#), "{line}");
        assert_eq!(serde_json::from_str::<MetricRecord>(&line).unwrap(), new);
        // Reserved: the reserve where it is above the high-water mark, the mark where it is above the reserve.
        assert_eq!(new.reserved_bytes(), Some(8192));
        let busy = MetricRecord {
            mem_peak_bytes: Some(9000),
            ..new.clone()
        };
        assert_eq!(busy.reserved_bytes(), Some(9000));
        // Old readers' view: the record without the new keys is what cohort 0.1 wrote.
        assert_eq!(serde_json::to_string(&r).unwrap(), old);
    }
}
