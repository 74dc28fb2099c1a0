//! CUDA tensor benchmarks (run on a GPU: `cargo bench -p cohort-tensor --features cuda --bench cuda`).
//!
//! - `cuda_tensor_host_<op>`: host time of one tensor op (allocation from the caching allocator,
//!   launch, and the free at drop), without synchronisation inside the timed loop.
//! - `cuda_mlp_step_n<M>`: one training step (forward, backward, Adam) of M members of the
//!   784-128-10 MLP at batch 256, all members fused into batched products with a shared input;
//!   throughput in model-steps per second. GPU timings synchronise inside `iter_custom`.

use std::time::{Duration, Instant};

use cohort_tensor::{DType, Device, Result, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const GPU: Device = Device::Cuda(0);

fn host_time(iters: u64, mut f: impl FnMut()) -> Duration {
    GPU.synchronize().expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let e = t.elapsed();
    GPU.synchronize().expect("sync");
    e
}

/// M fused MLP members (shared input): parameters, Adam moments, learning rates.
struct Cohort {
    m: usize,
    x: Tensor,
    onehot: Tensor,
    labels: Tensor,
    params: Vec<Tensor>,
    moments: Vec<(Tensor, Tensor)>,
    lrs: Vec<f64>,
    step: u64,
}

impl Cohort {
    fn new(m: usize) -> Result<Cohort> {
        let (b, k, h, c) = (256, 784, 128, 10);
        let x = Tensor::rand_uniform(&[b, k], 0.0, 1.0, DType::F32, 1, &GPU)?;
        let lab: Vec<i32> = (0..m * b).map(|i| (i % c) as i32).collect();
        let labels = Tensor::from_vec(lab, &[m, b], &GPU)?;
        let onehot =
            Tensor::one_hot(&labels.reshape(&[m * b])?, c, DType::F32)?.reshape(&[m, b, c])?;
        let params = vec![
            Tensor::rand_uniform(&[m, k, h], -0.05, 0.05, DType::F32, 2, &GPU)?,
            Tensor::zeros(&[m, 1, h], DType::F32, &GPU)?,
            Tensor::rand_uniform(&[m, h, c], -0.1, 0.1, DType::F32, 3, &GPU)?,
            Tensor::zeros(&[m, 1, c], DType::F32, &GPU)?,
        ];
        let moments = params
            .iter()
            .map(|p| Ok((Tensor::zeros_like(p)?, Tensor::zeros_like(p)?)))
            .collect::<Result<_>>()?;
        Ok(Cohort {
            m,
            x,
            onehot,
            labels,
            params,
            moments,
            lrs: (0..m).map(|i| 1e-3 * (1.0 + i as f64 / m as f64)).collect(),
            step: 0,
        })
    }

    fn step(&mut self) -> Result<Tensor> {
        let [w1, b1, w2, b2] = [
            &self.params[0],
            &self.params[1],
            &self.params[2],
            &self.params[3],
        ];
        let b = self.x.shape()[0];
        let pre = self.x.matmul(w1)?.add(b1)?; // [M, B, H]
        let hid = pre.relu()?;
        let logits = hid.matmul(w2)?.add(b2)?; // [M, B, C]
        let lsm = logits.log_softmax_last()?;
        let loss = lsm.gather_last(&self.labels)?.mean_all()?.neg()?;
        let dlogits = lsm.exp()?.sub(&self.onehot)?.mul_scalar(1.0 / b as f64)?;
        let dw2 = hid.matmul_t(&dlogits, true, false)?;
        let db2 = dlogits.sum(1, true)?;
        let dhid = dlogits.matmul_t(w2, false, true)?;
        let dpre = dhid.mul(&pre.gt_scalar(0.0)?)?;
        let dw1 = self.x.matmul_t(&dpre, true, false)?;
        let db1 = dpre.sum(1, true)?;
        self.step += 1;
        for (p, (g, (m, v))) in self
            .params
            .iter()
            .zip([dw1, db1, dw2, db2].iter().zip(&self.moments))
        {
            Tensor::adam_step_(
                p, g, m, v, &self.lrs, 0.9, 0.999, 1e-8, 0.0, false, self.step,
            )?;
        }
        Ok(loss)
    }
}

fn bench(c: &mut Criterion) {
    if let Err(e) = Tensor::zeros(&[1], DType::F32, &GPU) {
        eprintln!("skipping CUDA tensor benchmarks: {e}");
        return;
    }
    let mut group = c.benchmark_group("cuda_tensor_host");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let a = Tensor::rand_uniform(&[256, 128], -1.0, 1.0, DType::F32, 1, &GPU).expect("a");
    let bias = Tensor::rand_uniform(&[128], -1.0, 1.0, DType::F32, 2, &GPU).expect("bias");
    let w = Tensor::rand_uniform(&[128, 128], -1.0, 1.0, DType::F32, 3, &GPU).expect("w");
    group.bench_function("cuda_tensor_host_add_bias", |b| {
        b.iter_custom(|iters| host_time(iters, || drop(a.add(&bias).expect("add"))))
    });
    group.bench_function("cuda_tensor_host_relu", |b| {
        b.iter_custom(|iters| host_time(iters, || drop(a.relu().expect("relu"))))
    });
    group.bench_function("cuda_tensor_host_sum", |b| {
        b.iter_custom(|iters| host_time(iters, || drop(a.sum(0, false).expect("sum"))))
    });
    group.bench_function("cuda_tensor_host_matmul", |b| {
        b.iter_custom(|iters| host_time(iters, || drop(a.matmul(&w).expect("matmul"))))
    });
    group.finish();

    let mut group = c.benchmark_group("cuda_mlp");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for m in [1usize, 16, 128] {
        let mut cohort = Cohort::new(m).expect("cohort");
        cohort.step().expect("warm-up step");
        group.throughput(Throughput::Elements(cohort.m as u64));
        group.bench_function(format!("cuda_mlp_step_n{m}"), |b| {
            b.iter_custom(|iters| {
                GPU.synchronize().expect("sync");
                let t = Instant::now();
                for _ in 0..iters {
                    drop(cohort.step().expect("step"));
                }
                GPU.synchronize().expect("sync");
                t.elapsed()
            })
        });
        let loss = cohort.step().and_then(|l| l.to_vec::<f32>()).expect("loss");
        eprintln!(
            "cuda_mlp_step_n{m}: loss after {} steps = {:?}",
            cohort.step, loss
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
