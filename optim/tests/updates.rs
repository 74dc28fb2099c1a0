//! Optimizer updates against the published PyTorch update rules (torch.optim.SGD / Adam / AdamW docs),
//! re-derived here element by element in scalar f64. Tolerance: 1e-12 relative (f64 rounding only).

use cohort_autograd::Param;
use cohort_optim::{OptimConfig, Optimizer, Schedule};
use cohort_tensor::{Device, Tensor};

const DEV: Device = Device::Cpu;
const M: usize = 2; // members
const K: usize = 3; // values per member
const STEPS: usize = 6;

fn init() -> Vec<f64> {
    vec![0.5, -1.25, 2.0, -0.75, 0.1, 1.5]
}

fn grad(t: usize, i: usize) -> f64 {
    ((t * 7 + i * 3) as f64 * 0.37).sin() * (1.0 + i as f64 * 0.5)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + b.abs())
}

/// Runs our optimizer STEPS times with the given gradients and per-member learning rates.
fn run(config: OptimConfig, lrs: &[f64], schedule: Schedule) -> (Vec<f64>, Optimizer, Param) {
    let p = Param::new(
        "layers.0.weight",
        Tensor::from_vec(init(), &[M, K], &DEV).unwrap(),
    );
    let mut opt = Optimizer::new(config, std::slice::from_ref(&p))
        .unwrap()
        .with_schedule(schedule);
    opt.set_member_lrs(lrs).unwrap();
    for t in 0..STEPS {
        let g: Vec<f64> = (0..M * K).map(|i| grad(t, i)).collect();
        p.accumulate_grad(Tensor::from_vec(g, &[M, K], &DEV).unwrap())
            .unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    (p.value().to_vec::<f64>().unwrap(), opt, p)
}

/// torch.optim.SGD, one element.
fn sgd_ref(
    lr: &dyn Fn(usize) -> f64,
    i: usize,
    momentum: f64,
    dampening: f64,
    wd: f64,
    nesterov: bool,
) -> f64 {
    let mut p = init()[i];
    let mut buf = 0.0;
    for t in 0..STEPS {
        let mut g = grad(t, i) + wd * p;
        if momentum != 0.0 {
            buf = if t == 0 {
                g
            } else {
                momentum * buf + (1.0 - dampening) * g
            };
            g = if nesterov { g + momentum * buf } else { buf };
        }
        p -= lr(t) * g;
    }
    p
}

/// torch.optim.Adam / AdamW, one element.
fn adam_ref(
    lr: &dyn Fn(usize) -> f64,
    i: usize,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    decoupled: bool,
) -> f64 {
    let (mut p, mut m, mut v) = (init()[i], 0.0, 0.0);
    for t in 0..STEPS {
        let step = (t + 1) as i32;
        let mut g = grad(t, i);
        if decoupled {
            p *= 1.0 - lr(t) * wd;
        } else {
            g += wd * p;
        }
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        let bc1 = 1.0 - b1.powi(step);
        let bc2 = 1.0 - b2.powi(step);
        p -= lr(t) / bc1 * m / ((v.sqrt() / bc2.sqrt()) + eps);
    }
    p
}

fn member_lr(lrs: &[f64], i: usize) -> f64 {
    if lrs.len() == 1 { lrs[0] } else { lrs[i / K] }
}

#[test]
fn sgd_variants_match_pytorch_rules() {
    let lrs = [0.1, 0.03];
    for (momentum, dampening, wd, nesterov) in [
        (0.0, 0.0, 0.0, false),
        (0.9, 0.0, 0.0, false),
        (0.9, 0.0, 0.01, true),
        (0.8, 0.3, 0.05, false),
    ] {
        let cfg = OptimConfig::Sgd {
            lr: 0.1,
            momentum,
            dampening,
            weight_decay: wd,
            nesterov,
        };
        let (got, _, _) = run(cfg, &lrs, Schedule::Constant);
        for (i, g) in got.iter().enumerate() {
            let want = sgd_ref(
                &|_| member_lr(&lrs, i),
                i,
                momentum,
                dampening,
                wd,
                nesterov,
            );
            assert!(
                close(*g, want),
                "sgd m={momentum} d={dampening} wd={wd} n={nesterov} [{i}]: {g} vs {want}"
            );
        }
    }
}

#[test]
fn adam_and_adamw_match_pytorch_rules() {
    for lrs in [vec![1e-2], vec![1e-2, 3e-3]] {
        for (wd, decoupled) in [(0.0, false), (0.1, false), (0.1, true)] {
            let cfg = if decoupled {
                OptimConfig::AdamW {
                    lr: 1e-2,
                    betas: (0.9, 0.99),
                    eps: 1e-8,
                    weight_decay: wd,
                }
            } else {
                OptimConfig::Adam {
                    lr: 1e-2,
                    betas: (0.9, 0.99),
                    eps: 1e-8,
                    weight_decay: wd,
                }
            };
            let (got, opt, _) = run(cfg, &lrs, Schedule::Constant);
            assert_eq!(opt.steps(), STEPS as u64);
            for (i, g) in got.iter().enumerate() {
                let want = adam_ref(&|_| member_lr(&lrs, i), i, 0.9, 0.99, 1e-8, wd, decoupled);
                assert!(
                    close(*g, want),
                    "adam wd={wd} decoupled={decoupled} lrs={lrs:?} [{i}]: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn schedules_follow_pytorch_formulas() {
    let step = Schedule::Step {
        every: 2,
        gamma: 0.5,
    };
    assert_eq!(
        (0..6).map(|t| step.factor(t)).collect::<Vec<_>>(),
        [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    );
    let cos = Schedule::Cosine {
        total: 4,
        min_factor: 0.1,
    };
    for t in 0..6u64 {
        let want = 0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * t.min(4) as f64 / 4.0).cos());
        assert!(close(cos.factor(t), want));
    }
    let warm = Schedule::Warmup {
        steps: 3,
        then: Box::new(Schedule::Step {
            every: 1,
            gamma: 0.5,
        }),
    };
    assert_eq!(
        (0..5).map(|t| warm.factor(t)).collect::<Vec<_>>(),
        [0.25, 0.5, 0.75, 1.0, 0.5]
    );
    // the schedule reaches the update
    let sched = Schedule::Step {
        every: 2,
        gamma: 0.5,
    };
    let (got, _, _) = run(OptimConfig::sgd(0.1), &[0.1], sched.clone());
    for (i, g) in got.iter().enumerate() {
        let want = sgd_ref(&|t| 0.1 * sched.factor(t as u64), i, 0.0, 0.0, 0.0, false);
        assert!(close(*g, want), "scheduled sgd [{i}]");
    }
    let json = serde_json::to_string(&warm).unwrap();
    assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), warm);
}

#[test]
fn state_dict_round_trip_resumes_exactly() {
    let cfg = OptimConfig::adam(1e-2);
    let (_, opt, p) = run(cfg.clone(), &[1e-2], Schedule::Constant);
    let state = opt.state_dict();
    assert_eq!(state.step, STEPS as u64);
    let names: Vec<&str> = state.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["layers.0.weight.exp_avg", "layers.0.weight.exp_avg_sq"]
    );
    // a copy of the parameter and a fresh optimizer loaded from the state continue identically
    let q = Param::new(
        "layers.0.weight",
        Tensor::from_vec(p.value().to_vec::<f64>().unwrap(), &[M, K], &DEV).unwrap(),
    );
    let mut a = opt;
    let mut b = Optimizer::new(cfg, std::slice::from_ref(&q)).unwrap();
    b.load_state_dict(&state).unwrap();
    for t in 0..3 {
        let g = Tensor::from_vec(
            (0..M * K).map(|i| grad(t + 50, i)).collect::<Vec<_>>(),
            &[M, K],
            &DEV,
        )
        .unwrap();
        p.accumulate_grad(g.clone()).unwrap();
        q.accumulate_grad(g).unwrap();
        a.step().unwrap();
        b.step().unwrap();
        a.zero_grad();
        b.zero_grad();
    }
    assert_eq!(
        p.value().to_vec::<f64>().unwrap(),
        q.value().to_vec::<f64>().unwrap()
    );
    // member slices: member 1 of the fused state loads into member 0 of another
    let s1 = a.state_dict().member(1).unwrap();
    assert_eq!(s1.tensors[0].1.shape(), &[K]);
    b.load_member_state(0, &s1).unwrap();
    let bs = b.state_dict();
    assert_eq!(
        bs.tensors[0]
            .1
            .narrow(0, 0, 1)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        s1.tensors[0].1.to_vec::<f64>().unwrap()
    );
    // unknown buffers are refused, naming them
    let mut bad = state.clone();
    bad.tensors[0].0 = "layers.7.weight.exp_avg".into();
    assert!(
        b.load_state_dict(&bad)
            .unwrap_err()
            .to_string()
            .contains("layers.7.weight.exp_avg")
    );
}

#[test]
fn bad_hyper_parameters_are_errors() {
    let p = Param::new(
        "w",
        Tensor::zeros(&[2, 3], cohort_tensor::DType::F32, &DEV).unwrap(),
    );
    let bad = OptimConfig::Adam {
        lr: 1e-3,
        betas: (1.0, 0.999),
        eps: 1e-8,
        weight_decay: 0.0,
    };
    assert!(
        Optimizer::new(bad, std::slice::from_ref(&p))
            .unwrap_err()
            .to_string()
            .contains("beta1")
    );
    let nes = OptimConfig::Sgd {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: true,
    };
    assert!(Optimizer::new(nes, std::slice::from_ref(&p)).is_err());
    let mut opt = Optimizer::new(OptimConfig::sgd(0.1), std::slice::from_ref(&p)).unwrap();
    assert!(opt.set_member_lrs(&[0.1, 0.2, 0.3]).is_err());
    assert!(opt.set_member_lrs(&[0.1, 0.2]).is_ok());
}
