//! The GPU kernels deterministic mode swaps in, run in a process of their own (the mode is process-wide): the same
//! bits run after run, and the CPU kernels' values (`cargo test -p cohort-kernels --features cuda --test
//! cuda_deterministic -- --include-ignored` on a GPU).
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use cohort_kernels::Math;
use cohort_kernels::conv::{ConvParams, cpu as conv_cpu, cuda as conv_cuda};
use cohort_kernels::cuda::{CudaType, Gpu};
use cohort_kernels::index::{cpu as index_cpu, cuda as index_cuda};
use cohort_kernels::pool::{PoolParams, cpu as pool_cpu, cuda as pool_cuda};
use cohort_kernels::{Error, set_deterministic};

use common::{assert_near, down, rand_vec, up};

/// Device 0, with deterministic mode on: every test of this process wants it, none turns it off.
fn gpu() -> Arc<Gpu> {
    set_deterministic(true);
    Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

/// Within 1e-5 of the CPU's values, relative (absolute below 1). Both add in the same order, so they should be
/// the same bits.
#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// `run` five times gives the same bits each time; returns them.
fn same_bits_five_times(what: &str, run: impl Fn() -> Vec<f32>) -> Vec<f32> {
    let first = run();
    for k in 1..5 {
        let again = run();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&again), bits(&first), "{what}: run {k} differs");
    }
    first
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_backward_over_overlapping_windows_is_the_same_bits_every_run() {
    let g = gpu();
    // 3x3 windows at stride 2 share their border rows and columns.
    let p = PoolParams {
        planes: 96,
        h: 33,
        w: 31,
        kernel: 3,
        stride: 2,
    };
    let (plane_in, plane_out) = (p.h * p.w, p.out_h() * p.out_w());
    // Few distinct values: ties make shared border elements the max of both windows often.
    let x: Vec<f32> = rand_vec(p.planes * plane_in, 61)
        .iter()
        .map(|v| (v * 4.0).round())
        .collect();
    let (_, idx) = pool_cpu::max_pool2d(&x, &p);
    let mut hits = vec![0u32; p.planes * plane_in];
    for (t, &i) in idx.iter().enumerate() {
        hits[t / plane_out * plane_in + i as usize] += 1;
    }
    let shared = hits.iter().filter(|&&h| h > 1).count();
    assert!(
        shared > 100,
        "only {shared} input elements take several gradients"
    );
    let go = rand_vec(p.planes * plane_out, 62);
    let want = pool_cpu::max_pool2d_backward(&go, &idx, p.planes, plane_in, plane_out).unwrap();
    let (dgo, didx) = (up(&g, &go), up(&g, &idx));
    let gi = g.alloc(want.len() * 4).unwrap();
    let got = same_bits_five_times("max_pool2d_backward", || {
        // SAFETY: sizes from p.
        unsafe {
            pool_cuda::max_pool2d_backward(
                &g,
                p.planes,
                plane_in,
                plane_out,
                dgo.ptr(),
                didx.ptr(),
                gi.ptr(),
            )
            .unwrap()
        };
        down(&g, &gi, want.len())
    });
    assert_close("max_pool2d_backward", &got, &want);

    // An index outside its plane is reported, as by the kernel it stands in for.
    let mut bad = idx.clone();
    bad[plane_out + 5] = plane_in as i32;
    let dbad = up(&g, &bad);
    // SAFETY: sizes from p.
    unsafe {
        pool_cuda::max_pool2d_backward(
            &g,
            p.planes,
            plane_in,
            plane_out,
            dgo.ptr(),
            dbad.ptr(),
            gi.ptr(),
        )
        .unwrap()
    };
    match g.synchronize() {
        Err(Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!(
                (op, index, size),
                ("max_pool2d_backward", plane_in as i64, plane_in)
            )
        }
        other => panic!("a bad index gave {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn index_add_with_repeated_indices_is_the_same_bits_every_run() {
    let g = gpu();
    // An embedding's gradient (a batch of token ids into a 50-row table, most ids repeated), an embedding bag's
    // (a row of the source for each bag of 40 ids), then an index_add along a middle dim, into a destination that
    // holds values already.
    for (outer, dim, inner, nidx, start, repeat) in [
        (1usize, 50usize, 96usize, 4000usize, 0.0f32, 1usize),
        (1, 50, 96, 4000, 0.0, 40),
        (3, 20, 7, 700, 1.0, 1),
    ] {
        let idx: Vec<i32> = rand_vec(nidx, 71 + dim as u64)
            .iter()
            .map(|v| (((v + 1.0) * 0.5 * dim as f32) as i32).min(dim as i32 - 1))
            .collect();
        let src = rand_vec(outer * nidx / repeat * inner, 72);
        let init: Vec<f32> = rand_vec(outer * dim * inner, 73)
            .iter()
            .map(|v| v * start)
            .collect();
        let mut want = init.clone();
        index_cpu::index_add(&mut want, (outer, dim, inner), &idx, &src, repeat).unwrap();
        let (didx, dsrc) = (up(&g, &idx), up(&g, &src));
        let dst = g.alloc(init.len() * 4).unwrap();
        let what = format!("index_add [{outer}, {dim}, {inner}] by {nidx} indices, {repeat} a row");
        let got = same_bits_five_times(&what, || {
            // SAFETY: dst holds init.len() f32.
            unsafe { g.htod(dst.ptr(), bytemuck::cast_slice(&init)).unwrap() };
            // SAFETY: sizes as declared.
            unsafe {
                index_cuda::index_add(
                    &g,
                    CudaType::F32,
                    dst.ptr(),
                    (outer, dim, inner),
                    (didx.ptr(), nidx),
                    (dsrc.ptr(), repeat),
                )
                .unwrap()
            };
            down(&g, &dst, init.len())
        });
        assert_close(&what, &got, &want);
    }

    let (dim, inner) = (10usize, 4usize);
    let idx = [3i32, 10, 3];
    let (didx, dsrc) = (up(&g, &idx), up(&g, &[0f32; 12]));
    let dst = up(&g, &[0f32; 40]);
    // SAFETY: sizes as declared.
    unsafe {
        index_cuda::index_add(
            &g,
            CudaType::F32,
            dst.ptr(),
            (1, dim, inner),
            (didx.ptr(), idx.len()),
            (dsrc.ptr(), 1),
        )
        .unwrap()
    };
    match g.synchronize() {
        Err(Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!((op, index, size), ("index_add", 10, dim))
        }
        other => panic!("a bad index gave {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn convolutions_are_the_same_bits_every_run() {
    let g = gpu();
    // Backward data and filter both have algorithms that add with atomics at these sizes, which deterministic mode
    // must not pick (through cuDNN; on the own kernels every sum has a fixed order).
    for p in [
        ConvParams {
            batch: 7,
            c_in: 64,
            h: 13,
            w: 11,
            c_out: 128,
            kh: 3,
            kw: 3,
            stride: 1,
            padding: 1,
            groups: 1,
        },
        ConvParams {
            batch: 7,
            c_in: 3,
            h: 13,
            w: 11,
            c_out: 16,
            kh: 5,
            kw: 5,
            stride: 2,
            padding: 1,
            groups: 1,
        },
    ] {
        let x = rand_vec(p.input_len(), 71);
        let w = rand_vec(p.weight_len(), 72);
        let bias = rand_vec(p.c_out, 73);
        let dy = rand_vec(p.output_len(), 74);
        let (dx, dw, db, ddy) = (up(&g, &x), up(&g, &w), up(&g, &bias), up(&g, &dy));
        // A workspace from the device per request, kept until the pass has run.
        let run = |len: usize, pass: &dyn Fn(u64, &mut conv_cuda::Workspace<'_>)| {
            let out = up(&g, &vec![f32::NAN; len]);
            let mut held = Vec::new();
            pass(out.ptr(), &mut |bytes| {
                let b = g.alloc(bytes)?;
                let ptr = b.ptr();
                held.push(b);
                Ok(ptr)
            });
            down(&g, &out, len)
        };
        let got = same_bits_five_times("conv forward", || {
            run(p.output_len(), &|out, ws| {
                // SAFETY: sizes from p.
                unsafe {
                    conv_cuda::conv2d(
                        &g,
                        Math::Fp32,
                        &p,
                        (dx.ptr(), dw.ptr()),
                        Some(db.ptr()),
                        out,
                        ws,
                    )
                    .unwrap()
                }
            })
        });
        assert_near(
            &format!("forward {p:?}"),
            &got,
            &conv_cpu::conv2d(&x, &w, Some(&bias), &p),
        );
        let got = same_bits_five_times("conv backward data", || {
            run(p.input_len(), &|out, ws| {
                // SAFETY: sizes from p.
                unsafe {
                    conv_cuda::conv2d_backward_input(
                        &g,
                        Math::Fp32,
                        &p,
                        ddy.ptr(),
                        dw.ptr(),
                        out,
                        ws,
                    )
                    .unwrap()
                }
            })
        });
        assert_near(
            &format!("backward data {p:?}"),
            &got,
            &conv_cpu::conv2d_backward_input(&dy, &w, &p),
        );
        let got = same_bits_five_times("conv backward filter", || {
            run(p.weight_len(), &|out, ws| {
                // SAFETY: sizes from p.
                unsafe {
                    conv_cuda::conv2d_backward_weight(
                        &g,
                        Math::Fp32,
                        &p,
                        dx.ptr(),
                        ddy.ptr(),
                        out,
                        ws,
                    )
                    .unwrap()
                }
            })
        });
        assert_near(
            &format!("backward filter {p:?}"),
            &got,
            &conv_cpu::conv2d_backward_weight(&x, &dy, &p),
        );
    }
}
