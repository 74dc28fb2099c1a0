//! `memory-trace.json`: a run's memory over time as a Chrome trace, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open. Per member three counters: its live bytes (what its tenant held at the height of each
//! logged step), its reserved bytes (what the pool held on its behalf: its high-water mark since the previous
//! record, or its guaranteed reserve) and its limit; and an instant event at each of its events (out of memory, a
//! batch change, a budget changed, memory handed back, a failure). On a GPU also the process: what the driver saw
//! it hold, the pool's reserved bytes and limit, and what lies outside the pool (`memory.jsonl`, once a second).
//! Written from the run's own records ([`crate::memory_timeline`], as `memory.png` is), so a trace costs the
//! training nothing.

use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::memory_timeline::{DeviceTimeline, MemberTimeline, Timeline};

/// The trace's file name in a run directory.
pub const FILE: &str = "memory-trace.json";

/// Microseconds, the trace's unit.
fn micros(seconds: f64) -> f64 {
    seconds * 1e6
}

/// A counter sample.
fn counter(pid: u32, name: &str, seconds: f64, bytes: u64) -> Value {
    json!({"name": name, "ph": "C", "ts": micros(seconds), "pid": pid, "args": {"bytes": bytes}})
}

/// The trace events of one member: its live and reserved bytes, its limit and its events.
fn member_events(m: &MemberTimeline, out: &mut Vec<Value>) {
    let name = &m.name;
    for &(t, b) in &m.live {
        out.push(counter(1, &format!("{name} live"), t, b));
    }
    for &(t, b) in &m.reserved {
        out.push(counter(1, &format!("{name} reserved"), t, b));
    }
    for s in &m.limits {
        out.push(counter(1, &format!("{name} limit"), s.from, s.bytes));
        out.push(counter(1, &format!("{name} limit"), s.to, s.bytes));
    }
    for e in &m.events {
        out.push(
            json!({"name": e.text, "ph": "i", "s": "p", "ts": micros(e.time), "pid": 1, "tid": 0,
            "args": {"member": name, "step": e.step, "batch": e.batch}}),
        );
    }
}

/// The trace events of the process on a GPU.
fn process_events(d: &DeviceTimeline, out: &mut Vec<Value>) {
    for (series, name) in [
        (&d.process, "process (nvidia-smi)"),
        (&d.pool_reserved, "pool reserved"),
        (&d.pool_limit, "pool limit"),
        (&d.outside_pool, "outside the pool"),
    ] {
        out.extend(series.iter().map(|&(t, b)| counter(0, name, t, b)));
    }
}

/// The trace of `timeline`, as JSON.
pub fn trace(timeline: &Timeline) -> Value {
    let mut out = vec![
        json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "device"}}),
        json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "members"}}),
    ];
    process_events(&timeline.device, &mut out);
    for m in &timeline.members {
        member_events(m, &mut out);
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"})
}

/// Writes `root/memory-trace.json` of the run's `timeline`.
///
/// # Errors
/// The trace cannot be written.
pub fn write(root: &Path, timeline: &Timeline) -> Result<()> {
    let path = root.join(FILE);
    std::fs::write(&path, trace(timeline).to_string()).map_err(|e| Error::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_timeline::Span;

    #[test]
    fn each_member_has_live_reserved_and_limit_counters() {
        let t = Timeline {
            members: vec![MemberTimeline {
                name: "hog".into(),
                live: vec![(1.0, 100), (2.0, 90)],
                reserved: vec![(1.0, 150), (2.0, 200)],
                limits: vec![Span {
                    from: 1.0,
                    to: 2.0,
                    bytes: 1000,
                }],
                ..MemberTimeline::default()
            }],
            device: DeviceTimeline {
                pool_reserved: vec![(1.0, 4096)],
                pool_limit: vec![(1.0, 1 << 20)],
                ..DeviceTimeline::default()
            },
        };
        let v = trace(&t);
        let events = v["traceEvents"].as_array().unwrap();
        let samples = |n: &str| -> Vec<(f64, u64)> {
            events
                .iter()
                .filter(|e| e["name"] == n && e["ph"] == "C")
                .map(|e| {
                    (
                        e["ts"].as_f64().unwrap(),
                        e["args"]["bytes"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        assert_eq!(samples("hog live"), [(1e6, 100), (2e6, 90)]);
        assert_eq!(samples("hog reserved"), [(1e6, 150), (2e6, 200)]);
        assert_eq!(samples("hog limit"), [(1e6, 1000), (2e6, 1000)]);
        assert_eq!(samples("pool reserved"), [(1e6, 4096)]);
        assert_eq!(samples("pool limit"), [(1e6, 1 << 20)]);
    }
}
