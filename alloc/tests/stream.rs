//! Page moves and the stream: a page freed in stream order may still be used by queued work, so its old mapping
//! stays until the (simulated) stream passes its last use; waits for the stream happen only where they must, and
//! are counted; steady-state replays of the shared traces make none.

use cohort_alloc::replay::{ReplayOptions, read_trace, replay};
use cohort_alloc::{Bfc, Config, SimMemory, TenantId};

const MIB: u64 = 1 << 20;
const T: TenantId = TenantId::DEFAULT;

/// One arena (blocks share pages), no idle-page slack, a limit of `pages` pages, the device held: it passes a
/// point only when the test says so or the allocator waits.
fn held(pages: u64) -> Bfc<SimMemory> {
    held_in(1 << 30, pages)
}

/// [`held`] on a device of `capacity` bytes, whose one arena spans as much virtual memory.
fn held_in(capacity: u64, pages: u64) -> Bfc<SimMemory> {
    let config = Config::builder()
        .limit_bytes(pages * 2 * MIB)
        .large_block(u64::MAX)
        .idle_page_slack(0)
        .build()
        .unwrap();
    let source = SimMemory::stitched(capacity);
    source.stream().hold();
    Bfc::new(source, config).unwrap()
}

#[test]
fn a_moved_page_keeps_its_old_mapping_until_the_stream_passes_its_last_use() {
    let bfc = held(8);
    let a = bfc.alloc((2 * MIB) as usize, T).unwrap();
    let b = bfc.alloc((2 * MIB) as usize, T).unwrap();
    let page0 = a.ptr;
    bfc.free(a);
    // d past b needs two pages: page 0's physical page moves there at once, no wait, and page 0 stays mapped.
    let d = bfc.alloc((4 * MIB) as usize, T).unwrap();
    bfc.check_invariants().unwrap();
    let s = bfc.stats();
    assert_eq!(
        (s.counters.page_moves, s.pages_mapped, s.pages_retired),
        (1, 3, 1)
    );
    assert_eq!(s.counters.stream_waits, 0);
    assert!(
        bfc.with_source(|s| s.is_mapped(page0)),
        "unmapped before the stream passed it"
    );
    assert_eq!(
        bfc.with_source(|s| s.used()),
        3 * 2 * MIB,
        "a retired page holds no memory of its own"
    );
    // A block that best fit would put on page 0 goes past the retired page instead of waiting for the stream.
    let c = bfc.alloc((2 * MIB) as usize, T).unwrap();
    assert_ne!(c.ptr, page0);
    assert_eq!(bfc.counters().stream_waits, 0);
    assert!(bfc.with_source(|s| s.is_mapped(page0)));
    // The stream passes; the next page fault unmaps page 0, still without a wait.
    bfc.with_source(|s| s.stream().catch_up());
    let e = bfc.alloc((4 * MIB) as usize, T).unwrap();
    bfc.check_invariants().unwrap();
    assert!(!bfc.with_source(|s| s.is_mapped(page0)));
    let s = bfc.stats();
    assert_eq!((s.pages_retired, s.counters.stream_waits), (0, 0));
    assert_eq!(bfc.with_source(|s| s.counters().stream_waits), 0);
    for x in [b, c, d, e] {
        bfc.free(x);
    }
}

#[test]
fn a_block_landing_on_a_retired_page_waits_for_the_stream_and_counts_it() {
    // Four pages of virtual memory: once d has taken page 0's physical page, page 0 is the only place left for c.
    let bfc = held_in(8 * MIB, 4);
    let a = bfc.alloc((2 * MIB) as usize, T).unwrap();
    let b = bfc.alloc((2 * MIB) as usize, T).unwrap();
    let page0 = a.ptr;
    bfc.free(a);
    let d = bfc.alloc((4 * MIB) as usize, T).unwrap();
    assert_eq!(bfc.counters().synchronising_moves, 0);
    let c = bfc.alloc((2 * MIB) as usize, T).unwrap();
    assert_eq!(c.ptr, page0);
    bfc.check_invariants().unwrap();
    let s = bfc.stats();
    assert_eq!(
        (s.counters.synchronising_moves, s.counters.stream_waits),
        (1, 1)
    );
    assert_eq!(
        bfc.with_source(|s| s.counters().stream_waits),
        1,
        "the source waited"
    );
    assert_eq!(s.pages_retired, 0);
    for x in [b, c, d] {
        bfc.free(x);
    }
}

#[test]
fn a_trim_waits_for_the_stream_once_and_gives_everything_back() {
    let bfc = held(64);
    let blocks: Vec<_> = (1..=6)
        .map(|k| bfc.alloc((k * 3 * MIB) as usize, T).unwrap())
        .collect();
    for b in blocks {
        bfc.free(b);
    }
    assert!(bfc.stats().pages_pending > 0);
    let reserved = bfc.counters().reserved;
    assert_eq!(bfc.trim(), reserved);
    let s = bfc.stats();
    assert_eq!((s.pages_mapped, s.pages_idle, s.pages_retired), (0, 0, 0));
    assert_eq!(s.counters.stream_waits, 1);
    assert_eq!(
        bfc.with_source(|s| (s.used(), s.counters().stream_waits)),
        (0, 1)
    );
    // Once the stream has passed everything, a trim has nothing to wait for.
    let b = bfc.alloc((8 * MIB) as usize, T).unwrap();
    bfc.free(b);
    bfc.with_source(|s| s.stream().catch_up());
    bfc.trim();
    assert_eq!(bfc.counters().stream_waits, 1);
}

/// Every shared trace, three passes on one allocator, with the device running behind: after the first pass no page
/// move waits for the stream, and the peak stays within 1.5 % of the trace's peak live bytes.
#[test]
fn steady_state_replays_of_the_shared_traces_never_wait_for_the_stream() {
    // The package folder at run time (a test binary carried to a GPU machine runs there), else at build time.
    let root =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = std::path::Path::new(&root).join("tests/traces");
    for name in ["transformer-lm", "transformer-varlen", "mlp-grid8"] {
        let path = dir.join(format!("{name}.csv.gz"));
        let trace = read_trace(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for lag in [ReplayOptions::default().stream_lag, 4096] {
            let r = replay(
                &trace,
                &ReplayOptions {
                    passes: 3,
                    stream_lag: lag,
                    ..ReplayOptions::default()
                },
            )
            .unwrap();
            let steady: Vec<_> = r.passes[1..]
                .iter()
                .map(|p| (p.synchronising_moves, p.stream_waits))
                .collect();
            assert_eq!(steady, [(0, 0), (0, 0)], "{name}, lag {lag}: {r:?}");
            assert_eq!(r.ooms, 0);
            assert!(
                r.overhead <= 0.015,
                "{name}, lag {lag}: overhead {}",
                r.overhead
            );
        }
    }
}
