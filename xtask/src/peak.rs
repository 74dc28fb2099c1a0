//! What the CPU's vector units can do, beside what our matrix products get: the FMA peak of this machine, measured,
//! and the products of the cohort benchmark in GFLOP/s as a fraction of it.
//!
//! The peak is timed, not taken from a data sheet: a shared or throttled machine (a cloud VM, a laptop on battery)
//! runs below its nominal clock, and the products run at the same clock as the probe. Both are the best of
//! [`TRIALS`] short trials, which leaves out the spells when another process held a core.

use anyhow::Result;
use serde_json::{Value, json};
use std::time::Instant;

use cohort_kernels::matmul::{MatmulShape, cpu};
use cohort_kernels::simd::Isa;

/// Trials per figure; the best one counts.
const TRIALS: usize = 5;

fn best_of(trial: impl FnMut() -> f64) -> f64 {
    std::iter::repeat_with(trial)
        .take(TRIALS)
        .fold(0.0, f64::max)
}

/// Independent FMA chains per thread: enough to cover the FMA latency (4 cycles) on two ports.
const CHAINS: usize = 12;

/// GFLOP/s of `threads` threads each running FMA chains of the widest vectors `isa` allows.
pub fn fma_peak(isa: Isa, threads: usize) -> f64 {
    best_of(|| fma_trial(isa, threads))
}

fn fma_trial(isa: Isa, threads: usize) -> f64 {
    let iters = 5_000_000;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || std::hint::black_box(fma_chains(isa, iters)));
        }
    });
    let flops = (threads * iters * CHAINS * 2 * isa.f32_lanes()) as f64;
    flops / start.elapsed().as_secs_f64() / 1e9
}

fn fma_chains(isa: Isa, iters: usize) -> f32 {
    match isa {
        // SAFETY: `Isa` says the CPU runs AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { chains_avx512(iters) },
        // SAFETY: `Isa` says the CPU runs AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { chains_avx2(iters) },
        _ => chains_scalar(iters),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for r in &mut acc {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    acc.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for r in &mut acc {
            *r = _mm256_fmadd_ps(*r, a, b);
        }
    }
    let mut lanes = [0f32; 8];
    acc.iter()
        .map(|&r| {
            // SAFETY: `lanes` holds the 8 floats the store writes.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), r) };
            lanes.iter().sum::<f32>()
        })
        .sum()
}

fn chains_scalar(iters: usize) -> f32 {
    let mut acc = [[1.0f32; 4]; CHAINS];
    for _ in 0..iters {
        for r in &mut acc {
            for x in r.iter_mut() {
                *x = x.mul_add(0.999_999, 1e-7);
            }
        }
    }
    acc.iter().flatten().sum()
}

/// The cohort benchmark's products: the first layer's forward (`x · W`, the input shared by the members) and its
/// weight gradient (`xᵀ · dh`), for one model and for 16 fused members.
fn products() -> Vec<(&'static str, MatmulShape)> {
    let fwd = |batch| MatmulShape {
        batch,
        lhs_batch_stride: 0,
        ..MatmulShape::plain(256, 128, 784)
    };
    let grad = |batch| MatmulShape {
        batch,
        lhs_batch_stride: 0,
        trans_lhs: true,
        ..MatmulShape::plain(784, 128, 256)
    };
    vec![
        ("x·W  256x784·784x128", fwd(1)),
        ("xᵀ·dh 784x256·256x128", grad(1)),
        ("x·W  16 members", fwd(16)),
        ("xᵀ·dh 16 members", grad(16)),
    ]
}

fn gflops(shape: &MatmulShape) -> f64 {
    let lhs = vec![0.5f32; shape.m * shape.k];
    let rhs = vec![0.25f32; shape.batch * shape.k * shape.n];
    let mut out = vec![0f32; shape.batch * shape.m * shape.n];
    let mut time = |reps: usize| {
        let start = Instant::now();
        for _ in 0..reps {
            cpu::matmul_into(&mut out, false, &lhs, &rhs, shape);
        }
        start.elapsed().as_secs_f64()
    };
    time(3);
    let reps = (5e8 / shape.flops() as f64).ceil().max(3.0) as usize;
    best_of(|| shape.flops() as f64 * reps as f64 / time(reps) / 1e9)
}

/// Prints and returns the machine's FMA peak (one thread, all threads) and each product's GFLOP/s against it.
pub fn report() -> Result<Value> {
    let isa = Isa::current();
    let threads = rayon::current_num_threads();
    let one = fma_peak(isa, 1);
    let all = fma_peak(isa, threads);
    println!(
        "\nmatrix products ({isa}, {threads} threads): FMA peak {one:.0} GFLOP/s on one thread, {all:.0} on {threads}"
    );
    let mut rows = Vec::new();
    for (name, shape) in products() {
        let got = gflops(&shape);
        println!(
            "{name:<24} {got:8.1} GFLOP/s  {:5.1} % of peak",
            100.0 * got / all
        );
        rows.push(json!({ "product": name, "gflops": got, "of_peak": got / all }));
    }
    Ok(
        json!({ "isa": isa.to_string(), "threads": threads, "peak_one_thread": one, "peak": all, "products": rows }),
    )
}
