//! CPU kernels on raw buffers against naive f64 loops.

use cohort_kernels::binary::{BinaryOp, BroadcastPlan, cpu as binary};
use cohort_kernels::copy::{Copy2d, cpu as copy};
use cohort_kernels::index::cpu as index;
use cohort_kernels::matmul::{MatmulShape, cpu as matmul};
use cohort_kernels::optim::{AdamParams, SgdParams, cpu as optim};
use cohort_kernels::reduce::{ReduceOp, ReduceShape, cpu as reduce};
use cohort_kernels::softmax::cpu as softmax;
use cohort_kernels::unary::{UnaryOp, cpu as unary};

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: {a} vs {b}"
        );
    }
}

#[test]
fn broadcast_plan_merges_contiguous_dims() {
    let p = BroadcastPlan::new(&[4, 5, 6], &[4, 5, 6], &[4, 5, 6]);
    assert_eq!(
        (p.rows(), p.inner, p.lhs_inner_step, p.rhs_inner_step),
        (1, 120, 1, 1)
    );
    let p = BroadcastPlan::new(&[8, 16], &[16], &[8, 16]);
    assert_eq!(
        (p.rows(), p.inner, p.lhs_inner_step, p.rhs_inner_step),
        (8, 16, 1, 1)
    );
    assert_eq!(p.offsets(3), (48, 0));
    let p = BroadcastPlan::new(&[3, 1], &[1, 4], &[3, 4]);
    assert_eq!(
        (p.rows(), p.inner, p.lhs_inner_step, p.rhs_inner_step),
        (3, 4, 0, 1)
    );
    assert_eq!(p.offsets(2), (2, 0));
}

#[test]
fn binary_broadcast_matches_loops() {
    let (a, b) = (data(3 * 4 * 5, 1), data(4, 2));
    let out = binary::binary(BinaryOp::Sub, &a, &[3, 4, 5], &b, &[4, 1], &[3, 4, 5]);
    let want: Vec<f64> = (0..60).map(|i| a[i] - b[(i / 5) % 4]).collect();
    close("sub", &out, &want, 0.0);
    // Large enough for the parallel path.
    let (a, b) = (data(300 * 400, 3), data(400, 4));
    let out = binary::binary(BinaryOp::Mul, &a, &[300, 400], &b, &[400], &[300, 400]);
    let want: Vec<f64> = (0..120_000).map(|i| a[i] * b[i % 400]).collect();
    close("mul parallel", &out, &want, 0.0);
    let mut d = a.clone();
    binary::binary_assign(BinaryOp::Add, &mut d, &[300, 400], &b, &[400]);
    let want: Vec<f64> = (0..120_000).map(|i| a[i] + b[i % 400]).collect();
    close("add_assign", &d, &want, 0.0);
}

#[test]
fn unary_matches_reference() {
    let x = data(100_000, 5);
    for op in [
        UnaryOp::Gelu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::MulScalar(3.0),
    ] {
        let got = unary::unary(op, &x);
        let want: Vec<f64> = x.iter().map(|&v| op.apply_f64(v)).collect();
        close(op.name(), &got, &want, 1e-12);
        let mut inplace = x.clone();
        unary::unary_inplace(op, &mut inplace);
        close(op.name(), &inplace, &want, 1e-12);
    }
}

fn matmul_ref(a: &[f64], b: &[f64], s: &MatmulShape) -> Vec<f64> {
    let mut out = vec![0.0; s.batch * s.m * s.n];
    for bi in 0..s.batch {
        let (ao, bo) = (bi * s.lhs_batch_stride, bi * s.rhs_batch_stride);
        for i in 0..s.m {
            for j in 0..s.n {
                out[(bi * s.m + i) * s.n + j] = (0..s.k)
                    .map(|p| {
                        let av = if s.trans_lhs {
                            a[ao + p * s.m + i]
                        } else {
                            a[ao + i * s.k + p]
                        };
                        let bv = if s.trans_rhs {
                            b[bo + j * s.k + p]
                        } else {
                            b[bo + p * s.n + j]
                        };
                        av * bv
                    })
                    .sum();
            }
        }
    }
    out
}

#[test]
fn matmul_all_layouts() {
    for &(batch, m, n, k) in &[
        (1, 5, 7, 3),
        (4, 9, 2, 11),
        (2, 130, 70, 90),
        (1, 0, 3, 2),
        (2, 3, 3, 0),
    ] {
        for (tl, tr) in [(false, false), (true, false), (false, true), (true, true)] {
            for (lb, rb) in [(true, true), (false, true), (true, false)] {
                let s = MatmulShape {
                    batch,
                    m,
                    n,
                    k,
                    lhs_batch_stride: if lb { m * k } else { 0 },
                    rhs_batch_stride: if rb { k * n } else { 0 },
                    trans_lhs: tl,
                    trans_rhs: tr,
                };
                let a = data(batch * m * k, 7);
                let b = data(batch * k * n, 8);
                let want = matmul_ref(&a, &b, &s);
                close(&format!("{s:?}"), &matmul::matmul(&a, &b, &s), &want, 1e-12);
                // accumulate adds onto the existing output
                let mut acc = vec![1.0; batch * m * n];
                matmul::matmul_into(&mut acc, true, &a, &b, &s);
                let want1: Vec<f64> = want.iter().map(|v| v + 1.0).collect();
                close("accumulate", &acc, &want1, 1e-12);
            }
        }
    }
    let a: Vec<f32> = data(64 * 64, 9).into_iter().map(|v| v as f32).collect();
    let s = MatmulShape::plain(64, 64, 64);
    let want = matmul_ref(
        &a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &s,
    );
    let got: Vec<f64> = matmul::matmul(&a, &a, &s)
        .into_iter()
        .map(f64::from)
        .collect();
    close("f32", &got, &want, 1e-5);
}

#[test]
fn linear_adds_each_products_bias_then_relu() {
    for &(batch, m, n, k, lb) in &[
        (1, 5, 7, 3, false),
        (3, 9, 4, 11, false),
        (3, 6, 5, 8, true),
        (2, 3, 3, 0, true),
    ] {
        let s = MatmulShape {
            batch,
            lhs_batch_stride: if lb { m * k } else { 0 },
            ..MatmulShape {
                batch: 1,
                ..MatmulShape::plain(m, n, k)
            }
        };
        let (a, b) = (data(batch * m * k, 3), data(batch * k * n, 4));
        let bias = data(batch * n, 5);
        let product = matmul_ref(&a, &b, &s);
        for (stride, relu) in [(0, false), (n, false), (n, true), (0, true)] {
            let want: Vec<f64> = product
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (p, col) = (i / (m * n), i % n);
                    let y = v + bias[p * stride + col];
                    if relu { y.max(0.0) } else { y }
                })
                .collect();
            let got = matmul::linear(&a, &b, &bias, stride, relu, &s);
            close(
                &format!("{s:?} stride {stride} relu {relu}"),
                &got,
                &want,
                1e-12,
            );
            if relu {
                assert!(got.iter().all(|&v| v >= 0.0), "a ReLU output below 0");
            }
        }
    }
}

#[test]
fn max_pool_takes_the_first_of_tied_maxima() {
    use cohort_kernels::pool::{PoolParams, cpu as pool};
    // Two 4x4 planes: all zeros (every window ties), then a plane whose windows tie between their last two cells.
    let mut x = vec![0.0f32; 32];
    for i in [16 + 4, 16 + 5, 16 + 6, 16 + 7] {
        x[i] = 1.0;
    }
    let p = PoolParams {
        planes: 2,
        h: 4,
        w: 4,
        kernel: 2,
        stride: 2,
    };
    let (y, idx) = pool::max_pool2d(&x, &p);
    assert_eq!(&y[..4], &[0.0; 4]);
    assert_eq!(
        &idx[..4],
        &[0, 2, 8, 10],
        "ties go to the window's first element"
    );
    assert_eq!(&y[4..6], &[1.0, 1.0]);
    assert_eq!(
        &idx[4..6],
        &[4, 6],
        "ties go to the first of the tied elements"
    );
}

#[test]
fn reductions_and_softmax() {
    let x = data(2 * 3000 * 4, 10);
    let s = ReduceShape {
        outer: 2,
        dim: 3000,
        inner: 4,
    };
    let sum = reduce::reduce(ReduceOp::Sum, &x, s);
    let want: Vec<f64> = (0..8)
        .map(|i| (0..3000).map(|d| x[(i / 4) * 12_000 + d * 4 + i % 4]).sum())
        .collect();
    close("sum", &sum, &want, 1e-12);
    let am = reduce::argmax(&x, s);
    for i in 0..8 {
        let best = x[(i / 4) * 12_000 + am[i] as usize * 4 + i % 4];
        let max = (0..3000)
            .map(|d| x[(i / 4) * 12_000 + d * 4 + i % 4])
            .fold(f64::MIN, f64::max);
        assert_eq!(best, max);
    }
    let sm = softmax::softmax_last(&x, 6, false);
    for row in sm.chunks(6) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    let big = vec![1000.0f64, 0.0, -1000.0];
    let ls = softmax::softmax_last(&big, 3, true);
    assert!(ls.iter().all(|v| v.is_finite()), "{ls:?}");
}

/// Fused members' logits `[4, 256, 10]` against shared labels split across threads (as one member's `[256, 10]`
/// does not): each member's losses and gradient are the bits it gets on its own.
#[test]
fn cross_entropy_of_fused_members_is_each_members_own() {
    let (members, rows, cols) = (4, 256, 10);
    let logits: Vec<f32> = data(members * rows * cols, 11)
        .iter()
        .map(|&v| (v * 8.0) as f32)
        .collect();
    let labels: Vec<i32> = (0..rows).map(|r| (r * 7 % cols) as i32).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (loss, grad) = pool
        .install(|| softmax::cross_entropy(&logits, cols, &labels, 1.0 / rows as f32))
        .unwrap();
    for m in 0..members {
        let one = &logits[m * rows * cols..][..rows * cols];
        let (l, g) = softmax::cross_entropy(one, cols, &labels, 1.0 / rows as f32).unwrap();
        assert_eq!(&loss[m * rows..][..rows], &l[..], "member {m}: losses");
        assert_eq!(
            &grad[m * rows * cols..][..rows * cols],
            &g[..],
            "member {m}: gradient"
        );
    }
    assert!(
        loss.iter().all(|&l| l > 0.0),
        "logsumexp exceeds every logit"
    );
}

#[test]
fn copies_and_indices() {
    let src: Vec<i32> = (0..12).collect();
    let mut dst = vec![0; 8];
    copy::copy2d(
        &src,
        &mut dst,
        &Copy2d {
            rows: 2,
            cols: 2,
            src_stride: 6,
            dst_stride: 4,
            src_offset: 1,
            dst_offset: 2,
        },
    );
    assert_eq!(dst, vec![0, 0, 1, 2, 0, 0, 7, 8]);
    assert_eq!(
        copy::transpose(&src, 2, 2, 3),
        vec![0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]
    );
    assert_eq!(
        copy::broadcast(&[1, 2], &[2, 1], &[2, 3]),
        vec![1, 1, 1, 2, 2, 2]
    );
    assert_eq!(
        copy::where_cond(&[1u8, 0, 2], &[1, 2, 3], &[7, 8, 9]),
        vec![1, 8, 3]
    );
    assert_eq!(
        index::index_select(&src, 1, 4, 3, &[3, 0]).unwrap(),
        vec![9, 10, 11, 0, 1, 2]
    );
    assert!(index::index_select(&src, 1, 4, 3, &[4]).is_err());
    let mut d = vec![0.0; 6];
    index::index_add(&mut d, (1, 3, 2), &[2, 2], &[1.0, 2.0, 3.0, 4.0], 1).unwrap();
    assert_eq!(d, vec![0.0, 0.0, 0.0, 0.0, 4.0, 6.0]);
    assert_eq!(
        index::one_hot::<f32>(&[2, 0], 3).unwrap(),
        vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    );
    assert!(index::one_hot::<f32>(&[-1], 3).is_err());
    assert_eq!(
        index::gather_last(&src, 4, &[1, 2, 3]).unwrap(),
        vec![1, 6, 11]
    );
}

#[test]
fn optimizer_steps_use_per_member_rates() {
    let n = 3 * 50_000;
    let g = data(n, 11);
    let mut p = vec![1.0; n];
    let lrs = [0.1, 0.2, 0.3];
    let h = SgdParams {
        lrs: &lrs,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    };
    optim::sgd_step(&mut p, &g, None, &h);
    for i in (0..n).step_by(997) {
        assert!((p[i] - (1.0 - lrs[i / 50_000] * g[i])).abs() < 1e-15);
    }
    let (mut p, mut m, mut v) = (vec![1.0; n], vec![0.0; n], vec![0.0; n]);
    let h = AdamParams {
        lrs: &lrs,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step: 1,
    };
    optim::adam_step(&mut p, &g, &mut m, &mut v, &h);
    // The first Adam step moves each weight by lr·sign(g) (up to eps).
    for i in (0..n).step_by(991) {
        let want = 1.0 - lrs[i / 50_000] * g[i].signum();
        assert!((p[i] - want).abs() < 1e-6, "{i}: {} vs {want}", p[i]);
    }
}

/// Every CPU kernel that sums floats gives the same bits whatever the thread count (a resumed run may get another
/// one): the convolution (its weight gradient sums the batch), products large enough to run threaded and batches of
/// small ones, reductions (losses, means, norms' and biases' gradients over the batch), softmax and log-softmax,
/// cross-entropy with its gradient, max-pool's backward over overlapping windows, index_add (an embedding's
/// gradient), scatter_add_last and the optimizer steps. Each runs above the size where it goes parallel. A kernel that
/// grouped its sums by the thread count (chunks of `len / current_num_threads()`, or rayon's `fold` / `sum` over
/// floats, which group by work stealing) fails here: sums of a few thousand terms in another grouping differ in the
/// last bits.
#[test]
fn reductions_are_the_same_bits_with_one_thread_or_many() {
    use cohort_kernels::conv::{ConvParams, cpu as conv};
    use cohort_kernels::pool::{PoolParams, cpu as pool};
    let f32s =
        |n: usize, seed: u64| -> Vec<f32> { data(n, seed).iter().map(|&v| v as f32).collect() };
    let p = ConvParams {
        batch: 37,
        c_in: 6,
        h: 12,
        w: 12,
        c_out: 8,
        kh: 3,
        kw: 3,
        stride: 1,
        padding: 1,
        groups: 2,
    };
    let x = f32s(p.batch * p.c_in * p.h * p.w, 1);
    let gy = f32s(p.batch * p.c_out * p.out_h() * p.out_w(), 2);
    let wt = f32s(p.weight_len(), 3);
    let bias = f32s(p.c_out, 4);
    let (m, n, k) = (192, 160, 1024);
    let a = f32s(m * k, 5);
    let b = f32s(k * n, 6);
    let small = MatmulShape {
        batch: 64,
        m: 24,
        n: 20,
        k: 48,
        lhs_batch_stride: 24 * 48,
        rhs_batch_stride: 0,
        trans_lhs: false,
        trans_rhs: true,
    };
    let (sa, sb) = (f32s(64 * 24 * 48, 7), f32s(20 * 48, 8));
    let r = f32s(96 * 3000, 9);
    let logits = f32s(2000 * 100, 10);
    let labels: Vec<i32> = (0..2000).map(|i| i * 37 % 100).collect();
    let pp = PoolParams {
        planes: 64,
        h: 33,
        w: 31,
        kernel: 3,
        stride: 2,
    };
    let (plane_in, plane_out) = (pp.h * pp.w, pp.out_h() * pp.out_w());
    let px = f32s(pp.planes * plane_in, 11);
    let pg = f32s(pp.planes * plane_out, 12);
    let ids: Vec<i32> = (0..5000).map(|i| i * 7919 % 50).collect();
    let rows = f32s(ids.len() * 96, 13);
    let grad = f32s(200_000, 14);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut out: Vec<(&str, Vec<f32>)> = vec![
                (
                    "conv weight gradient",
                    conv::conv2d_backward_weight(&x, &gy, &p),
                ),
                (
                    "conv input gradient",
                    conv::conv2d_backward_input(&gy, &wt, &p),
                ),
                ("conv forward", conv::conv2d(&x, &wt, Some(&bias), &p)),
                (
                    "product",
                    matmul::matmul(&a, &b, &MatmulShape::plain(m, n, k)),
                ),
                ("batch of small products", matmul::matmul(&sa, &sb, &small)),
            ];
            for (what, shape) in [
                (
                    "row sums",
                    ReduceShape {
                        outer: 96,
                        dim: 3000,
                        inner: 1,
                    },
                ),
                (
                    "middle-dim means",
                    ReduceShape {
                        outer: 24,
                        dim: 300,
                        inner: 40,
                    },
                ),
                (
                    "sums over the batch",
                    ReduceShape {
                        outer: 1,
                        dim: 3000,
                        inner: 96,
                    },
                ),
            ] {
                let op = if what.contains("means") {
                    ReduceOp::Mean
                } else {
                    ReduceOp::Sum
                };
                out.push((what, reduce::reduce(op, &r, shape)));
            }
            out.push(("softmax", softmax::softmax_last(&logits, 100, false)));
            out.push(("log-softmax", softmax::softmax_last(&logits, 100, true)));
            let (loss, dlogits) =
                softmax::cross_entropy(&logits, 100, &labels, 1.0 / 2000.0).unwrap();
            out.push(("cross-entropy", loss));
            out.push(("cross-entropy gradient", dlogits));
            let (_, idx) = pool::max_pool2d(&px, &pp);
            let back = pool::max_pool2d_backward(&pg, &idx, pp.planes, plane_in, plane_out);
            out.push(("max-pool backward", back.unwrap()));
            let mut table = vec![0f32; 50 * 96];
            index::index_add(&mut table, (1, 50, 96), &ids, &rows, 1).unwrap();
            out.push(("index_add", table));
            let mut dst = vec![0f32; 2000 * 100];
            index::scatter_add_last(&mut dst, 100, &labels, &logits[..2000]).unwrap();
            out.push(("scatter_add_last", dst));
            let (mut sgd, mut mom) = (
                grad.iter().map(|g| g * 0.5).collect::<Vec<_>>(),
                vec![0f32; grad.len()],
            );
            let lrs = [0.1, 0.01];
            let h = SgdParams {
                lrs: &lrs,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 1e-4,
                nesterov: true,
            };
            optim::sgd_step(&mut sgd, &grad, Some(&mut mom), &h);
            out.push(("sgd step", sgd));
            let (mut adam, mut m1, mut m2) = (
                vec![1f32; grad.len()],
                vec![0f32; grad.len()],
                vec![0f32; grad.len()],
            );
            let h = AdamParams {
                lrs: &lrs,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                decoupled: true,
                step: 3,
            };
            optim::adam_step(&mut adam, &grad, &mut m1, &mut m2, &h);
            out.push(("adam step", adam));
            out
        })
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let one = run(1);
    for threads in [2, 3, 8] {
        for ((what, want), (_, got)) in one.iter().zip(run(threads)) {
            assert_eq!(bits(want), bits(&got), "{what} with {threads} threads");
        }
    }
}
