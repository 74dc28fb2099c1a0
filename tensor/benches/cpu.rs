//! CPU tensor benchmarks: matmul through the tensor API, and one full training step of the
//! 784-128-10 MLP (batch 256, Adam) written with tensor ops and a hand-written backward pass.

use std::hint::black_box;

use cohort_tensor::{DType, Device, Result, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

struct Mlp {
    params: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
}

impl Mlp {
    fn new(dev: &Device) -> Result<Self> {
        let params = vec![
            Tensor::rand_uniform(&[784, 128], -0.05, 0.05, DType::F32, 1, dev)?,
            Tensor::zeros(&[128], DType::F32, dev)?,
            Tensor::rand_uniform(&[128, 10], -0.1, 0.1, DType::F32, 2, dev)?,
            Tensor::zeros(&[10], DType::F32, dev)?,
        ];
        let m = params
            .iter()
            .map(Tensor::zeros_like)
            .collect::<Result<_>>()?;
        let v = params
            .iter()
            .map(Tensor::zeros_like)
            .collect::<Result<_>>()?;
        Ok(Mlp {
            params,
            m,
            v,
            step: 0,
        })
    }

    /// Forward, backward and an Adam update; returns the loss.
    fn step(&mut self, x: &Tensor, y: &Tensor, onehot: &Tensor) -> Result<Tensor> {
        let [w1, b1, w2, b2] = [
            &self.params[0],
            &self.params[1],
            &self.params[2],
            &self.params[3],
        ];
        let h = x.matmul(w1)?.add(b1)?;
        let a = h.relu()?;
        let z = a.matmul(w2)?.add(b2)?;
        let ls = z.log_softmax_last()?;
        let loss = ls.gather_last(y)?.mean_all()?.neg()?;
        let batch = x.shape()[0] as f64;
        let dz = ls.exp()?.sub(onehot)?.mul_scalar(1.0 / batch)?;
        let dw2 = a.matmul_t(&dz, true, false)?;
        let db2 = dz.sum(0, false)?;
        let da = dz.matmul_t(w2, false, true)?;
        let dh = da.mul(&h.gt_scalar(0.0)?)?;
        let dw1 = x.matmul_t(&dh, true, false)?;
        let db1 = dh.sum(0, false)?;
        self.step += 1;
        for (i, g) in [dw1, db1, dw2, db2].iter().enumerate() {
            Tensor::adam_step_(
                &self.params[i],
                g,
                &self.m[i],
                &self.v[i],
                &[1e-3],
                0.9,
                0.999,
                1e-8,
                0.0,
                false,
                self.step,
            )?;
        }
        Ok(loss)
    }
}

fn bench(c: &mut Criterion) {
    let dev = Device::Cpu;
    let mut g = c.benchmark_group("cpu_tensor");
    let a = Tensor::rand_uniform(&[256, 784], -1.0, 1.0, DType::F32, 3, &dev).expect("input");
    let b = Tensor::rand_uniform(&[784, 128], -1.0, 1.0, DType::F32, 4, &dev).expect("input");
    g.throughput(Throughput::Elements(2 * 256 * 784 * 128));
    g.bench_function("matmul_256x784x128", |bch| {
        bch.iter(|| black_box(a.matmul(&b).expect("matmul")))
    });

    let x = Tensor::rand_uniform(&[256, 784], 0.0, 1.0, DType::F32, 5, &dev).expect("x");
    let labels: Vec<i32> = (0..256).map(|i| i * 7 % 10).collect();
    let y = Tensor::from_vec(labels, &[256], &dev).expect("y");
    let onehot = Tensor::one_hot(&y, 10, DType::F32).expect("onehot");
    let mut mlp = Mlp::new(&dev).expect("mlp");
    // One step = one model-step; FLOPs ≈ 3 big matmuls' worth would mislead, so count steps.
    g.throughput(Throughput::Elements(1));
    g.bench_function("mlp_784_128_10_adam_step", |bch| {
        bch.iter(|| black_box(mlp.step(&x, &y, &onehot).expect("step")))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
