//! Whole op sequences (an MLP step, fused members, a conv net, layout ops, casts) run on CUDA and on
//! the CPU from the same seeded inputs must agree; GPU storage is charged to the current tenant
//! and given back on drop; bad input is an error, not a crash.
//! Run on a GPU: `cargo test -p cohort-tensor --features cuda -- --include-ignored`.

use cohort_tensor::{DType, Device, Result, Tensor, memory};

const GPU: Device = Device::Cuda(0);

/// Runs `f` on the CPU and on CUDA and compares every returned tensor (as f32) within `tol`
/// relative error.
fn agree(what: &str, tol: f32, f: impl Fn(&Device) -> Result<Vec<Tensor>>) {
    let cpu = f(&Device::Cpu).unwrap_or_else(|e| panic!("{what} on the CPU: {e}"));
    let gpu = f(&GPU).unwrap_or_else(|e| panic!("{what} on CUDA: {e}"));
    assert_eq!(cpu.len(), gpu.len());
    for (i, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
        assert_eq!(c.shape(), g.shape(), "{what}: output {i} shape");
        assert_eq!(g.device(), GPU, "{what}: output {i} left the GPU");
        let c = c
            .to_dtype(DType::F32)
            .and_then(|t| t.to_vec::<f32>())
            .expect("cpu read");
        let g = g
            .to_device(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec::<f32>())
            .unwrap_or_else(|e| panic!("{what}: reading output {i} back: {e}"));
        for (j, (&a, &b)) in g.iter().zip(&c).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()),
                "{what}: output {i} element {j}: cuda {a}, cpu {b}"
            );
        }
    }
}

fn rand(shape: &[usize], seed: u64, dev: &Device) -> Result<Tensor> {
    Tensor::rand_uniform(shape, -1.0, 1.0, DType::F32, seed, dev)
}

fn labels(n: usize, classes: usize, dev: &Device) -> Result<Tensor> {
    let v: Vec<i32> = (0..n).map(|i| ((i * 7 + 3) % classes) as i32).collect();
    Tensor::from_vec(v, &[n], dev)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mlp_training_step_agrees() {
    agree("mlp step", 2e-4, |dev| {
        let (b, k, h, c) = (256, 784, 128, 10);
        let x = Tensor::rand_uniform(&[b, k], 0.0, 1.0, DType::F32, 1, dev)?;
        let y = labels(b, c, dev)?;
        let w1 = rand(&[k, h], 2, dev)?.mul_scalar(0.05)?;
        let b1 = Tensor::zeros(&[h], DType::F32, dev)?;
        let w2 = rand(&[h, c], 3, dev)?.mul_scalar(0.1)?;
        let pre = x.matmul(&w1)?.add(&b1)?;
        let hid = pre.relu()?;
        let logits = hid.matmul(&w2)?;
        let lsm = logits.log_softmax_last()?;
        let loss = lsm.gather_last(&y)?.mean_all()?.neg()?;
        let acc = logits.argmax(1)?.eq(&y)?.to_dtype(DType::F32)?.mean_all()?;
        // backward by hand
        let onehot = Tensor::one_hot(&y, c, DType::F32)?;
        let dlogits = logits
            .softmax_last()?
            .sub(&onehot)?
            .mul_scalar(1.0 / b as f64)?;
        let dw2 = hid.matmul_t(&dlogits, true, false)?;
        let dhid = dlogits.matmul_t(&w2, false, true)?;
        let zero = Tensor::zeros_like(&dhid)?;
        let dpre = Tensor::where_cond(&pre.gt_scalar(0.0)?, &dhid, &zero)?;
        let db1 = dpre.sum(0, false)?;
        let db1_to = dpre.sum_to(&[h])?;
        let dw1 = x.matmul_t(&dpre, true, false)?;
        // Adam on w1, SGD with momentum on w2
        let (m, v) = (Tensor::zeros_like(&w1)?, Tensor::zeros_like(&w1)?);
        Tensor::adam_step_(&w1, &dw1, &m, &v, &[1e-3], 0.9, 0.999, 1e-8, 0.01, true, 1)?;
        let buf = Tensor::zeros_like(&w2)?;
        Tensor::sgd_step_(&w2, &dw2, Some(&buf), &[0.1], 0.9, 0.0, 1e-4, false)?;
        Ok(vec![
            loss, acc, logits, dw2, dhid, db1, db1_to, dw1, w1, m, v, w2, buf,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_members_agree() {
    agree("fused members", 1e-4, |dev| {
        let (m, b, k, n) = (8, 32, 64, 16);
        let x_shared = rand(&[b, k], 10, dev)?;
        let x = rand(&[m, b, k], 11, dev)?;
        let w = rand(&[m, k, n], 12, dev)?;
        let w_t = rand(&[m, n, k], 13, dev)?;
        let bias = rand(&[m, 1, n], 14, dev)?;
        let per_member = x.matmul(&w)?.add(&bias)?;
        let shared = x_shared.matmul(&w)?;
        let shared_t = x_shared.matmul_t(&w_t, false, true)?;
        let one_weight = x.matmul(&rand(&[k, n], 15, dev)?)?;
        let grad_w = x.matmul_t(&per_member, true, false)?;
        let lrs: Vec<f64> = (0..m).map(|i| 0.01 * (i + 1) as f64).collect();
        let buf = Tensor::zeros_like(&w)?;
        Tensor::sgd_step_(&w, &grad_w, Some(&buf), &lrs, 0.9, 0.1, 0.0, true)?;
        let (mm, vv) = (Tensor::zeros_like(&w_t)?, Tensor::zeros_like(&w_t)?);
        let g_t = rand(&[m, n, k], 16, dev)?;
        Tensor::adam_step_(&w_t, &g_t, &mm, &vv, &lrs, 0.9, 0.99, 1e-8, 0.01, false, 5)?;
        Ok(vec![
            per_member, shared, shared_t, one_weight, grad_w, w, buf, w_t, mm, vv,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn linear_with_its_bias_and_relu_in_one_call_agrees() {
    agree("linear", 1e-4, |dev| {
        let mut outs = Vec::new();
        for relu in [false, true] {
            // Shared input, a bias per member (128 columns: 16-byte aligned, the epilogue runs).
            let x = rand(&[64, 96], 30, dev)?;
            let w = rand(&[3, 96, 128], 31, dev)?;
            outs.push(x.linear(&w, &rand(&[3, 1, 128], 32, dev)?, relu)?);
            // One member, and members each with their own input and one shared bias.
            outs.push(x.linear(
                &rand(&[1, 96, 128], 33, dev)?,
                &rand(&[1, 1, 128], 34, dev)?,
                relu,
            )?);
            outs.push(rand(&[3, 64, 96], 35, dev)?.linear(&w, &rand(&[128], 36, dev)?, relu)?);
            // Members with their own input and bias sharing one weight (one merged product).
            let shared_w = rand(&[96, 128], 39, dev)?;
            let x3 = rand(&[3, 64, 96], 40, dev)?;
            outs.push(x3.linear(&shared_w, &rand(&[3, 1, 128], 41, dev)?, relu)?);
            // Ten columns per member: biases 40 bytes apart, the product and bias then run apart.
            let w10 = rand(&[3, 96, 10], 37, dev)?;
            outs.push(x.linear(&w10, &rand(&[3, 1, 10], 38, dev)?, relu)?);
        }
        Ok(outs)
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn linear_weight_and_bias_gradients_beside_the_input_gradient_agree() {
    agree("linear grads", 1e-4, |dev| {
        let g = rand(&[3, 64, 128], 40, dev)?;
        let w = rand(&[3, 96, 128], 45, dev)?;
        // Each alongside the input's gradient, as a Linear layer's backward runs them.
        let input_grad = || g.matmul_t(&w, false, true);
        let ((gw, gb), gx) = rand(&[64, 96], 41, dev)?.linear_grads_beside(&g, input_grad)?;
        let g1 = rand(&[1, 64, 16], 43, dev)?;
        let w1 = rand(&[1, 96, 16], 46, dev)?;
        let ((gw1, gb1), gx1) =
            rand(&[64, 96], 42, dev)?.linear_grads_beside(&g1, || g1.matmul_t(&w1, false, true))?;
        let ((gwm, gbm), gxm) = rand(&[3, 64, 96], 44, dev)?.linear_grads_beside(&g, input_grad)?;
        // Large enough (2^27 multiply-adds) to run on the side stream outside a capture too.
        let gl = rand(&[2, 512, 256], 47, dev)?;
        let wl = rand(&[2, 512, 256], 48, dev)?;
        let ((gwl, gbl), gxl) = rand(&[2, 512, 512], 49, dev)?
            .mul_scalar(0.1)?
            .linear_grads_beside(&gl, || gl.matmul_t(&wl, false, true))?;
        Ok(vec![
            gw, gb, gx, gw1, gb1, gx1, gwm, gbm, gxm, gwl, gbl, gxl,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_cross_entropy_agrees_on_narrow_and_wide_rows() {
    agree("cross entropy", 1e-5, |dev| {
        let mut outs = Vec::new();
        // 10 classes run a thread per row, 300 a warp per row; labels shared or per member.
        for classes in [10, 300] {
            let logits = rand(&[3, 40, classes], 50, dev)?.mul_scalar(4.0)?;
            let (loss, grad) = logits.cross_entropy_rows(&labels(40, classes, dev)?, 0.025)?;
            let own = labels(120, classes, dev)?.reshape(&[3, 40])?;
            let (loss_own, grad_own) = logits.cross_entropy_rows(&own, 1.0)?;
            // ... and averaged per member (one kernel for the narrow head).
            let (mean, grad_mean) = logits.cross_entropy_mean(&own)?;
            outs.extend([loss, grad, loss_own, grad_own, mean, grad_mean]);
        }
        Ok(outs)
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_relu_backward_with_bias_gradient_agrees() {
    // Rows that are not a multiple of the kernel's 32, columns that are not either.
    agree("relu backward with bias", 1e-5, |dev| {
        let (m, b, n) = (3, 45, 70);
        let y = rand(&[m, b, n], 20, dev)?.bias_relu(&rand(&[m, 1, n], 21, dev)?)?;
        let shifted = rand(&[m, b, n], 27, dev)?.bias_add(&rand(&[n], 28, dev)?)?;
        let shifted4 = rand(&[160, 20, 256], 29, dev)?.bias_add(&rand(&[160, 1, 256], 30, dev)?)?;
        let dy = rand(&[m, b, n], 22, dev)?;
        let (dx, db) = dy.relu_backward_bias(&y, &[m, 1, n])?;
        let (dx4, db4) = dy
            .reshape(&[m, 5, 9, n])?
            .relu_backward_bias(&y.reshape(&[m, 5, 9, n])?, &[m, 1, 1, n])?;
        // Enough groups for the kernel that takes four columns at a time.
        let (m, b, n) = (160, 20, 256);
        let y = rand(&[m, b, n], 23, dev)?.relu()?;
        let (dxw, dbw) = rand(&[m, b, n], 24, dev)?.relu_backward_bias(&y, &[m, 1, n])?;
        // One bias shared by 2,000 rows: the element-wise backward and a split reduction.
        let y = rand(&[2000, 64], 25, dev)?.relu()?;
        let (dxs, dbs) = rand(&[2000, 64], 26, dev)?.relu_backward_bias(&y, &[64])?;
        Ok(vec![
            dx, db, dx4, db4, dxw, dbw, dxs, dbs, shifted, shifted4,
        ])
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_net_pieces_agree() {
    agree("conv net", 2e-4, |dev| {
        let x = rand(&[8, 3, 16, 16], 20, dev)?;
        let w = rand(&[6, 3, 3, 3], 21, dev)?.mul_scalar(0.3)?;
        let bias = rand(&[6], 22, dev)?;
        let y = x.conv2d(&w, Some(&bias), 1, 1, 1)?;
        let (p, idx) = y.relu()?.max_pool2d(2, 2)?;
        let gp = rand(p.shape(), 23, dev)?;
        let gy = Tensor::max_pool2d_backward(&gp, &idx, y.shape(), (2, 2))?;
        let gx = Tensor::conv2d_backward_input(&gy, &w, x.shape(), 1, 1, 1)?;
        let gw = Tensor::conv2d_backward_weight(&x, &gy, w.shape(), 1, 1, 1)?;
        // Windows that leave the last row and column out, and windows apart with gaps (2x2 ones tile the planes).
        let (p3, idx3) = y.max_pool2d(3, 3)?;
        let gy3 = Tensor::max_pool2d_backward(&p3.relu()?, &idx3, y.shape(), (3, 3))?;
        let (p23, idx23) = y.max_pool2d(2, 3)?;
        let wg = rand(&[4, 3, 3, 2], 24, dev)?;
        let xg = rand(&[2, 6, 9, 7], 25, dev)?;
        let yg = xg.conv2d(&wg, None, 2, 1, 2)?;
        let idx3 = idx3.to_dtype(DType::F32)?;
        let idx23 = idx23.to_dtype(DType::F32)?;
        // A bias and ReLU moved after the pool: the same values as `p`, in one kernel on CUDA.
        let (pooled, _) = x.conv2d(&w, None, 1, 1, 1)?.max_pool2d(2, 2)?;
        let moved = pooled.channel_bias_relu(Some(&bias))?;
        // Its backward in one pass: planes of 8 x 8 (four elements a thread) and of 5 x 5 (one).
        let (gmoved, gbias) = rand(moved.shape(), 26, dev)?.relu_backward_channel_bias(&moved)?;
        let y5 = p3.channel_bias_relu(Some(&bias))?;
        let (g5, gbias5) = rand(y5.shape(), 27, dev)?.relu_backward_channel_bias(&y5)?;
        // The pool, bias and ReLU in one pass (2x2 windows that tile), and apart (3x3 ones that leave a row out).
        let (fused, fused_idx) = y.max_pool2d_bias_relu(2, 2, &bias)?;
        let (apart, _) = y.max_pool2d_bias_relu(3, 3, &bias)?;
        let fused_idx = fused_idx.to_dtype(DType::F32)?;
        Ok(vec![
            moved,
            fused,
            fused_idx,
            apart,
            gmoved,
            gbias,
            g5,
            gbias5,
            y,
            p,
            idx.to_dtype(DType::F32)?,
            gy,
            gx,
            gw,
            yg,
            p3,
            idx3,
            gy3,
            p23,
            idx23,
        ])
    });
}

/// Values that are multiples of 1/8 in [-1, 1], from `seed`: a convolution of them is exact in f32 in any order, so
/// both devices find the same maxima (ties included) and differ only in how they sum gradients.
fn eighths(shape: &[usize], seed: usize, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 37 + seed * 11 + i / 7) % 17) as f32 / 8.0 - 1.0)
        .collect();
    Tensor::from_vec(v, shape, dev)
}

/// A first layer's convolution, pool, bias and ReLU as one op (one pass on CUDA, the ops apart on the CPU) and the
/// weight's and bias's gradients from the pooled one: several tiles a side each way (35 pooled columns, 11 rows), 20
/// output channels (a group of 16, or of 32, cut short), 5x5 kernels on one channel as LeNet's, and no padding.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pooled_convolution_agrees() {
    for (c, h, w, k, pad) in [(3, 22, 70, 3, 1), (1, 12, 12, 5, 2), (4, 18, 10, 3, 0)] {
        agree(
            &format!("pooled conv c{c} {h}x{w} k{k} p{pad}"),
            1e-4,
            |dev| {
                let x = eighths(&[3, c, h, w], 1, dev)?;
                let wt = eighths(&[20, c, k, k], 2, dev)?;
                let bias = eighths(&[20], 3, dev)?.mul_scalar(2.0)?;
                assert_eq!(x.conv2d_max_pool_fuses(&wt, pad, 2), dev.is_cuda());
                let (y, idx) = x.conv2d_max_pool_bias_relu(&wt, &bias, pad, 2)?;
                let g = rand(y.shape(), 4, dev)?;
                let (_, gw, gb) = Tensor::conv2d_max_pool_backward(
                    &x,
                    &wt,
                    (&g, &y, &idx),
                    (pad, 2),
                    (false, true),
                )?;
                Ok(vec![y, idx.to_dtype(DType::F32)?, gb, gw.unwrap()])
            },
        );
    }
}

/// The pooled convolution on bf16 and f16 inputs (a mixed policy's activations): f32 math on the f32 weights, so
/// the output differs from the f32 input's only by its own rounding, and the weight's and bias's gradients by the
/// 16-bit gradient's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pooled_convolution_takes_16bit_inputs() {
    let x = eighths(&[4, 3, 16, 16], 5, &GPU).unwrap();
    let wt = eighths(&[24, 3, 3, 3], 6, &GPU).unwrap();
    let bias = eighths(&[24], 7, &GPU).unwrap();
    let run = |x: &Tensor| {
        let (y, idx) = x.conv2d_max_pool_bias_relu(&wt, &bias, 1, 2).unwrap();
        let g = rand(y.shape(), 8, &GPU)
            .unwrap()
            .to_dtype(x.dtype())
            .unwrap();
        let (_, gw, gb) =
            Tensor::conv2d_max_pool_backward(x, &wt, (&g, &y, &idx), (1, 2), (false, true))
                .unwrap();
        let gw = gw.unwrap();
        assert_eq!(y.dtype(), x.dtype());
        assert_eq!((gw.dtype(), gb.dtype()), (DType::F32, DType::F32));
        let host = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let idx = host(&idx.to_dtype(DType::F32).unwrap());
        (host(&y), idx, [host(&gw), host(&gb)].concat())
    };
    let (y, idx, gw) = run(&x);
    let scale = gw.iter().fold(0f32, |m, v| m.max(v.abs()));
    for dtype in [DType::BF16, DType::F16] {
        let (y16, idx16, gw16) = run(&x.to_dtype(dtype).unwrap());
        assert_eq!(
            idx16, idx,
            "{dtype:?}: the same maxima (the inputs are exact in 16 bits)"
        );
        let tol = if dtype == DType::BF16 { 8e-3 } else { 1e-3 };
        for (a, b) in y16.iter().zip(&y) {
            assert!((a - b).abs() <= tol * b.abs(), "{dtype:?}: {a} against {b}");
        }
        for (a, b) in gw16.iter().zip(&gw) {
            assert!(
                (a - b).abs() <= 4.0 * tol * scale,
                "{dtype:?}: gradient {a} against {b}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn layout_index_and_cast_ops_agree() {
    agree("layout", 1e-5, |dev| {
        let a = rand(&[4, 6, 5], 30, dev)?;
        let b = rand(&[4, 2, 5], 31, dev)?;
        let cat = Tensor::cat(&[&a, &b], 1)?;
        let stack = Tensor::stack(&[&a, &a], 0)?;
        let narrow = cat.narrow(1, 3, 4)?;
        let target = Tensor::zeros(&[4, 8, 5], DType::F32, dev)?;
        target.narrow_assign_(1, 2, &a)?;
        let tr = a.transpose()?;
        let bc = rand(&[6, 1], 32, dev)?.broadcast_to(&[3, 6, 5])?;
        let sum_to = bc.sum_to(&[6, 1])?;
        let table = rand(&[50, 8], 33, dev)?;
        let ids = Tensor::from_vec(vec![3i32, 0, 49, 3, 7], &[5], dev)?;
        let emb = table.index_select(&ids, 0)?;
        // Embedding bags in one kernel: 64 columns four at a time, and 130 one at a time over three blocks.
        let bags = Tensor::from_vec((0..35).map(|i: i32| i * 17 % 50).collect(), &[5, 7], dev)?;
        let bag_means = [
            rand(&[50, 64], 35, dev)?.bag_mean(&bags, 7)?,
            rand(&[50, 130], 36, dev)?.bag_mean(&bags, 5)?,
        ];
        let table_grad = table.index_add(0, &ids, &rand(&[5, 8], 34, dev)?)?;
        let reductions = vec![
            a.sum(1, true)?,
            a.mean(2, false)?,
            a.max(0, false)?,
            a.min(1, false)?,
            a.argmax(2)?.to_dtype(DType::F32)?,
            a.sum_all()?,
        ];
        let h16 = a.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
        let hb16 = a.to_dtype(DType::BF16)?.to_dtype(DType::F32)?;
        let ints = a
            .mul_scalar(100.0)?
            .to_dtype(DType::I32)?
            .to_dtype(DType::F32)?;
        let bytes = a
            .mul_scalar(300.0)?
            .to_dtype(DType::U8)?
            .to_dtype(DType::F32)?;
        let acc = a.copy()?;
        acc.add_assign_(&a)?;
        let filled = Tensor::full(&[3, 3], 2.5, DType::F32, dev)?;
        let ar = Tensor::arange(10, DType::F32, dev)?;
        let un = vec![
            a.exp()?,
            a.abs()?.log()?,
            a.abs()?.sqrt()?,
            a.tanh()?,
            a.sigmoid()?,
            a.gelu()?,
            a.powf(2.0)?,
        ];
        let mut out = vec![
            cat, stack, narrow, target, tr, bc, sum_to, emb, table_grad, h16, hb16, ints, bytes,
            acc, filled, ar,
        ];
        out.extend(reductions);
        out.extend(un);
        out.extend(bag_means);
        Ok(out)
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn half_precision_tensors_round_trip_and_matmul_is_f32_or_a_clear_error() -> Result<()> {
    let a = rand(&[64, 96], 40, &GPU)?;
    let b = rand(&[96, 32], 41, &GPU)?;
    let want = a.matmul(&b)?.to_vec::<f32>()?;
    for dt in [DType::F16, DType::BF16] {
        let (ah, bh) = (a.to_dtype(dt)?, b.to_dtype(dt)?);
        assert_eq!(ah.dtype(), dt);
        // f16 / bf16 are storage types (the contract): a product either computes (GemmEx) or says so.
        match ah.matmul(&bh) {
            Ok(got) => {
                assert_eq!(got.dtype(), dt);
                let got = got.to_dtype(DType::F32)?.to_vec::<f32>()?;
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < 0.1, "{dt}: {g} vs {w}");
                }
            }
            Err(e) => assert!(e.to_string().contains(dt.as_str()), "{e}"),
        }
        let back = ah
            .to_dtype(DType::F32)?
            .matmul(&bh.to_dtype(DType::F32)?)?
            .to_vec::<f32>()?;
        for (g, w) in back.iter().zip(&want) {
            assert!((g - w).abs() < 0.1, "{dt} cast back: {g} vs {w}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_storage_is_charged_to_the_tenant_and_freed_on_drop() -> Result<()> {
    let alloc = memory::allocator(&GPU)?;
    let tenant = alloc.add_tenant("cuda-test-member", Default::default())?;
    let before = alloc.tenant_stats(tenant).map_or(0, |r| r.in_use);
    let t = memory::with_tenant(tenant, || Tensor::zeros(&[1 << 20], DType::F32, &GPU))?;
    let during = alloc.tenant_stats(tenant).map_or(0, |r| r.in_use);
    assert!(
        during >= before + (4 << 20),
        "in use {during} after a 4 MiB tensor (was {before})"
    );
    drop(t);
    let after = alloc.tenant_stats(tenant).map_or(0, |r| r.in_use);
    assert_eq!(after, before, "dropping the tensor gives its block back");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_input_on_the_gpu_is_an_error() -> Result<()> {
    let table = rand(&[10, 4], 50, &GPU)?;
    let ids = Tensor::from_vec(vec![1i32, 10], &[2], &GPU)?;
    // The op is queued; the next read-back reports the flagged index, naming the op.
    let picked = table.index_select(&ids, 0)?;
    let err = picked
        .to_vec::<f32>()
        .expect_err("an index out of range fails the read-back");
    let msg = err.to_string();
    assert!(msg.contains("index_select") && msg.contains("10"), "{msg}");
    let bags = Tensor::from_vec(vec![1i32, 2, 3, 10], &[4], &GPU)?;
    let msg = table
        .bag_mean(&bags, 2)?
        .to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("bag_mean") && msg.contains("10"), "{msg}");
    // The device stays usable afterwards.
    assert_eq!(table.sum_all()?.to_device(&Device::Cpu)?.elem_count(), 1);
    let f64_on_gpu = Tensor::zeros(&[2], DType::F64, &GPU);
    assert!(
        f64_on_gpu.is_err(),
        "f64 has no CUDA kernels and must say so"
    );
    let no_such_gpu = Tensor::zeros(&[2], DType::F32, &Device::Cuda(99));
    assert!(no_such_gpu.is_err());
    Ok(())
}

#[test]
fn asking_for_a_gpu_without_one_is_an_error() {
    if cohort_tensor::cuda::device_count().unwrap_or(0) > 0 {
        return;
    }
    let err = Tensor::zeros(&[2], DType::F32, &GPU).expect_err("no GPU here");
    let msg = err.to_string();
    assert!(msg.contains("cuda"), "{msg}");
}

/// Reads queued behind later work arrive with the values of their moment: the host goes on
/// queueing (here, overwriting the tensor) while earlier reads are in flight.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_later_keep_the_values_of_their_moment() {
    let t = rand(&[4096], 61, &GPU).unwrap();
    let want = t.to_vec::<f32>().unwrap();
    let mut reads = Vec::new();
    for k in 0..8 {
        reads.push(t.read_later().unwrap());
        t.add_assign_(&Tensor::full(&[4096], 1.0, DType::F32, &GPU).unwrap())
            .unwrap();
        assert_eq!(reads.len(), k + 1);
    }
    for (k, r) in reads.into_iter().enumerate() {
        let got = r.wait::<f32>().unwrap();
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - (b + k as f32)).abs() <= 1e-5 * (1.0 + b.abs()),
                "read {k} element {j}: {a} vs {}",
                b + k as f32
            );
        }
    }
    // The wrong element type is an error, not a reinterpretation.
    let e = t.read_later().unwrap().wait::<i32>().unwrap_err();
    assert!(e.to_string().contains("read_later"), "{e}");
}
