//! Allocator speed: a cached alloc + free pair (target ≤ 50 ns median, segments and stitched), a mixed-size
//! workload, 4 threads contending, and a real trace.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cohort_alloc::{Bfc, Block, Config, HostMemory, SimMemory, TenantId};
use criterion::{Criterion, criterion_group, criterion_main};

fn warm<S: cohort_alloc::MemorySource>(bfc: &Bfc<S>) {
    // Grow the cache and the chunk slab to the working set, so the timed loop is steady state.
    let blocks: Vec<Block> = (0..256)
        .map(|i| bfc.alloc(256 * (1 + i % 97), TenantId::DEFAULT).unwrap())
        .collect();
    for b in blocks {
        bfc.free(b);
    }
}

/// Times `f` in wall time (`NAME`) and in this thread's CPU time (`NAME_cpu_time`), which a machine shared with
/// other builds does not inflate.
fn both(c: &mut Criterion, name: &str, mut f: impl FnMut()) {
    c.bench_function(name, |b| b.iter(&mut f));
    if on_cpu_ns().is_some() {
        c.bench_function(&format!("{name}_cpu_time"), |b| {
            b.iter_custom(|iters| {
                let start = on_cpu_ns().unwrap_or(0);
                for _ in 0..iters {
                    f();
                }
                Duration::from_nanos(on_cpu_ns().unwrap_or(0).saturating_sub(start))
            })
        });
    }
}

fn cached_pair(c: &mut Criterion) {
    let sim = Bfc::new(SimMemory::new(1 << 40), Config::default()).unwrap();
    warm(&sim);
    both(c, "sim_cached_alloc_free", || {
        let block = sim.alloc(black_box(4096), TenantId::DEFAULT).unwrap();
        sim.free(black_box(block));
    });
    let stitched = Bfc::new(SimMemory::stitched(1 << 40), Config::default()).unwrap();
    warm(&stitched);
    both(c, "sim_stitched_cached_alloc_free", || {
        let block = stitched.alloc(black_box(4096), TenantId::DEFAULT).unwrap();
        stitched.free(black_box(block));
    });
    let host = Bfc::new(HostMemory::with_capacity(1 << 30), Config::default()).unwrap();
    warm(&host);
    both(c, "cpu_cached_alloc_free", || {
        let block = host.alloc(black_box(4096), TenantId::DEFAULT).unwrap();
        host.free(black_box(block));
    });
}

/// Nanoseconds this thread has run on a CPU.
fn on_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

fn mixed_sizes(c: &mut Criterion) {
    let bfc = Bfc::new(SimMemory::new(1 << 40), Config::default()).unwrap();
    // Sizes from 256 B to 8 MiB, log-spread; a window of 64 live blocks, oldest freed first.
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let sizes: Vec<usize> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            256usize << (x % 16)
        })
        .collect();
    let mut window: std::collections::VecDeque<Block> =
        std::collections::VecDeque::with_capacity(65);
    for &s in sizes.iter().take(64) {
        window.push_back(bfc.alloc(s, TenantId::DEFAULT).unwrap());
    }
    let mut i = 0;
    both(c, "sim_mixed_sizes_alloc_free", || {
        let old = window.pop_front().unwrap();
        bfc.free(old);
        window.push_back(
            bfc.alloc(sizes[i % sizes.len()], TenantId::DEFAULT)
                .unwrap(),
        );
        i += 1;
    });
    for blk in window.drain(..) {
        bfc.free(blk);
    }
}

fn contended(c: &mut Criterion) {
    let bfc = Arc::new(Bfc::new(SimMemory::new(1 << 40), Config::default()).unwrap());
    warm(&bfc);
    c.bench_function("sim_4_threads_alloc_free", |b| {
        b.iter_custom(|iters| {
            let barrier = Arc::new(Barrier::new(5));
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let bfc = bfc.clone();
                    let barrier = barrier.clone();
                    std::thread::spawn(move || {
                        barrier.wait();
                        for k in 0..iters {
                            let block = bfc
                                .alloc(256 * (1 + ((k as usize + t) % 64)), TenantId::DEFAULT)
                                .unwrap();
                            bfc.free(black_box(block));
                        }
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            for h in handles {
                h.join().unwrap();
            }
            // Time per pair, all four threads together (wall time / pairs done per thread).
            start.elapsed()
        })
    });
}

fn trace(c: &mut Criterion) {
    // Found at run time (the package folder), so a bench binary carried elsewhere still finds the traces.
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let path = std::path::Path::new(&dir).join("../../shared/traces/transformer-lm.csv.gz");
    let Ok(trace) = cohort_alloc::replay::read_trace(&path) else {
        eprintln!(
            "skipping sim_replay_transformer_lm: {} not found",
            path.display()
        );
        return;
    };
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.bench_function("sim_replay_transformer_lm", |b| {
        b.iter(|| {
            cohort_alloc::replay::replay(&trace, &cohort_alloc::replay::ReplayOptions::default())
                .unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = cached_pair, mixed_sizes, contended, trace
}
criterion_main!(benches);
