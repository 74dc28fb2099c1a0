//! Random sequences of allocations, frees and trims across tenants; every invariant checked after every step.

use cohort_alloc::{
    Backend, Bfc, Block, Config, MemorySource, OomCause, SimMemory, TenantId, TenantLimits,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, tenant: u16 },
    Free(usize),
    Trim,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..4096,
        3 => 4096usize..(256 << 10),
        2 => (256usize << 10)..(4 << 20),
        1 => (4usize << 20)..(12 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size(), 0u16..4).prop_map(|(size, tenant)| Op::Alloc { size, tenant }),
        8 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
    ]
}

/// Runs `ops` on `bfc` with tenants 1..=3 (one limited, one with a reserve, one free to borrow).
fn run<S: MemorySource>(bfc: &Bfc<S>, ops: &[Op]) -> Result<(), TestCaseError> {
    let a = bfc
        .add_tenant("limited", TenantLimits::limit(12 * MIB))
        .unwrap();
    let b = bfc
        .add_tenant(
            "reserved",
            TenantLimits::limit(24 * MIB).with_reserve(8 * MIB),
        )
        .unwrap();
    let c = bfc
        .add_tenant("borrower", TenantLimits::unlimited())
        .unwrap();
    let ids = [TenantId::DEFAULT, a, b, c];
    let mut live: Vec<Block> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc { size, tenant } => {
                let t = ids[usize::from(tenant)];
                match bfc.alloc(size, t) {
                    Ok(block) => {
                        prop_assert!(block.size >= size as u64);
                        prop_assert_eq!(block.ptr % 256, 0);
                        prop_assert_eq!(block.tenant(), t);
                        live.push(block);
                    }
                    Err(e) => {
                        let oom = e.out_of_memory().expect("only OOM errors are expected");
                        if oom.cause == OomCause::TenantLimit {
                            prop_assert!(
                                oom.tenant_in_use + oom.rounded > oom.tenant_limit.unwrap()
                            );
                        }
                    }
                }
            }
            Op::Free(i) => {
                if !live.is_empty() {
                    let block = live.swap_remove(i % live.len());
                    bfc.try_free(block).unwrap();
                }
            }
            Op::Trim => {
                bfc.trim();
            }
        }
        if let Err(e) = bfc.check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
        }
        // No overlap between live blocks, and stats equal a recount.
        let mut spans: Vec<(u64, u64)> = live.iter().map(|b| (b.ptr, b.size)).collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            prop_assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap: {:?}", w);
        }
        let s = bfc.stats();
        prop_assert_eq!(s.counters.in_use, live.iter().map(|b| b.size).sum::<u64>());
        prop_assert_eq!(s.counters.live_blocks, live.len() as u64);
        for (i, id) in ids.iter().enumerate() {
            let used: u64 = live
                .iter()
                .filter(|b| b.tenant() == *id)
                .map(|b| b.size)
                .sum();
            prop_assert_eq!(s.tenants[i].in_use, used);
        }
        prop_assert!(s.tenants[1].in_use <= 12 * MIB);
        prop_assert!(s.counters.reserved <= s.limit);
    }
    for block in live.drain(..) {
        bfc.try_free(block).unwrap();
    }
    bfc.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(bfc.counters().in_use, 0);
    bfc.trim();
    prop_assert_eq!(bfc.counters().reserved, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn segments_growth(ops in proptest::collection::vec(op(), 1..300)) {
        let bfc = Bfc::new(SimMemory::new(1 << 30), Config::builder().limit_bytes(48 * MIB).build().unwrap()).unwrap();
        run(&bfc, &ops)?;
        let calls = bfc.with_source(|s| s.counters());
        prop_assert_eq!(calls.reserves, calls.releases);
    }

    #[test]
    fn segments_preallocate(ops in proptest::collection::vec(op(), 1..300)) {
        let config = Config::builder().limit_bytes(48 * MIB).preallocate(0.75).build().unwrap();
        let bfc = Bfc::new(SimMemory::new(1 << 30), config).unwrap();
        run(&bfc, &ops)?;
    }

    #[test]
    fn direct(ops in proptest::collection::vec(op(), 1..200)) {
        let config = Config::builder().limit_bytes(48 * MIB).backend(Backend::Direct).build().unwrap();
        let bfc = Bfc::new(SimMemory::new(1 << 30), config).unwrap();
        run(&bfc, &ops)?;
    }

    #[test]
    fn stitched(ops in proptest::collection::vec(op(), 1..300), slack in 0u64..6) {
        let config = Config::builder().limit_bytes(48 * MIB).idle_page_slack(slack).build().unwrap();
        let bfc = Bfc::new(SimMemory::stitched_with_page(1 << 30, 64 << 10), config).unwrap();
        run(&bfc, &ops)?;
        let s = bfc.stats();
        let sim = bfc.with_source(|s| s.counters());
        prop_assert_eq!(sim.page_moves, s.counters.page_moves);
        prop_assert_eq!(sim.page_creates, s.counters.page_creates);
        prop_assert_eq!(sim.page_releases, s.counters.page_releases);
    }

    #[test]
    fn stitched_preallocate(ops in proptest::collection::vec(op(), 1..200)) {
        let config = Config::builder().limit_bytes(48 * MIB).preallocate(0.5).build().unwrap();
        let bfc = Bfc::new(SimMemory::stitched_with_page(1 << 30, 64 << 10), config).unwrap();
        run(&bfc, &ops)?;
    }
}
