//! Every CUDA kernel against the CPU kernels on fresh random inputs (run on a GPU:
//! `cargo test -p cohort-kernels --features cuda -- --include-ignored`).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use cohort_kernels::binary::{BinaryOp, cpu as bin_cpu, cuda as bin_cuda};
use cohort_kernels::conv::{ConvParams, cpu as conv_cpu, cuda as conv_cuda};
use cohort_kernels::copy::{Copy2d, cpu as copy_cpu, cuda as copy_cuda};
use cohort_kernels::cuda::{CudaType, DeviceBuffer, Gpu};
use cohort_kernels::index::{cpu as index_cpu, cuda as index_cuda};
use cohort_kernels::matmul::{MatmulShape, cpu as mm_cpu, cuda as mm_cuda};
use cohort_kernels::optim::{AdamParams, SgdParams, cpu as optim_cpu, cuda as optim_cuda};
use cohort_kernels::pool::{PoolParams, cpu as pool_cpu, cuda as pool_cuda};
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cpu as red_cpu, cuda as red_cuda};
use cohort_kernels::softmax::{cpu as sm_cpu, cuda as sm_cuda};
use cohort_kernels::unary::{UnaryOp, cpu as un_cpu, cuda as un_cuda};
use cohort_kernels::{Error, Math};

fn gpu() -> Arc<Gpu> {
    Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

/// Deterministic values in [lo, hi) (xorshift).
fn rand_vec(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn rand_idx(n: usize, seed: u64, max: usize) -> Vec<i32> {
    rand_vec(n, seed, 0.0, max as f32)
        .into_iter()
        .map(|v| (v as i32).min(max as i32 - 1))
        .collect()
}

fn up<T: bytemuck::Pod>(g: &Gpu, data: &[T]) -> DeviceBuffer {
    let buf = g.alloc(std::mem::size_of_val(data)).unwrap();
    // SAFETY: the buffer holds exactly these bytes.
    unsafe { g.htod(buf.ptr(), bytemuck::cast_slice(data)).unwrap() };
    buf
}

fn zeros(g: &Gpu, bytes: usize) -> DeviceBuffer {
    let buf = g.alloc(bytes).unwrap();
    // SAFETY: the buffer holds `bytes` bytes.
    unsafe { g.zero(buf.ptr(), bytes).unwrap() };
    buf
}

fn down<T: bytemuck::Pod + Default>(g: &Gpu, buf: &DeviceBuffer, n: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    // SAFETY: the buffer holds at least n elements (callers size it).
    unsafe {
        g.dtoh(buf.ptr(), bytemuck::cast_slice_mut(&mut out))
            .unwrap()
    };
    out
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn binary_ops_broadcast_like_the_cpu() {
    let g = gpu();
    let cases: [(&[usize], &[usize], &[usize]); 4] = [
        (&[4, 1, 5], &[3, 1], &[4, 3, 5]),
        (&[256, 128], &[128], &[256, 128]),
        (&[1000], &[1000], &[1000]),
        (&[7, 9], &[1], &[7, 9]),
    ];
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Eq,
    ];
    for (ci, (ls, rs, os)) in cases.iter().enumerate() {
        let a = rand_vec(ls.iter().product(), 1 + ci as u64, -2.0, 2.0);
        let mut b = rand_vec(rs.iter().product(), 100 + ci as u64, 0.5, 2.0);
        b[0] = a[0]; // one equal pair for eq / ge / le
        let n: usize = os.iter().product();
        let (da, db) = (up(&g, &a), up(&g, &b));
        let out = zeros(&g, n * 4);
        for op in ops {
            // SAFETY: buffers sized by the shapes.
            unsafe {
                bin_cuda::binary(
                    &g,
                    op,
                    CudaType::F32,
                    da.ptr(),
                    ls,
                    db.ptr(),
                    rs,
                    out.ptr(),
                    os,
                )
                .unwrap()
            };
            let want = bin_cpu::binary(op, &a, ls, &b, rs, os);
            assert_close(
                &format!("{op:?} {ls:?} {rs:?}"),
                &down::<f32>(&g, &out, n),
                &want,
                1e-6,
            );
        }
        let ai: Vec<i32> = a.iter().map(|v| (v * 10.0) as i32).collect();
        let bi: Vec<i32> = b.iter().map(|v| (v * 10.0) as i32).collect();
        let (dai, dbi) = (up(&g, &ai), up(&g, &bi));
        for op in ops {
            // SAFETY: as above.
            unsafe {
                bin_cuda::binary(
                    &g,
                    op,
                    CudaType::I32,
                    dai.ptr(),
                    ls,
                    dbi.ptr(),
                    rs,
                    out.ptr(),
                    os,
                )
                .unwrap()
            };
            assert_eq!(
                down::<i32>(&g, &out, n),
                bin_cpu::binary(op, &ai, ls, &bi, rs, os),
                "{op:?} i32"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn where_picks_by_mask() {
    let g = gpu();
    let n = 1000;
    let mask: Vec<f32> = rand_vec(n, 3, -1.0, 1.0)
        .iter()
        .map(|&v| f32::from(u8::from(v > 0.0)))
        .collect();
    let (t, f) = (rand_vec(n, 4, -1.0, 1.0), rand_vec(n, 5, -1.0, 1.0));
    let (dm, dt, df, out) = (up(&g, &mask), up(&g, &t), up(&g, &f), zeros(&g, n * 4));
    // SAFETY: all n long.
    unsafe {
        bin_cuda::where_cond(
            &g,
            CudaType::F32,
            CudaType::F32,
            dm.ptr(),
            &[n],
            dt.ptr(),
            &[n],
            df.ptr(),
            &[n],
            out.ptr(),
            &[n],
        )
        .unwrap()
    };
    assert_eq!(
        down::<f32>(&g, &out, n),
        copy_cpu::where_cond(&mask, &t, &f)
    );
    let mask_u8: Vec<u8> = mask.iter().map(|&m| m as u8).collect();
    let dm8 = up(&g, &mask_u8);
    // SAFETY: as above.
    unsafe {
        bin_cuda::where_cond(
            &g,
            CudaType::U8,
            CudaType::F32,
            dm8.ptr(),
            &[n],
            dt.ptr(),
            &[n],
            df.ptr(),
            &[n],
            out.ptr(),
            &[n],
        )
        .unwrap()
    };
    assert_eq!(
        down::<f32>(&g, &out, n),
        copy_cpu::where_cond(&mask, &t, &f)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn unary_ops_match_the_cpu() {
    let g = gpu();
    for n in [1001usize, 4096] {
        let x = rand_vec(n, 7, -3.0, 3.0);
        let xp = rand_vec(n, 8, 0.1, 3.0);
        let (dx, dxp, out) = (up(&g, &x), up(&g, &xp), zeros(&g, n * 4));
        let ops = [
            UnaryOp::Neg,
            UnaryOp::Relu,
            UnaryOp::Gelu,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Abs,
            UnaryOp::Square,
            UnaryOp::AddScalar(1.5),
            UnaryOp::MulScalar(-0.5),
            UnaryOp::Powf(2.5),
            UnaryOp::GtScalar(0.25),
            UnaryOp::LtScalar(0.25),
        ];
        for op in ops {
            let positive = matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Powf(_));
            let (src, host) = if positive { (&dxp, &xp) } else { (&dx, &x) };
            // SAFETY: n f32 each.
            unsafe { un_cuda::unary(&g, op, CudaType::F32, src.ptr(), out.ptr(), n).unwrap() };
            assert_close(
                &format!("{op:?}"),
                &down::<f32>(&g, &out, n),
                &un_cpu::unary(op, host),
                2e-6,
            );
        }
        let dy = rand_vec(n, 9, -1.0, 1.0);
        let ddy = up(&g, &dy);
        // SAFETY: n f32 each.
        unsafe {
            un_cuda::gelu_backward(&g, CudaType::F32, ddy.ptr(), dx.ptr(), out.ptr(), n).unwrap()
        };
        assert_close(
            "gelu_backward",
            &down::<f32>(&g, &out, n),
            &un_cpu::gelu_backward(&dy, &x),
            2e-6,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reductions_match_the_cpu() {
    let g = gpu();
    let shapes = [
        ReduceShape {
            outer: 64,
            dim: 100,
            inner: 1,
        },
        ReduceShape {
            outer: 3,
            dim: 50,
            inner: 40,
        },
        ReduceShape {
            outer: 1,
            dim: 1 << 20,
            inner: 1,
        },
        ReduceShape {
            outer: 1,
            dim: 100_000,
            inner: 16,
        },
        ReduceShape {
            outer: 256,
            dim: 10,
            inner: 1,
        },
        // a bias gradient: few outputs over long columns, split in two passes
        ReduceShape {
            outer: 1,
            dim: 256,
            inner: 128,
        },
        ReduceShape {
            outer: 2,
            dim: 300,
            inner: 10,
        },
        // a conv bias's gradient summed over the batch: a few splits of many outputs, finished a thread each
        ReduceShape {
            outer: 1,
            dim: 64,
            inner: 1 << 16,
        },
    ];
    for s in shapes {
        let n = s.outer * s.dim * s.inner;
        let x = rand_vec(n, n as u64, -1.0, 1.0);
        let dx = up(&g, &x);
        let out = zeros(&g, s.outer * s.inner * 4);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            // SAFETY: sizes from s.
            unsafe { red_cuda::reduce(&g, op, CudaType::F32, dx.ptr(), out.ptr(), s).unwrap() };
            let want = red_cpu::reduce(op, &x, s);
            let tol = if s.dim > 10_000 { 1e-3 } else { 1e-5 };
            assert_close(
                &format!("{op:?} {s:?}"),
                &down::<f32>(&g, &out, s.outer * s.inner),
                &want,
                tol,
            );
        }
        // SAFETY: as above; out holds outer·inner i32.
        unsafe { red_cuda::argmax(&g, CudaType::F32, dx.ptr(), out.ptr(), s).unwrap() };
        assert_eq!(
            down::<i32>(&g, &out, s.outer * s.inner),
            red_cpu::argmax(&x, s),
            "argmax {s:?}"
        );
        let xi: Vec<i32> = x.iter().map(|v| (v * 100.0) as i32).collect();
        let dxi = up(&g, &xi);
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            // SAFETY: as above.
            unsafe { red_cuda::reduce(&g, op, CudaType::I32, dxi.ptr(), out.ptr(), s).unwrap() };
            assert_eq!(
                down::<i32>(&g, &out, s.outer * s.inner),
                red_cpu::reduce(op, &xi, s),
                "{op:?} i32 {s:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn softmax_matches_the_cpu() {
    let g = gpu();
    for (rows, cols) in [(256usize, 10usize), (7, 1000), (3, 10_000)] {
        let x = rand_vec(rows * cols, cols as u64, -5.0, 5.0);
        let (dx, out) = (up(&g, &x), zeros(&g, rows * cols * 4));
        for log in [false, true] {
            // SAFETY: rows·cols f32 each.
            unsafe { sm_cuda::softmax_last(&g, dx.ptr(), out.ptr(), rows, cols, log).unwrap() };
            let want = sm_cpu::softmax_last(&x, cols, log);
            assert_close(
                &format!("softmax log={log} {rows}x{cols}"),
                &down::<f32>(&g, &out, rows * cols),
                &want,
                1e-5,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_all_layouts_match_the_cpu() {
    let g = gpu();
    let mut shapes = Vec::new();
    for (tl, tr) in [(false, false), (true, false), (false, true), (true, true)] {
        let (m, n, k) = (33, 17, 29);
        shapes.push(MatmulShape {
            trans_lhs: tl,
            trans_rhs: tr,
            ..MatmulShape::plain(m, n, k)
        });
        // batched, both sides
        shapes.push(MatmulShape {
            batch: 4,
            m,
            n,
            k,
            lhs_batch_stride: m * k,
            rhs_batch_stride: k * n,
            trans_lhs: tl,
            trans_rhs: tr,
        });
        // shared lhs (all members see the same input)
        shapes.push(MatmulShape {
            batch: 3,
            m,
            n,
            k,
            lhs_batch_stride: 0,
            rhs_batch_stride: k * n,
            trans_lhs: tl,
            trans_rhs: tr,
        });
        // shared rhs
        shapes.push(MatmulShape {
            batch: 3,
            m,
            n,
            k,
            lhs_batch_stride: m * k,
            rhs_batch_stride: 0,
            trans_lhs: tl,
            trans_rhs: tr,
        });
    }
    shapes.push(MatmulShape::plain(256, 128, 784));
    for s in shapes {
        let lhs_len = if s.lhs_batch_stride == 0 {
            s.m * s.k
        } else {
            s.batch * s.m * s.k
        };
        let rhs_len = if s.rhs_batch_stride == 0 {
            s.k * s.n
        } else {
            s.batch * s.k * s.n
        };
        let a = rand_vec(lhs_len, 11, -1.0, 1.0);
        let b = rand_vec(rhs_len, 12, -1.0, 1.0);
        let (da, db, out) = (up(&g, &a), up(&g, &b), zeros(&g, s.batch * s.m * s.n * 4));
        // SAFETY: sizes from s.
        unsafe { mm_cuda::matmul(&g, CudaType::F32, da.ptr(), db.ptr(), out.ptr(), &s).unwrap() };
        let want = mm_cpu::matmul(&a, &b, &s);
        assert_close(
            &format!("{s:?}"),
            &down::<f32>(&g, &out, s.batch * s.m * s.n),
            &want,
            1e-4,
        );
        // f16 and bf16 through GemmEx, against the f32 product of the rounded inputs
        for ty in [CudaType::F16, CudaType::BF16] {
            let (ah, bh, tol): (Vec<u16>, Vec<u16>, f32) = if ty == CudaType::F16 {
                (
                    a.iter()
                        .map(|&v| half::f16::from_f32(v).to_bits())
                        .collect(),
                    b.iter()
                        .map(|&v| half::f16::from_f32(v).to_bits())
                        .collect(),
                    2e-2,
                )
            } else {
                (
                    a.iter()
                        .map(|&v| half::bf16::from_f32(v).to_bits())
                        .collect(),
                    b.iter()
                        .map(|&v| half::bf16::from_f32(v).to_bits())
                        .collect(),
                    8e-2,
                )
            };
            let (dah, dbh, outh) = (up(&g, &ah), up(&g, &bh), zeros(&g, s.batch * s.m * s.n * 2));
            // SAFETY: sizes from s, 2-byte elements.
            unsafe { mm_cuda::matmul(&g, ty, dah.ptr(), dbh.ptr(), outh.ptr(), &s).unwrap() };
            let got: Vec<f32> = down::<u16>(&g, &outh, s.batch * s.m * s.n)
                .into_iter()
                .map(|h| {
                    if ty == CudaType::F16 {
                        half::f16::from_bits(h).to_f32()
                    } else {
                        half::bf16::from_bits(h).to_f32()
                    }
                })
                .collect();
            let scale = (s.k as f32).sqrt();
            for (i, (&x, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - w).abs() <= tol * scale,
                    "{ty:?} {s:?} element {i}: {x} vs {w}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn index_ops_match_the_cpu() {
    let g = gpu();
    let (outer, dim, inner, nidx) = (3usize, 50usize, 16usize, 40usize);
    let src = rand_vec(outer * dim * inner, 21, -1.0, 1.0);
    let idx = rand_idx(nidx, 22, dim);
    let (ds, di) = (up(&g, &src), up(&g, &idx));
    let out = zeros(&g, outer * nidx * inner * 4);
    // SAFETY: sizes as declared.
    unsafe {
        index_cuda::index_select(
            &g,
            CudaType::F32,
            ds.ptr(),
            outer,
            dim,
            inner,
            di.ptr(),
            nidx,
            out.ptr(),
        )
        .unwrap()
    };
    assert_eq!(
        down::<f32>(&g, &out, outer * nidx * inner),
        index_cpu::index_select(&src, outer, dim, inner, &idx).unwrap()
    );

    let add_src = rand_vec(outer * nidx * inner, 23, -1.0, 1.0);
    let mut want = src.clone();
    index_cpu::index_add(&mut want, (outer, dim, inner), &idx, &add_src, 1).unwrap();
    let (dst, das) = (up(&g, &src), up(&g, &add_src));
    // SAFETY: as above.
    unsafe {
        index_cuda::index_add(
            &g,
            CudaType::F32,
            dst.ptr(),
            (outer, dim, inner),
            (di.ptr(), nidx),
            (das.ptr(), 1),
        )
        .unwrap()
    };
    assert_close(
        "index_add",
        &down::<f32>(&g, &dst, outer * dim * inner),
        &want,
        1e-6,
    );

    let (rows, cols) = (300usize, 10usize);
    let m = rand_vec(rows * cols, 24, -1.0, 1.0);
    let li = rand_idx(rows, 25, cols);
    let (dm, dl, o) = (up(&g, &m), up(&g, &li), zeros(&g, rows * cols * 4));
    // SAFETY: as above.
    unsafe {
        index_cuda::gather_last(&g, CudaType::F32, dm.ptr(), rows, cols, dl.ptr(), o.ptr()).unwrap()
    };
    assert_eq!(
        down::<f32>(&g, &o, rows),
        index_cpu::gather_last(&m, cols, &li).unwrap()
    );

    let gsrc = rand_vec(rows, 26, -1.0, 1.0);
    let mut want = m.clone();
    index_cpu::scatter_add_last(&mut want, cols, &li, &gsrc).unwrap();
    let (dd, dg) = (up(&g, &m), up(&g, &gsrc));
    // SAFETY: as above.
    unsafe { index_cuda::scatter_add_last(&g, dd.ptr(), rows, cols, dl.ptr(), dg.ptr()).unwrap() };
    assert_close(
        "scatter_add_last",
        &down::<f32>(&g, &dd, rows * cols),
        &want,
        1e-6,
    );

    // SAFETY: as above.
    unsafe { index_cuda::one_hot(&g, CudaType::F32, dl.ptr(), rows, cols, o.ptr()).unwrap() };
    assert_eq!(
        down::<f32>(&g, &o, rows * cols),
        index_cpu::one_hot::<f32>(&li, cols).unwrap()
    );

    // An out-of-range index is reported, not a crash, and the device stays usable.
    let bad = up(&g, &[0i32, 99, 1]);
    // SAFETY: as above; index 99 is out of range on purpose.
    unsafe {
        index_cuda::gather_last(&g, CudaType::F32, dm.ptr(), 3, cols, bad.ptr(), o.ptr()).unwrap()
    };
    match g.synchronize() {
        Err(Error::IndexOutOfRange { op, index, size }) => {
            assert_eq!((op, index, size), ("gather_last", 99, cols));
        }
        other => panic!("expected an index error, got {other:?}"),
    }
    g.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copies_transposes_and_casts_match_the_cpu() {
    let g = gpu();
    let (b, r, c) = (3usize, 37usize, 45usize);
    let x = rand_vec(b * r * c, 31, -100.0, 100.0);
    let (dx, out) = (up(&g, &x), zeros(&g, b * r * c * 4));
    // SAFETY: sizes as declared.
    unsafe { copy_cuda::transpose(&g, 4, dx.ptr(), out.ptr(), b, r, c).unwrap() };
    assert_eq!(
        down::<f32>(&g, &out, b * r * c),
        copy_cpu::transpose(&x, b, r, c)
    );

    let cp = Copy2d {
        rows: 10,
        cols: 7,
        src_stride: 45,
        dst_stride: 9,
        src_offset: 3,
        dst_offset: 1,
    };
    let mut want = vec![0.0f32; 100];
    copy_cpu::copy2d(&x, &mut want, &cp);
    let d = zeros(&g, 400);
    // SAFETY: blocks inside both buffers.
    unsafe { copy_cuda::copy2d(&g, 4, dx.ptr(), d.ptr(), &cp).unwrap() };
    assert_eq!(down::<f32>(&g, &d, 100), want);

    let small = rand_vec(12, 32, -1.0, 1.0);
    let ds = up(&g, &small);
    let bo = zeros(&g, 5 * 3 * 4 * 4);
    // SAFETY: 12 in, 60 out.
    unsafe { copy_cuda::broadcast(&g, 4, ds.ptr(), &[3, 4], bo.ptr(), &[5, 3, 4]).unwrap() };
    assert_eq!(
        down::<f32>(&g, &bo, 60),
        copy_cpu::broadcast(&small, &[3, 4], &[5, 3, 4])
    );

    // arange and fill
    // SAFETY: 100 i32 fit in `d`.
    unsafe { copy_cuda::arange(&g, CudaType::I32, d.ptr(), 100).unwrap() };
    assert_eq!(down::<i32>(&g, &d, 100), (0..100).collect::<Vec<i32>>());
    // SAFETY: as above.
    unsafe { copy_cuda::fill(&g, CudaType::F32, d.ptr(), 100, 2.5).unwrap() };
    assert_eq!(down::<f32>(&g, &d, 100), vec![2.5f32; 100]);

    // casts, against the `half` crate and Rust's saturating `as`
    let mut vals = rand_vec(1000, 33, -300.0, 300.0);
    vals[0] = f32::NAN;
    vals[1] = 1e10;
    vals[2] = -1e10;
    let n = vals.len();
    let dv = up(&g, &vals);
    let o16 = zeros(&g, n * 2);
    let o32 = zeros(&g, n * 4);
    let o8 = zeros(&g, n);
    // SAFETY: n elements each.
    unsafe {
        copy_cuda::cast(&g, CudaType::F32, CudaType::F16, dv.ptr(), o16.ptr(), n).unwrap();
    }
    let want16: Vec<u16> = vals
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let got16 = down::<u16>(&g, &o16, n);
    for i in 1..n {
        assert_eq!(got16[i], want16[i], "f32->f16 of {}", vals[i]);
    }
    // SAFETY: as above.
    unsafe { copy_cuda::cast(&g, CudaType::F32, CudaType::BF16, dv.ptr(), o16.ptr(), n).unwrap() };
    let wantb: Vec<u16> = vals
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let gotb = down::<u16>(&g, &o16, n);
    for i in 1..n {
        assert_eq!(gotb[i], wantb[i], "f32->bf16 of {}", vals[i]);
    }
    // SAFETY: as above.
    unsafe { copy_cuda::cast(&g, CudaType::BF16, CudaType::F32, o16.ptr(), o32.ptr(), n).unwrap() };
    let back: Vec<f32> = down::<f32>(&g, &o32, n);
    for i in 1..n {
        assert_eq!(back[i], half::bf16::from_bits(wantb[i]).to_f32());
    }
    // SAFETY: as above.
    unsafe { copy_cuda::cast(&g, CudaType::F32, CudaType::I32, dv.ptr(), o32.ptr(), n).unwrap() };
    assert_eq!(
        down::<i32>(&g, &o32, n),
        vals.iter().map(|&v| v as i32).collect::<Vec<_>>()
    );
    // SAFETY: as above.
    unsafe { copy_cuda::cast(&g, CudaType::F32, CudaType::U8, dv.ptr(), o8.ptr(), n).unwrap() };
    assert_eq!(
        down::<u8>(&g, &o8, n),
        vals.iter().map(|&v| v as u8).collect::<Vec<_>>()
    );
    let ints: Vec<i32> = (0..n as i32).map(|i| i * 7 - 3000).collect();
    let di = up(&g, &ints);
    // SAFETY: as above.
    unsafe { copy_cuda::cast(&g, CudaType::I32, CudaType::U8, di.ptr(), o8.ptr(), n).unwrap() };
    assert_eq!(
        down::<u8>(&g, &o8, n),
        ints.iter().map(|&v| (v as f64) as u8).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn float_casts_agree_four_wide_with_a_tail_and_one_at_a_time_when_unaligned() {
    let g = gpu();
    // 1003 = 250 four-wide groups and a tail of 3; from offset 1 no access is aligned.
    let n = 1003;
    let mut vals = rand_vec(n + 1, 34, -70_000.0, 70_000.0);
    vals[5] = f32::NAN;
    vals[6] = f32::INFINITY;
    vals[7] = 1e-6;
    let dv = up(&g, &vals);
    let (o16, o32, b16) = (
        zeros(&g, (n + 1) * 2),
        zeros(&g, (n + 1) * 4),
        zeros(&g, (n + 1) * 2),
    );
    for start in [0usize, 1] {
        let src = &vals[start..start + n];
        // f32 -> bf16 -> f16 -> f32, each from and to `start`
        let chain = [
            (CudaType::F32, &dv, CudaType::BF16, &o16),
            (CudaType::BF16, &o16, CudaType::F16, &b16),
            (CudaType::F16, &b16, CudaType::F32, &o32),
        ];
        for (from, src, to, dst) in chain {
            let at = |b: &DeviceBuffer, ty: CudaType| b.ptr() + (start * ty.size()) as u64;
            // SAFETY: n elements from `start` fit in each buffer of n + 1.
            unsafe { copy_cuda::cast(&g, from, to, at(src, from), at(dst, to), n).unwrap() };
        }
        let bf = &down::<u16>(&g, &o16, n + 1)[start..start + n];
        let hf = &down::<u16>(&g, &b16, n + 1)[start..start + n];
        let back = &down::<f32>(&g, &o32, n + 1)[start..start + n];
        for i in 0..n {
            let want_bf = half::bf16::from_f32(src[i]);
            let want_h = half::f16::from_f32(want_bf.to_f32());
            if src[i].is_nan() {
                assert!(
                    half::bf16::from_bits(bf[i]).is_nan() && back[i].is_nan(),
                    "NaN at {i}"
                );
                continue;
            }
            assert_eq!(
                bf[i],
                want_bf.to_bits(),
                "f32->bf16 of {} (start {start})",
                src[i]
            );
            assert_eq!(
                hf[i],
                want_h.to_bits(),
                "bf16->f16 of {} (start {start})",
                src[i]
            );
            assert_eq!(
                back[i],
                want_h.to_f32(),
                "f16->f32 of {} (start {start})",
                src[i]
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_forward_and_backward_match_the_cpu() {
    let g = gpu();
    let params = [
        ConvParams {
            batch: 2,
            c_in: 3,
            h: 9,
            w: 8,
            c_out: 4,
            kh: 3,
            kw: 3,
            stride: 1,
            padding: 1,
            groups: 1,
        },
        ConvParams {
            batch: 3,
            c_in: 4,
            h: 11,
            w: 10,
            c_out: 6,
            kh: 3,
            kw: 2,
            stride: 2,
            padding: 1,
            groups: 2,
        },
        ConvParams {
            batch: 16,
            c_in: 1,
            h: 28,
            w: 28,
            c_out: 8,
            kh: 5,
            kw: 5,
            stride: 1,
            padding: 0,
            groups: 1,
        },
    ];
    for p in params {
        let x = rand_vec(p.input_len(), 41, -1.0, 1.0);
        let w = rand_vec(p.weight_len(), 42, -1.0, 1.0);
        let bias = rand_vec(p.c_out, 43, -1.0, 1.0);
        let go = rand_vec(p.output_len(), 44, -1.0, 1.0);
        let (dx, dw, db, dgo) = (up(&g, &x), up(&g, &w), up(&g, &bias), up(&g, &go));
        // Workspaces from the device, one per request (cuDNN's differ by algorithm), kept until the test ends.
        let mut held = Vec::new();
        let mut ws = |bytes: usize| -> cohort_kernels::Result<u64> {
            let b = g.alloc(bytes)?;
            let ptr = b.ptr();
            held.push(b);
            Ok(ptr)
        };
        let out = zeros(&g, p.output_len() * 4);
        // SAFETY: sizes from p.
        unsafe {
            conv_cuda::conv2d(
                &g,
                Math::Fp32,
                &p,
                (dx.ptr(), dw.ptr()),
                Some(db.ptr()),
                out.ptr(),
                &mut ws,
            )
            .unwrap()
        };
        let want = conv_cpu::conv2d(&x, &w, Some(&bias), &p);
        assert_close(
            &format!("conv2d {p:?}"),
            &down::<f32>(&g, &out, p.output_len()),
            &want,
            1e-4,
        );

        let gi = zeros(&g, p.input_len() * 4);
        // SAFETY: as above.
        unsafe {
            conv_cuda::conv2d_backward_input(
                &g,
                Math::Fp32,
                &p,
                dgo.ptr(),
                dw.ptr(),
                gi.ptr(),
                &mut ws,
            )
            .unwrap()
        };
        let want = conv_cpu::conv2d_backward_input(&go, &w, &p);
        assert_close(
            &format!("conv2d_backward_input {p:?}"),
            &down::<f32>(&g, &gi, p.input_len()),
            &want,
            1e-4,
        );

        let gw = zeros(&g, p.weight_len() * 4);
        // SAFETY: as above.
        unsafe {
            conv_cuda::conv2d_backward_weight(
                &g,
                Math::Fp32,
                &p,
                dx.ptr(),
                dgo.ptr(),
                gw.ptr(),
                &mut ws,
            )
            .unwrap()
        };
        let want = conv_cpu::conv2d_backward_weight(&x, &go, &p);
        assert_close(
            &format!("conv2d_backward_weight {p:?}"),
            &down::<f32>(&g, &gw, p.weight_len()),
            &want,
            1e-3,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn max_pool_matches_the_cpu() {
    let g = gpu();
    for p in [
        PoolParams {
            planes: 6,
            h: 8,
            w: 8,
            kernel: 2,
            stride: 2,
        },
        PoolParams {
            planes: 4,
            h: 9,
            w: 7,
            kernel: 3,
            stride: 2,
        },
    ] {
        let x = rand_vec(p.planes * p.h * p.w, 51, -1.0, 1.0);
        let no = p.planes * p.out_h() * p.out_w();
        let (dx, out, idx) = (up(&g, &x), zeros(&g, no * 4), zeros(&g, no * 4));
        // SAFETY: sizes from p.
        unsafe {
            pool_cuda::max_pool2d(&g, CudaType::F32, &p, None, dx.ptr(), out.ptr(), idx.ptr())
                .unwrap()
        };
        let (want, want_idx) = pool_cpu::max_pool2d(&x, &p);
        assert_eq!(down::<f32>(&g, &out, no), want);
        assert_eq!(down::<i32>(&g, &idx, no), want_idx);
        let go = rand_vec(no, 52, -1.0, 1.0);
        let (dgo, gi) = (up(&g, &go), zeros(&g, x.len() * 4));
        // SAFETY: as above.
        unsafe {
            pool_cuda::max_pool2d_backward(
                &g,
                p.planes,
                p.h * p.w,
                p.out_h() * p.out_w(),
                dgo.ptr(),
                idx.ptr(),
                gi.ptr(),
            )
            .unwrap()
        };
        let want = pool_cpu::max_pool2d_backward(
            &go,
            &want_idx,
            p.planes,
            p.h * p.w,
            p.out_h() * p.out_w(),
        )
        .unwrap();
        assert_close(
            "max_pool2d_backward",
            &down::<f32>(&g, &gi, x.len()),
            &want,
            1e-6,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_optimizer_steps_match_the_cpu() {
    let g = gpu();
    // Three parameters, one of them fused over 300 members (more rates than one launch table holds).
    let lens = [784 * 128, 10, 300 * 12];
    let lrs: [Vec<f64>; 3] = [
        vec![1e-3],
        vec![0.5],
        (0..300).map(|i| 1e-3 * (1.0 + i as f64)).collect(),
    ];
    let sgd = SgdParams {
        lrs: &[],
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 1e-2,
        nesterov: true,
    };
    let adam = AdamParams {
        lrs: &[],
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-2,
        decoupled: true,
        step: 3,
    };
    for use_adam in [false, true] {
        let mut host = Vec::new();
        let mut dev = Vec::new();
        for (i, &n) in lens.iter().enumerate() {
            let p = rand_vec(n, 60 + i as u64, -1.0, 1.0);
            let gr = rand_vec(n, 70 + i as u64, -1.0, 1.0);
            let m = rand_vec(n, 80 + i as u64, -0.1, 0.1);
            let v = rand_vec(n, 90 + i as u64, 0.0, 0.1);
            dev.push((up(&g, &p), up(&g, &gr), up(&g, &m), up(&g, &v)));
            host.push((p, gr, m, v));
        }
        let bufs: Vec<_> = dev
            .iter()
            .zip(&lens)
            .zip(&lrs)
            .map(|((d, &len), lrs)| optim_cuda::ParamBuffers {
                param: d.0.ptr(),
                grad: d.1.ptr(),
                state1: d.2.ptr(),
                state2: d.3.ptr(),
                len,
                lrs,
            })
            .collect();
        // SGD's second step runs as a captured step would: its rates halved by a device state.
        let state = up(&g, &[optim_cuda::StepState::before(2, 0.5)]);
        for k in 0..2 {
            let scale = if use_adam || k == 0 { 1.0 } else { 0.5 };
            // SAFETY: every buffer holds `len` f32; the state is a StepState.
            unsafe {
                if use_adam {
                    optim_cuda::adam_step(&g, &bufs, &adam, None, None).unwrap();
                } else if k == 0 {
                    optim_cuda::sgd_step(&g, &bufs, &sgd, None, None).unwrap();
                } else {
                    optim_cuda::sgd_step(&g, &bufs, &sgd, Some(state.ptr()), None).unwrap();
                }
            }
            let lrs: Vec<Vec<f64>> = lrs
                .iter()
                .map(|l| l.iter().map(|r| r * scale).collect())
                .collect();
            for (i, (p, gr, m, v)) in host.iter_mut().enumerate() {
                if use_adam {
                    optim_cpu::adam_step(
                        p,
                        gr,
                        m,
                        v,
                        &AdamParams {
                            lrs: &lrs[i],
                            ..adam
                        },
                    );
                } else {
                    optim_cpu::sgd_step(
                        p,
                        gr,
                        Some(m),
                        &SgdParams {
                            lrs: &lrs[i],
                            ..sgd
                        },
                    );
                }
            }
        }
        for (i, ((p, _, m, _), d)) in host.iter().zip(&dev).enumerate() {
            let what = format!("{} param {i}", if use_adam { "adam" } else { "sgd" });
            assert_close(&what, &down::<f32>(&g, &d.0, p.len()), p, 1e-5);
            assert_close(
                &format!("{what} state"),
                &down::<f32>(&g, &d.2, m.len()),
                m,
                1e-5,
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tuned_f32_products_report_their_choice_and_run_on_any_alignment() {
    let g = gpu();
    g.gemm_tuning(); // forget earlier tests' tunings
    // A geometry no other test uses, batched over a shared lhs as fused members are.
    let s = MatmulShape {
        batch: 5,
        m: 96,
        n: 40,
        k: 72,
        lhs_batch_stride: 0,
        rhs_batch_stride: 72 * 40,
        trans_lhs: false,
        trans_rhs: false,
    };
    let a = rand_vec(s.m * s.k + 1, 21, -1.0, 1.0);
    let b = rand_vec(s.batch * s.k * s.n + 1, 22, -1.0, 1.0);
    let want = mm_cpu::matmul(&a[1..], &b[1..], &s);
    let (da, db) = (up(&g, &a), up(&g, &b));
    let outs = s.batch * s.m * s.n;
    let out = zeros(&g, (outs + 1) * 4);
    let mut first = None;
    // Aligned operands, then every operand one element off its 16-byte alignment.
    for shift in [0u64, 4] {
        let (pa, pb, po) = (da.ptr() + 4, db.ptr() + 4, out.ptr() + shift);
        for _ in 0..2 {
            // SAFETY: each buffer holds one element more than the product reads or writes.
            unsafe { mm_cuda::matmul(&g, CudaType::F32, pa, pb, po, &s).unwrap() };
            let mut got = vec![0f32; outs];
            // SAFETY: po addresses outs f32 inside `out`.
            unsafe { g.dtoh(po, bytemuck::cast_slice_mut(&mut got)).unwrap() };
            assert_close(&format!("shift {shift}"), &got, &want, 1e-4);
            // The chosen algorithm is kept: the same call gives the same bits.
            match &first {
                None => first = Some(got),
                Some(f) if shift == 0 => assert_eq!(&got, f, "a repeated product changed"),
                Some(_) => {}
            }
        }
    }
    let report = g.gemm_tuning();
    let label = "gemmNN 96x40x72 x5";
    let tuned: Vec<_> = report.iter().filter(|t| t.label == label).collect();
    assert!(!tuned.is_empty(), "no tuning of {label} in {report:?}");
    for t in tuned {
        assert!(t.candidates >= 1 && t.best_index < t.candidates, "{t:?}");
        assert!(t.best_us > 0.0, "{t:?}");
        if let Some(h) = t.heuristic_us {
            assert!(
                t.best_us <= h,
                "the fastest is slower than the heuristic's pick: {t:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn products_with_a_bias_and_relu_epilogue_match_the_cpu() {
    let g = gpu();
    // Four members sharing their input, each with its own weight and bias.
    let s = MatmulShape {
        batch: 4,
        m: 50,
        n: 64,
        k: 30,
        lhs_batch_stride: 0,
        rhs_batch_stride: 30 * 64,
        trans_lhs: false,
        trans_rhs: false,
    };
    let a = rand_vec(s.m * s.k, 41, -1.0, 1.0);
    let b = rand_vec(s.batch * s.k * s.n, 42, -1.0, 1.0);
    let bias = rand_vec(s.batch * s.n + 1, 43, -1.0, 1.0);
    let (da, db, dbias) = (up(&g, &a), up(&g, &b), up(&g, &bias));
    let out = zeros(&g, s.batch * s.m * s.n * 4);
    let product = mm_cpu::matmul(&a, &b, &s);
    for relu in [false, true] {
        let want: Vec<f32> = product
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let z = v + bias[(i / (s.m * s.n)) * s.n + i % s.n];
                if relu { z.max(0.0) } else { z }
            })
            .collect();
        let ptrs = (da.ptr(), db.ptr(), out.ptr(), dbias.ptr());
        // SAFETY: the buffers hold what s and the bias stride (n) describe.
        let ran = unsafe { mm_cuda::matmul_bias(&g, CudaType::F32, ptrs, &s, s.n, relu).unwrap() };
        assert!(ran, "the epilogue did not run (relu {relu})");
        assert_close(
            &format!("bias relu={relu}"),
            &down::<f32>(&g, &out, want.len()),
            &want,
            1e-4,
        );
    }
    // A bias off its 16-byte alignment is left to the caller.
    let ptrs = (da.ptr(), db.ptr(), out.ptr(), dbias.ptr() + 4);
    // SAFETY: as above; the bias buffer holds one element more.
    let ran = unsafe { mm_cuda::matmul_bias(&g, CudaType::F32, ptrs, &s, s.n, true).unwrap() };
    assert!(!ran, "an unaligned bias must not reach the epilogue");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn products_with_the_sums_of_their_rhs_match_the_cpu() {
    let g = gpu();
    for batch in [1, 3] {
        // A Linear layer's weight gradient (input transposed) and bias gradient.
        let s = MatmulShape {
            batch,
            m: 48,
            n: 32,
            k: 64,
            lhs_batch_stride: 0,
            rhs_batch_stride: 64 * 32,
            trans_lhs: true,
            trans_rhs: false,
        };
        let a = rand_vec(s.k * s.m, 51, -1.0, 1.0);
        let b = rand_vec(batch * s.k * s.n, 52, -1.0, 1.0);
        let (da, db) = (up(&g, &a), up(&g, &b));
        let (out, sums) = (zeros(&g, batch * s.m * s.n * 4), zeros(&g, batch * s.n * 4));
        let ptrs = (da.ptr(), db.ptr(), out.ptr(), sums.ptr());
        // SAFETY: the buffers hold what s and the sums' stride (n) describe.
        let ran = unsafe { mm_cuda::matmul_rhs_sums(&g, CudaType::F32, ptrs, &s, s.n).unwrap() };
        // cuBLASLt has this epilogue for one product (checked on the H200); for a batch it may
        // not, and the caller then runs the product and the sums apart.
        assert!(
            ran || batch > 1,
            "no column-sum epilogue for a single product"
        );
        if !ran {
            continue;
        }
        let want_sums: Vec<f32> = (0..batch * s.n)
            .map(|i| {
                (0..s.k)
                    .map(|r| b[(i / s.n) * s.k * s.n + r * s.n + i % s.n])
                    .sum()
            })
            .collect();
        let what = format!("batch {batch}");
        assert_close(
            &what,
            &down::<f32>(&g, &out, batch * s.m * s.n),
            &mm_cpu::matmul(&a, &b, &s),
            1e-4,
        );
        assert_close(
            &what,
            &down::<f32>(&g, &sums, batch * s.n),
            &want_sums,
            1e-4,
        );
    }
}

/// One parameter's buffers (parameter, gradient, m, v) of `n` f32 with a rate per member.
fn adam_buffers<'a>(
    bufs: [&DeviceBuffer; 4],
    n: usize,
    lrs: &'a [f64],
) -> [optim_cuda::ParamBuffers<'a>; 1] {
    let [p, g, m, v] = bufs.map(DeviceBuffer::ptr);
    [optim_cuda::ParamBuffers {
        param: p,
        grad: g,
        state1: m,
        state2: v,
        len: n,
        lrs,
    }]
}

/// PyTorch's Adam defaults at `step`, the rates per parameter.
fn adam(step: u64) -> AdamParams<'static> {
    AdamParams {
        lrs: &[],
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn counted_adam_steps_advance_their_device_state_and_follow_its_scale() {
    let g = gpu();
    // 300 members need two launch tables: only the last launch may advance the step.
    let (members, per) = (300, 12);
    let lrs: Vec<f64> = (0..members).map(|i| 1e-3 * (1.0 + i as f64)).collect();
    let n = members * per;
    let mut p = rand_vec(n, 1, -1.0, 1.0);
    let gr = rand_vec(n, 2, -1.0, 1.0);
    let mut m = rand_vec(n, 3, -0.1, 0.1);
    let mut v = rand_vec(n, 4, 0.0, 0.1);
    let (dp, dg, dm, dv) = (up(&g, &p), up(&g, &gr), up(&g, &m), up(&g, &v));
    // Scaled rates: the schedule's factor relative to the captured rates, set by the host.
    let scale = 0.25f32;
    let state = up(&g, &[optim_cuda::StepState::before(3, scale)]);
    let bufs = adam_buffers([&dp, &dg, &dm, &dv], n, &lrs);
    let h = AdamParams {
        weight_decay: 1e-2,
        decoupled: true,
        step: 0, // ignored: the device state decides
        ..adam(0)
    };
    let scaled: Vec<f64> = lrs.iter().map(|l| l * f64::from(scale)).collect();
    for step in [3, 4] {
        // SAFETY: every buffer holds n f32; the state is a StepState.
        unsafe { optim_cuda::adam_step(&g, &bufs, &h, Some(state.ptr()), None).unwrap() };
        optim_cpu::adam_step(
            &mut p,
            &gr,
            &mut m,
            &mut v,
            &AdamParams {
                lrs: &scaled,
                step,
                ..h
            },
        );
    }
    assert_eq!(
        down::<optim_cuda::StepState>(&g, &state, 1),
        vec![optim_cuda::StepState::before(5, scale)],
        "two steps after step 2"
    );
    assert_close("counted adam", &down::<f32>(&g, &dp, n), &p, 1e-5);
    assert_close("counted adam m", &down::<f32>(&g, &dm, n), &m, 1e-5);
}

/// A step replayed from a graph (its number on the device) updates to the bits of the eager step of that number:
/// both take the bias corrections from the same f64 operations, at early steps where they matter most and late
/// ones where the powers take many squarings.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_counted_adam_step_gives_the_eager_steps_bits() {
    let g = gpu();
    let (members, per) = (3, 1000);
    let lrs = [1e-3, 3e-4, 1e-2];
    let n = members * per;
    let (p, gr) = (rand_vec(n, 1, -1.0, 1.0), rand_vec(n, 2, -1.0, 1.0));
    let (m, v) = (rand_vec(n, 3, -0.1, 0.1), rand_vec(n, 4, 0.0, 0.1));
    for step in [1, 2, 3, 10, 1000, 123_457] {
        let run = |counted: bool| {
            let (dp, dg, dm, dv) = (up(&g, &p), up(&g, &gr), up(&g, &m), up(&g, &v));
            let state = up(&g, &[optim_cuda::StepState::before(step, 1.0)]);
            let bufs = adam_buffers([&dp, &dg, &dm, &dv], n, &lrs);
            let h = adam(step);
            let state = counted.then(|| state.ptr());
            // SAFETY: every buffer holds n f32; the state is a StepState.
            unsafe { optim_cuda::adam_step(&g, &bufs, &h, state, None).unwrap() };
            [&dp, &dm, &dv].map(|b| down::<f32>(&g, b, n))
        };
        let (eager, replayed) = (run(false), run(true));
        for (what, (a, b)) in ["param", "m", "v"].iter().zip(eager.iter().zip(&replayed)) {
            let differ = a
                .iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "step {step}: {differ} of {n} {what} values differ"
            );
        }
        assert_ne!(eager[0], p, "step {step}: the step moved the parameters");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn prefetch_on_the_copy_stream_is_ordered_with_compute() {
    let g = gpu();
    let n = 1 << 20;
    let x = rand_vec(n, 99, -1.0, 1.0);
    let buf = zeros(&g, n * 4);
    // SAFETY: n f32.
    unsafe {
        g.htod_prefetch(buf.ptr(), bytemuck::cast_slice(&x))
            .unwrap()
    };
    // SAFETY: in place over n f32; runs after the prefetch on the compute stream.
    unsafe {
        un_cuda::unary(
            &g,
            UnaryOp::MulScalar(2.0),
            CudaType::F32,
            buf.ptr(),
            buf.ptr(),
            n,
        )
        .unwrap()
    };
    let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    assert_eq!(down::<f32>(&g, &buf, n), want);
}
