//! Trace replay: real allocation sequences (`op,id,bytes` CSV, optionally gzip) through the allocator on a
//! simulated device, with the figures that compare it to PyTorch's caching allocator.
//!
//! The simulated device runs [`ReplayOptions::stream_lag`] operations behind the host: a page freed at one
//! operation may be moved without waiting only that many operations later. Waits the allocator made anyway are
//! reported ([`ReplayReport::synchronising_moves`], [`ReplayReport::stream_waits`]).

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bfc::{Bfc, Block};
use crate::config::{
    Config, DEFAULT_IDLE_PAGE_SLACK, DEFAULT_LARGE_BLOCK, DEFAULT_PLACEMENT_CANDIDATES, Policy,
};
use crate::error::{Error, Result};
use crate::sim::SimMemory;
use crate::tenant::TenantId;

/// One line of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceOp {
    /// Allocate block `id` of `bytes`.
    Alloc {
        /// The block's id (unique in the trace).
        id: u64,
        /// Its size.
        bytes: u64,
    },
    /// Free block `id`.
    Free {
        /// The block's id.
        id: u64,
    },
    /// Give every idle region or page back ([`Bfc::trim`]).
    Trim,
}

/// A parsed, checked trace.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Where it came from.
    pub name: String,
    /// The operations in order.
    pub ops: Vec<TraceOp>,
    /// Highest sum of live block sizes.
    pub peak_live_bytes: u64,
}

/// Reads a trace file; `.gz` files (or any file starting with the gzip magic) are decompressed.
///
/// # Errors
/// [`Error::Trace`] with the path and line number of the first bad line, or the I/O error.
pub fn read_trace(path: &Path) -> Result<Trace> {
    let name = path.display().to_string();
    let io = |e: std::io::Error| Error::Trace {
        path: name.clone(),
        line: 0,
        detail: e.to_string(),
    };
    let mut file = BufReader::new(File::open(path).map_err(io)?);
    let magic = file.fill_buf().map_err(io)?;
    let gz = magic.len() >= 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    parse_trace(BufReader::new(reader), &name)
}

impl Trace {
    /// A trace of `ops`, checked as [`parse_trace`] checks a file.
    ///
    /// # Errors
    /// [`Error::Trace`] naming the line of the file form ([`to_csv`](Self::to_csv); operation k is line k + 1) that
    /// allocates a live id or frees one that is not.
    pub fn from_ops(name: &str, ops: Vec<TraceOp>) -> Result<Trace> {
        parse_trace(std::io::Cursor::new(Trace::csv_of(&ops)), name)
    }

    /// The trace in its file form, which [`read_trace`] and `cohort replay` read back.
    pub fn to_csv(&self) -> String {
        Trace::csv_of(&self.ops)
    }

    fn csv_of(ops: &[TraceOp]) -> String {
        use std::fmt::Write;
        let mut s = String::from("op,id,bytes\n");
        for op in ops {
            // Writing to a String cannot fail.
            let _ = match *op {
                TraceOp::Alloc { id, bytes } => writeln!(s, "a,{id},{bytes}"),
                TraceOp::Free { id } => writeln!(s, "f,{id},0"),
                TraceOp::Trim => writeln!(s, "t,0,0"),
            };
        }
        s
    }
}

/// Parses a trace: an optional `op,id,bytes` header, then `a,ID,BYTES`, `f,ID,0` and `t,0,0` (trim) lines (text
/// after `#` and blank lines are ignored).
///
/// # Errors
/// [`Error::Trace`] naming the line: an unknown op, a number that does not parse, an id allocated twice while live,
/// a free of an id that is not live.
pub fn parse_trace(reader: impl BufRead, name: &str) -> Result<Trace> {
    let err = |line: usize, detail: String| Error::Trace {
        path: name.to_string(),
        line,
        detail,
    };
    let mut ops = Vec::new();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for (n, line) in reader.lines().enumerate() {
        let lineno = n + 1;
        let line = line.map_err(|e| err(lineno, e.to_string()))?;
        let text = line.split('#').next().unwrap_or("").trim();
        if text.is_empty() || (lineno == 1 && text.replace(' ', "") == "op,id,bytes") {
            continue;
        }
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != 3 {
            return Err(err(
                lineno,
                format!("expected 3 fields `op,id,bytes`, found {:?}", text),
            ));
        }
        let id: u64 = fields[1].parse().map_err(|_| {
            err(
                lineno,
                format!("id {:?} is not a non-negative integer", fields[1]),
            )
        })?;
        let bytes: u64 = fields[2].parse().map_err(|_| {
            err(
                lineno,
                format!("bytes {:?} is not a non-negative integer", fields[2]),
            )
        })?;
        match fields[0] {
            "a" => {
                if live.insert(id, bytes).is_some() {
                    return Err(err(
                        lineno,
                        format!("block {id} allocated again while live"),
                    ));
                }
                now += bytes;
                peak = peak.max(now);
                ops.push(TraceOp::Alloc { id, bytes });
            }
            "f" => {
                let Some(b) = live.remove(&id) else {
                    return Err(err(
                        lineno,
                        format!("free of block {id}, which is not live"),
                    ));
                };
                now -= b;
                ops.push(TraceOp::Free { id });
            }
            "t" => ops.push(TraceOp::Trim),
            other => {
                return Err(err(
                    lineno,
                    format!("op {other:?} is not `a` (alloc), `f` (free) or `t` (trim)"),
                ));
            }
        }
    }
    Ok(Trace {
        name: name.to_string(),
        ops,
        peak_live_bytes: peak,
    })
}

/// How the replayed allocator gets its memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayPolicy {
    /// Best fit over one stitched virtual range of 2 MiB physical pages (the CUDA VMM design); the default, since it
    /// wastes the least.
    #[default]
    Stitched,
    /// Segments reserved on demand (cuMemAlloc regions).
    Growth,
    /// One segment of the whole limit up front (TensorFlow's default).
    Preallocate,
}

impl fmt::Display for ReplayPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplayPolicy::Stitched => "stitched",
            ReplayPolicy::Growth => "growth",
            ReplayPolicy::Preallocate => "preallocate",
        })
    }
}

impl FromStr for ReplayPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "stitched" => Ok(ReplayPolicy::Stitched),
            "growth" => Ok(ReplayPolicy::Growth),
            "preallocate" => Ok(ReplayPolicy::Preallocate),
            _ => Err(Error::InvalidConfig {
                setting: "policy",
                value: s.into(),
                expected: "stitched, growth or preallocate",
            }),
        }
    }
}

/// Settings of a replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayOptions {
    /// How memory is obtained.
    pub policy: ReplayPolicy,
    /// Hard limit in bytes (default: the simulated device's capacity).
    pub limit: Option<u64>,
    /// Simulated device capacity (default: an H200's 143,771 MiB).
    pub capacity: u64,
    /// Times the trace is replayed on the same allocator (blocks left live are freed between passes).
    pub passes: u32,
    /// Training steps in one pass, for the per-step figures.
    pub steps: Option<u64>,
    /// Stitched policy: idle-page slack.
    pub idle_page_slack: u64,
    /// Stitched policy: free chunks examined for backed pages.
    pub placement_candidates: usize,
    /// Stitched policy: large-arena threshold in bytes.
    pub large_block: u64,
    /// Operations of the trace the simulated device runs behind the host (0: it keeps up).
    #[serde(default = "default_stream_lag")]
    pub stream_lag: u64,
}

/// The simulated device's lag behind the host, in trace operations, for [`ReplayOptions::default`]: about a
/// quarter of a training step of the shared Transformer traces (1,100 to 1,150 operations a step), a device far
/// behind a host that synchronizes once a step.
pub const DEFAULT_STREAM_LAG: u64 = 256;

fn default_stream_lag() -> u64 {
    DEFAULT_STREAM_LAG
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            policy: ReplayPolicy::Stitched,
            limit: None,
            capacity: 143_771 << 20,
            passes: 1,
            steps: None,
            idle_page_slack: DEFAULT_IDLE_PAGE_SLACK,
            placement_candidates: DEFAULT_PLACEMENT_CANDIDATES,
            large_block: DEFAULT_LARGE_BLOCK,
            stream_lag: DEFAULT_STREAM_LAG,
        }
    }
}

/// Source activity of one pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassReport {
    /// 1-based.
    pub pass: u32,
    /// All source calls (reserves, releases, page map calls, page releases).
    pub source_calls: u64,
    /// Regions reserved.
    pub source_reserves: u64,
    /// Regions released.
    pub source_releases: u64,
    /// Physical pages moved.
    pub page_moves: u64,
    /// Physical pages created.
    pub page_creates: u64,
    /// Map calls (one per contiguous run of pages; each costs one cuMemSetAccess on a GPU).
    pub map_calls: u64,
    /// Map calls per training step (when the step count is known).
    pub map_calls_per_step: Option<f64>,
    /// Page moves per training step (when the step count is known).
    pub page_moves_per_step: Option<f64>,
    /// Pages moved only after waiting for the simulated stream (each wait a device synchronisation on a GPU).
    pub synchronising_moves: u64,
    /// Waits for the stream, for moves or trims.
    pub stream_waits: u64,
    /// Highest reserved bytes so far.
    pub peak_reserved_bytes: u64,
    /// Failed allocations.
    pub ooms: u64,
}

/// The figures of a replay; the binary prints it as one line of JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The trace.
    pub trace: String,
    /// The policy.
    pub policy: ReplayPolicy,
    /// Lines replayed per pass.
    pub events: u64,
    /// Highest live bytes of the trace (as recorded, before rounding).
    pub peak_live_bytes: u64,
    /// Highest reserved bytes of the allocator over all passes.
    pub peak_reserved_bytes: u64,
    /// peak reserved / peak live − 1.
    pub overhead: f64,
    /// Regions reserved, all passes.
    pub source_reserves: u64,
    /// Regions released, all passes.
    pub source_releases: u64,
    /// All source calls, all passes.
    pub source_calls: u64,
    /// Physical pages moved, all passes (stitched).
    pub page_moves: u64,
    /// Physical pages created, all passes (stitched).
    pub page_creates: u64,
    /// Pages moved only after waiting for the stream to pass their last use, all passes (stitched).
    pub synchronising_moves: u64,
    /// Waits for the stream, for moves or trims, all passes (stitched).
    pub stream_waits: u64,
    /// Failed allocations, all passes.
    pub ooms: u64,
    /// Mean CPU time of one alloc or free, nanoseconds (the replaying thread's CPU clock, so that a busy machine
    /// does not inflate it; wall time where that clock is missing).
    pub ns_per_op: f64,
    /// Mean wall time of one alloc or free, nanoseconds.
    pub wall_ns_per_op: f64,
    /// Stitched policy: the idle-page slack ([`Config::idle_page_slack`](crate::Config::idle_page_slack)).
    pub idle_page_slack: u64,
    /// Operations the simulated device ran behind the host.
    pub stream_lag: u64,
    /// Per pass.
    pub passes: Vec<PassReport>,
}

/// CPU time of the calling thread in nanoseconds.
#[cfg(not(unix))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// CPU time of the calling thread in nanoseconds.
#[cfg(unix)]
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The allocator a replay with `options` runs on: a fresh one over a [`SimMemory`]. Tests that want their
/// sequences to replay with `cohort replay` build theirs here.
///
/// # Errors
/// A setting the configuration refuses.
pub fn allocator(options: &ReplayOptions) -> Result<Bfc<SimMemory>> {
    let mut builder = Config::builder()
        .idle_page_slack(options.idle_page_slack)
        .placement_candidates(options.placement_candidates)
        .large_block(options.large_block);
    if let Some(l) = options.limit {
        builder = builder.limit_bytes(l);
    }
    if options.policy == ReplayPolicy::Preallocate {
        builder = builder.policy(Policy::Preallocate { fraction: 1.0 });
    }
    let config = builder.build()?;
    let source = match options.policy {
        ReplayPolicy::Stitched => SimMemory::stitched(options.capacity),
        _ => SimMemory::new(options.capacity),
    };
    source.stream().set_lag(options.stream_lag);
    Bfc::new(source, config)
}

/// Replays `trace` on a fresh allocator over a [`SimMemory`] as `options` say.
///
/// # Errors
/// Only a source failure (a bug the simulation caught); out-of-memory is counted in `ooms`, not an error.
pub fn replay(trace: &Trace, options: &ReplayOptions) -> Result<ReplayReport> {
    let bfc = allocator(options)?;
    let stream = bfc.with_source(SimMemory::stream);
    let max_id = trace
        .ops
        .iter()
        .map(|op| match *op {
            TraceOp::Alloc { id, .. } | TraceOp::Free { id } => id,
            TraceOp::Trim => 0,
        })
        .max()
        .unwrap_or(0);
    // Ids are dense in real traces; a table indexed by id keeps the timed loop free of hashing.
    let dense = max_id < 16 * trace.ops.len() as u64 + 1024;
    let mut table: Vec<Option<Block>> = Vec::new();
    let mut map: HashMap<u64, Block> = HashMap::new();
    if dense {
        table.resize_with(max_id as usize + 1, || None);
    }
    let mut passes = Vec::new();
    let mut elapsed_ns = 0u128;
    let mut cpu_ns = 0u64;
    let mut ops = 0u64;
    let mut before = bfc.counters();
    for pass in 1..=options.passes.max(1) {
        let start = Instant::now();
        let cpu_start = thread_cpu_ns();
        for op in &trace.ops {
            match *op {
                TraceOp::Alloc { id, bytes } => {
                    if let Ok(block) = bfc.alloc(bytes as usize, TenantId::DEFAULT) {
                        if dense {
                            table[id as usize] = Some(block);
                        } else {
                            map.insert(id, block);
                        }
                    }
                }
                TraceOp::Free { id } => {
                    let block = if dense {
                        table[id as usize].take()
                    } else {
                        map.remove(&id)
                    };
                    if let Some(block) = block {
                        bfc.free(block);
                    }
                }
                TraceOp::Trim => {
                    bfc.trim();
                }
            }
            stream.tick();
        }
        elapsed_ns += start.elapsed().as_nanos();
        cpu_ns += match (cpu_start, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => start.elapsed().as_nanos() as u64,
        };
        ops += trace.ops.len() as u64;
        if pass < options.passes {
            for block in table.iter_mut().filter_map(Option::take) {
                bfc.free(block);
            }
            for (_, block) in map.drain() {
                bfc.free(block);
            }
        }
        let now = bfc.counters();
        let moves = now.page_moves - before.page_moves;
        passes.push(PassReport {
            pass,
            source_calls: now.source_calls() - before.source_calls(),
            source_reserves: now.source_reserves - before.source_reserves,
            source_releases: now.source_releases - before.source_releases,
            page_moves: moves,
            page_creates: now.page_creates - before.page_creates,
            map_calls: now.map_calls - before.map_calls,
            map_calls_per_step: options
                .steps
                .filter(|&s| s > 0)
                .map(|s| (now.map_calls - before.map_calls) as f64 / s as f64),
            page_moves_per_step: options
                .steps
                .filter(|&s| s > 0)
                .map(|s| moves as f64 / s as f64),
            synchronising_moves: now.synchronising_moves - before.synchronising_moves,
            stream_waits: now.stream_waits - before.stream_waits,
            peak_reserved_bytes: now.peak_reserved,
            ooms: now.ooms - before.ooms,
        });
        before = now;
    }
    let c = bfc.counters();
    let peak_live = trace.peak_live_bytes;
    Ok(ReplayReport {
        trace: trace.name.clone(),
        policy: options.policy,
        events: trace.ops.len() as u64,
        peak_live_bytes: peak_live,
        peak_reserved_bytes: c.peak_reserved,
        overhead: if peak_live == 0 {
            0.0
        } else {
            c.peak_reserved as f64 / peak_live as f64 - 1.0
        },
        source_reserves: c.source_reserves,
        source_releases: c.source_releases,
        source_calls: c.source_calls(),
        page_moves: c.page_moves,
        page_creates: c.page_creates,
        synchronising_moves: c.synchronising_moves,
        stream_waits: c.stream_waits,
        ooms: c.ooms,
        ns_per_op: if ops == 0 {
            0.0
        } else {
            cpu_ns as f64 / ops as f64
        },
        wall_ns_per_op: if ops == 0 {
            0.0
        } else {
            elapsed_ns as f64 / ops as f64
        },
        idle_page_slack: options.idle_page_slack,
        stream_lag: options.stream_lag,
        passes,
    })
}
