//! The MNIST input pipeline against a plain loop, the per-batch overhead of the adapters, and `share(2)` against
//! one pipeline and two independent pipelines.
//!
//! The share comparison consumes in lockstep on one thread, as the trainer's lockstep schedule does: each step, each
//! member takes its next batch. The pipelines there have no prefetch thread, so their work is visible: two
//! independent pipelines decode every batch twice, `share(2)` once (the first consumer to need a batch pulls it).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use cohort_data::{Dataset, Layout, Mnist, MnistConfig, Split, bundled_mnist_dir};
use criterion::{Criterion, Throughput, criterion_group};

const BATCH: usize = 256;

fn mnist() -> Arc<Mnist> {
    Arc::new(Mnist::load(bundled_mnist_dir(), Split::Train).expect("bundled MNIST digits"))
}

fn touch(x: &cohort_data::Array) -> f32 {
    x.as_f32().map_or(0.0, |v| v[0] + v[v.len() - 1])
}

fn bench_pipeline(c: &mut Criterion) {
    let m = mnist();
    let batches = m.len.div_ceil(BATCH) as u64;
    let mut g = c.benchmark_group("mnist_epoch");
    g.throughput(Throughput::Elements(batches));
    g.sample_size(20).measurement_time(Duration::from_secs(4));

    // the floor: a plain loop over a pre-built, normalised array, copying each batch out
    let pre = m.images_f32();
    g.bench_function("cpu_plain_loop", |b| {
        b.iter(|| {
            let mut s = 0.0;
            for chunk in pre.chunks(BATCH * 784) {
                let batch = chunk.to_vec();
                s += batch[0] + batch[batch.len() - 1];
            }
            black_box(s)
        });
    });

    for (name, workers, prefetch) in [
        ("cpu_pipeline_inline", 1, 0),
        ("cpu_pipeline_prefetch2", 1, 2),
        ("cpu_pipeline_2workers_prefetch2", 2, 2),
    ] {
        let cfg = MnistConfig {
            batch_size: BATCH,
            workers,
            prefetch,
            ..MnistConfig::default()
        };
        let ds = m.batches(&cfg);
        let mut it = ds.iter();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = 0.0;
                for batch in it.by_ref() {
                    s += touch(&batch.expect("batch").0);
                }
                black_box(s)
            });
        });
    }
    for (name, prefetch) in [
        ("cpu_train_batches_inline", 0),
        ("cpu_train_batches_prefetch2", 2),
    ] {
        let cfg = MnistConfig {
            batch_size: BATCH,
            prefetch,
            ..MnistConfig::default()
        };
        let ds = m.train_batches(&cfg, cohort_tensor::Device::Cpu);
        let mut it = ds.iter();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0;
                for batch in it.by_ref() {
                    n += batch.expect("batch").len();
                }
                black_box(n)
            });
        });
    }
    g.finish();
}

fn bench_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("per_batch_overhead");
    const N: i64 = 2000;
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.bench_function("cpu_plain_iter", |b| {
        b.iter(|| black_box((0..N).map(black_box).sum::<i64>()));
    });
    let plain = Dataset::range(0, N);
    g.bench_function("cpu_source", |b| {
        b.iter(|| black_box(plain.iter().map(|x| x.unwrap_or(0)).sum::<i64>()));
    });
    let mapped = Dataset::range(0, N).map(Ok);
    g.bench_function("cpu_map", |b| {
        b.iter(|| black_box(mapped.iter().map(|x| x.unwrap_or(0)).sum::<i64>()));
    });
    let pre = Dataset::range(0, N).map(Ok).prefetch(8);
    g.bench_function("cpu_map_prefetch", |b| {
        b.iter(|| black_box(pre.iter().map(|x| x.unwrap_or(0)).sum::<i64>()));
    });
    let par = Dataset::range(0, N).map_parallel(2, Ok);
    g.bench_function("cpu_map_parallel2", |b| {
        b.iter(|| black_box(par.iter().map(|x| x.unwrap_or(0)).sum::<i64>()));
    });
    let shared = Dataset::range(0, N);
    g.bench_function("cpu_share1", |b| {
        b.iter(|| {
            let mut c = shared.share(1).expect("share");
            black_box(c[0].by_ref().map(|x| x.map_or(0, |v| *v)).sum::<i64>())
        });
    });
    g.finish();
}

fn bench_share(c: &mut Criterion) {
    let m = mnist();
    let batches = m.len.div_ceil(BATCH) as u64;
    let cfg = MnistConfig {
        batch_size: BATCH,
        workers: 1,
        prefetch: 0,
        layout: Layout::Flat,
        ..MnistConfig::default()
    };
    let mut g = c.benchmark_group("two_members");
    g.throughput(Throughput::Elements(batches));
    g.sample_size(20).measurement_time(Duration::from_secs(4));

    let one = m.batches(&cfg);
    g.bench_function("cpu_one_pipeline", |b| {
        b.iter(|| {
            let mut s = 0.0;
            for batch in one.iter() {
                s += touch(&batch.expect("batch").0);
            }
            black_box(s)
        });
    });

    let (p1, p2) = (
        m.batches(&cfg),
        m.batches(&MnistConfig {
            seed: 1,
            ..cfg.clone()
        }),
    );
    g.bench_function("cpu_two_independent", |b| {
        b.iter(|| {
            let (mut a, mut b) = (p1.iter(), p2.iter());
            let mut s = 0.0;
            while let (Some(x), Some(y)) = (a.next(), b.next()) {
                s += touch(&x.expect("batch").0) + touch(&y.expect("batch").0);
            }
            black_box(s)
        });
    });

    let shared = m.batches(&cfg);
    g.bench_function("cpu_share2", |b| {
        b.iter(|| {
            let mut cs = shared
                .share_with(cohort_data::ShareOptions {
                    epochs: Some(1),
                    ..cohort_data::ShareOptions::new(2)
                })
                .expect("share");
            let (mut a, mut rest) = (cs.remove(0), cs);
            let mut s = 0.0;
            while let (Some(x), Some(y)) = (a.next(), rest[0].next()) {
                s += touch(&x.expect("batch").0) + touch(&y.expect("batch").0);
            }
            black_box(s)
        });
    });
    g.finish();
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod cpu_clock {
    #[repr(C)]
    pub struct Timespec {
        pub tv_sec: i64,
        pub tv_nsec: i64,
    }
    pub const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    unsafe extern "C" {
        pub fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
}

/// CPU time of the calling thread in ns, to compare work rather than wall time on a loaded host.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = cpu_clock::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on 64-bit Linux); the call only writes it.
    let rc = unsafe { cpu_clock::clock_gettime(cpu_clock::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Interleaved rounds of the variants (so that load from other processes hits all alike), medians of wall time and
/// of this thread's CPU time; printed as ratios to the first variant.
/// A named way to run one epoch.
type Variant<'a> = (&'static str, Box<dyn FnMut() -> f32 + 'a>);

fn ratios(title: &str, variants: &mut [Variant<'_>], rounds: usize) {
    let k = variants.len();
    let (mut wall, mut cpu) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    for r in 0..rounds {
        for j in 0..k {
            let i = (r + j) % k;
            let (t0, c0) = (std::time::Instant::now(), thread_cpu_ns());
            black_box((variants[i].1)());
            wall[i].push(t0.elapsed().as_secs_f64());
            if let (Some(a), Some(b)) = (c0, thread_cpu_ns()) {
                cpu[i].push((b - a) as f64 * 1e-9);
            }
        }
    }
    println!("\n{title} (median of {rounds} interleaved rounds)");
    println!(
        "{:<34} {:>12} {:>8} {:>14} {:>8}",
        "variant", "wall ms", "x", "thread cpu ms", "x"
    );
    let (w0, c0) = (
        median(wall[0].clone()),
        if cpu[0].is_empty() {
            0.0
        } else {
            median(cpu[0].clone())
        },
    );
    for i in 0..k {
        let w = median(wall[i].clone());
        let c = if cpu[i].is_empty() {
            0.0
        } else {
            median(cpu[i].clone())
        };
        println!(
            "{:<34} {:>12.3} {:>8.2} {:>14.3} {:>8.2}",
            variants[i].0,
            w * 1e3,
            w / w0,
            c * 1e3,
            if c0 > 0.0 { c / c0 } else { 0.0 }
        );
    }
}

fn figures() {
    let m = mnist();
    let batches = m.len.div_ceil(BATCH);
    let inline = MnistConfig {
        batch_size: BATCH,
        workers: 1,
        prefetch: 0,
        ..MnistConfig::default()
    };
    let pre = m.images_f32();
    let one = m.batches(&inline);
    let (p1, p2) = (
        m.batches(&inline),
        m.batches(&MnistConfig {
            seed: 1,
            ..inline.clone()
        }),
    );
    let shared = m.batches(&inline);
    let prefetched = m.batches(&MnistConfig {
        prefetch: 2,
        ..inline.clone()
    });
    let epoch = |ds: &Dataset<(cohort_data::Array, cohort_data::Array)>| -> f32 {
        ds.iter().map(|b| touch(&b.expect("batch").0)).sum()
    };
    let mut v: Vec<Variant<'_>> = vec![
        (
            "plain loop over a pre-built array",
            Box::new(|| {
                pre.chunks(BATCH * 784)
                    .map(|c| {
                        let b = c.to_vec();
                        b[0] + b[b.len() - 1]
                    })
                    .sum()
            }),
        ),
        ("pipeline, inline", Box::new(|| epoch(&one))),
        ("pipeline, prefetch(2)", Box::new(|| epoch(&prefetched))),
    ];
    ratios(
        &format!(
            "MNIST epoch ({} images, {batches} batches of {BATCH})",
            m.len
        ),
        &mut v,
        101,
    );
    let mut v: Vec<Variant<'_>> = vec![
        ("one member, one pipeline", Box::new(|| epoch(&one))),
        (
            "two members, two pipelines",
            Box::new(|| {
                let (mut a, mut b) = (p1.iter(), p2.iter());
                let mut s = 0.0;
                while let (Some(x), Some(y)) = (a.next(), b.next()) {
                    s += touch(&x.expect("batch").0) + touch(&y.expect("batch").0);
                }
                s
            }),
        ),
        (
            "two members, share(2)",
            Box::new(|| {
                let mut cs = shared
                    .share_with(cohort_data::ShareOptions {
                        epochs: Some(1),
                        ..cohort_data::ShareOptions::new(2)
                    })
                    .expect("share");
                let b = cs.pop().expect("consumer");
                let mut a = cs.pop().expect("consumer");
                let mut b = b;
                let mut s = 0.0;
                while let (Some(x), Some(y)) = (a.next(), b.next()) {
                    s += touch(&x.expect("batch").0) + touch(&y.expect("batch").0);
                }
                s
            }),
        ),
    ];
    ratios(
        "Two members in lockstep on one thread (one epoch)",
        &mut v,
        101,
    );
}

criterion_group!(benches, bench_pipeline, bench_overhead, bench_share);

fn main() {
    benches();
    figures();
    Criterion::default().configure_from_args().final_summary();
}
