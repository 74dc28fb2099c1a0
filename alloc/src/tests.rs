//! Unit tests of policies, trim, tenants, configuration errors, the OOM report, stats and events.

use crate::replay::{ReplayOptions, ReplayPolicy, TraceOp, parse_trace, replay};
use crate::*;

const MIB: u64 = 1 << 20;

fn sim(limit: u64) -> Bfc<SimMemory> {
    Bfc::new(
        SimMemory::new(1 << 34),
        Config::builder().limit_bytes(limit).build().unwrap(),
    )
    .unwrap()
}

#[test]
fn rounds_aligns_and_reuses_cached_memory_without_source_calls() {
    let bfc = sim(64 * MIB);
    let a = bfc.alloc(1, TenantId::DEFAULT).unwrap();
    assert_eq!(a.size, 256);
    assert_eq!(a.ptr % 256, 0);
    let b = bfc.alloc(1000, TenantId::DEFAULT).unwrap();
    assert_eq!(b.size, 1024);
    assert_eq!(
        b.ptr,
        a.ptr + 256,
        "best fit splits the first region in address order"
    );
    let calls = bfc.counters().source_calls();
    for _ in 0..1000 {
        let x = bfc.alloc(4096, TenantId::DEFAULT).unwrap();
        bfc.free(x);
    }
    assert_eq!(
        bfc.counters().source_calls(),
        calls,
        "cached alloc + free makes no source call"
    );
    bfc.free(a);
    bfc.free(b);
    bfc.check_invariants().unwrap();
    assert_eq!(bfc.stats().cached_free, bfc.counters().reserved);
}

#[test]
fn coalescing_never_grows_the_pool() {
    let bfc = sim(64 * MIB);
    let blocks: Vec<Block> = (0..8)
        .map(|_| bfc.alloc(128 << 10, TenantId::DEFAULT).unwrap())
        .collect();
    let reserved = bfc.counters().reserved;
    // Free every other block, then the rest: neighbours merge into one chunk.
    let (even, odd): (Vec<_>, Vec<_>) = blocks
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    for (_, b) in even {
        bfc.free(b);
    }
    bfc.check_invariants().unwrap();
    for (_, b) in odd {
        bfc.free(b);
    }
    bfc.check_invariants().unwrap();
    let big = bfc.alloc((1024 << 10) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(
        bfc.counters().reserved,
        reserved,
        "a merged chunk serves the large request"
    );
    bfc.free(big);
    let s = bfc.stats();
    assert_eq!(s.fragmentation, 0.0);
    assert_eq!(s.largest_free_block.min(s.cached_free), s.cached_free);
}

#[test]
fn growth_regions_are_sized_by_request_class() {
    let bfc = sim(1 << 30);
    let small = bfc.alloc(1000, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.counters().reserved, 2 * MIB);
    let mid = bfc.alloc((3 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.counters().reserved, 22 * MIB);
    let large = bfc.alloc((33 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.counters().reserved, 22 * MIB + 34 * MIB);
    assert_eq!(bfc.counters().source_reserves, 3);
    for b in [small, mid, large] {
        bfc.free(b);
    }
    assert_eq!(bfc.trim(), 56 * MIB);
    let c = bfc.counters();
    assert_eq!(
        (c.reserved, c.source_releases, c.peak_reserved),
        (0, 3, 56 * MIB)
    );
}

#[test]
fn preallocate_reserves_once_and_never_grows() {
    let config = Config::builder()
        .limit_bytes(100 * MIB)
        .preallocate(0.5)
        .build()
        .unwrap();
    let bfc = Bfc::new(SimMemory::new(1 << 34), config).unwrap();
    let a = bfc.alloc(1024, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.counters().reserved, 50 * MIB);
    assert_eq!(bfc.counters().source_reserves, 1);
    let e = bfc
        .alloc((60 * MIB) as usize, TenantId::DEFAULT)
        .unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.cause, OomCause::DeviceFull);
    assert_eq!(bfc.counters().source_reserves, 1);
    bfc.free(a);
}

#[test]
fn hard_limit_in_bytes_and_percent() {
    let bfc = sim(10 * MIB);
    let a = bfc.alloc((8 * MIB) as usize, TenantId::DEFAULT).unwrap();
    let e = bfc
        .alloc((4 * MIB) as usize, TenantId::DEFAULT)
        .unwrap_err();
    assert_eq!(e.out_of_memory().unwrap().cause, OomCause::DeviceFull);
    assert!(bfc.counters().reserved <= 10 * MIB);
    bfc.free(a);
    let too_big = bfc
        .alloc((11 * MIB) as usize, TenantId::DEFAULT)
        .unwrap_err();
    assert_eq!(too_big.out_of_memory().unwrap().cause, OomCause::TooLarge);

    let pct = Config::builder().limit_percent(25.0).build().unwrap();
    let bfc = Bfc::new(SimMemory::new(400 * MIB), pct).unwrap();
    assert_eq!(bfc.limit(), 100 * MIB);
}

#[test]
fn oom_trims_cached_regions_and_retries_once() {
    let bfc = sim(40 * MIB);
    // Fill the limit with 20 MiB regions of medium blocks, free them: all cached.
    let blocks: Vec<Block> = (0..4)
        .map(|_| bfc.alloc((9 * MIB) as usize, TenantId::DEFAULT).unwrap())
        .collect();
    for b in blocks {
        bfc.free(b);
    }
    assert_eq!(bfc.counters().reserved, 40 * MIB);
    // 30 MiB fits no cached chunk (regions never merge) and the limit leaves no room: trim, then it fits.
    let big = bfc.alloc((30 * MIB) as usize, TenantId::DEFAULT).unwrap();
    let c = bfc.counters();
    assert_eq!(c.trims, 1);
    assert_eq!(c.ooms, 0);
    assert_eq!(c.source_releases, 2);
    bfc.free(big);
}

#[test]
fn fragmentation_is_the_cause_when_free_bytes_are_split() {
    let config = Config::builder()
        .limit_bytes(4 * MIB)
        .preallocate(1.0)
        .build()
        .unwrap();
    let bfc = Bfc::new(SimMemory::new(1 << 30), config).unwrap();
    let blocks: Vec<Block> = (0..16)
        .map(|_| bfc.alloc(256 << 10, TenantId::DEFAULT).unwrap())
        .collect();
    let mut keep = Vec::new();
    for (i, b) in blocks.into_iter().enumerate() {
        if i % 2 == 0 {
            bfc.free(b);
        } else {
            keep.push(b);
        }
    }
    let e = bfc.alloc(MIB as usize, TenantId::DEFAULT).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.cause, OomCause::Fragmentation);
    assert_eq!(oom.largest_free_block, 256 << 10);
    assert!(
        (oom.fragmentation - 0.875).abs() < 1e-9,
        "{}",
        oom.fragmentation
    );
    let text = e.to_string();
    assert!(text.contains("fragmentation 87.5 %"), "{text}");
    assert!(text.contains("trim()"), "{text}");
    for b in keep {
        bfc.free(b);
    }
}

#[test]
fn tenant_limit_fails_that_tenant_alone_with_a_full_report() {
    let bfc = sim(64 * MIB);
    let cnn = bfc.add_tenant("cnn", TenantLimits::limit(2 * MIB)).unwrap();
    let mlp = bfc.add_tenant("mlp", TenantLimits::unlimited()).unwrap();
    let a = bfc.alloc((1536 << 10) as usize, cnn).unwrap();
    let e = bfc.alloc(MIB as usize, cnn).unwrap_err();
    let oom = e.out_of_memory().unwrap().clone();
    assert_eq!(oom.cause, OomCause::TenantLimit);
    assert_eq!(oom.tenant_name, "cnn");
    assert_eq!(oom.requested, MIB);
    assert_eq!(oom.tenant_in_use, 1536 << 10);
    assert_eq!(oom.tenant_limit, Some(2 * MIB));
    assert_eq!(oom.limit, 64 * MIB);
    assert!(oom.device_free > 0);
    let text = e.to_string();
    for needle in [
        "tenant \"cnn\" asked 1.00 MiB",
        "1.50 MiB of its 2.00 MiB limit",
        "Cause: tenant limit",
        "Raise this tenant's limit",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from {text}");
    }
    // The other tenant is unaffected.
    let b = bfc.alloc((8 * MIB) as usize, mlp).unwrap();
    let s = bfc.stats();
    assert_eq!(s.tenants[cnn.index()].ooms, 1);
    assert_eq!(s.tenants[mlp.index()].ooms, 0);
    assert_eq!(s.counters.ooms, 1);
    assert_eq!(
        s.counters.trims, 0,
        "a tenant limit is not helped by trimming"
    );
    bfc.free(a);
    bfc.free(b);
}

#[test]
fn reserves_are_kept_and_unused_memory_is_borrowed() {
    let bfc = sim(32 * MIB);
    let main = bfc
        .add_tenant("main", TenantLimits::unlimited().with_reserve(16 * MIB))
        .unwrap();
    let side = bfc.add_tenant("side", TenantLimits::unlimited()).unwrap();
    // side may borrow everything except main's reserve.
    let s1 = bfc.alloc((15 * MIB) as usize, side).unwrap();
    let e = bfc.alloc((2 * MIB) as usize, side).unwrap_err();
    let oom = e.out_of_memory().unwrap();
    assert_eq!(oom.cause, OomCause::ReservedByOthers);
    assert_eq!(oom.reserved_for_others, 16 * MIB);
    // main gets its reserve, and once it uses it, the rest is shared.
    let m = bfc.alloc((16 * MIB) as usize, main).unwrap();
    bfc.free(s1);
    let s2 = bfc.alloc((16 * MIB) as usize, side).unwrap();
    bfc.check_invariants().unwrap();
    bfc.free(m);
    bfc.free(s2);
    assert!(matches!(
        bfc.add_tenant("greedy", TenantLimits::unlimited().with_reserve(20 * MIB)),
        Err(Error::InvalidTenant { .. })
    ));
    assert!(matches!(
        bfc.add_tenant("odd", TenantLimits::limit(MIB).with_reserve(2 * MIB)),
        Err(Error::InvalidTenant { .. })
    ));
    assert!(matches!(
        bfc.alloc(1, TenantId(99)),
        Err(Error::UnknownTenant(_))
    ));
    bfc.set_tenant_limits(main, TenantLimits::unlimited())
        .unwrap();
    let all = bfc.alloc((32 * MIB) as usize, side).unwrap();
    bfc.free(all);
    assert_eq!(bfc.tenant("side"), Some(side));
    assert_eq!(bfc.tenant_stats(side).unwrap().peak_in_use, 32 * MIB);
}

/// A loop of models trained one after another: each one's step temporaries are freed before the next one's are
/// made, so the allocator-wide peak after a reset is the most held at one moment, not the sum of the tenants' peaks.
#[test]
fn reset_peak_restarts_the_allocator_peak_from_what_is_held() {
    let bfc = sim(256 * MIB);
    let a = bfc.add_tenant("a", TenantLimits::unlimited()).unwrap();
    let b = bfc.add_tenant("b", TenantLimits::unlimited()).unwrap();
    let pa = bfc.alloc((4 * MIB) as usize, a).unwrap();
    let pb = bfc.alloc((4 * MIB) as usize, b).unwrap();
    let warm = bfc.alloc((40 * MIB) as usize, a).unwrap();
    bfc.free(warm);
    let before = bfc.counters();
    assert_eq!(before.peak_in_use, 48 * MIB);
    bfc.trim();
    let trimmed = bfc.counters();
    assert!(
        trimmed.reserved < trimmed.peak_reserved,
        "the trim lowered reserved below its peak"
    );

    bfc.reset_peak();
    let c = bfc.counters();
    assert_eq!((c.in_use, c.peak_in_use), (8 * MIB, 8 * MIB));
    assert_eq!(c.peak_reserved, c.reserved);
    // The tenants' own peaks are not the allocator's: they stay.
    assert_eq!(bfc.tenant_stats(a).unwrap().peak_in_use, 44 * MIB);
    assert_eq!(bfc.tenant_stats(b).unwrap().peak_in_use, 4 * MIB);

    // One step each, in turn: 16 MiB of a's temporaries, freed, then 16 MiB of b's.
    for t in [a, b] {
        let tmp = bfc.alloc((16 * MIB) as usize, t).unwrap();
        bfc.free(tmp);
    }
    let c = bfc.counters();
    assert_eq!(
        c.peak_in_use,
        24 * MIB,
        "the held 8 MiB and one step's 16 MiB at a time"
    );
    assert!(c.peak_reserved >= c.peak_in_use);
    let b_peak = bfc.tenant_stats(b).unwrap().peak_in_use;
    assert_eq!(b_peak, 20 * MIB, "b's own peak grew with its step");
    assert_eq!(bfc.tenant_stats(a).unwrap().peak_in_use, 44 * MIB);
    bfc.free(pa);
    bfc.free(pb);
    bfc.check_invariants().unwrap();
}

/// A program that resets the peak to measure a phase places blocks, and moves and creates pages, as one that does
/// not: the peak is a figure reported, never an input to placement.
#[test]
fn reset_peak_does_not_change_where_blocks_go() {
    let run = |reset: bool| {
        let config = Config::builder()
            .idle_page_slack(0)
            .large_block(u64::MAX)
            .build()
            .unwrap();
        let bfc = Bfc::new(SimMemory::stitched(1 << 30), config).unwrap();
        let held = bfc.alloc((64 * MIB) as usize, TenantId::DEFAULT).unwrap();
        for _ in 0..6 {
            let a = bfc.alloc((6 * MIB) as usize, TenantId::DEFAULT).unwrap();
            let b = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
            bfc.free(a);
            let c = bfc.alloc((10 * MIB) as usize, TenantId::DEFAULT).unwrap();
            bfc.free(b);
            bfc.free(c);
        }
        // The model that held most of the memory goes, leaving idle pages below a block that stays.
        let top = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.free(held);
        if reset {
            bfc.reset_peak();
        }
        let before = bfc.counters();
        // More than the idle pages below `top`: placed past it, on new pages and idle ones moved.
        let big = bfc.alloc((100 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.check_invariants().unwrap();
        let after = bfc.counters();
        let map = bfc.chunk_map();
        bfc.free(big);
        bfc.free(top);
        (
            after.page_moves - before.page_moves,
            after.page_creates - before.page_creates,
            map,
            before.peak_in_use,
        )
    };
    let (moves, creates, map, peak) = run(false);
    let (moves_r, creates_r, map_r, peak_r) = run(true);
    assert!(
        moves > 0 && creates > 0,
        "the block takes idle pages and new ones: {moves} moved, {creates} created"
    );
    assert_eq!(
        (moves_r, creates_r),
        (moves, creates),
        "pages moved and created, with and without the reset"
    );
    assert_eq!(map_r, map);
    assert_eq!(
        (peak, peak_r),
        (76 * MIB, 2 * MIB),
        "the reset lowered the peak to what was held"
    );
}

#[test]
fn foreign_and_double_free_are_errors() {
    let a = sim(16 * MIB);
    let b = sim(16 * MIB);
    let x = a.alloc(4096, TenantId::DEFAULT).unwrap();
    let _y = b.alloc(4096, TenantId::DEFAULT).unwrap();
    let forged = Block {
        ptr: x.ptr + 256,
        size: x.size,
        ..x
    };
    assert!(matches!(
        a.try_free(forged),
        Err(Error::ForeignBlock { .. })
    ));
    a.check_invariants().unwrap();
    assert_eq!(a.counters().live_blocks, 1);
}

#[test]
fn configuration_freezes_at_first_allocation() {
    let bfc = sim(16 * MIB);
    bfc.set_limit(Some(Limit::Bytes(8 * MIB))).unwrap();
    assert_eq!(bfc.limit(), 8 * MIB);
    let line = line!() + 1;
    let a = bfc.alloc(100, TenantId::DEFAULT).unwrap();
    let e = bfc.set_limit(Some(Limit::Bytes(4 * MIB))).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::ConfigFrozen { .. }));
    assert!(text.contains(&format!("src/tests.rs:{line}")), "{text}");
    assert!(text.contains("before the first allocation"), "{text}");
    assert!(bfc.reconfigure(Config::default()).is_err());
    bfc.free(a);
}

#[test]
fn a_huge_request_is_too_large_not_a_panic() {
    let bfc = sim(16 * MIB);
    let e = bfc.alloc(usize::MAX, TenantId::DEFAULT).unwrap_err();
    assert_eq!(e.out_of_memory().unwrap().cause, OomCause::TooLarge);
    assert!(e.to_string().contains("can never fit"), "{e}");
    assert!(
        bfc.add_tenant("x", TenantLimits::unlimited().with_reserve(u64::MAX))
            .is_err()
    );
}

#[test]
fn environment_changes_after_first_use_are_refused() {
    let bfc = sim(16 * MIB);
    bfc.apply_env().unwrap();
    let a = bfc.alloc(100, TenantId::DEFAULT).unwrap();
    bfc.apply_env().unwrap();
    // SAFETY: no other test reads or writes COHORT_ALLOCATOR.
    unsafe { std::env::set_var("COHORT_ALLOCATOR", "direct") };
    let e = bfc.apply_env().unwrap_err();
    // SAFETY: as above.
    unsafe { std::env::remove_var("COHORT_ALLOCATOR") };
    assert!(matches!(e, Error::ConfigFrozen { .. }), "{e:?}");
    assert!(
        e.to_string().contains("COHORT_* environment variables"),
        "{e}"
    );
    bfc.free(a);
}

fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn environment_variables_parse() {
    let c = Config::builder()
        .env_from(env(&[
            ("COHORT_MEMORY_LIMIT", "12GiB"),
            ("COHORT_MEMORY_GROWTH", "false"),
            ("COHORT_ALLOCATOR", "direct"),
            ("COHORT_DEVICE", "cuda:1"),
        ]))
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.limit, Some(Limit::Bytes(12 << 30)));
    assert_eq!(
        c.policy,
        Policy::Preallocate {
            fraction: DEFAULT_PREALLOCATE_FRACTION
        }
    );
    assert_eq!(c.backend, Backend::Direct);
    assert_eq!(c.device, DeviceSelector::Cuda(1));
    let c = Config::builder()
        .env_from(env(&[
            ("COHORT_MEMORY_LIMIT", "40%"),
            ("COHORT_DEVICE", "auto"),
            ("COHORT_ALLOCATOR", "async"),
        ]))
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.limit, Some(Limit::Percent(40.0)));
    assert_eq!(c.limit_bytes(1000), 400);
    assert_eq!(c.backend, Backend::Async);
    assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
    assert_eq!(parse_bytes("1.5 GB"), Some(1_500_000_000));
    assert_eq!(parse_bytes("64k"), Some(65536));
    assert_eq!(
        "cpu".parse::<DeviceSelector>().unwrap(),
        DeviceSelector::Cpu
    );
    assert_eq!(
        "cuda".parse::<DeviceSelector>().unwrap(),
        DeviceSelector::Cuda(0)
    );
}

#[test]
fn every_bad_environment_value_names_variable_value_and_forms() {
    let cases = [
        ("COHORT_MEMORY_LIMIT", "12 parsecs", "12GiB"),
        ("COHORT_MEMORY_LIMIT", "140%", "40%"),
        ("COHORT_MEMORY_LIMIT", "0%", "40%"),
        ("COHORT_MEMORY_LIMIT", "-5GiB", "12GiB"),
        ("COHORT_MEMORY_GROWTH", "maybe", "true or false"),
        ("COHORT_ALLOCATOR", "tlsf", "bfc, async, direct"),
        ("COHORT_DEVICE", "tpu:0", "cuda:N"),
        ("COHORT_DEVICE", "cuda:x", "cuda:N"),
    ];
    for (var, value, form) in cases {
        let e = Config::builder()
            .env_from(env(&[(var, value)]))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, Error::InvalidEnv { .. }),
            "{var}={value}: {e:?}"
        );
        assert!(
            text.contains(var) && text.contains(value) && text.contains(form),
            "{text}"
        );
    }
}

#[test]
fn every_bad_builder_value_is_an_error() {
    for f in [0.0, -0.5, 1.5, f64::NAN] {
        let e = Config::builder().preallocate(f).build().unwrap_err();
        assert!(e.to_string().contains("preallocate fraction"), "{e}");
    }
    for p in [0.0, 101.0, f64::NAN] {
        assert!(Config::builder().limit_percent(p).build().is_err());
    }
    assert!(Config::builder().limit_bytes(0).build().is_err());
    assert!("tlsf".parse::<Backend>().is_err());
    assert!("gpu:1".parse::<DeviceSelector>().is_err());
    assert!("".parse::<Limit>().is_err());
}

#[test]
fn direct_backend_calls_the_source_every_time() {
    let config = Config::builder().backend(Backend::Direct).build().unwrap();
    let bfc = Bfc::new(SimMemory::new(1 << 30), config).unwrap();
    for _ in 0..10 {
        let b = bfc.alloc(1000, TenantId::DEFAULT).unwrap();
        bfc.free(b);
    }
    let c = bfc.counters();
    assert_eq!(
        (c.source_reserves, c.source_releases, c.reserved),
        (10, 10, 0)
    );
}

/// A stitched allocator of `pages` 2 MiB pages with one arena (no large-block alignment, so that blocks share
/// pages) and no idle-page slack.
fn one_arena_stitched(pages: u64) -> Bfc<SimMemory> {
    let config = Config::builder()
        .limit_bytes(pages * 2 * MIB)
        .large_block(u64::MAX)
        .idle_page_slack(0)
        .build()
        .unwrap();
    Bfc::new(SimMemory::stitched(1 << 30), config).unwrap()
}

/// A CUDA graph's pool grows during its capture, when the stream may be neither waited for nor recorded on: an
/// allocation without sync still moves an idle page (that needs no wait), records no point, and an OOM does not
/// trim (which may wait).
#[test]
fn allocations_without_sync_never_wait_record_or_trim() {
    let bfc = one_arena_stitched(6);
    bfc.with_source(|s| s.stream().hold());
    let a = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
    let b = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
    bfc.free(a);
    // Page 0 is idle and its last use not passed: its physical page moves under d, its mapping stays.
    let d = bfc
        .alloc_without_sync((4 * MIB) as usize, TenantId::DEFAULT)
        .unwrap();
    bfc.check_invariants().unwrap();
    let s = bfc.stats();
    assert_eq!((s.counters.page_moves, s.counters.page_creates), (1, 3));
    assert_eq!((s.pages_mapped, s.pages_retired), (3, 1));
    let sim = bfc.with_source(|s| s.counters());
    assert_eq!((sim.points_recorded, sim.stream_waits), (0, 0));
    // Three pages are left under the limit and none is idle: 8 MiB more fails, without the trim a plain
    // allocation makes first.
    let e = bfc
        .alloc_without_sync((8 * MIB) as usize, TenantId::DEFAULT)
        .unwrap_err();
    assert_eq!(e.out_of_memory().unwrap().cause, OomCause::DeviceFull);
    let s = bfc.stats();
    assert_eq!((s.counters.trims, s.counters.stream_waits), (0, 0));
    bfc.check_invariants().unwrap();
    for x in [b, d] {
        bfc.free(x);
    }
}

#[test]
fn stitched_maps_pages_moves_idle_ones_and_trims_them() {
    let page = 2 * MIB;
    let bfc = one_arena_stitched(8);
    let a = bfc.alloc((3 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.stats().pages_mapped, 2);
    let b = bfc.alloc((8 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(bfc.stats().pages_mapped, 6, "b shares a's second page");
    bfc.free(a);
    let s = bfc.stats();
    assert_eq!((s.pages_mapped, s.pages_idle), (6, 1));
    // 6 of 8 pages mapped, one idle: a 10 MiB block past b needs 5 more pages, only 3 can be had.
    let e = bfc
        .alloc((10 * MIB) as usize, TenantId::DEFAULT)
        .unwrap_err();
    assert_eq!(e.out_of_memory().unwrap().cause, OomCause::DeviceFull);
    bfc.check_invariants().unwrap();
    // A 6 MiB block past b needs 3 pages: the 2 left under the limit are created, the idle page 0 is moved.
    let c = bfc.alloc((6 * MIB) as usize, TenantId::DEFAULT).unwrap();
    bfc.check_invariants().unwrap();
    let s = bfc.stats();
    assert_eq!(s.pages_mapped, 8);
    assert_eq!((s.counters.page_moves, s.counters.page_creates), (1, 8));
    assert!(s.counters.reserved <= 8 * page);
    bfc.free(b);
    bfc.free(c);
    let released = bfc.trim();
    assert_eq!(released, s.counters.reserved);
    assert_eq!(bfc.stats().pages_mapped, 0);

    for (slack, moves, mapped) in [(0, 1, 3), (1, 0, 4)] {
        let config = Config::builder()
            .idle_page_slack(slack)
            .large_block(u64::MAX)
            .build()
            .unwrap();
        let bfc = Bfc::new(SimMemory::stitched(1 << 30), config).unwrap();
        let a = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        let b = bfc.alloc((2 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.free(a);
        // Page 0 is idle; a 4 MiB block after b needs pages 2 and 3: one moved from page 0 unless the slack keeps it.
        let d = bfc.alloc((4 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.check_invariants().unwrap();
        let s = bfc.stats();
        assert_eq!(
            (s.counters.page_moves, s.pages_mapped),
            (moves, mapped),
            "slack {slack}"
        );
        assert_eq!(bfc.with_source(|s| s.counters().page_moves), moves);
        bfc.free(b);
        bfc.free(d);
    }
    let sim = bfc.with_source(|s| s.counters());
    assert_eq!(sim.page_releases, bfc.counters().page_releases);
    assert_eq!(bfc.with_source(|s| s.used()), 0);
}

#[test]
fn stitched_large_blocks_start_on_a_page_in_their_own_arena() {
    let bfc = Bfc::new(SimMemory::stitched(1 << 30), Config::default()).unwrap();
    let small = bfc.alloc(1000, TenantId::DEFAULT).unwrap();
    let large = bfc.alloc((3 * MIB) as usize, TenantId::DEFAULT).unwrap();
    let large2 = bfc.alloc((3 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(large.ptr % (2 * MIB), 0);
    assert_eq!(
        large2.ptr % (2 * MIB),
        0,
        "the padding after the first large block is skipped"
    );
    assert!(
        large.ptr > small.ptr + (256 << 20),
        "large blocks live in the upper arena"
    );
    assert_eq!(bfc.stats().pages_mapped, 1 + 2 + 2);
    bfc.free(large);
    let again = bfc.alloc((4 * MIB) as usize, TenantId::DEFAULT).unwrap();
    assert_eq!(again.ptr % (2 * MIB), 0);
    bfc.check_invariants().unwrap();
    for b in [small, large2, again] {
        bfc.free(b);
    }
    bfc.check_invariants().unwrap();
}

#[test]
fn report_displays_a_table_and_serializes() {
    let bfc = sim(64 * MIB);
    let t = bfc
        .add_tenant("mlp-lr1e-3", TenantLimits::limit(8 * MIB))
        .unwrap();
    let b = bfc.alloc((3 * MIB) as usize, t).unwrap();
    let report = bfc.stats();
    let text = report.to_string();
    assert!(
        text.contains("mlp-lr1e-3") && text.contains("3.00 MiB") && text.contains("fragmentation"),
        "{text}"
    );
    let json = report.to_json();
    let back: MemoryReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    assert!(json.contains("\"peak_reserved\""));
    bfc.free(b);
}

#[test]
fn events_are_bounded_and_export_as_chrome_trace() {
    let config = Config::builder().record_events(16).build().unwrap();
    let bfc = Bfc::new(SimMemory::new(1 << 30), config).unwrap();
    let t = bfc.add_tenant("cnn", TenantLimits::limit(MIB)).unwrap();
    for _ in 0..20 {
        let b = bfc.alloc(1000, t).unwrap();
        bfc.free(b);
    }
    assert!(bfc.alloc((2 * MIB) as usize, t).is_err());
    let events = bfc.events();
    assert_eq!(events.len(), 16);
    assert_eq!(events.last().unwrap().kind, EventKind::Oom);
    let trace: serde_json::Value = serde_json::from_str(&bfc.chrome_trace()).unwrap();
    let evs = trace["traceEvents"].as_array().unwrap();
    assert!(
        evs.iter()
            .any(|e| e["name"] == "reserved" && e["ph"] == "C")
    );
    assert!(
        evs.iter()
            .any(|e| e["name"] == "in use" && e["args"]["cnn"].is_u64())
    );
    assert!(
        evs.iter()
            .any(|e| e["name"] == "out of memory" && e["ph"] == "i")
    );
}

#[test]
fn allocator_is_send_and_sync_and_serves_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Bfc<SimMemory>>();
    assert_send_sync::<Block>();
    let bfc = std::sync::Arc::new(sim(256 * MIB));
    let handles: Vec<_> = (0..4)
        .map(|k| {
            let bfc = bfc.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    let b = bfc
                        .alloc(256 * (1 + (i * 7 + k) % 64), TenantId::DEFAULT)
                        .unwrap();
                    bfc.free(b);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    bfc.check_invariants().unwrap();
    assert_eq!(bfc.counters().allocs, 2000);
}

#[test]
fn trace_lines_are_checked_with_line_numbers() {
    let good = "op,id,bytes\na,1,2048   # alloc\na,2,512\nf,1,0\nt,0,0\n\n";
    let t = parse_trace(good.as_bytes(), "t").unwrap();
    assert_eq!((t.ops.len(), t.peak_live_bytes), (4, 2560));
    assert_eq!(t.ops[3], TraceOp::Trim);
    // The file form reads back as the same trace.
    let again = parse_trace(t.to_csv().as_bytes(), "t").unwrap();
    assert_eq!(again.ops, t.ops);
    for (text, line, what) in [
        ("op,id,bytes\na,1,2048\nx,2,5\n", 3, "is not `a`"),
        ("a,1,2048\nf,7,0\n", 2, "not live"),
        ("a,1,2048\na,1,64\n", 2, "again"),
        ("a,1\n", 1, "3 fields"),
        ("a,one,5\n", 1, "id"),
        ("a,1,-5\n", 1, "bytes"),
    ] {
        let e = parse_trace(text.as_bytes(), "bad.csv").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains(&format!("line {line}")) && s.contains(what),
            "{s}"
        );
    }
}

#[test]
fn replay_second_pass_makes_no_source_calls_with_segments() {
    let mut text = String::from("op,id,bytes\n");
    let mut id = 0;
    for _step in 0..4 {
        let first = id;
        for k in 0..50u64 {
            text.push_str(&format!("a,{id},{}\n", 512 * (1 + (k * 37) % 4096)));
            id += 1;
        }
        for k in first..id {
            text.push_str(&format!("f,{k},0\n"));
        }
    }
    let trace = parse_trace(text.as_bytes(), "synthetic").unwrap();
    for policy in [ReplayPolicy::Growth, ReplayPolicy::Stitched] {
        let r = replay(
            &trace,
            &ReplayOptions {
                policy,
                passes: 2,
                ..ReplayOptions::default()
            },
        )
        .unwrap();
        assert_eq!(r.ooms, 0);
        assert!(r.overhead >= 0.0);
        assert_eq!(r.passes.len(), 2);
        if policy == ReplayPolicy::Growth {
            assert_eq!(r.passes[1].source_calls, 0, "{r:?}");
        }
    }
}

#[test]
fn a_limit_resized_in_use_gives_idle_memory_back_and_never_touches_live_blocks() {
    for bfc in [
        sim(1 << 30),
        Bfc::new(SimMemory::stitched(1 << 34), Config::default()).unwrap(),
    ] {
        let a = bfc.alloc((100 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.free(a);
        assert!(bfc.stats().counters.reserved >= 100 * MIB);
        // Lower: the idle cache goes back to the source at once, and nothing larger fits any more.
        assert_eq!(bfc.resize_limit(50 * MIB).unwrap(), 0);
        assert_eq!(bfc.limit(), 50 * MIB);
        let e = bfc
            .alloc((60 * MIB) as usize, TenantId::DEFAULT)
            .unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        // Higher: it grows again.
        bfc.resize_limit(200 * MIB).unwrap();
        let live = bfc.alloc((120 * MIB) as usize, TenantId::DEFAULT).unwrap();
        // Below what is live: the block stays where it is, the pool only stops growing.
        let reserved = bfc.resize_limit(50 * MIB).unwrap();
        assert!(reserved >= 120 * MIB, "{reserved}");
        assert!(
            bfc.alloc(1, TenantId::DEFAULT)
                .unwrap_err()
                .is_out_of_memory()
        );
        bfc.free(live);
        assert_eq!(
            bfc.resize_limit(50 * MIB).unwrap(),
            0,
            "applied again, it trims"
        );
        let small = bfc.alloc((10 * MIB) as usize, TenantId::DEFAULT).unwrap();
        bfc.free(small);
        bfc.check_invariants().unwrap();
        // A limit below the promised reserves is refused, naming both figures, and changes nothing.
        bfc.resize_limit(200 * MIB).unwrap();
        bfc.add_tenant("main", TenantLimits::unlimited().with_reserve(80 * MIB))
            .unwrap();
        let e = bfc.resize_limit(64 * MIB).unwrap_err().to_string();
        assert!(e.contains("64.00 MiB") && e.contains("80.00 MiB"), "{e}");
        assert_eq!(bfc.limit(), 200 * MIB);
    }
}

#[test]
fn a_process_limit_leaves_the_pool_what_lies_outside_it_does_not_take() {
    assert_eq!(
        pool_share(2 << 30, 600 * MIB).unwrap(),
        (2 << 30) - 600 * MIB - PROCESS_HEADROOM
    );
    // 512 MiB for a process whose context and modules hold 530 MiB: refused with both figures and the way out.
    let e = pool_share(512 * MIB, 530 * MIB).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::LimitBelowOutside { .. }));
    assert!(
        text.contains("512.00 MiB") && text.contains("594.00 MiB") && text.contains("598.00 MiB"),
        "{text}"
    );
    assert!(text.contains("scope = \"pool\""), "{text}");
    assert!(pool_share(530 * MIB + PROCESS_HEADROOM + MIN_POOL, 530 * MIB).is_ok());
    // The scope is read from the environment like the other settings, and checked.
    let get = |v: &'static str| move |k: &str| (k == "COHORT_MEMORY_SCOPE").then(|| v.to_string());
    let c = Config::builder()
        .env_from(get("process"))
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(c.scope, Scope::Process);
    let e = Config::builder()
        .env_from(get("card"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("COHORT_MEMORY_SCOPE") && e.contains("process"),
        "{e}"
    );
}
