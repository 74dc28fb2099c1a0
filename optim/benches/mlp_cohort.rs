//! CPU training throughput of the MLP 784-128-10 (Adam 1e-3, batch 256, synthetic data) for N models, run
//! separately (N models in turn) and fused (one model with M = N members). Throughput is in model-steps per
//! second (criterion "elements": one element = one model-step).

use std::hint::black_box;
use std::time::Duration;

use cohort_autograd::{BuildOptions, Model, ModelSpec, Tape, loss};
use cohort_optim::{OptimConfig, Optimizer};
use cohort_tensor::{DType, Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const B: usize = 256;
const ROWS: usize = 8192;

struct Trainee {
    model: Model,
    opt: Optimizer,
    tape: Tape,
}

impl Trainee {
    fn new(members: usize, seed: u64) -> Trainee {
        let spec =
            ModelSpec::from_toml(r#"layers = [{ linear = 128, act = "relu" }, { linear = 10 }]"#)
                .unwrap();
        let model = spec
            .build(&[784], &BuildOptions::new(members, seed, Device::Cpu))
            .unwrap();
        let opt = Optimizer::new(OptimConfig::adam(1e-3), model.params()).unwrap();
        Trainee {
            model,
            opt,
            tape: Tape::new(),
        }
    }

    fn step(&mut self, x: &Tensor, y: &Tensor) {
        let logits = self.model.forward(&self.tape, x).unwrap();
        let l = loss::cross_entropy(&logits, y).unwrap();
        self.tape.backward(&l).unwrap();
        self.opt.step().unwrap();
        self.opt.zero_grad();
        black_box(l);
    }
}

fn data() -> (Tensor, Tensor) {
    let x = Tensor::rand_uniform(&[ROWS, 784], 0.0, 1.0, DType::F32, 0, &Device::Cpu).unwrap();
    let y: Vec<i32> = (0..ROWS).map(|i| ((i * 7919) % 10) as i32).collect();
    (x, Tensor::from_vec(y, &[ROWS], &Device::Cpu).unwrap())
}

fn batches(x: &Tensor, y: &Tensor) -> Vec<(Tensor, Tensor)> {
    (0..ROWS / B)
        .map(|i| {
            (
                x.narrow(0, i * B, B).unwrap(),
                y.narrow(0, i * B, B).unwrap(),
            )
        })
        .collect()
}

fn mlp_cohort(c: &mut Criterion) {
    let (x, y) = data();
    let bs = batches(&x, &y);
    let mut g = c.benchmark_group("cpu_mlp_cohort");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for n in [1usize, 4, 16] {
        g.throughput(Throughput::Elements(n as u64));
        let mut separate: Vec<Trainee> = (0..n).map(|i| Trainee::new(1, i as u64)).collect();
        let mut i = 0;
        g.bench_function(format!("cpu_mlp_separate_n{n}"), |b| {
            b.iter(|| {
                let (bx, by) = &bs[i % bs.len()];
                i += 1;
                for t in &mut separate {
                    t.step(bx, by);
                }
            })
        });
        drop(separate);
        let mut fused = Trainee::new(n, 0);
        g.bench_function(format!("cpu_mlp_fused_n{n}"), |b| {
            b.iter(|| {
                let (bx, by) = &bs[i % bs.len()];
                i += 1;
                fused.step(bx, by);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, mlp_cohort);
criterion_main!(benches);
