//! CPU kernel benchmarks: matmul at the MLP's shapes and at 1024³, and the default CNN's convolutions and max
//! pools (batch 64 of 28×28 digits), reported in GFLOP/s (pools in input elements per second).

use std::hint::black_box;

use cohort_kernels::conv::{ConvParams, cpu as conv};
use cohort_kernels::matmul::{MatmulShape, cpu};
use cohort_kernels::pool::{PoolParams, cpu as pool};
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

/// The default CNN's two convolutions: `conv 16 k3` on the digits, `conv 32 k3` on the first pool's output.
fn cnn_convs() -> [(&'static str, ConvParams); 2] {
    let layer = |c_in, hw, c_out| ConvParams {
        batch: 64,
        c_in,
        h: hw,
        w: hw,
        c_out,
        kh: 3,
        kw: 3,
        stride: 1,
        padding: 0,
        groups: 1,
    };
    [
        ("1x28x28_16", layer(1, 28, 16)),
        ("16x13x13_32", layer(16, 13, 32)),
    ]
}

/// Multiply-adds of any of the three passes, counted as two flops.
fn conv_flops(p: &ConvParams) -> u64 {
    2 * (p.output_len() * p.col_rows()) as u64
}

fn bench_conv(c: &mut Criterion) {
    for (name, p) in cnn_convs() {
        let x = data(p.input_len(), 1);
        let w = data(p.weight_len(), 2);
        let bias = data(p.c_out, 3);
        let dy = data(p.output_len(), 4);
        let mut g = c.benchmark_group(format!("cpu_conv2d_{name}"));
        g.throughput(Throughput::Elements(conv_flops(&p)));
        g.bench_function("forward", |b| {
            b.iter(|| conv::conv2d(black_box(&x), black_box(&w), Some(&bias), &p))
        });
        g.bench_function("backward_input", |b| {
            b.iter(|| conv::conv2d_backward_input(black_box(&dy), black_box(&w), &p))
        });
        g.bench_function("backward_weight", |b| {
            b.iter(|| conv::conv2d_backward_weight(black_box(&x), black_box(&dy), &p))
        });
        g.finish();
    }
}

fn bench_max_pool(c: &mut Criterion) {
    // The two conv outputs the CNN pools 2×2: 64 images of 16 planes of 26×26 and of 32 planes of 11×11.
    let cases = [("16x26x26", 16, 26), ("32x11x11", 32, 11)];
    for (name, channels, hw) in cases {
        let p = PoolParams {
            planes: 64 * channels,
            h: hw,
            w: hw,
            kernel: 2,
            stride: 2,
        };
        let (plane_in, plane_out) = (p.h * p.w, p.out_h() * p.out_w());
        let x = data(p.planes * plane_in, 1);
        let dy = data(p.planes * plane_out, 2);
        let (_, idx) = pool::max_pool2d(&x, &p);
        let mut g = c.benchmark_group(format!("cpu_max_pool2d_{name}"));
        g.throughput(Throughput::Elements((p.planes * plane_in) as u64));
        g.bench_function("forward", |b| {
            b.iter(|| pool::max_pool2d(black_box(&x), &p))
        });
        g.bench_function("backward", |b| {
            b.iter(|| {
                pool::max_pool2d_backward(black_box(&dy), &idx, p.planes, plane_in, plane_out)
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench_matmul, bench_conv, bench_max_pool);
criterion_main!(benches);
