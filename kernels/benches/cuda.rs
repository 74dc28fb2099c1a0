//! CUDA benchmarks (run on a GPU: `cargo bench -p cohort-kernels --features cuda --bench cuda`).
//!
//! - `cuda_sgemm_ours_N` vs `cuda_sgemm_raw_N`: SGEMM through `matmul::cuda::matmul` and straight
//!   through cuBLAS, N = 1024 and 4096 (throughput in FLOP/s).
//! - `cuda_add_16m`, `cuda_relu_16m`: element-wise on 16 M f32 (throughput in bytes moved).
//! - `cuda_host_<op>`: host time to enqueue one op (no synchronisation inside the timed loop).
//! - `cuda_conv_cudnn_<pass>` vs `cuda_conv_own_<pass>`: a CNN layer's convolution (forward with its bias, input and
//!   weight gradients) through cuDNN and on the own kernels (throughput in FLOP/s).
//!
//! GPU timings synchronise the device inside `iter_custom`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cohort_kernels::Math;
use cohort_kernels::binary::{BinaryOp, cuda as bin_cuda};
use cohort_kernels::conv::{ConvParams, CudnnMode, cuda as conv_cuda};
use cohort_kernels::cuda::{CudaType, DeviceBuffer, Gpu};
use cohort_kernels::matmul::{MatmulShape, cuda as mm_cuda};
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cuda as red_cuda};
use cohort_kernels::unary::{UnaryOp, cuda as un_cuda};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cudarc::cublas::{result as blas, sys as blas_sys};

fn filled(g: &Gpu, n: usize, v: f32) -> DeviceBuffer {
    let b = g.alloc(n * 4).expect("alloc");
    // SAFETY: n f32.
    unsafe { g.fill(b.ptr(), v.to_bits(), 4, n).expect("fill") };
    b
}

fn timed(g: &Gpu, iters: u64, mut f: impl FnMut()) -> Duration {
    g.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    g.synchronize().expect("sync");
    t.elapsed()
}

fn bench(c: &mut Criterion) {
    let g = match Gpu::get(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping CUDA benchmarks: {e}");
            return;
        }
    };
    eprintln!("device: {} ({} SMs)", g.name(), g.sm_count());
    let raw = blas::create_handle().expect("cublasCreate");
    // SAFETY: both handles live for the whole benchmark.
    unsafe { blas::set_stream(raw, g.compute_stream().cu_stream() as _) }.expect("set stream");

    let mut group = c.benchmark_group("cuda_sgemm");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in [1024usize, 4096] {
        let (a, b, out) = (
            filled(&g, n * n, 0.5),
            filled(&g, n * n, 0.25),
            filled(&g, n * n, 0.0),
        );
        let shape = MatmulShape::plain(n, n, n);
        group.throughput(Throughput::Elements(shape.flops()));
        group.bench_function(format!("cuda_sgemm_ours_{n}"), |bch| {
            bch.iter_custom(|iters| {
                timed(&g, iters, || {
                    // SAFETY: n·n f32 each.
                    unsafe {
                        mm_cuda::matmul(&g, CudaType::F32, a.ptr(), b.ptr(), out.ptr(), &shape)
                            .expect("matmul")
                    }
                })
            })
        });
        let ni = n as i32;
        group.bench_function(format!("cuda_sgemm_raw_{n}"), |bch| {
            bch.iter_custom(|iters| {
                timed(&g, iters, || {
                    let (alpha, beta) = (1.0f32, 0.0f32);
                    g.bind().expect("bind");
                    // SAFETY: n·n f32 each; same call our API makes for a plain product.
                    unsafe {
                        blas::sgemm(
                            raw,
                            blas_sys::cublasOperation_t::CUBLAS_OP_N,
                            blas_sys::cublasOperation_t::CUBLAS_OP_N,
                            ni,
                            ni,
                            ni,
                            &alpha,
                            b.ptr() as *const f32,
                            ni,
                            a.ptr() as *const f32,
                            ni,
                            &beta,
                            out.ptr() as *mut f32,
                            ni,
                        )
                    }
                    .expect("sgemm")
                })
            })
        });
    }
    group.finish();

    let n = 16 << 20;
    let (x, y, out) = (filled(&g, n, 1.0), filled(&g, n, 2.0), filled(&g, n, 0.0));
    let mut group = c.benchmark_group("cuda_elementwise");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Bytes((3 * n * 4) as u64));
    group.bench_function("cuda_add_16m", |bch| {
        bch.iter_custom(|iters| {
            timed(&g, iters, || {
                // SAFETY: n f32 each.
                unsafe {
                    bin_cuda::binary(
                        &g,
                        BinaryOp::Add,
                        CudaType::F32,
                        x.ptr(),
                        &[n],
                        y.ptr(),
                        &[n],
                        out.ptr(),
                        &[n],
                    )
                    .expect("add")
                }
            })
        })
    });
    group.throughput(Throughput::Bytes((2 * n * 4) as u64));
    group.bench_function("cuda_relu_16m", |bch| {
        bch.iter_custom(|iters| {
            timed(&g, iters, || {
                // SAFETY: n f32 each.
                unsafe {
                    un_cuda::unary(&g, UnaryOp::Relu, CudaType::F32, x.ptr(), out.ptr(), n)
                        .expect("relu")
                }
            })
        })
    });
    group.throughput(Throughput::Bytes((n * 4) as u64));
    group.bench_function("cuda_sum_16m", |bch| {
        bch.iter_custom(|iters| {
            timed(&g, iters, || {
                let s = ReduceShape {
                    outer: 1,
                    dim: n,
                    inner: 1,
                };
                // SAFETY: n f32 in, 1 out.
                unsafe {
                    red_cuda::reduce(&g, ReduceOp::Sum, CudaType::F32, x.ptr(), out.ptr(), s)
                        .expect("sum")
                }
            })
        })
    });
    group.finish();

    bench_conv(c, &g);

    // Host-side cost: enqueue only; the device runs these small ops faster than the host issues them.
    let small = 1024;
    let mut group = c.benchmark_group("cuda_host");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let host = |iters: u64, f: &mut dyn FnMut()| {
        g.synchronize().expect("sync");
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let e = t.elapsed();
        g.synchronize().expect("sync");
        e
    };
    group.bench_function("cuda_host_add", |bch| {
        bch.iter_custom(|iters| {
            host(iters, &mut || {
                // SAFETY: small ≤ n f32 each.
                unsafe {
                    bin_cuda::binary(
                        &g,
                        BinaryOp::Add,
                        CudaType::F32,
                        x.ptr(),
                        black_box(&[256, 4]),
                        y.ptr(),
                        &[4],
                        out.ptr(),
                        &[256, 4],
                    )
                    .expect("add")
                }
            })
        })
    });
    group.bench_function("cuda_host_relu", |bch| {
        bch.iter_custom(|iters| {
            host(iters, &mut || {
                // SAFETY: small ≤ n f32 each.
                unsafe {
                    un_cuda::unary(
                        &g,
                        UnaryOp::Relu,
                        CudaType::F32,
                        x.ptr(),
                        out.ptr(),
                        black_box(small),
                    )
                    .expect("relu")
                }
            })
        })
    });
    let mm = MatmulShape::plain(32, 32, 32);
    group.bench_function("cuda_host_matmul", |bch| {
        bch.iter_custom(|iters| {
            host(iters, &mut || {
                // SAFETY: 32·32 f32 each.
                unsafe {
                    mm_cuda::matmul(
                        &g,
                        CudaType::F32,
                        x.ptr(),
                        y.ptr(),
                        out.ptr(),
                        black_box(&mm),
                    )
                    .expect("mm")
                }
            })
        })
    });
    group.bench_function("cuda_host_matmul_raw_cublas", |bch| {
        bch.iter_custom(|iters| {
            host(iters, &mut || {
                let (alpha, beta) = (1.0f32, 0.0f32);
                let op = blas_sys::cublasOperation_t::CUBLAS_OP_N;
                // SAFETY: 32·32 f32 each; the same call as `cuda_host_matmul` makes.
                unsafe {
                    blas::sgemm(
                        raw,
                        op,
                        op,
                        32,
                        32,
                        32,
                        &alpha,
                        y.ptr() as *const f32,
                        32,
                        x.ptr() as *const f32,
                        32,
                        &beta,
                        out.ptr() as *mut f32,
                        32,
                    )
                }
                .expect("sgemm")
            })
        })
    });
    group.finish();
    // SAFETY: created above, no longer used.
    let _ = unsafe { blas::destroy_handle(raw) };
}

/// A workspace that grows to the largest request and is kept: allocating on every call would time cuMemAlloc.
struct Scratch<'a> {
    g: &'a Gpu,
    buf: Option<DeviceBuffer>,
}

impl Scratch<'_> {
    fn get(&mut self, bytes: usize) -> cohort_kernels::Result<u64> {
        if self.buf.as_ref().is_none_or(|b| b.bytes() < bytes) {
            // cuMemFree waits for the work still using the old one.
            self.buf = None;
            self.buf = Some(self.g.alloc(bytes)?);
        }
        Ok(self.buf.as_ref().map_or(0, DeviceBuffer::ptr))
    }
}

/// `cuda_conv_{cudnn,own}_{fwd,bwd_data,bwd_filter}`: the CNN's 64 -> 128 channel 3x3 layer on 32x32 images, batch
/// 128, through cuDNN (the algorithm timing picked) and on the own kernels (im2col + cuBLAS in tiles), in FLOP/s.
fn bench_conv(c: &mut Criterion, g: &Gpu) {
    let p = ConvParams {
        batch: 128,
        c_in: 64,
        h: 32,
        w: 32,
        c_out: 128,
        kh: 3,
        kw: 3,
        stride: 1,
        padding: 1,
        groups: 1,
    };
    let (x, w, b, y) = (
        filled(g, p.input_len(), 0.5),
        filled(g, p.weight_len(), 0.25),
        filled(g, p.c_out, 0.1),
        filled(g, p.output_len(), 0.0),
    );
    let (gx, gw) = (
        filled(g, p.input_len(), 0.0),
        filled(g, p.weight_len(), 0.0),
    );
    let mut group = c.benchmark_group("cuda_conv");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(
        (2 * p.output_len() * p.col_rows()) as u64,
    ));
    let before = conv_cuda::cudnn_mode();
    for (name, mode) in [("cudnn", CudnnMode::Timed), ("own", CudnnMode::Off)] {
        conv_cuda::set_cudnn_mode(mode);
        let mut ws = Scratch { g, buf: None };
        group.bench_function(format!("cuda_conv_{name}_fwd"), |bch| {
            bch.iter_custom(|iters| {
                timed(g, iters, || {
                    // SAFETY: sizes from p.
                    unsafe {
                        conv_cuda::conv2d(
                            g,
                            Math::Fp32,
                            &p,
                            (x.ptr(), w.ptr()),
                            Some(b.ptr()),
                            y.ptr(),
                            &mut |n| ws.get(n),
                        )
                        .expect("conv forward")
                    }
                })
            })
        });
        group.bench_function(format!("cuda_conv_{name}_bwd_data"), |bch| {
            bch.iter_custom(|iters| {
                timed(g, iters, || {
                    // SAFETY: sizes from p.
                    unsafe {
                        conv_cuda::conv2d_backward_input(
                            g,
                            Math::Fp32,
                            &p,
                            y.ptr(),
                            w.ptr(),
                            gx.ptr(),
                            &mut |n| ws.get(n),
                        )
                        .expect("conv backward data")
                    }
                })
            })
        });
        group.bench_function(format!("cuda_conv_{name}_bwd_filter"), |bch| {
            bch.iter_custom(|iters| {
                timed(g, iters, || {
                    // SAFETY: sizes from p.
                    unsafe {
                        conv_cuda::conv2d_backward_weight(
                            g,
                            Math::Fp32,
                            &p,
                            x.ptr(),
                            y.ptr(),
                            gw.ptr(),
                            &mut |n| ws.get(n),
                        )
                        .expect("conv backward filter")
                    }
                })
            })
        });
    }
    conv_cuda::set_cudnn_mode(before);
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
