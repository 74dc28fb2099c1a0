//! The allocator's promises about fragmentation, as properties over random and adversarial sequences.
//!
//! Each property is checked at every operation of every sequence, on an allocator built exactly as `cohort replay`
//! builds its own ([`replay::allocator`]). A failing sequence is shrunk by proptest and written as a trace file, and
//! the failure message gives the `cohort replay` command that runs it again. Members are tenants without limits or
//! reserves here (placement does not depend on the tenant), so the trace replays the same choices on one tenant;
//! limits and reserves have their own properties in `proptest_bfc.rs`.
//!
//! Scale: about a million operations in a release run (`PROPTEST_CASES` multiplies it; a debug run takes a tenth),
//! and the ignored `soak` test runs tens of millions. `--nocapture` prints the counts. With the feature
//! `fault-injection` (on for tests), `each_property_catches_its_broken_rule` flips one placement rule per property
//! and expects the property to fail.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use cohort_alloc::fault::Fault;
use cohort_alloc::replay::{self, ReplayOptions, ReplayPolicy, Trace, TraceOp};
use cohort_alloc::{Bfc, Block, OomCause, SimMemory, SimStream, TenantId, TenantLimits};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 256 * MIB;
const CAPACITY: u64 = 1 << 30;
const POLICIES: [ReplayPolicy; 3] = [
    ReplayPolicy::Stitched,
    ReplayPolicy::Growth,
    ReplayPolicy::Preallocate,
];

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc {
        size: u64,
        tenant: u8,
    },
    /// Frees the live block at this index (modulo the live count), so that shrinking keeps sequences valid; the
    /// top 4,096 values count from the newest block instead ([`from_end`]).
    Free(usize),
    Trim,
}

/// Frees the block `m` places before the newest live one.
fn from_end(m: usize) -> Op {
    Op::Free(usize::MAX - m)
}

/// What a sequence is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Property {
    /// Stitched: a request fails only when live bytes would pass the limit or the whole pages it needs are more
    /// than the pages no live block touches (no OOM caused by fragmentation).
    NoFragmentationOom,
    /// Stitched: reserved memory never exceeds the pages live blocks touched at their peak (peak live plus its
    /// page rounding) plus the idle-page slack.
    PeakWithinSlack,
    /// Stitched: a virtual page is unmapped (its physical page moved away or released) only once the simulated
    /// stream has passed the tick its last block was freed at, or after a wait for the stream that the counters
    /// show.
    UnmapsOnlyPassedPages,
    /// Segments: the pool grows only when no cached free chunk could hold the request.
    GrowsOnlyWithoutFit,
    /// Segments: the reported fragmentation equals 1 − largest free chunk / free bytes, recounted from the chunk
    /// map; an OOM blames fragmentation exactly when the free total (and the room to grow) would have sufficed.
    HonestFragmentation,
    /// Trim returns every wholly free region (segments) and every idle page (stitched).
    TrimReturnsAll,
}

fn options(policy: ReplayPolicy, slack: u64) -> ReplayOptions {
    ReplayOptions {
        policy,
        limit: Some(LIMIT),
        capacity: CAPACITY,
        idle_page_slack: slack,
        ..ReplayOptions::default()
    }
}

// --- sizes and sequences -------------------------------------------------------------------------------------

fn uniform_size() -> impl Strategy<Value = u64> {
    1u64..(8 * MIB)
}

/// Block sizes of the shared traces (transformer-lm, transformer-varlen, mlp-grid8: 8,409 allocations), by power of
/// two: (log2 of the upper bound, count). Sizes above 16 MiB are scaled down 16× so that the 256 MiB limit holds
/// many blocks, as the traces' 1.7-2.9 GiB peaks hold theirs.
const TRACE_SIZES: [(u32, u32); 24] = [
    (2, 159),
    (3, 14),
    (4, 156),
    (6, 260),
    (8, 13),
    (9, 104),
    (11, 1166),
    (12, 24),
    (13, 554),
    (14, 236),
    (15, 246),
    (16, 92),
    (17, 191),
    (18, 113),
    (19, 116),
    (20, 213),
    (21, 291),
    (22, 825),
    (23, 1674),
    (24, 857),
    (25 - 4, 656),
    (26 - 4, 317),
    (27 - 4, 69),
    (28 - 4, 23),
];

fn trace_size() -> impl Strategy<Value = u64> {
    let arms: Vec<_> = TRACE_SIZES
        .iter()
        .map(|&(log2, count)| (count, ((1u64 << log2) / 2 + 1)..=(1u64 << log2)))
        .collect();
    proptest::strategy::Union::new_weighted(arms)
}

fn ops(size: impl Strategy<Value = u64>, len: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        50 => (size, 0u8..3).prop_map(|(size, tenant)| Op::Alloc { size, tenant }),
        45 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
    ];
    proptest::collection::vec(op, 1..len)
}

/// Sequences built to fragment: holes too small for what comes next.
fn adversarial(len: usize) -> impl Strategy<Value = Vec<Op>> {
    let rounds = (len / 64).max(1);
    prop_oneof![
        // Sawtooth: many small blocks, every other one freed, then a block twice their size; sizes grow per round.
        (256u64..(256 << 10), 8usize..48).prop_map(move |(small, n)| {
            let mut v = Vec::new();
            for r in 0..rounds as u64 {
                let s = small * (r % 8 + 1);
                for k in 0..n {
                    v.push(Op::Alloc {
                        size: s,
                        tenant: (k % 3) as u8,
                    });
                }
                // Every other block of this round, newest first: the m-th free is then m places from the end.
                for m in 0..n.div_ceil(2) {
                    v.push(from_end(m));
                }
                v.push(Op::Alloc {
                    size: 2 * s + 256,
                    tenant: 0,
                });
            }
            v
        }),
        // Ramp: each block a little larger than the last, the last one freed after the next is placed.
        (4096u64..(1 << 20), 11u64..16).prop_map(move |(start, growth)| {
            let mut v = Vec::new();
            let mut s = start;
            for _ in 0..rounds * 8 {
                v.push(Op::Alloc { size: s, tenant: 1 });
                v.push(Op::Free(0));
                s = (s * growth / 10) % (24 * MIB) + 4096;
            }
            v
        }),
        // Checkerboard: the limit filled with blocks of one size, every other one freed, then blocks twice as large
        // (which fit no hole) until memory runs out, all freed, and again with another size.
        ((1u64 << 20)..(8 << 20)).prop_map(move |first| {
            let mut v = Vec::new();
            let mut s = first;
            for _ in 0..rounds.div_ceil(4) {
                let n = (LIMIT / s) as usize;
                v.extend((0..n).map(|k| Op::Alloc {
                    size: s,
                    tenant: (k % 3) as u8,
                }));
                v.extend((0..n.div_ceil(2)).map(from_end));
                v.extend((0..n / 2).map(|_| Op::Alloc {
                    size: 2 * s + 4096,
                    tenant: 1,
                }));
                v.extend((0..n * 2).map(|_| Op::Free(0)));
                s = s * 7 / 5 % (8 << 20) + (1 << 20);
            }
            v
        }),
        // Pinned: a long-lived small block between short-lived large ones, which then come back larger.
        (1u64 << 20..8 << 20, 256u64..4096).prop_map(move |(large, tiny)| {
            let mut v = Vec::new();
            for r in 0..rounds as u64 * 4 {
                v.push(Op::Alloc {
                    size: large + r * 4096,
                    tenant: 0,
                });
                v.push(Op::Alloc {
                    size: tiny,
                    tenant: 2,
                });
                v.push(from_end(1)); // the large one
            }
            v
        }),
    ]
}

/// A step's churn: a few sizes allocated and freed again at once or a little later, the pattern the parked-block
/// fast path serves.
fn churn(len: usize) -> impl Strategy<Value = Vec<Op>> {
    let sizes = proptest::collection::vec(trace_size(), 4);
    let steps = proptest::collection::vec((0usize..4, 0usize..3, any::<bool>()), 1..len / 2);
    (sizes, steps).prop_map(|(sizes, steps)| {
        let mut v = Vec::new();
        for (k, back, free_first) in steps {
            if free_first {
                v.push(from_end(back));
            }
            v.push(Op::Alloc {
                size: sizes[k],
                tenant: (k % 3) as u8,
            });
            if !free_first {
                v.push(from_end(back));
            }
        }
        v
    })
}

// --- the driver ----------------------------------------------------------------------------------------------

/// One sequence run on a fresh allocator, with the model the properties are checked against.
struct Run {
    bfc: Bfc<SimMemory>,
    options: ReplayOptions,
    tenants: [TenantId; 3],
    live: Vec<(u64, Block)>,
    trace: Vec<TraceOp>,
    /// Stitched: page size, base of the virtual range, live blocks per page, pages touched.
    page: u64,
    base: u64,
    per_page: Vec<u32>,
    /// Stitched: pages no live block touches that the source may still map, and the tick they became so.
    untouched_since: std::collections::HashMap<usize, u64>,
    stream: SimStream,
    touched: u64,
    peak_touched: u64,
    in_use: u64,
    peak_in_use: u64,
    ooms: u64,
}

impl Run {
    fn new(options: &ReplayOptions, fault: Option<Fault>) -> Run {
        let bfc = replay::allocator(options).expect("replay allocator");
        let stream = bfc.with_source(SimMemory::stream);
        bfc.inject(fault);
        let tenants = [
            TenantId::DEFAULT,
            bfc.add_tenant("b", TenantLimits::unlimited()).unwrap(),
            bfc.add_tenant("c", TenantLimits::unlimited()).unwrap(),
        ];
        let (page, base, pages) = match options.policy {
            ReplayPolicy::Stitched => {
                let base = bfc.chunk_map()[0].ptr;
                (2 * MIB, base, (4 * CAPACITY / (2 * MIB)) as usize)
            }
            _ => (0, 0, 0),
        };
        Run {
            bfc,
            options: options.clone(),
            tenants,
            live: Vec::new(),
            trace: Vec::new(),
            page,
            base,
            per_page: vec![0; pages],
            untouched_since: std::collections::HashMap::new(),
            stream,
            touched: 0,
            peak_touched: 0,
            in_use: 0,
            peak_in_use: 0,
            ooms: 0,
        }
    }

    fn stitched(&self) -> bool {
        self.options.policy == ReplayPolicy::Stitched
    }

    fn pages_of(&self, b: &Block) -> std::ops::RangeInclusive<usize> {
        let a = (b.ptr - self.base) / self.page;
        let z = (b.ptr + b.size - 1 - self.base) / self.page;
        a as usize..=z as usize
    }

    fn touch(&mut self, b: &Block, delta: i32) {
        for p in self.pages_of(b) {
            let n = &mut self.per_page[p];
            if delta > 0 {
                self.touched += u64::from(*n == 0);
                *n += 1;
                self.untouched_since.remove(&p);
            } else {
                *n -= 1;
                if *n == 0 {
                    self.touched -= 1;
                    self.untouched_since.insert(p, self.stream.now());
                }
            }
        }
    }

    /// Every page the source unmapped since the last look was free of queued work, or the allocator waited.
    fn check_unmaps(&mut self, waits_before: u64) -> Result<(), String> {
        let waited = self.bfc.counters().stream_waits > waits_before;
        let (base, page) = (self.base, self.page);
        let unmapped: Vec<(usize, u64)> = self.bfc.with_source(|s| {
            self.untouched_since
                .iter()
                .filter(|&(&p, _)| !s.is_mapped(base + p as u64 * page))
                .map(|(&p, &t)| (p, t))
                .collect()
        });
        for (p, since) in unmapped {
            if !waited && !self.stream.passed(since) {
                return Err(format!(
                    "page {p} was unmapped at tick {}, its last block freed at tick {since}: the stream had not \
                     passed it and the allocator did not wait",
                    self.stream.now()
                ));
            }
            self.untouched_since.remove(&p);
        }
        Ok(())
    }

    /// Runs `ops`, checking `property` after each; the outcome of every allocation (its address, or none).
    fn drive(&mut self, ops: &[Op], property: Property) -> Result<Vec<Option<u64>>, String> {
        let mut choices = Vec::with_capacity(ops.len());
        for (n, op) in ops.iter().enumerate() {
            let waits_before = self.bfc.counters().stream_waits;
            match *op {
                Op::Alloc { size, tenant } => {
                    let id = self.trace.len() as u64;
                    self.trace.push(TraceOp::Alloc { id, bytes: size });
                    choices.push(self.alloc(size, tenant, property)?);
                }
                Op::Free(k) => {
                    if self.live.is_empty() {
                        continue;
                    }
                    let k = match usize::MAX - k {
                        m if m < 4096 => self.live.len().saturating_sub(m + 1),
                        _ => k % self.live.len(),
                    };
                    let (id, block) = self.live.remove(k);
                    self.trace.push(TraceOp::Free { id });
                    if self.stitched() {
                        self.touch(&block, -1);
                    }
                    self.in_use -= block.size;
                    self.bfc.try_free(block).map_err(|e| e.to_string())?;
                }
                Op::Trim => {
                    self.trace.push(TraceOp::Trim);
                    self.bfc.trim();
                    if property == Property::TrimReturnsAll {
                        self.check_trimmed()?;
                    }
                }
            }
            if property == Property::UnmapsOnlyPassedPages {
                self.check_unmaps(waits_before)?;
            }
            // The simulated device runs `stream_lag` operations behind, as in a replay.
            self.stream.tick();
            if n % 16 == 15 || n + 1 == ops.len() {
                self.bfc.check_invariants()?;
                let c = self.bfc.counters();
                if c.in_use != self.in_use || c.live_blocks != self.live.len() as u64 {
                    return Err(format!(
                        "counters say {} B in {} blocks, the model {} B in {}",
                        c.in_use,
                        c.live_blocks,
                        self.in_use,
                        self.live.len()
                    ));
                }
                if property == Property::HonestFragmentation {
                    self.check_fragmentation_figure()?;
                }
            }
        }
        Ok(choices)
    }

    fn alloc(&mut self, size: u64, tenant: u8, property: Property) -> Result<Option<u64>, String> {
        let rounded = size.next_multiple_of(256);
        let reserved_before = self.bfc.counters().reserved;
        match self
            .bfc
            .alloc(size as usize, self.tenants[usize::from(tenant)])
        {
            Ok(block) => {
                let ptr = block.ptr;
                self.in_use += block.size;
                self.peak_in_use = self.peak_in_use.max(self.in_use);
                if self.stitched() {
                    self.touch(&block, 1);
                    self.peak_touched = self.peak_touched.max(self.touched);
                }
                let grew = self.bfc.counters().reserved > reserved_before;
                if property == Property::GrowsOnlyWithoutFit && grew {
                    self.check_growth(&block)?;
                }
                if property == Property::PeakWithinSlack {
                    self.check_peak()?;
                }
                let id = self.trace.len() as u64 - 1;
                self.live.push((id, block));
                Ok(Some(ptr))
            }
            Err(e) => {
                self.ooms += 1;
                let oom = e.out_of_memory().ok_or_else(|| e.to_string())?;
                match property {
                    Property::NoFragmentationOom => self.check_stitched_oom(rounded, oom.cause)?,
                    Property::HonestFragmentation => self.check_oom_cause(rounded, oom.cause)?,
                    _ => {}
                }
                Ok(None)
            }
        }
    }

    fn check_stitched_oom(&self, rounded: u64, cause: OomCause) -> Result<(), String> {
        let page_limit = LIMIT / self.page;
        let untouched = page_limit - self.touched;
        let pages = rounded.div_ceil(self.page);
        let over_limit = self.in_use + rounded > LIMIT;
        if !over_limit && pages <= untouched {
            return Err(format!(
                "a request of {rounded} B ({pages} pages) failed ({cause:?}) with {untouched} of {page_limit} pages \
                 touched by no live block and {} B live: an OOM caused by fragmentation",
                self.in_use
            ));
        }
        Ok(())
    }

    fn check_peak(&self) -> Result<(), String> {
        let c = self.bfc.counters();
        let slack = self.options.idle_page_slack;
        let bound = (self.peak_touched + slack) * self.page;
        if c.peak_reserved > bound {
            return Err(format!(
                "peak reserved {} B ({} pages) above the peak of touched pages {} plus the slack {slack}",
                c.peak_reserved,
                c.peak_reserved / self.page,
                self.peak_touched
            ));
        }
        Ok(())
    }

    /// The pool grew for `block`: no free chunk outside its new region may have held it.
    fn check_growth(&self, block: &Block) -> Result<(), String> {
        let map = self.bfc.chunk_map();
        let region = map
            .iter()
            .find(|c| c.ptr == block.ptr)
            .map(|c| c.region)
            .ok_or("the new block is not in the chunk map")?;
        if let Some(fit) = map
            .iter()
            .find(|c| c.free && c.region != region && c.size >= block.size)
        {
            return Err(format!(
                "the pool grew for {} B while a free chunk of {} B at {:#x} could hold it",
                block.size, fit.size, fit.ptr
            ));
        }
        Ok(())
    }

    fn free_total(&self) -> (u64, u64) {
        let map = self.bfc.chunk_map();
        let free = map.iter().filter(|c| c.free).map(|c| c.size);
        (free.clone().sum(), free.max().unwrap_or(0))
    }

    fn check_fragmentation_figure(&self) -> Result<(), String> {
        let (total, largest) = self.free_total();
        let want = if total == 0 {
            0.0
        } else {
            1.0 - largest as f64 / total as f64
        };
        let s = self.bfc.stats();
        if s.cached_free != total || (s.fragmentation - want).abs() > 1e-12 {
            return Err(format!(
                "the report says {} B cached free at fragmentation {}, the chunk map {total} B free, largest \
                 {largest}: fragmentation {want}",
                s.cached_free, s.fragmentation
            ));
        }
        Ok(())
    }

    fn check_oom_cause(&self, rounded: u64, cause: OomCause) -> Result<(), String> {
        let (total, _) = self.free_total();
        let c = self.bfc.counters();
        let room = match self.options.policy {
            ReplayPolicy::Growth => LIMIT.saturating_sub(c.reserved),
            _ => 0,
        };
        let would_fit = total + room >= rounded && self.in_use + rounded <= LIMIT;
        let blames_fragmentation = cause == OomCause::Fragmentation;
        if would_fit != blames_fragmentation {
            return Err(format!(
                "an OOM of {rounded} B blamed {cause:?} with {total} B free and {room} B room to grow"
            ));
        }
        Ok(())
    }

    fn check_trimmed(&self) -> Result<(), String> {
        if self.stitched() {
            let s = self.bfc.stats();
            if s.pages_idle != 0 || s.counters.reserved != self.touched * self.page {
                return Err(format!(
                    "after trim {} pages idle, {} B reserved for {} touched pages",
                    s.pages_idle, s.counters.reserved, self.touched
                ));
            }
            return Ok(());
        }
        let map = self.bfc.chunk_map();
        for c in &map {
            let alone = map.iter().filter(|d| d.region == c.region).count() == 1;
            if c.free && alone {
                return Err(format!(
                    "after trim a wholly free region of {} B at {:#x} is kept",
                    c.size, c.ptr
                ));
            }
        }
        Ok(())
    }

    /// Frees every live block.
    fn free_all(&mut self) {
        for (id, block) in self.live.drain(..) {
            self.trace.push(TraceOp::Free { id });
            self.bfc.free(block);
        }
        self.in_use = 0;
        let now = self.stream.now();
        for (p, n) in self.per_page.iter_mut().enumerate() {
            if *n > 0 {
                self.untouched_since.insert(p, now);
            }
            *n = 0;
        }
        self.touched = 0;
    }

    /// Writes the sequence as a trace and says how to replay it; a short one is printed as well.
    fn report(&self, name: &str, why: &str) -> String {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fragmentation");
        let path = dir.join(format!("{name}.csv"));
        let csv = Trace::from_ops(name, self.trace.clone())
            .expect("the model writes valid traces")
            .to_csv();
        let written = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &csv));
        let shown = if self.trace.len() <= 40 {
            format!("\n{csv}")
        } else {
            String::new()
        };
        match written {
            Ok(()) => format!(
                "{why}\n  {} operations; replay with: cohort replay {} --policy {} --limit {LIMIT} --capacity {CAPACITY} \
                 --idle-page-slack {} --stream-lag {}{shown}",
                self.trace.len(),
                path.display(),
                self.options.policy,
                self.options.idle_page_slack,
                self.options.stream_lag,
            ),
            Err(e) => format!(
                "{why}\n  (writing the trace to {} failed: {e}){shown}",
                path.display()
            ),
        }
    }
}

// --- runners -------------------------------------------------------------------------------------------------

/// Cases per property: `PROPTEST_CASES` when set, else `release` in a release build and a tenth in a debug one.
fn cases(release: u32) -> u32 {
    match std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) => n,
        None if cfg!(debug_assertions) => (release / 10).max(2),
        None => release,
    }
}

/// Prints how many operations a hand-run property ran, and fails with its shrunk case if it failed.
fn conclude(name: &str, ops_run: &AtomicU64, result: Result<(), TestError<Vec<Op>>>) {
    eprintln!("{name}: {} operations", ops_run.load(Ordering::Relaxed));
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

/// A runner of `cases` cases that keeps no regression file (a failing sequence is written as a trace instead).
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Checks `property` on `cases` sequences from `strategy` under `options`: the operations run, or why it failed
/// and the shrunk sequence.
fn check(
    name: &str,
    options: &ReplayOptions,
    property: Property,
    strategy: impl Strategy<Value = Vec<Op>>,
    cases: u32,
    fault: Option<Fault>,
) -> Result<u64, (String, Vec<Op>)> {
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: if fault.is_some() { 256 } else { 4096 },
        ..Config::default()
    };
    let ops_run = AtomicU64::new(0);
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |ops| {
        ops_run.fetch_add(ops.len() as u64, Ordering::Relaxed);
        let mut run = Run::new(options, fault);
        run.drive(&ops, property)
            .map(|_| ())
            .map_err(|why| TestCaseError::fail(run.report(name, &why)))
    });
    let n = ops_run.load(Ordering::Relaxed);
    eprintln!("{name}: {cases} cases, {n} operations");
    match result {
        Ok(()) => Ok(n),
        Err(TestError::Fail(why, ops)) => Err((why.to_string(), ops)),
        Err(TestError::Abort(why)) => Err((why.to_string(), Vec::new())),
    }
}

fn must_hold(
    name: &str,
    options: &ReplayOptions,
    property: Property,
    strategy: impl Strategy<Value = Vec<Op>>,
    cases: u32,
) {
    if let Err((why, _)) = check(name, options, property, strategy, cases, None) {
        panic!("{name}: {why}");
    }
}

// --- the properties ------------------------------------------------------------------------------------------

/// Checks `property` on uniform sizes, on the traces' sizes and on adversarial sequences of up to `len` operations.
fn must_hold_on_all_sizes(name: &str, o: &ReplayOptions, property: Property, len: usize, n: u32) {
    let uniform = ops(uniform_size(), len);
    must_hold(&format!("{name}-uniform"), o, property, uniform, cases(n));
    let traces = ops(trace_size(), len);
    must_hold(&format!("{name}-traces"), o, property, traces, cases(n));
    let adversarial = adversarial(len);
    must_hold(
        &format!("{name}-adversarial"),
        o,
        property,
        adversarial,
        cases(n * 2 / 3),
    );
}

#[test]
fn stitched_fails_only_for_want_of_pages() {
    for slack in [0, 8] {
        let o = options(ReplayPolicy::Stitched, slack);
        must_hold_on_all_sizes("stitched-oom", &o, Property::NoFragmentationOom, 4000, 24);
    }
}

/// Moves need no wait, so the bound holds as well on a device held until the allocator waits for it.
#[test]
fn stitched_peak_stays_within_the_slack() {
    for (slack, lag) in [
        (0, ReplayOptions::default().stream_lag),
        (8, 0),
        (0, u64::MAX),
    ] {
        let o = ReplayOptions {
            stream_lag: lag,
            ..options(ReplayPolicy::Stitched, slack)
        };
        must_hold_on_all_sizes("stitched-peak", &o, Property::PeakWithinSlack, 4000, 24);
    }
}

/// On a device that runs behind (the replay's lag, and a device held until the allocator waits) and one that
/// keeps up.
#[test]
fn stitched_unmaps_only_pages_the_stream_has_passed() {
    for lag in [0, 64, ReplayOptions::default().stream_lag, u64::MAX] {
        let o = ReplayOptions {
            stream_lag: lag,
            ..options(ReplayPolicy::Stitched, 0)
        };
        let p = Property::UnmapsOnlyPassedPages;
        must_hold_on_all_sizes(&format!("stitched-unmaps-lag{lag}"), &o, p, 3000, 16);
    }
}

#[test]
fn segments_grow_only_without_a_fit() {
    let o = options(ReplayPolicy::Growth, 0);
    must_hold_on_all_sizes("growth-fit", &o, Property::GrowsOnlyWithoutFit, 4000, 32);
}

#[test]
fn segments_report_fragmentation_honestly() {
    for policy in [ReplayPolicy::Growth, ReplayPolicy::Preallocate] {
        let o = options(policy, 0);
        let p = Property::HonestFragmentation;
        must_hold_on_all_sizes("segments-fragmentation", &o, p, 2000, 24);
    }
}

#[test]
fn trim_returns_every_free_region_and_idle_page() {
    for policy in POLICIES {
        let o = options(policy, 8);
        let p = Property::TrimReturnsAll;
        let trimmed = (ops(trace_size(), 2000), 0usize..40).prop_map(|(mut v, k)| {
            // Trims where they matter: after frees, with cached memory about.
            for i in (0..v.len()).step_by(k + 10) {
                v.insert(i, Op::Trim);
            }
            v
        });
        must_hold("trim-all", &o, p, trimmed, cases(24));
    }
}

/// Pass 1, everything freed, a trim, pass 2: every choice the same (addresses shifted by one constant where
/// segments come from new source addresses), the same OOMs, and the same memory figures.
#[test]
fn replay_after_trim_makes_the_same_choices() {
    for policy in POLICIES {
        let o = options(policy, 8);
        let mut runner = runner(cases(24));
        let ops_run = AtomicU64::new(0);
        let result = runner.run(&ops(trace_size(), 2000), |ops| {
            ops_run.fetch_add(2 * ops.len() as u64, Ordering::Relaxed);
            let mut run = Run::new(&o, None);
            let first = run
                .drive(&ops, Property::TrimReturnsAll)
                .map_err(TestCaseError::fail)?;
            run.free_all();
            run.trace.push(TraceOp::Trim);
            run.bfc.trim();
            prop_assert_eq!(run.bfc.counters().reserved, 0);
            let second = run
                .drive(&ops, Property::TrimReturnsAll)
                .map_err(TestCaseError::fail)?;
            let shift = first
                .iter()
                .zip(&second)
                .find_map(|(a, b)| Some(b.as_ref()?.wrapping_sub(*a.as_ref()?)));
            for (k, (a, b)) in first.iter().zip(&second).enumerate() {
                let same = match (a, b) {
                    (Some(a), Some(b)) => Some(b.wrapping_sub(*a)) == shift,
                    (None, None) => true,
                    _ => false,
                };
                if !same || (policy == ReplayPolicy::Stitched && shift.is_some_and(|s| s != 0)) {
                    let why = format!(
                        "allocation {k}: first pass {a:x?}, second pass {b:x?} (shift {shift:x?})"
                    );
                    return Err(TestCaseError::fail(run.report("replay-after-trim", &why)));
                }
            }
            Ok(())
        });
        conclude(&format!("replay-after-trim-{policy}"), &ops_run, result);
    }
}

/// The parked-block fast path changes no choice: the same addresses, OOMs and counters as without it.
#[test]
fn parking_makes_the_choices_of_plain_best_fit() {
    for policy in POLICIES {
        let o = options(policy, 8);
        let mut runner = runner(cases(32));
        let ops_run = AtomicU64::new(0);
        let strategy = prop_oneof![churn(3000), ops(trace_size(), 2000), adversarial(2000)];
        let result = runner.run(&strategy, |ops| {
            ops_run.fetch_add(2 * ops.len() as u64, Ordering::Relaxed);
            let mut parked = Run::new(&o, None);
            let mut plain = Run::new(&o, Some(Fault::NoParking));
            let a = parked
                .drive(&ops, Property::TrimReturnsAll)
                .map_err(TestCaseError::fail)?;
            let b = plain
                .drive(&ops, Property::TrimReturnsAll)
                .map_err(TestCaseError::fail)?;
            if let Some(k) = (0..a.len()).find(|&k| a[k] != b[k]) {
                let why = format!(
                    "allocation {k}: {:x?} parked, {:x?} without parking",
                    a[k], b[k]
                );
                return Err(TestCaseError::fail(parked.report("parking", &why)));
            }
            prop_assert_eq!(parked.bfc.counters(), plain.bfc.counters());
            Ok(())
        });
        conclude(&format!("parking-{policy}"), &ops_run, result);
    }
}

/// The failure writer's trace replays through `replay` with the same outcome the run saw.
#[test]
fn a_written_sequence_replays_the_same() {
    let mut runner = runner(cases(8));
    for policy in [ReplayPolicy::Stitched, ReplayPolicy::Growth] {
        let o = options(policy, 8);
        runner
            .run(&ops(trace_size(), 1500), |ops| {
                let mut run = Run::new(&o, None);
                run.drive(&ops, Property::TrimReturnsAll)
                    .map_err(TestCaseError::fail)?;
                let text = Trace::from_ops("t", run.trace.clone()).unwrap().to_csv();
                let trace = replay::parse_trace(std::io::Cursor::new(text), "t").unwrap();
                let r = replay::replay(&trace, &o).unwrap();
                prop_assert_eq!(r.ooms, run.ooms);
                prop_assert_eq!(r.peak_reserved_bytes, run.bfc.counters().peak_reserved);
                Ok(())
            })
            .unwrap();
    }
}

/// Each property fails when the rule it guards is flipped, and its failure names a trace that replays.
#[test]
fn each_property_catches_its_broken_rule() {
    let stitched = options(ReplayPolicy::Stitched, 8);
    let lagging = ReplayOptions {
        stream_lag: 64,
        ..options(ReplayPolicy::Stitched, 0)
    };
    let growth = options(ReplayPolicy::Growth, 0);
    let flips = [
        (Fault::NoPageReuse, &stitched, Property::NoFragmentationOom),
        (Fault::CreateOverMove, &stitched, Property::PeakWithinSlack),
        (
            Fault::UnmapBeforePassed,
            &lagging,
            Property::UnmapsOnlyPassedPages,
        ),
        (Fault::GrowBeforeFit, &growth, Property::GrowsOnlyWithoutFit),
        (Fault::TrimKeepsOne, &growth, Property::TrimReturnsAll),
        (Fault::TrimKeepsOne, &stitched, Property::TrimReturnsAll),
    ];
    for (fault, o, property) in flips {
        let name = format!("broken-{fault:?}");
        // Sizes from the traces, and sequences that fill the limit and leave holes, so that pages run short while
        // idle ones are about.
        let strategy = prop_oneof![ops(trace_size(), 1500), adversarial(1500)];
        let (caught, shrunk) = check(&name, o, property, strategy, 64, Some(fault))
            .expect_err(&format!("{property:?} did not catch {fault:?}"));
        assert!(caught.contains("cohort replay"), "{caught}");
        let path =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fragmentation/{name}.csv"));
        let trace = replay::read_trace(&path).expect("the shrunk sequence is a trace");
        assert!(!trace.ops.is_empty() && !shrunk.is_empty());
        // With the rule mended, the same sequence holds.
        Run::new(o, None)
            .drive(&shrunk, property)
            .unwrap_or_else(|why| {
                panic!("{fault:?} mended, the shrunk sequence still fails: {why}")
            });
    }
}

/// Tens of millions of operations: `cargo test --release -p cohort-alloc --test fragmentation -- --ignored`.
#[test]
#[ignore = "soak: about 50 million operations, a few minutes in release"]
fn soak() {
    let mut total = 0;
    for (policy, property) in [
        (ReplayPolicy::Stitched, Property::NoFragmentationOom),
        (ReplayPolicy::Stitched, Property::PeakWithinSlack),
        (ReplayPolicy::Growth, Property::GrowsOnlyWithoutFit),
        (ReplayPolicy::Growth, Property::HonestFragmentation),
        (ReplayPolicy::Preallocate, Property::HonestFragmentation),
    ] {
        let o = options(policy, 8);
        let name = format!("soak-{property:?}-{policy}");
        total += check(&name, &o, property, ops(trace_size(), 20_000), 1000, None)
            .unwrap_or_else(|(why, _)| panic!("{name}: {why}"));
    }
    eprintln!("soak: {total} operations");
}
