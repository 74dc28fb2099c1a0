//! Every op against a naive f64 reference on fresh seeded inputs, on every device.

mod common;

use cohort_tensor::{DType, Device, LossScaleState, Result, Tensor};
use common::*;

fn binary_ref(op: &str, a: f64, b: f64) -> f64 {
    let t = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "maximum" => a.max(b),
        "minimum" => a.min(b),
        "gt" => t(a > b),
        "ge" => t(a >= b),
        "lt" => t(a < b),
        "le" => t(a <= b),
        "eq" => t(a == b),
        _ => unreachable!("unknown op {op}"),
    }
}

fn binary(dev: &Device) -> Result<()> {
    let pairs: &[(&[usize], &[usize])] = &[
        (&[4, 5], &[4, 5]),
        (&[4, 5], &[5]),
        (&[3, 1, 5], &[4, 1]),
        (&[], &[2, 3]),
        (&[2, 3], &[1]),
        (&[256, 300], &[300]),        // parallel path, bias-like
        (&[64, 1, 700], &[64, 9, 1]), // parallel path, both broadcast
    ];
    let mut seed = 1;
    for dt in float_dtypes(dev) {
        for &(sa, sb) in pairs {
            seed += 2;
            let a = rand(sa, seed, dt, dev)?;
            // Keep divisors away from 0 and give eq something to find.
            let b = rand_pos(sb, seed + 1, dt, dev)?;
            let (ha, hb) = (host(&a), host(&b));
            let out = cohort_tensor::broadcast_shape("test", sa, sb)?;
            let n: usize = out.iter().product();
            for op in [
                "add", "sub", "mul", "div", "maximum", "minimum", "gt", "ge", "lt", "le", "eq",
            ] {
                let got = match op {
                    "add" => a.add(&b)?,
                    "sub" => a.sub(&b)?,
                    "mul" => a.mul(&b)?,
                    "div" => a.div(&b)?,
                    "maximum" => a.maximum(&b)?,
                    "minimum" => a.minimum(&b)?,
                    "gt" => a.gt(&b)?,
                    "ge" => a.ge(&b)?,
                    "lt" => a.lt(&b)?,
                    "le" => a.le(&b)?,
                    _ => a.eq(&b)?,
                };
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let idx = unravel(i, &out);
                        binary_ref(op, at_broadcast(&ha, sa, &idx), at_broadcast(&hb, sb, &idx))
                    })
                    .collect();
                assert_close(
                    &format!("{op} {sa:?} {sb:?} {dt}"),
                    &got,
                    &out,
                    &want,
                    tol(dt),
                );
            }
            // eq against itself is all ones.
            assert!(host(&a.eq(&a)?).iter().all(|&v| v == 1.0));
        }
    }
    // Integer element-wise ops (labels vs predictions).
    let p = Tensor::from_vec(vec![1i32, 2, 3, 4], &[4], dev)?;
    let l = Tensor::from_vec(vec![1i32, 0, 3, 0], &[4], dev)?;
    assert_eq!(p.eq(&l)?.to_vec::<i32>()?, vec![1, 0, 1, 0]);
    assert_eq!(p.add(&l)?.to_vec::<i32>()?, vec![2, 2, 6, 4]);
    assert_eq!(p.div(&l)?.to_vec::<i32>()?, vec![1, 0, 1, 0]);
    Ok(())
}

fn unary(dev: &Device) -> Result<()> {
    use cohort_tensor::UnaryOp as U;
    let ops = [
        U::Neg,
        U::Relu,
        U::Gelu,
        U::Tanh,
        U::Sigmoid,
        U::Exp,
        U::Log,
        U::Sqrt,
        U::Abs,
        U::Square,
        U::AddScalar(0.75),
        U::MulScalar(-1.5),
        U::Powf(1.7),
        U::Powf(2.0),
        U::GtScalar(0.25),
        U::LtScalar(-0.25),
    ];
    for dt in float_dtypes(dev) {
        for (si, shape) in [&[7usize, 13][..], &[40_000][..]].iter().enumerate() {
            let x = rand(shape, 100 + si as u64, dt, dev)?;
            let xp = rand_pos(shape, 200 + si as u64, dt, dev)?;
            for op in ops {
                let positive = matches!(op, U::Log | U::Sqrt | U::Powf(_));
                let input = if positive { &xp } else { &x };
                let got = match op {
                    U::Neg => input.neg()?,
                    U::Relu => input.relu()?,
                    U::Gelu => input.gelu()?,
                    U::Tanh => input.tanh()?,
                    U::Sigmoid => input.sigmoid()?,
                    U::Exp => input.exp()?,
                    U::Log => input.log()?,
                    U::Sqrt => input.sqrt()?,
                    U::Abs => input.abs()?,
                    U::Square => input.square()?,
                    U::AddScalar(c) => input.add_scalar(c)?,
                    U::MulScalar(c) => input.mul_scalar(c)?,
                    U::Powf(c) => input.powf(c)?,
                    U::GtScalar(c) => input.gt_scalar(c)?,
                    U::LtScalar(c) => input.lt_scalar(c)?,
                };
                let want: Vec<f64> = host(input).into_iter().map(|v| op.apply_f64(v)).collect();
                assert_close(
                    &format!("{} {dt}", op.name()),
                    &got,
                    shape,
                    &want,
                    tol(dt) * 4.0,
                );
            }
        }
        // The fused bias + ReLU and ReLU's backward agree with the ops they replace.
        let x = rand(&[3, 5, 4], 130, dt, dev)?;
        for bias in [rand(&[3, 1, 4], 131, dt, dev)?, rand(&[4], 132, dt, dev)?] {
            let want = host(&x.add(&bias)?.relu()?);
            assert_close("bias_relu", &x.bias_relu(&bias)?, &[3, 5, 4], &want, 0.0);
            let want = host(&x.add(&bias)?);
            assert_close("bias_add", &x.bias_add(&bias)?, &[3, 5, 4], &want, 0.0);
        }
        // Rows of three: no four-wide kernel.
        let (odd, odd_bias) = (rand(&[2, 3, 3], 137, dt, dev)?, rand(&[3], 138, dt, dev)?);
        let want = host(&odd.add(&odd_bias)?.relu()?);
        assert_close(
            "bias_relu of 3",
            &odd.bias_relu(&odd_bias)?,
            &[2, 3, 3],
            &want,
            0.0,
        );
        let g = rand(&[3, 5, 4], 133, dt, dev)?;
        let want = host(&g.mul(&x.gt_scalar(0.0)?)?);
        assert_close(
            "relu_backward",
            &g.relu_backward(&x)?,
            &[3, 5, 4],
            &want,
            0.0,
        );
        assert!(x.bias_relu(&rand(&[5, 4], 134, dt, dev)?).is_err());
        // A Linear layer's bias is one row, or one per member: not one per row.
        let w = rand(&[3, 4, 2], 135, dt, dev)?;
        let err = x.linear(&w, &rand(&[3, 5, 2], 136, dt, dev)?, false);
        assert!(err.is_err(), "a [3, 5, 2] bias for a [3, 5, 2] output");
        assert!(x.linear(&w, &rand(&[3, 1, 2], 137, dt, dev)?, true).is_ok());
        // ... and with the bias's gradient, the sum of that backward over the rows.
        let (dx, db) = g.relu_backward_bias(&x, &[3, 1, 4])?;
        assert_close("relu_backward_bias dx", &dx, &[3, 5, 4], &want, 0.0);
        let want_db = host(&g.mul(&x.gt_scalar(0.0)?)?.sum(1, true)?);
        assert_close("relu_backward_bias db", &db, &[3, 1, 4], &want_db, tol(dt));
        for bad in [&[1, 1, 4][..], &[3, 4], &[3, 5, 4]] {
            assert!(g.relu_backward_bias(&x, bad).is_err(), "bias {bad:?}");
        }
    }
    Ok(())
}

fn reductions(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        for shape in [
            &[3usize, 4, 5][..],
            &[70, 600][..],
            &[2048, 40][..],
            &[6][..],
        ] {
            let x = rand(shape, 300 + shape.len() as u64, dt, dev)?;
            let hx = host(&x);
            for dim in 0..shape.len() {
                let mut out = shape.to_vec();
                out[dim] = 1;
                let n: usize = out.iter().product();
                let st = strides(shape);
                let red = |f: &dyn Fn(&[f64]) -> f64| -> Vec<f64> {
                    (0..n)
                        .map(|i| {
                            let idx = unravel(i, &out);
                            let base: usize = idx.iter().zip(&st).map(|(a, b)| a * b).sum();
                            let vals: Vec<f64> =
                                (0..shape[dim]).map(|j| hx[base + j * st[dim]]).collect();
                            f(&vals)
                        })
                        .collect()
                };
                let sum = red(&|v| v.iter().sum());
                let mean = red(&|v| v.iter().sum::<f64>() / v.len() as f64);
                let max = red(&|v| v.iter().cloned().fold(f64::MIN, f64::max));
                let min = red(&|v| v.iter().cloned().fold(f64::MAX, f64::min));
                let argmax = red(&|v| {
                    let mut b = 0;
                    for j in 0..v.len() {
                        if v[j] > v[b] {
                            b = j;
                        }
                    }
                    b as f64
                });
                let t = tol(dt) * shape[dim] as f64;
                let what = format!("{shape:?} dim {dim} {dt}");
                assert_close(&format!("sum {what}"), &x.sum(dim, true)?, &out, &sum, t);
                assert_close(&format!("mean {what}"), &x.mean(dim, true)?, &out, &mean, t);
                assert_close(&format!("max {what}"), &x.max(dim, true)?, &out, &max, 0.0);
                assert_close(&format!("min {what}"), &x.min(dim, true)?, &out, &min, 0.0);
                let mut squeezed = shape.to_vec();
                squeezed.remove(dim);
                assert_close(
                    &format!("sum keepdim=false {what}"),
                    &x.sum(dim, false)?,
                    &squeezed,
                    &sum,
                    t,
                );
                let am = x.argmax(dim)?;
                assert_eq!(am.dtype(), DType::I32);
                assert_close(&format!("argmax {what}"), &am, &squeezed, &argmax, 0.0);
            }
            let n = hx.len() as f64;
            let t = tol(dt) * n.sqrt() * 4.0;
            assert_close("sum_all", &x.sum_all()?, &[], &[hx.iter().sum()], t);
            assert_close(
                "mean_all",
                &x.mean_all()?,
                &[],
                &[hx.iter().sum::<f64>() / n],
                t,
            );
        }
    }
    Ok(())
}

fn softmax(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        for shape in [&[5usize, 10][..], &[2, 3, 7][..], &[256, 200][..]] {
            let x = rand(shape, 400, dt, dev)?.mul_scalar(8.0)?;
            let hx = host(&x);
            let cols = *shape.last().unwrap_or(&1);
            let mut sm = Vec::new();
            let mut lsm = Vec::new();
            for row in hx.chunks(cols) {
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                sm.extend(row.iter().map(|v| (v - m).exp() / s));
                lsm.extend(row.iter().map(|v| v - m - s.ln()));
            }
            assert_close(
                &format!("softmax {dt}"),
                &x.softmax_last()?,
                shape,
                &sm,
                tol(dt) * 4.0,
            );
            assert_close(
                &format!("log_softmax {dt}"),
                &x.log_softmax_last()?,
                shape,
                &lsm,
                tol(dt) * 4.0,
            );
        }
    }
    Ok(())
}

fn cross_entropy(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let x = rand(&[2, 3, 7], 450, dt, dev)?.mul_scalar(6.0)?;
        let hx = host(&x);
        let shared = Tensor::from_vec(vec![0i32, 6, 3], &[3], dev)?;
        let per_row = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3], dev)?;
        for (labels, hl) in [
            (&shared, [0, 6, 3, 0, 6, 3]),
            (&per_row, [1, 2, 3, 4, 5, 6]),
        ] {
            let (mut loss, mut grad) = (Vec::new(), Vec::new());
            for (row, &l) in hx.chunks(7).zip(&hl) {
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                loss.push(m + s.ln() - row[l]);
                grad.extend(row.iter().enumerate().map(|(j, v)| {
                    let hot = if j == l { 1.0 } else { 0.0 };
                    ((v - m).exp() / s - hot) * 0.25
                }));
            }
            let (got_loss, got_grad) = x.cross_entropy_rows(labels, 0.25)?;
            assert_close(
                &format!("cross_entropy loss {dt}"),
                &got_loss,
                &[2, 3],
                &loss,
                tol(dt) * 4.0,
            );
            assert_close(
                &format!("cross_entropy grad {dt}"),
                &got_grad,
                &[2, 3, 7],
                &grad,
                tol(dt) * 4.0,
            );
        }
        let bad = Tensor::from_vec(vec![0i32, 7, 1], &[3], dev)?;
        let e = index_error(x.cross_entropy_rows(&bad, 1.0).map(|(loss, _)| loss));
        assert!(e.contains("cross_entropy") && e.contains('7'), "{e}");
        let wrong = Tensor::from_vec(vec![0i32, 1], &[2], dev)?;
        let e = x.cross_entropy_rows(&wrong, 1.0).unwrap_err().to_string();
        assert!(e.contains("[2]") && e.contains("[2, 3, 7]"), "{e}");
        // A single label is not a label per row.
        let scalar = Tensor::from_vec(vec![1i32], &[], dev)?;
        assert!(x.cross_entropy_rows(&scalar, 1.0).is_err());
        assert!(x.cross_entropy_mean(&scalar).is_err());
    }
    Ok(())
}

/// Naive matmul of host values for batch entry `b` with optional transposes and broadcast.
#[allow(clippy::too_many_arguments)]
fn matmul_ref(
    a: &[f64],
    b: &[f64],
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    a_b: bool,
    b_b: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let ao = if a_b { bi * m * k } else { 0 };
        let bo = if b_b { bi * k * n } else { 0 };
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let av = if ta {
                        a[ao + p * m + i]
                    } else {
                        a[ao + i * k + p]
                    };
                    let bv = if tb {
                        b[bo + j * k + p]
                    } else {
                        b[bo + p * n + j]
                    };
                    s += av * bv;
                }
                out[bi * m * n + i * n + j] = s;
            }
        }
    }
    out
}

fn matmul(dev: &Device) -> Result<()> {
    let mut seed = 500;
    for dt in float_dtypes(dev) {
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 4, 5),
            (17, 33, 9),
            (64, 70, 300),
            (256, 128, 784),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                seed += 2;
                let sa = if ta { [k, m] } else { [m, k] };
                let sb = if tb { [n, k] } else { [k, n] };
                let a = rand(&sa, seed, dt, dev)?;
                let b = rand(&sb, seed + 1, dt, dev)?;
                let want = matmul_ref(&host(&a), &host(&b), 1, m, n, k, ta, tb, false, false);
                let got = a.matmul_t(&b, ta, tb)?;
                let t = tol(dt) * (k as f64).sqrt() * 2.0;
                assert_close(
                    &format!("matmul {m}x{n}x{k} t={ta},{tb} {dt}"),
                    &got,
                    &[m, n],
                    &want,
                    t,
                );
                if !ta && !tb {
                    assert_close("matmul()", &a.matmul(&b)?, &[m, n], &want, t);
                }
            }
        }
        // Batched and broadcast-batched forms.
        let (bt, m, n, k) = (3, 5, 6, 7);
        for (ta, tb) in [(false, false), (true, true), (false, true), (true, false)] {
            for (ab, bb) in [(true, true), (false, true), (true, false)] {
                seed += 2;
                let mut sa = if ta { vec![k, m] } else { vec![m, k] };
                let mut sb = if tb { vec![n, k] } else { vec![k, n] };
                if ab {
                    sa.insert(0, bt);
                }
                if bb {
                    sb.insert(0, bt);
                }
                let a = rand(&sa, seed, dt, dev)?;
                let b = rand(&sb, seed + 1, dt, dev)?;
                let want = matmul_ref(&host(&a), &host(&b), bt, m, n, k, ta, tb, ab, bb);
                let got = a.matmul_t(&b, ta, tb)?;
                let what = format!("batched {sa:?}x{sb:?} t={ta},{tb} {dt}");
                assert_close(&what, &got, &[bt, m, n], &want, tol(dt) * 8.0);
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    xs: &[usize],
    ws: &[usize],
    stride: usize,
    pad: usize,
    groups: usize,
) -> (Vec<f64>, Vec<usize>) {
    let (nb, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (o, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let oh = (h + 2 * pad - kh) / stride + 1;
    let ow = (wd + 2 * pad - kw) / stride + 1;
    let og = o / groups;
    let mut out = vec![0.0; nb * o * oh * ow];
    for n in 0..nb {
        for oc in 0..o {
            let g = oc / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut s = b.map_or(0.0, |b| b[oc]);
                    for ci in 0..cg {
                        let ic = g * cg + ci;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky) as isize - pad as isize;
                                let ix = (xx * stride + kx) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                    continue;
                                }
                                s += x[((n * c + ic) * h + iy as usize) * wd + ix as usize]
                                    * w[((oc * cg + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    out[((n * o + oc) * oh + y) * ow + xx] = s;
                }
            }
        }
    }
    let _ = c;
    (out, vec![nb, o, oh, ow])
}

fn conv2d(dev: &Device) -> Result<()> {
    let mut seed = 700;
    type Case<'a> = (&'a [usize], &'a [usize], usize, usize, usize);
    let cases: &[Case] = &[
        (&[2, 3, 8, 8], &[4, 3, 3, 3], 1, 1, 1),
        (&[2, 4, 9, 7], &[6, 2, 3, 2], 2, 0, 2),
        (&[1, 1, 5, 5], &[2, 1, 5, 5], 1, 2, 1),
        (&[3, 4, 6, 6], &[4, 1, 3, 3], 1, 1, 4),
    ];
    for dt in float_dtypes(dev) {
        for &(xs, ws, stride, pad, groups) in cases {
            seed += 3;
            let x = rand(xs, seed, dt, dev)?;
            let w = rand(ws, seed + 1, dt, dev)?;
            let b = rand(&[ws[0]], seed + 2, dt, dev)?;
            let (hx, hw, hb) = (host(&x), host(&w), host(&b));
            let (want, os) = conv_ref(&hx, &hw, Some(&hb), xs, ws, stride, pad, groups);
            let what = format!("conv2d {xs:?} {ws:?} s{stride} p{pad} g{groups} {dt}");
            let t = tol(dt) * 10.0;
            assert_close(
                &what,
                &x.conv2d(&w, Some(&b), stride, pad, groups)?,
                &os,
                &want,
                t,
            );
            let (want_nb, _) = conv_ref(&hx, &hw, None, xs, ws, stride, pad, groups);
            assert_close(
                &what,
                &x.conv2d(&w, None, stride, pad, groups)?,
                &os,
                &want_nb,
                t,
            );
            // Backward against the definition: d<g, conv(x, w)> / dx and / dw, since conv is
            // linear in each: grad_x[i] = <g, conv(e_i, w)>, computed by the adjoint sums.
            let g = rand(&os, seed + 3, dt, dev)?;
            let hg = host(&g);
            let mut gx = vec![0.0; hx.len()];
            let mut gw = vec![0.0; hw.len()];
            let (nb, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
            let (o, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
            let (oh, ow) = (os[2], os[3]);
            let og = o / groups;
            for n in 0..nb {
                for oc in 0..o {
                    let gi = oc / og;
                    for y in 0..oh {
                        for xx in 0..ow {
                            let gv = hg[((n * o + oc) * oh + y) * ow + xx];
                            for ci in 0..cg {
                                let ic = gi * cg + ci;
                                for ky in 0..kh {
                                    for kx in 0..kw {
                                        let iy = (y * stride + ky) as isize - pad as isize;
                                        let ix = (xx * stride + kx) as isize - pad as isize;
                                        if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd
                                        {
                                            continue;
                                        }
                                        let xi =
                                            ((n * c + ic) * h + iy as usize) * wd + ix as usize;
                                        let wi = ((oc * cg + ci) * kh + ky) * kw + kx;
                                        gx[xi] += gv * hw[wi];
                                        gw[wi] += gv * hx[xi];
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let bi = Tensor::conv2d_backward_input(&g, &w, xs, stride, pad, groups)?;
            assert_close(&format!("{what} backward input"), &bi, xs, &gx, t);
            let bw = Tensor::conv2d_backward_weight(&x, &g, ws, stride, pad, groups)?;
            assert_close(&format!("{what} backward weight"), &bw, ws, &gw, t * 4.0);
        }
    }
    Ok(())
}

fn max_pool(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        for &(shape, k, s) in &[
            (&[2usize, 3, 8, 8][..], 2, 2),
            (&[1, 2, 7, 9][..], 3, 2),
            (&[4, 5][..], 2, 1),
        ] {
            let x = rand(shape, 800 + k as u64, dt, dev)?;
            let hx = host(&x);
            let r = shape.len();
            let (h, w) = (shape[r - 2], shape[r - 1]);
            let (oh, ow) = ((h - k) / s + 1, (w - k) / s + 1);
            let planes: usize = shape[..r - 2].iter().product();
            let mut want = Vec::new();
            let mut want_idx = Vec::new();
            for p in 0..planes {
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut best = f64::MIN;
                        let mut bi = 0;
                        for ky in 0..k {
                            for kx in 0..k {
                                let i = (y * s + ky) * w + xx * s + kx;
                                if hx[p * h * w + i] > best {
                                    best = hx[p * h * w + i];
                                    bi = i;
                                }
                            }
                        }
                        want.push(best);
                        want_idx.push(bi as f64);
                    }
                }
            }
            let mut os = shape.to_vec();
            os[r - 2] = oh;
            os[r - 1] = ow;
            let (o, idx) = x.max_pool2d(k, s)?;
            assert_close("max_pool2d", &o, &os, &want, 0.0);
            assert_close("max_pool2d indices", &idx, &os, &want_idx, 0.0);
            let g = rand(&os, 900, dt, dev)?;
            let hg = host(&g);
            let mut gx = vec![0.0; hx.len()];
            for (j, &gv) in hg.iter().enumerate() {
                let p = j / (oh * ow);
                gx[p * h * w + want_idx[j] as usize] += gv;
            }
            let back = Tensor::max_pool2d_backward(&g, &idx, shape, (k, s))?;
            assert_close("max_pool2d_backward", &back, shape, &gx, tol(dt));
        }
    }
    Ok(())
}

fn channel_bias_relu(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let shape = [2usize, 3, 4, 5];
        let x = rand(&shape, 950, dt, dev)?;
        let b = rand(&[3], 951, dt, dev)?;
        let (hx, hb) = (host(&x), host(&b));
        let plane = 4 * 5;
        let want: Vec<f64> = hx
            .iter()
            .enumerate()
            .map(|(i, &v)| (v + hb[(i / plane) % 3]).max(0.0))
            .collect();
        assert_close(
            "channel_bias_relu",
            &x.channel_bias_relu(Some(&b))?,
            &shape,
            &want,
            tol(dt),
        );
        let want: Vec<f64> = hx.iter().map(|&v| v.max(0.0)).collect();
        assert_close(
            "channel_bias_relu without a bias",
            &x.channel_bias_relu(None)?,
            &shape,
            &want,
            0.0,
        );
        let e = x
            .channel_bias_relu(Some(&rand(&[4], 952, dt, dev)?))
            .unwrap_err();
        assert!(e.to_string().contains("channel_bias_relu"), "{e}");
        let e = x
            .reshape(&[6, 4, 5])?
            .channel_bias_relu(Some(&b))
            .unwrap_err();
        assert!(e.to_string().contains("[N, C, H, W]"), "{e}");

        // Its backward: the gradient where the output is positive, and the bias's, each channel's sum of that.
        let y = x.channel_bias_relu(Some(&b))?;
        let g = rand(&shape, 953, dt, dev)?;
        let (hy, hg) = (host(&y), host(&g));
        let (dx, db) = g.relu_backward_channel_bias(&y)?;
        let want: Vec<f64> = hg
            .iter()
            .zip(&hy)
            .map(|(&g, &v)| if v > 0.0 { g } else { 0.0 })
            .collect();
        assert_close("relu_backward_channel_bias", &dx, &shape, &want, 0.0);
        let sums: Vec<f64> = (0..3)
            .map(|c| {
                (0..want.len())
                    .filter(|i| (i / plane) % 3 == c)
                    .map(|i| want[i])
                    .sum()
            })
            .collect();
        assert_close("its bias's gradient", &db, &[3], &sums, tol(dt));
        let e = g
            .relu_backward_channel_bias(&y.reshape(&[6, 4, 5])?)
            .unwrap_err();
        assert!(e.to_string().contains("relu_backward_channel_bias"), "{e}");
    }
    Ok(())
}

fn indexing(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let table = rand(&[6, 4], 1000, dt, dev)?;
        let ht = host(&table);
        let ids = Tensor::from_vec(vec![5i32, 0, 2, 2, 1, 5], &[2, 3], dev)?;
        let sel = table.index_select(&ids, 0)?;
        let want: Vec<f64> = [5, 0, 2, 2, 1, 5]
            .iter()
            .flat_map(|&r| ht[r * 4..r * 4 + 4].to_vec())
            .collect();
        assert_close("index_select dim 0", &sel, &[2, 3, 4], &want, 0.0);
        let cols = Tensor::from_vec(vec![3i32, 1], &[2], dev)?;
        let want: Vec<f64> = (0..6)
            .flat_map(|r| vec![ht[r * 4 + 3], ht[r * 4 + 1]])
            .collect();
        assert_close(
            "index_select dim 1",
            &table.index_select(&cols, 1)?,
            &[6, 2],
            &want,
            0.0,
        );

        let src = rand(&[2, 3, 4], 1001, dt, dev)?;
        let hs = host(&src);
        let mut want = ht.clone();
        for (i, &r) in [5usize, 0, 2, 2, 1, 5].iter().enumerate() {
            for c in 0..4 {
                want[r * 4 + c] += hs[i * 4 + c];
            }
        }
        assert_close(
            "index_add",
            &table.index_add(0, &ids, &src)?,
            &[6, 4],
            &want,
            tol(dt),
        );
        assert_close("index_add leaves self", &table, &[6, 4], &ht, 0.0);
        // One row of the source per bag of three consecutive ids, added in place.
        let flat = Tensor::from_vec(vec![5i32, 0, 2, 2, 1, 5], &[6], dev)?;
        let per_bag = rand(&[2, 4], 1002, dt, dev)?;
        let hb = host(&per_bag);
        let mut want = ht.clone();
        for (i, &r) in [5usize, 0, 2, 2, 1, 5].iter().enumerate() {
            for c in 0..4 {
                want[r * 4 + c] += hb[i / 3 * 4 + c];
            }
        }
        let acc = table.copy()?;
        acc.index_add_(0, &flat, &per_bag)?;
        assert_close("index_add_ by bags", &acc, &[6, 4], &want, tol(dt));
        let e = acc
            .index_add_(0, &flat, &rand(&[4, 4], 1003, dt, dev)?)
            .unwrap_err();
        assert!(e.to_string().contains("index_add_"), "{e}");

        let gi = Tensor::from_vec(vec![0i32, 3, 1, 1, 2, 0], &[6], dev)?;
        let want: Vec<f64> = [0usize, 3, 1, 1, 2, 0]
            .iter()
            .enumerate()
            .map(|(r, &c)| ht[r * 4 + c])
            .collect();
        let g = table.gather_last(&gi)?;
        assert_close("gather_last", &g, &[6], &want, 0.0);
        let mut want2 = ht.clone();
        for (r, &c) in [0usize, 3, 1, 1, 2, 0].iter().enumerate() {
            want2[r * 4 + c] += want[r];
        }
        assert_close(
            "scatter_add_last",
            &table.scatter_add_last(&gi, &g)?,
            &[6, 4],
            &want2,
            tol(dt),
        );

        let oh = Tensor::one_hot(&gi, 4, dt)?;
        let want: Vec<f64> = [0usize, 3, 1, 1, 2, 0]
            .iter()
            .flat_map(|&c| (0..4).map(move |j| if j == c { 1.0 } else { 0.0 }))
            .collect();
        assert_close("one_hot", &oh, &[6, 4], &want, 0.0);

        // Out-of-range indices are errors that name the op, the index and the size.
        let bad = Tensor::from_vec(vec![6i32], &[1], dev)?;
        let e = index_error(table.index_select(&bad, 0));
        assert!(e.contains('6') && e.contains("index_select"), "{e}");
        let neg = Tensor::from_vec(vec![-1i32; 6], &[6], dev)?;
        assert!(index_error(table.gather_last(&neg)).contains("gather_last"));
        assert!(index_error(Tensor::one_hot(&bad, 4, dt)).contains("one_hot"));
        // The device is usable afterwards, and the error is not reported twice.
        assert_eq!(
            host(&table.index_select(&gi, 0)?).len(),
            6 * table.shape()[1]
        );
    }
    Ok(())
}

/// An out-of-range index fails the op on the CPU, and on CUDA the next read-back (see the crate docs): the error
/// either way.
fn index_error(r: Result<Tensor>) -> String {
    match r.and_then(|t| t.to_device(&Device::Cpu)) {
        Ok(t) => panic!(
            "an out-of-range index gave a tensor of shape {:?}",
            t.shape()
        ),
        Err(e) => e.to_string(),
    }
}

fn layout(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let x = rand(&[2, 3, 4], 1100, dt, dev)?;
        let hx = host(&x);
        // transpose of the last two dims
        let want: Vec<f64> = (0..24)
            .map(|i| {
                let idx = unravel(i, &[2, 4, 3]);
                hx[idx[0] * 12 + idx[2] * 4 + idx[1]]
            })
            .collect();
        assert_close("transpose", &x.transpose()?, &[2, 4, 3], &want, 0.0);
        // narrow
        let want: Vec<f64> = (0..2 * 3 * 2)
            .map(|i| {
                let idx = unravel(i, &[2, 3, 2]);
                hx[idx[0] * 12 + idx[1] * 4 + idx[2] + 1]
            })
            .collect();
        assert_close("narrow", &x.narrow(2, 1, 2)?, &[2, 3, 2], &want, 0.0);
        assert_close(
            "narrow dim 0",
            &x.narrow(0, 1, 1)?,
            &[1, 3, 4],
            &hx[12..],
            0.0,
        );
        // cat and stack
        let y = rand(&[2, 1, 4], 1101, dt, dev)?;
        let hy = host(&y);
        let c = Tensor::cat(&[&x, &y], 1)?;
        let want: Vec<f64> = (0..2)
            .flat_map(|b| {
                let mut v = hx[b * 12..b * 12 + 12].to_vec();
                v.extend_from_slice(&hy[b * 4..b * 4 + 4]);
                v
            })
            .collect();
        assert_close("cat", &c, &[2, 4, 4], &want, 0.0);
        let s = Tensor::stack(&[&x, &x], 1)?;
        let want: Vec<f64> = (0..2)
            .flat_map(|b| {
                let mut v = hx[b * 12..b * 12 + 12].to_vec();
                v.extend_from_slice(&hx[b * 12..b * 12 + 12]);
                v
            })
            .collect();
        assert_close("stack", &s, &[2, 2, 3, 4], &want, 0.0);
        // broadcast_to and sum_to
        let b = rand(&[3, 1], 1102, dt, dev)?;
        let hb = host(&b);
        let bt = b.broadcast_to(&[2, 3, 4])?;
        let want: Vec<f64> = (0..24).map(|i| hb[unravel(i, &[2, 3, 4])[1]]).collect();
        assert_close("broadcast_to", &bt, &[2, 3, 4], &want, 0.0);
        let st = x.sum_to(&[3, 1])?;
        let want: Vec<f64> = (0..3)
            .map(|r| {
                (0..2)
                    .flat_map(|bb| (0..4).map(move |c| (bb, c)))
                    .map(|(bb, c)| hx[bb * 12 + r * 4 + c])
                    .sum()
            })
            .collect();
        assert_close("sum_to", &st, &[3, 1], &want, tol(dt) * 8.0);
        let st = x.sum_to(&[4])?;
        let want: Vec<f64> = (0..4)
            .map(|c| (0..6).map(|r| hx[r * 4 + c]).sum())
            .collect();
        assert_close("sum_to bias", &st, &[4], &want, tol(dt) * 8.0);
        // reshape shares storage
        let r = x.reshape(&[6, 4])?;
        assert!(r.same_storage(&x));
        r.zero_()?;
        assert!(host(&x).iter().all(|&v| v == 0.0));
        // dtype round trips
        let i = Tensor::from_vec(vec![1.7f32, -2.2, 3.0], &[3], dev)?.to_dtype(DType::I32)?;
        assert_eq!(i.to_vec::<i32>()?, vec![1, -2, 3]);
        let h = Tensor::from_vec(vec![0.5f32, 1.25, -3.0], &[3], dev)?
            .to_dtype(DType::F16)?
            .to_dtype(DType::F32)?;
        assert_eq!(h.to_vec::<f32>()?, vec![0.5, 1.25, -3.0]);
        let bf = Tensor::from_vec(vec![0.5f32, 1.25, -3.0], &[3], dev)?
            .to_dtype(DType::BF16)?
            .to_dtype(dt)?;
        assert_close("bf16", &bf, &[3], &[0.5, 1.25, -3.0], 0.0);
    }
    Ok(())
}

fn in_place(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let x = rand(&[4, 3], 1200, dt, dev)?;
        let y = rand(&[4, 3], 1201, dt, dev)?;
        let (hx, hy) = (host(&x), host(&y));
        // Accumulating: the sum's bits, over whichever side is not shared, never over a shared one.
        let sum = host(&x.add(&y)?);
        let (a, b) = (x.copy()?, y.copy()?);
        let (seen_a, seen_b) = (a.clone(), b.clone());
        assert_eq!(host(&a.accumulate(b)?), sum, "both shared");
        assert_eq!((host(&seen_a), host(&seen_b)), (hx.clone(), hy.clone()));
        let (a, b) = (x.copy()?, y.copy()?);
        let seen_a = a.clone();
        let out = a.accumulate(b)?;
        assert!(!out.same_storage(&seen_a));
        assert_eq!(host(&out), sum, "over the one alone");
        assert_eq!(host(&seen_a), hx, "the shared one keeps its values");
        let (a, b) = (x.copy()?, y.copy()?);
        assert_eq!(host(&a.accumulate(b)?), sum, "over the left");
        let wide = rand(&[2, 4, 3], 1204, dt, dev)?;
        let e = host(&wide.add(&x)?);
        assert_eq!(host(&wide.accumulate(x.copy()?)?), e, "broadcast");
        let acc = x.copy()?;
        assert!(!acc.same_storage(&x));
        acc.add_assign_(&y)?;
        let want: Vec<f64> = hx.iter().zip(&hy).map(|(a, b)| a + b).collect();
        assert_close("add_assign_", &acc, &[4, 3], &want, tol(dt));
        let bias = rand(&[3], 1202, dt, dev)?;
        let hb = host(&bias);
        acc.add_assign_(&bias)?;
        let want: Vec<f64> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v + hb[i % 3])
            .collect();
        assert_close("add_assign_ broadcast", &acc, &[4, 3], &want, tol(dt));
        acc.add_assign_(&acc.clone())?;
        let want: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
        assert_close("add_assign_ self", &acc, &[4, 3], &want, tol(dt));
        acc.assign_(&x)?;
        assert_close("assign_", &acc, &[4, 3], &hx, 0.0);
        let part = rand(&[4, 1], 1203, dt, dev)?;
        acc.narrow_assign_(1, 2, &part)?;
        let hp = host(&part);
        let want: Vec<f64> = hx
            .iter()
            .enumerate()
            .map(|(i, &v)| if i % 3 == 2 { hp[i / 3] } else { v })
            .collect();
        assert_close("narrow_assign_", &acc, &[4, 3], &want, 0.0);
        acc.zero_()?;
        assert_close("zero_", &acc, &[4, 3], &[0.0; 12], 0.0);
        assert_close("copy untouched", &x, &[4, 3], &hx, 0.0);
        // where_cond with a broadcast mask
        let mask = x.gt_scalar(0.0)?;
        let w = Tensor::where_cond(&mask, &x, &y)?;
        let want: Vec<f64> = hx
            .iter()
            .zip(&hy)
            .map(|(&a, &b)| if a > 0.0 { a } else { b })
            .collect();
        assert_close("where_cond", &w, &[4, 3], &want, 0.0);
        let z = Tensor::zeros(&[1], dt, dev)?;
        let w = Tensor::where_cond(&mask, &x, &z)?;
        let want: Vec<f64> = hx.iter().map(|&a| if a > 0.0 { a } else { 0.0 }).collect();
        assert_close("where_cond broadcast", &w, &[4, 3], &want, 0.0);
    }
    Ok(())
}

fn optimizers(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        let shape = [3usize, 5000]; // 3 members, large enough for the parallel path
        let n = 15_000;
        let lrs = [0.1, 0.01, 0.001];
        for (momentum, dampening, wd, nesterov) in [
            (0.0, 0.0, 0.0, false),
            (0.9, 0.1, 0.01, false),
            (0.9, 0.0, 0.0, true),
        ] {
            let p = rand(&shape, 1300, dt, dev)?;
            let buf = Tensor::zeros(&shape, dt, dev)?;
            let mut hp = host(&p);
            let mut hb = vec![0.0; n];
            for step in 0..3u64 {
                let g = rand(&shape, 1400 + step, dt, dev)?;
                let hg = host(&g);
                let b = if momentum != 0.0 { Some(&buf) } else { None };
                Tensor::sgd_step_(&p, &g, b, &lrs, momentum, dampening, wd, nesterov)?;
                for i in 0..n {
                    let lr = lrs[i / 5000];
                    let mut gi = hg[i] + wd * hp[i];
                    if momentum != 0.0 {
                        hb[i] = momentum * hb[i] + (1.0 - dampening) * gi;
                        gi = if nesterov {
                            gi + momentum * hb[i]
                        } else {
                            hb[i]
                        };
                    }
                    hp[i] -= lr * gi;
                }
            }
            assert_close(
                &format!("sgd m={momentum} nesterov={nesterov} {dt}"),
                &p,
                &shape,
                &hp,
                tol(dt) * 4.0,
            );
        }
        for (wd, decoupled) in [(0.0, false), (0.01, false), (0.01, true)] {
            let p = rand(&shape, 1500, dt, dev)?;
            let m = Tensor::zeros(&shape, dt, dev)?;
            let v = Tensor::zeros(&shape, dt, dev)?;
            let mut hp = host(&p);
            let (mut hm, mut hv) = (vec![0.0; n], vec![0.0; n]);
            let (b1, b2, eps) = (0.9, 0.999, 1e-8);
            for step in 1..=3u64 {
                let g = rand(&shape, 1600 + step, dt, dev)?;
                let hg = host(&g);
                Tensor::adam_step_(&p, &g, &m, &v, &lrs, b1, b2, eps, wd, decoupled, step)?;
                for i in 0..n {
                    let lr = lrs[i / 5000];
                    let mut gi = hg[i];
                    if decoupled {
                        hp[i] *= 1.0 - lr * wd;
                    } else {
                        gi += wd * hp[i];
                    }
                    hm[i] = b1 * hm[i] + (1.0 - b1) * gi;
                    hv[i] = b2 * hv[i] + (1.0 - b2) * gi * gi;
                    let mh = hm[i] / (1.0 - b1.powi(step as i32));
                    let vh = hv[i] / (1.0 - b2.powi(step as i32));
                    hp[i] -= lr * mh / (vh.sqrt() + eps);
                }
            }
            assert_close(
                &format!("adam wd={wd} decoupled={decoupled} {dt}"),
                &p,
                &shape,
                &hp,
                tol(dt) * 10.0,
            );
        }
        // Many parameters at once equal one call per parameter.
        let shapes: [&[usize]; 3] = [&[3, 40], &[3], &[7, 2]];
        let mk = |seed: u64| -> Result<Vec<Tensor>> {
            shapes.iter().map(|s| rand(s, seed, dt, dev)).collect()
        };
        let (pa, pb, g) = (mk(1700)?, mk(1700)?, mk(1701)?);
        let zeros = || -> Result<Vec<Tensor>> {
            shapes.iter().map(|s| Tensor::zeros(s, dt, dev)).collect()
        };
        let (ma, va, mb, vb) = (zeros()?, zeros()?, zeros()?, zeros()?);
        let lrs: [&[f64]; 3] = [&[0.1, 0.2, 0.3], &[0.01], &[0.05]];
        for step in 1..=2 {
            let entries: Vec<_> = (0..3)
                .map(|i| (&pa[i], &g[i], &ma[i], &va[i], lrs[i]))
                .collect();
            Tensor::adam_step_many_(&entries, 0.9, 0.99, 1e-8, 0.01, true, step, None)?;
            for i in 0..3 {
                Tensor::adam_step_(
                    &pb[i], &g[i], &mb[i], &vb[i], lrs[i], 0.9, 0.99, 1e-8, 0.01, true, step,
                )?;
            }
        }
        for i in 0..3 {
            assert_close("adam_step_many_", &pa[i], shapes[i], &host(&pb[i]), tol(dt));
        }
        let dup = [
            (&pa[0], &g[0], &ma[0], &va[0], lrs[0]),
            (&pa[0], &g[1], &ma[1], &va[1], lrs[1]),
        ];
        assert!(Tensor::adam_step_many_(&dup, 0.9, 0.99, 1e-8, 0.0, false, 1, None).is_err());
        // SGD on many parameters at once equals one call per parameter.
        let bufs_a = zeros()?;
        let bufs_b = zeros()?;
        for _ in 0..2 {
            let entries: Vec<_> = (0..3)
                .map(|i| (&pa[i], &g[i], Some(&bufs_a[i]), lrs[i]))
                .collect();
            Tensor::sgd_step_many_(&entries, 0.9, 0.0, 0.01, true, None)?;
            for i in 0..3 {
                Tensor::sgd_step_(
                    &pb[i],
                    &g[i],
                    Some(&bufs_b[i]),
                    lrs[i],
                    0.9,
                    0.0,
                    0.01,
                    true,
                )?;
            }
        }
        for i in 0..3 {
            assert_close("sgd_step_many_", &pa[i], shapes[i], &host(&pb[i]), tol(dt));
        }
        let no_buf = [(&pa[0], &g[0], None, lrs[0])];
        assert!(Tensor::sgd_step_many_(&no_buf, 0.9, 0.0, 0.0, false, None).is_err());
        // A single rate applies to all members.
        let p = Tensor::ones(&[2, 2], dt, dev)?;
        let g = Tensor::ones(&[2, 2], dt, dev)?;
        Tensor::sgd_step_(&p, &g, None, &[0.5], 0.0, 0.0, 0.0, false)?;
        assert_close("sgd one lr", &p, &[2, 2], &[0.5; 4], 0.0);
        assert!(Tensor::sgd_step_(&p, &g, None, &[0.1, 0.2, 0.3], 0.0, 0.0, 0.0, false).is_err());
        assert!(Tensor::sgd_step_(&p, &g, None, &[0.1], 0.9, 0.0, 0.0, false).is_err());
        assert!(
            Tensor::adam_step_(&p, &g, &g, &p, &[0.1], 0.9, 0.999, 1e-8, 0.0, false, 1).is_err()
        );
    }
    Ok(())
}

fn creation(dev: &Device) -> Result<()> {
    for dt in float_dtypes(dev) {
        assert_close(
            "zeros",
            &Tensor::zeros(&[2, 3], dt, dev)?,
            &[2, 3],
            &[0.0; 6],
            0.0,
        );
        assert_close("ones", &Tensor::ones(&[3], dt, dev)?, &[3], &[1.0; 3], 0.0);
        assert_close(
            "full",
            &Tensor::full(&[2], 2.5, dt, dev)?,
            &[2],
            &[2.5; 2],
            0.0,
        );
        assert_close("scalar", &Tensor::scalar(-4.0, dt, dev)?, &[], &[-4.0], 0.0);
        assert_close(
            "arange",
            &Tensor::arange(4, dt, dev)?,
            &[4],
            &[0.0, 1.0, 2.0, 3.0],
            0.0,
        );
        let u = Tensor::rand_uniform(&[100_000], 2.0, 4.0, dt, 7, dev)?;
        let hu = host(&u);
        assert!(hu.iter().all(|&v| (2.0..4.0).contains(&v)));
        let mean = hu.iter().sum::<f64>() / hu.len() as f64;
        assert!((mean - 3.0).abs() < 0.01, "uniform mean {mean}");
        let z = Tensor::rand_normal(&[100_001], 1.0, 2.0, dt, 8, dev)?;
        let hz = host(&z);
        let mean = hz.iter().sum::<f64>() / hz.len() as f64;
        let var = hz.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / hz.len() as f64;
        assert!(
            (mean - 1.0).abs() < 0.03 && (var.sqrt() - 2.0).abs() < 0.03,
            "normal {mean} {var}"
        );
        // Same seed, same values; another seed, other values.
        assert_eq!(
            host(&Tensor::rand_normal(&[10], 0.0, 1.0, dt, 8, dev)?),
            host(&Tensor::rand_normal(&[10], 0.0, 1.0, dt, 8, dev)?)
        );
        assert_ne!(
            host(&Tensor::rand_normal(&[10], 0.0, 1.0, dt, 8, dev)?),
            host(&Tensor::rand_normal(&[10], 0.0, 1.0, dt, 9, dev)?)
        );
    }
    let t = Tensor::from_vec(vec![1u8, 2, 3], &[3], dev)?;
    assert_eq!(t.to_vec::<u8>()?, vec![1, 2, 3]);
    assert_eq!(
        Tensor::scalar(3.0, DType::F32, dev)?.to_scalar::<f32>()?,
        3.0
    );
    Ok(())
}

fn reads_later(dev: &Device) -> Result<()> {
    let x = rand(&[5, 7], 71, DType::F32, dev)?;
    let pending = x.read_later()?;
    let y = Tensor::from_vec(vec![3i32, -1, 4], &[3], dev)?;
    let labels = y.read_later()?;
    assert_eq!(pending.wait::<f32>()?, x.to_vec::<f32>()?);
    assert_eq!(labels.wait::<i32>()?, vec![3, -1, 4]);
    let e = x.read_later()?.wait::<i32>().unwrap_err();
    assert!(e.to_string().contains("read_later"), "{e}");
    Ok(())
}

/// Loss scaling's device-side ops: gradients divided by the scale, an overflow flag the fused optimizer
/// steps read and skip on, and GradScaler's update of the scale.
fn loss_scaling(dev: &Device) -> Result<()> {
    let f = DType::F32;
    let at = |scale: f32| {
        let s = LossScaleState {
            scale,
            ..LossScaleState::default()
        };
        Tensor::loss_scale_state(s, dev)
    };
    let state = at(8.0)?;
    let shapes: [&[usize]; 2] = [&[3, 40], &[7]];
    let g: Vec<Tensor> = (0..2)
        .map(|i| rand(shapes[i], 1800 + i as u64, f, dev))
        .collect::<Result<_>>()?;
    let want: Vec<Vec<f64>> = g
        .iter()
        .map(|g| host(g).iter().map(|v| v / 8.0).collect())
        .collect();
    Tensor::unscale_grads_(&[&g[0], &g[1]], &state)?;
    for i in 0..2 {
        assert_close("unscale_grads_", &g[i], shapes[i], &want[i], 0.0);
    }
    Tensor::update_loss_scale_(&state, 3, 1.0, 1e9)?;
    assert_eq!(
        state.to_vec::<f32>()?,
        [0.0, 8.0, 1.0, 0.0],
        "a clean step counts"
    );
    // A gradient that is not finite raises the flag, and the steps that read it change nothing.
    let bad = Tensor::from_vec(
        vec![1.0f32, f32::INFINITY, 2.0, 3.0, f32::NAN, 0.0, 1.0],
        &[7],
        dev,
    )?;
    Tensor::unscale_grads_(&[&g[0], &bad], &state)?;
    assert_eq!(
        state.to_vec::<f32>()?[0],
        1.0,
        "an overflow raises the flag"
    );
    let p = rand(shapes[0], 1810, f, dev)?;
    let (m, v, b) = (
        rand(shapes[0], 1811, f, dev)?,
        rand_pos(shapes[0], 1812, f, dev)?,
        rand(shapes[0], 1813, f, dev)?,
    );
    let before: Vec<Vec<f64>> = [&p, &m, &v, &b].iter().map(|t| host(t)).collect();
    Tensor::adam_step_many_(
        &[(&p, &g[0], &m, &v, &[0.1])],
        0.9,
        0.99,
        1e-8,
        0.0,
        false,
        1,
        Some(&state),
    )?;
    Tensor::sgd_step_many_(
        &[(&p, &g[0], Some(&b), &[0.1])],
        0.9,
        0.0,
        0.0,
        false,
        Some(&state),
    )?;
    for (t, was) in [&p, &m, &v, &b].iter().zip(&before) {
        assert_eq!(&host(t), was, "a step under a raised flag changed a tensor");
    }
    Tensor::update_loss_scale_(&state, 3, 1.0, 1e9)?;
    assert_eq!(
        state.to_vec::<f32>()?,
        [0.0, 4.0, 0.0, 1.0],
        "an overflow halves the scale"
    );
    // With the flag down the same steps update.
    Tensor::adam_step_many_(
        &[(&p, &g[0], &m, &v, &[0.1])],
        0.9,
        0.99,
        1e-8,
        0.0,
        false,
        1,
        Some(&state),
    )?;
    assert_ne!(
        host(&p),
        before[0],
        "a step under a clear flag changed nothing"
    );
    // `interval` clean steps in a row double the scale, within its bounds.
    for _ in 0..3 {
        Tensor::update_loss_scale_(&state, 3, 1.0, 6.0)?;
    }
    assert_eq!(
        state.to_vec::<f32>()?,
        [0.0, 6.0, 0.0, 1.0],
        "the scale doubles, capped"
    );
    let low = at(1.0)?;
    Tensor::unscale_grads_(&[&bad], &low)?;
    Tensor::update_loss_scale_(&low, 3, 1.0, 6.0)?;
    assert_eq!(low.to_vec::<f32>()?[1], 1.0, "the scale stays at its floor");
    // Anything but a loss scale state is refused, naming what it should be.
    let e = Tensor::unscale_grads_(&[&g[0]], &Tensor::zeros(&[3], f, dev)?).unwrap_err();
    assert!(e.to_string().contains("loss scale state"), "{e}");
    let e = Tensor::adam_step_many_(
        &[(&p, &g[0], &m, &v, &[0.1])],
        0.9,
        0.99,
        1e-8,
        0.0,
        false,
        1,
        Some(&m),
    )
    .unwrap_err();
    assert!(e.to_string().contains("loss scale state"), "{e}");
    Ok(())
}

device_tests!(
    loss_scaling,
    reads_later,
    binary,
    unary,
    reductions,
    softmax,
    cross_entropy,
    matmul,
    conv2d,
    max_pool,
    channel_bias_relu,
    indexing,
    layout,
    in_place,
    optimizers,
    creation
);
