//! A cached alloc + free makes no heap allocation and no source call (counted by a global allocator wrapper).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use cohort_alloc::{Bfc, Block, Config, SimMemory, TenantId, TenantLimits};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn steady_state(bfc: &Bfc<SimMemory>, tenant: TenantId) {
    let sizes: Vec<usize> = (0..64).map(|i| 256 + i * 4093 % (3 << 20)).collect();
    let mut live: Vec<Block> = Vec::with_capacity(64);
    // Warm-up: the cache, the chunk slab and the page table grow to the working set.
    for _ in 0..3 {
        for &s in &sizes {
            live.push(bfc.alloc(s, tenant).unwrap());
        }
        for b in live.drain(..) {
            bfc.free(b);
        }
    }
    let calls = bfc.counters().source_calls();
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..10 {
        for &s in &sizes {
            live.push(bfc.alloc(s, tenant).unwrap());
        }
        for b in live.drain(..) {
            bfc.free(b);
        }
    }
    let after = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(after - before, 0, "heap allocations in steady state");
    assert_eq!(
        bfc.counters().source_calls(),
        calls,
        "source calls in steady state"
    );
}

#[test]
fn cached_alloc_and_free_allocate_nothing() {
    // One test function, so no other test thread allocates while counting.
    let seg = Bfc::new(SimMemory::new(1 << 34), Config::default()).unwrap();
    let t = seg
        .add_tenant("member", TenantLimits::limit(1 << 30))
        .unwrap();
    steady_state(&seg, t);
    let stitched = Bfc::new(
        SimMemory::stitched(1 << 34),
        Config::builder().record_events(128).build().unwrap(),
    )
    .unwrap();
    steady_state(&stitched, TenantId::DEFAULT);
}
