//! Bounded event recording and its export as Chrome trace JSON (opens in Perfetto and chrome://tracing).

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::tenant::TenantId;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A block was handed out.
    Alloc,
    /// A block came back.
    Free,
    /// A region was reserved from the source.
    Reserve,
    /// A region went back to the source.
    Release,
    /// Physical pages were mapped (created or moved).
    Map,
    /// Physical pages were released.
    Unmap,
    /// An allocation failed.
    Oom,
}

/// One recorded event, with the totals right after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Nanoseconds since the allocator was made.
    pub t_ns: u64,
    /// What happened.
    pub kind: EventKind,
    /// The tenant it was for.
    pub tenant: TenantId,
    /// Bytes of the block, region or pages.
    pub bytes: u64,
    /// Address of the block or region.
    pub ptr: u64,
    /// All tenants' live bytes after it.
    pub in_use: u64,
    /// Reserved bytes after it.
    pub reserved: u64,
    /// The tenant's live bytes after it.
    pub tenant_in_use: u64,
}

/// A ring of the last `capacity` events; recording never allocates once it is made.
#[derive(Debug)]
pub(crate) struct EventLog {
    buf: VecDeque<Event>,
    capacity: usize,
    start: Instant,
    pub dropped: u64,
}

impl EventLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: VecDeque::with_capacity(capacity),
            capacity,
            start: Instant::now(),
            dropped: 0,
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn push(&mut self, e: Event) {
        if self.buf.len() == self.capacity {
            self.buf.pop_front();
            self.dropped += 1;
        }
        self.buf.push_back(e);
    }

    pub fn events(&self) -> Vec<Event> {
        self.buf.iter().copied().collect()
    }
}

/// Chrome trace JSON: counter tracks `reserved` and `in use` (one series per tenant), OOMs as instant events.
pub(crate) fn chrome_trace(events: &[Event], tenant_names: &[String], device: &str) -> String {
    let mut out = Vec::with_capacity(events.len() * 2 + 1);
    out.push(json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": format!("cohort-alloc {device}")}}));
    let mut per_tenant = vec![0u64; tenant_names.len()];
    for e in events {
        let ts = e.t_ns as f64 / 1000.0;
        out.push(json!({"name": "reserved", "ph": "C", "ts": ts, "pid": 0, "args": {"bytes": e.reserved}}));
        if let Some(slot) = per_tenant.get_mut(e.tenant.index()) {
            *slot = e.tenant_in_use;
        }
        let mut args = Map::new();
        for (name, v) in tenant_names.iter().zip(&per_tenant) {
            args.insert(name.clone(), Value::from(*v));
        }
        out.push(json!({"name": "in use", "ph": "C", "ts": ts, "pid": 0, "args": args}));
        if e.kind == EventKind::Oom {
            let name = tenant_names
                .get(e.tenant.index())
                .cloned()
                .unwrap_or_default();
            out.push(
                json!({"name": "out of memory", "ph": "i", "s": "p", "ts": ts, "pid": 0, "tid": 0,
                "args": {"tenant": name, "requested": e.bytes}}),
            );
        }
    }
    json!({"traceEvents": out, "displayTimeUnit": "ms"}).to_string()
}
