//! CPU kernel benchmarks: matmul at the MLP's shapes and at 1024³, reported in GFLOP/s.

use std::hint::black_box;

use cohort_kernels::matmul::{MatmulShape, cpu};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 1000.0 - 0.5
        })
        .collect()
}

fn bench_matmul(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu_matmul");
    let cases = [
        ("256x784x128", MatmulShape::plain(256, 128, 784)),
        // The MLP's weight gradient: xᵀ·dh, lhs read transposed.
        (
            "784x256x128_tn",
            MatmulShape {
                trans_lhs: true,
                ..MatmulShape::plain(784, 128, 256)
            },
        ),
        ("1024", MatmulShape::plain(1024, 1024, 1024)),
    ];
    for (name, s) in cases {
        let a = data(s.m * s.k, 1);
        let b = data(s.k * s.n, 2);
        let mut out = vec![0.0f32; s.m * s.n];
        g.throughput(Throughput::Elements(s.flops()));
        g.bench_function(name, |bch| {
            bch.iter(|| {
                cpu::matmul_into(black_box(&mut out), false, black_box(&a), black_box(&b), &s)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
