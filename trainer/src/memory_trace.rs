//! `memory-trace.json`: a run's memory over time as a Chrome trace, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open. Per member: a counter of the bytes its budget held at each logged step, a counter of
//! its limit, and an instant event at each of its events (out of memory, a batch change, a budget changed, memory
//! handed back, a failure). On a GPU also the process: what the driver saw it hold, the pool's reserved bytes and
//! limit, and what lies outside the pool (`memory.jsonl`, once a second). Written from the run's own records, so a
//! trace costs the training nothing.

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::metrics::MetricRecord;

/// The trace's file name in a run directory.
pub const FILE: &str = "memory-trace.json";

/// Microseconds, the trace's unit.
fn micros(seconds: f64) -> f64 {
    seconds * 1e6
}

/// The trace events of one member: its live bytes, its limit and its events.
fn member_events(name: &str, limit: Option<u64>, records: &[MetricRecord], out: &mut Vec<Value>) {
    for r in records {
        let ts = micros(r.time);
        match &r.event {
            None => out.push(
                json!({"name": format!("{name} live"), "ph": "C", "ts": ts, "pid": 1,
                "args": {"bytes": r.mem_bytes}}),
            ),
            Some(text) => out.push(
                json!({"name": text, "ph": "i", "s": "p", "ts": ts, "pid": 1, "tid": 0,
                "args": {"member": name, "step": r.step, "batch": r.batch}}),
            ),
        }
    }
    if let (Some(l), Some(first), Some(last)) = (limit, records.first(), records.last()) {
        for r in [first, last] {
            out.push(
                json!({"name": format!("{name} limit"), "ph": "C", "ts": micros(r.time), "pid": 1,
                "args": {"bytes": l}}),
            );
        }
    }
}

/// The trace events of the process on a GPU, from `memory.jsonl`.
fn process_events(lines: &str, out: &mut Vec<Value>) {
    for v in lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let ts = micros(v["time"].as_f64().unwrap_or(0.0));
        for (key, name) in [
            ("process", "process (nvidia-smi)"),
            ("pool_reserved", "pool reserved"),
            ("pool_limit", "pool limit"),
            ("outside_pool", "outside the pool"),
        ] {
            if let Some(b) = v[key].as_u64() {
                out.push(
                    json!({"name": name, "ph": "C", "ts": ts, "pid": 0, "args": {"bytes": b}}),
                );
            }
        }
    }
}

/// Writes `root/memory-trace.json` for `members` (name and limit in bytes) from their `metrics.jsonl` and, on a
/// GPU, the run's `memory.jsonl`.
///
/// # Errors
/// A record file that cannot be read, or the trace that cannot be written.
pub fn write(root: &Path, members: &[(String, Option<u64>)]) -> Result<()> {
    let mut out = vec![
        json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "device"}}),
        json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "members"}}),
    ];
    let gpu = root.join(crate::run_dir::MEMORY_LOG_FILE);
    if let Ok(text) = std::fs::read_to_string(&gpu) {
        process_events(&text, &mut out);
    }
    for (name, limit) in members {
        let records = crate::metrics::read(&root.join(name).join("metrics.jsonl"))?;
        member_events(name, *limit, &records, &mut out);
    }
    let path = root.join(FILE);
    let text = json!({"traceEvents": out, "displayTimeUnit": "ms"}).to_string();
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
}
