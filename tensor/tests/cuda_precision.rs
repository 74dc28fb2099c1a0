//! Products under every precision policy on CUDA against the CPU's fp32: each within its stated tolerance, each
//! visibly in its own arithmetic (TF32 and 16-bit operands round more than fp32 does), every result f32; a Linear
//! layer and a small conv net trained a step through autograd in each policy; the CPU untouched by any policy.
//! Run on a GPU: `cargo test -p cohort-tensor --features cuda -- --include-ignored`.

use cohort_tensor::{DType, Device, Precision, Result, Tensor};

const GPU: Device = Device::Cuda(0);

/// The largest error of `got` against `want`, relative to `want`'s largest magnitude.
fn rel_err(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.shape(), want.shape());
    assert_eq!(
        got.dtype(),
        DType::F32,
        "a product under a policy returns f32"
    );
    let g = got
        .to_device(&Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let w = want.to_vec::<f32>().unwrap();
    let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs() / scale)
        .fold(0f32, f32::max)
}

/// The most a policy's products may lose against fp32, relative to the result's scale, over sums of up to a
/// few thousand terms of random sign; and the least they do lose on such sums (fp32 on the GPU stays below 1e-5):
/// TF32 and f16 keep 10 mantissa bits, bf16 7.
fn bounds(p: Precision) -> (f32, f32) {
    match p {
        Precision::Fp32 => (0.0, 2e-5),
        Precision::Tf32 | Precision::F16 => (2e-5, 4e-3),
        Precision::Bf16 => (1e-4, 3e-2),
    }
}

fn rand(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, DType::F32, seed, dev).unwrap()
}

/// `f` on the CPU in fp32 and on CUDA under every policy: each output within the policy's bounds. `tf32_shows`:
/// whether TF32 must show in the error (cuBLAS's TF32 compute type always takes tensor cores; cuDNN's
/// `CUDNN_DEFAULT_MATH` only allows them, and the timing may pick an fp32 algorithm).
fn check(what: &str, tf32_shows: bool, f: impl Fn(&Device) -> Result<Vec<Tensor>>) {
    check_as(what, tf32_shows, |p| p, f);
}

/// [`check`] with `effective` naming the arithmetic a policy's products really run in.
fn check_as(
    what: &str,
    tf32_shows: bool,
    effective: impl Fn(Precision) -> Precision,
    f: impl Fn(&Device) -> Result<Vec<Tensor>>,
) {
    let want = f(&Device::Cpu).unwrap();
    for p in Precision::ALL {
        let got = {
            let _p = p.enter();
            f(&GPU).unwrap_or_else(|e| panic!("{what} under {p}: {e}"))
        };
        let (mut least, most) = bounds(effective(p));
        if p == Precision::Tf32 && !tf32_shows {
            least = 0.0;
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = rel_err(g, w);
            assert!(
                e <= most,
                "{what} under {p}, output {i}: error {e:.2e} over {most:.0e}"
            );
            assert!(
                e >= least,
                "{what} under {p}, output {i}: error {e:.2e} is fp32's: the policy did not take effect"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn matrix_products_keep_to_each_policys_tolerance() {
    check("matmul", true, |dev| {
        let a = rand(&[192, 2048], 1, dev);
        let b = rand(&[2048, 160], 2, dev);
        let batched = rand(&[3, 64, 1024], 3, dev);
        let per = rand(&[3, 96, 1024], 4, dev);
        Ok(vec![
            a.matmul(&b)?,
            a.matmul_t(&rand(&[160, 2048], 5, dev), false, true)?,
            batched.matmul_t(&per, false, true)?,
            a.matmul_t(&rand(&[192, 96], 6, dev), true, false)?,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_linear_layer_and_its_gradients_keep_to_each_policys_tolerance() {
    check("linear", true, |dev| {
        let x = rand(&[256, 1024], 7, dev);
        let w = rand(&[1024, 384], 8, dev);
        let bias = rand(&[384], 9, dev);
        let g = rand(&[1, 256, 384], 10, dev);
        let y = x.linear(&w, &bias, false)?;
        let ((gw, gb), gx) =
            x.linear_grads_beside(&g, || g.reshape(&[256, 384])?.matmul_t(&w, false, true))?;
        // The bias's sums are plain f32 under every policy; only the products are compared.
        let _ = gb;
        Ok(vec![y, gw.reshape(&[1024, 384])?, gx])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn convolutions_keep_to_each_policys_tolerance() {
    // 3x3 from 64 channels over 32x32 images: 576 terms per output, 864 per input gradient, 8192 per weight's.
    // Without cuDNN the 16-bit convolutions run in f32 on the own kernels: fp32's bounds then.
    let dnn = cohort_tensor::cuda::cudnn_version(0).unwrap().is_some();
    let effective = |p: Precision| {
        if dnn || p.low().is_none() {
            p
        } else {
            Precision::Fp32
        }
    };
    check_as("conv2d", false, effective, |dev| {
        let x = rand(&[8, 64, 32, 32], 11, dev);
        let w = rand(&[96, 64, 3, 3], 12, dev).mul_scalar(0.1)?;
        let bias = rand(&[96], 13, dev);
        let y = x.conv2d(&w, Some(&bias), 1, 1, 1)?;
        // The ReLU in the epilogue of a 16-bit pass (the cast, bias and ReLU in one kernel), and without a bias.
        let rectified = x.conv2d_relu(&w, Some(&bias), 1, 1, 1)?;
        let plain = x.conv2d_relu(&w, None, 1, 1, 1)?;
        let gy = rand(y.shape(), 14, dev);
        let gx = Tensor::conv2d_backward_input(&gy, &w, x.shape(), 1, 1, 1)?;
        let gw = Tensor::conv2d_backward_weight(&x, &gy, w.shape(), 1, 1, 1)?;
        Ok(vec![y, rectified, plain, gx, gw])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_bit_operands_are_accepted_as_they_are() {
    // What autograd keeps for a backward pass: a bf16 weight beside an f32 gradient.
    let a = rand(&[128, 512], 15, &GPU);
    let w = rand(&[512, 64], 16, &GPU);
    let want = a
        .to_device(&Device::Cpu)
        .unwrap()
        .matmul(&w.to_device(&Device::Cpu).unwrap())
        .unwrap();
    let _p = Precision::Bf16.enter();
    let w16 = w.to_dtype(DType::BF16).unwrap();
    let y = a.matmul(&w16).unwrap();
    assert!(rel_err(&y, &want) <= bounds(Precision::Bf16).1);
    // Without a mixed policy the types must agree, as before.
    drop(_p);
    assert!(a.matmul(&w16).is_err());
}

/// `got` (on CUDA, in `dtype`) against `want` (the CPU's f32), relative to `want`'s largest magnitude.
fn off_in(dtype: DType, got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dtype(), dtype, "kept in its type");
    rel_err(&got.to_dtype(DType::F32).unwrap(), want)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_bit_activations_stay_in_their_type_through_a_conv_nets_ops() {
    // What a mixed policy's model runs on activations it keeps in the low type, against the CPU's f32 on the
    // same (rounded) values: the outputs differ by their own rounding (2^-8 for bf16, 2^-11 for f16), the
    // convolutions also by their products'.
    let cpu = Device::Cpu;
    for (p, low, tol) in [
        (Precision::Bf16, DType::BF16, 1e-2),
        (Precision::F16, DType::F16, 2e-3),
    ] {
        let round = |t: Tensor| t.to_dtype(low).unwrap();
        let host = |t: &Tensor| t.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap();
        let x = round(rand(&[8, 16, 12, 12], 20, &GPU));
        let w = rand(&[24, 16, 3, 3], 21, &GPU).mul_scalar(0.2).unwrap();
        let bias = rand(&[24], 22, &GPU);
        let (xc, wc, bc) = (host(&x), host(&w), host(&bias));
        let _p = p.enter();
        let what = |op: &str| format!("{op} under {p}");

        let y = x.conv2d_relu(&w, Some(&bias), 1, 1, 1).unwrap();
        let want = {
            let _fp32 = Precision::Fp32.enter();
            xc.conv2d_relu(&wc, Some(&bc), 1, 1, 1).unwrap()
        };
        let e = off_in(low, &y, &want);
        assert!(e <= bounds(p).1, "{}: {e:.2e}", what("conv2d_relu"));
        let yc = host(&y);

        let gy = round(rand(y.shape(), 23, &GPU));
        let gyc = host(&gy);
        let gx = Tensor::conv2d_backward_input(&gy, &w, x.shape(), 1, 1, 1).unwrap();
        let want = {
            let _fp32 = Precision::Fp32.enter();
            Tensor::conv2d_backward_input(&gyc, &wc, x.shape(), 1, 1, 1).unwrap()
        };
        let e = off_in(low, &gx, &want);
        assert!(
            e <= bounds(p).1,
            "{}: {e:.2e}",
            what("conv2d_backward_input")
        );
        let gb = Tensor::conv2d_backward_bias(&gy).unwrap();
        let e = rel_err(&gb, &Tensor::conv2d_backward_bias(&gyc).unwrap());
        assert!(
            e <= 1e-5,
            "{}: {e:.2e} (sums in f32)",
            what("conv2d_backward_bias")
        );

        let e = off_in(
            low,
            &y.relu_backward(&y).unwrap(),
            &yc.relu_backward(&yc).unwrap(),
        );
        assert!(e == 0.0, "{}: {e:.2e}", what("relu_backward"));
        let (gr, gb) = gy.relu_backward_channel_bias(&y).unwrap();
        let (grc, gbc) = gyc.relu_backward_channel_bias(&yc).unwrap();
        let e = off_in(low, &gr, &grc);
        assert!(e == 0.0, "{}: {e:.2e}", what("relu_backward_channel_bias"));
        let e = rel_err(&gb, &gbc);
        assert!(
            e <= 1e-5,
            "{}: {e:.2e} (bias sums in f32)",
            what("relu_backward_channel_bias")
        );
        let e = off_in(low, &gy.relu().unwrap(), &gyc.relu().unwrap());
        assert!(e == 0.0, "{}: {e:.2e}", what("relu"));
        let e = off_in(low, &y.add(&gy).unwrap(), &yc.add(&gyc).unwrap());
        assert!(e <= tol, "{}: {e:.2e}", what("add"));
        let e = off_in(
            low,
            &y.channel_bias_relu(Some(&bias)).unwrap(),
            &yc.channel_bias_relu(Some(&bc)).unwrap(),
        );
        assert!(e <= tol, "{}: {e:.2e}", what("channel_bias_relu"));
        let (fused, _) = y.max_pool2d_bias_relu(2, 2, &bias).unwrap();
        let (pooled, _) = y.max_pool2d(2, 2).unwrap();
        let apart = pooled.channel_bias_relu(Some(&bias)).unwrap();
        let e = off_in(low, &fused, &host(&apart));
        assert!(e == 0.0, "{}: {e:.2e}", what("max_pool2d_bias_relu"));

        // Windows that tile the planes (a thread per window), apart with gaps (gathered in the type) and overlapping
        // (summed in f32).
        for (k, s) in [(2, 2), (3, 3), (2, 3), (3, 2)] {
            let (o, idx) = y.max_pool2d(k, s).unwrap();
            let (oc, _) = yc.max_pool2d(k, s).unwrap();
            assert_eq!(off_in(low, &o, &oc), 0.0, "{} {k}/{s}", what("max_pool2d"));
            let go = round(rand(o.shape(), 24, &GPU));
            let back = Tensor::max_pool2d_backward(&go, &idx, y.shape(), (k, s)).unwrap();
            let idx_c = idx.to_device(&cpu).unwrap();
            let want = Tensor::max_pool2d_backward(&host(&go), &idx_c, y.shape(), (k, s)).unwrap();
            let e = off_in(low, &back, &want);
            assert!(e <= tol, "{} {k}/{s}: {e:.2e}", what("max_pool2d_backward"));
        }

        // Batch norm over [B, M, 1, C, H*W] with f32 parameters, statistics and their gradients.
        let five = [8, 2, 1, 12, 144];
        let (gamma, beta) = (rand(&[2, 12], 25, &GPU), rand(&[2, 12], 26, &GPU));
        let (gc, bc) = (host(&gamma), host(&beta));
        let (xb, xbc) = (y.reshape(&five).unwrap(), yc.reshape(&five).unwrap());
        let (out, mean, invstd) = xb.batch_norm((&gamma, &beta), None, 1e-5, true).unwrap();
        let (out_c, mean_c, invstd_c) = xbc.batch_norm((&gc, &bc), None, 1e-5, true).unwrap();
        assert!(off_in(low, &out, &out_c) <= tol, "{}", what("batch_norm"));
        assert!(
            rel_err(&mean, &mean_c) <= 1e-5,
            "{}: mean",
            what("batch_norm")
        );
        assert!(
            rel_err(&invstd, &invstd_c) <= 1e-4,
            "{}: invstd",
            what("batch_norm")
        );
        let dout = round(rand(&five, 27, &GPU));
        let (dx, dg, db) = xb
            .batch_norm_backward(Some(&out), &dout, (&mean, &invstd, &gamma))
            .unwrap();
        let (dx_c, dg_c, db_c) = xbc
            .batch_norm_backward(Some(&host(&out)), &host(&dout), (&mean_c, &invstd_c, &gc))
            .unwrap();
        assert!(
            off_in(low, &dx, &dx_c) <= 2.0 * tol,
            "{}: dx",
            what("batch_norm_backward")
        );
        assert!(
            rel_err(&dg, &dg_c) <= 1e-3,
            "{}: dgamma",
            what("batch_norm_backward")
        );
        assert!(
            rel_err(&db, &db_c) <= 1e-4,
            "{}: dbeta",
            what("batch_norm_backward")
        );

        // An f32 input still gives f32, as autocast's products return to their caller.
        let y32 = host(&x)
            .to_device(&GPU)
            .unwrap()
            .conv2d(&w, None, 1, 1, 1)
            .unwrap();
        assert_eq!(y32.dtype(), DType::F32);
    }
}

#[test]
fn the_cpu_computes_in_fp32_under_every_policy() {
    let a = rand(&[64, 300], 17, &Device::Cpu);
    let b = rand(&[300, 40], 18, &Device::Cpu);
    let plain = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    for p in Precision::ALL {
        let _p = p.enter();
        let y = a.matmul(&b).unwrap();
        assert_eq!(y.dtype(), DType::F32);
        assert_eq!(
            y.to_vec::<f32>().unwrap(),
            plain,
            "{p} changed a CPU product"
        );
    }
}
