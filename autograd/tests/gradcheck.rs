//! Finite-difference gradient checks, f64 on the CPU, for every differentiable op, loss and layer.

use cohort_autograd::nn::{Features, Module};
use cohort_autograd::{BuildOptions, ModelSpec, Result, Tape, Var, loss};
use cohort_tensor::{DType, Device, Tensor};

const DEV: Device = Device::Cpu;
const H: f64 = 1e-6;
const TOL: f64 = 1e-6;

fn rand(shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
    Tensor::rand_uniform(shape, lo, hi, DType::F64, seed, &DEV).unwrap()
}

/// Values in `[lo, hi]` kept at least `gap` away from each other and from 0 (kinks and ties).
fn spread(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = (0..n)
        .map(|i| (i as f64 + 0.75) / n as f64 * 2.0 - 1.0)
        .collect();
    // deterministic shuffle
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    Tensor::from_vec(v, shape, &DEV).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

/// Compares the tape's gradients of `sum(f(x) * r)` with central differences for every input element.
fn check(name: &str, inputs: &[Tensor], f: impl Fn(&[Var]) -> Result<Var>) {
    let tape = Tape::new();
    let vars: Vec<Var> = inputs.iter().map(|t| tape.watch(t.clone())).collect();
    let out = f(&vars).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let r = rand(out.shape(), -1.0, 1.0, 99);
    let rv = Var::constant(r.clone());
    let l = out.mul(&rv).unwrap().sum_all().unwrap();
    let grads = tape
        .backward(&l)
        .unwrap_or_else(|e| panic!("{name}: backward failed: {e}"));
    let objective = |xs: &[Tensor]| -> f64 {
        let vs: Vec<Var> = xs.iter().map(|t| Var::constant(t.clone())).collect();
        let o = f(&vs).unwrap();
        o.value()
            .mul(&r)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    for (i, x) in inputs.iter().enumerate() {
        if x.dtype() != DType::F64 {
            continue;
        }
        let g = grads
            .get(&vars[i])
            .map(values)
            .unwrap_or_else(|| vec![0.0; x.elem_count()]);
        assert_eq!(
            g.len(),
            x.elem_count(),
            "{name}: gradient {i} has the wrong size"
        );
        let base = values(x);
        for j in 0..base.len() {
            let mut xs = inputs.to_vec();
            let mut p = base.clone();
            p[j] += H;
            xs[i] = Tensor::from_vec(p.clone(), x.shape(), &DEV).unwrap();
            let fp = objective(&xs);
            p[j] -= 2.0 * H;
            xs[i] = Tensor::from_vec(p, x.shape(), &DEV).unwrap();
            let fm = objective(&xs);
            let num = (fp - fm) / (2.0 * H);
            assert!(
                (num - g[j]).abs() <= TOL * (1.0 + num.abs()),
                "{name}: input {i} element {j}: tape {} vs finite difference {num}",
                g[j]
            );
        }
    }
}

#[test]
fn elementwise_binary_with_broadcasting() {
    let a = rand(&[2, 3, 4], -1.0, 1.0, 1);
    let b = rand(&[3, 1], 0.5, 1.5, 2);
    check("add", &[a.clone(), b.clone()], |v| v[0].add(&v[1]));
    check("sub", &[a.clone(), b.clone()], |v| v[0].sub(&v[1]));
    check("mul", &[a.clone(), b.clone()], |v| v[0].mul(&v[1]));
    check("div", &[a.clone(), b.clone()], |v| v[0].div(&v[1]));
    check(
        "div same shape",
        &[a.clone(), rand(&[2, 3, 4], 0.5, 1.5, 3)],
        |v| v[0].div(&v[1]),
    );
    check(
        "maximum",
        &[
            spread(&[2, 3, 4], 4),
            spread(&[2, 3, 4], 5).mul_scalar(0.99).unwrap(),
        ],
        |v| v[0].maximum(&v[1]),
    );
}

#[test]
fn elementwise_unary() {
    let x = spread(&[3, 5], 7);
    let pos = rand(&[3, 5], 0.5, 2.0, 8);
    check("add_scalar", std::slice::from_ref(&x), |v| {
        v[0].add_scalar(0.3)
    });
    check("mul_scalar", std::slice::from_ref(&x), |v| {
        v[0].mul_scalar(-1.7)
    });
    check("powf", std::slice::from_ref(&pos), |v| v[0].powf(2.5));
    check("neg", std::slice::from_ref(&x), |v| v[0].neg());
    check("relu", std::slice::from_ref(&x), |v| v[0].relu());
    // x stays at least 0.02 from 0, the bias within 0.01: no kink inside the finite differences
    let bias = |shape: &[usize], seed| rand(shape, -0.01, 0.01, seed);
    check(
        "bias_relu per member",
        &[spread(&[2, 3, 4], 11), bias(&[2, 1, 4], 12)],
        |v| v[0].bias_relu(&v[1]),
    );
    check(
        "bias_relu shared",
        &[spread(&[3, 4], 13), bias(&[4], 14)],
        |v| v[0].bias_relu(&v[1]),
    );
    check(
        "bias_relu of a vector",
        &[spread(&[4], 21), bias(&[4], 22)],
        |v| v[0].bias_relu(&v[1]),
    );
    // Batch normalization in training, packed images [B, M, 1, C, HW] and features per member [1, M, B, C, 1],
    // with and without its ReLU (a small bias keeps the normalized values, spread and whole, off the kink).
    for (shape, seed) in [([3, 2, 1, 2, 4], 31), ([1, 2, 5, 3, 1], 32)] {
        let stats = [shape[1], shape[3]];
        for relu in [false, true] {
            check(
                "batch_norm",
                &[
                    spread(&shape, seed),
                    rand(&stats, 0.5, 1.5, seed + 1),
                    rand(&stats, -0.01, 0.01, seed + 2),
                ],
                |v| v[0].batch_norm((&v[1], &v[2]), None, 1e-5, relu),
            );
        }
    }
    // Layer norm over the last dimension, per member, with rows in one and in two dimensions.
    for (shape, seed) in [(vec![2, 5, 4], 140), (vec![3, 2, 3, 6], 143)] {
        let params = [shape[0], shape[shape.len() - 1]];
        check(
            "layer_norm",
            &[
                spread(&shape, seed),
                rand(&params, 0.5, 1.5, seed + 1),
                rand(&params, -0.5, 0.5, seed + 2),
            ],
            |v| v[0].layer_norm((&v[1], &v[2]), 1e-5),
        );
    }
    // Linear in one op: shared or per-member input, a bias per member or shared, with and
    // without its ReLU (a bias spread from 0 keeps the pre-activations away from the kink).
    for relu in [false, true] {
        check(
            "linear shared input",
            &[
                rand(&[5, 3], -1.0, 1.0, 15),
                rand(&[2, 3, 4], -1.0, 1.0, 16),
                spread(&[2, 1, 4], 17),
            ],
            |v| v[0].linear(&v[1], &v[2], relu),
        );
        check(
            "linear per member, shared bias",
            &[
                rand(&[2, 5, 3], -1.0, 1.0, 18),
                rand(&[2, 3, 4], -1.0, 1.0, 19),
                spread(&[4], 20),
            ],
            |v| v[0].linear(&v[1], &v[2], relu),
        );
    }
    check("gelu", &[x.mul_scalar(3.0).unwrap()], |v| v[0].gelu());
    check("tanh", std::slice::from_ref(&x), |v| v[0].tanh());
    check("sigmoid", std::slice::from_ref(&x), |v| v[0].sigmoid());
    check("exp", std::slice::from_ref(&x), |v| v[0].exp());
    check("log", std::slice::from_ref(&pos), |v| v[0].log());
    check("sqrt", std::slice::from_ref(&pos), |v| v[0].sqrt());
    check("abs", std::slice::from_ref(&x), |v| v[0].abs());
    check("square", std::slice::from_ref(&x), |v| v[0].square());
}

#[test]
fn shapes_and_indexing() {
    let x = rand(&[2, 3, 4], -1.0, 1.0, 11);
    check("reshape", std::slice::from_ref(&x), |v| {
        v[0].reshape(&[6, 4])
    });
    check("transpose", std::slice::from_ref(&x), |v| v[0].transpose());
    check("swap_leading", std::slice::from_ref(&x), |v| {
        v[0].swap_leading()
    });
    let x4 = rand(&[2, 3, 4, 2], -1.0, 1.0, 10);
    for dim in 0..3 {
        check("swap_adjacent", std::slice::from_ref(&x4), |v| {
            v[0].swap_adjacent(dim)
        });
    }
    check("broadcast_to", &[rand(&[3, 1], -1.0, 1.0, 12)], |v| {
        v[0].broadcast_to(&[2, 3, 4])
    });
    check("sum_to", std::slice::from_ref(&x), |v| v[0].sum_to(&[3, 1]));
    check("narrow", std::slice::from_ref(&x), |v| v[0].narrow(2, 1, 2));
    check("cat", &[x.clone(), rand(&[2, 1, 4], -1.0, 1.0, 13)], |v| {
        Var::cat(&[&v[0], &v[1]], 1)
    });
    check(
        "stack",
        &[x.clone(), rand(&[2, 3, 4], -1.0, 1.0, 14)],
        |v| Var::stack(&[&v[0], &v[1]], 1),
    );
    let idx = Tensor::from_vec(vec![2i32, 0, 2, 1], &[4], &DEV).unwrap();
    check("index_select", &[rand(&[3, 5], -1.0, 1.0, 15)], |v| {
        v[0].index_select(&idx, 0)
    });
    check(
        "index_add",
        &[rand(&[3, 5], -1.0, 1.0, 16), rand(&[4, 5], -1.0, 1.0, 17)],
        |v| v[0].index_add(0, &idx, &v[1]),
    );
    // Two bags of three ids, one id twice in a bag and one in both.
    let bags = Tensor::from_vec(vec![2i32, 0, 2, 1, 2, 4], &[6], &DEV).unwrap();
    check("bag_mean", &[rand(&[5, 4], -1.0, 1.0, 21)], |v| {
        v[0].bag_mean(&bags, 3)
    });
    let table = Var::constant(rand(&[5, 4], -1.0, 1.0, 21));
    let e = table.bag_mean(&bags, 4).unwrap_err().to_string();
    assert!(e.contains("6 indices do not make bags of 4"), "{e}");
    let cls = Tensor::from_vec(vec![4i32, 0, 3, 3, 1, 2], &[2, 3], &DEV).unwrap();
    check("gather_last", &[rand(&[2, 3, 5], -1.0, 1.0, 18)], |v| {
        v[0].gather_last(&cls)
    });
    let mask = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 1.0, 1.0, 0.0], &[2, 3], &DEV).unwrap();
    check(
        "where_cond",
        &[rand(&[2, 3], -1.0, 1.0, 19), rand(&[2, 3], -1.0, 1.0, 20)],
        |v| Var::where_cond(&mask, &v[0], &v[1]),
    );
}

#[test]
fn reductions_and_softmax() {
    let x = spread(&[2, 3, 4], 21);
    for dim in 0..3 {
        for keep in [false, true] {
            check("sum", std::slice::from_ref(&x), |v| v[0].sum(dim, keep));
            check("mean", std::slice::from_ref(&x), |v| v[0].mean(dim, keep));
            check("max", std::slice::from_ref(&x), |v| v[0].max(dim, keep));
        }
    }
    check("sum_all", std::slice::from_ref(&x), |v| v[0].sum_all());
    check("mean_all", std::slice::from_ref(&x), |v| v[0].mean_all());
    check("softmax_last", &[x.mul_scalar(3.0).unwrap()], |v| {
        v[0].softmax_last()
    });
    check("log_softmax_last", &[x.mul_scalar(3.0).unwrap()], |v| {
        v[0].log_softmax_last()
    });
}

#[test]
fn matrix_products() {
    let a2 = rand(&[3, 4], -1.0, 1.0, 31);
    let b2 = rand(&[4, 5], -1.0, 1.0, 32);
    let a3 = rand(&[2, 3, 4], -1.0, 1.0, 33);
    let b3 = rand(&[2, 4, 5], -1.0, 1.0, 34);
    check("matmul 2d", &[a2.clone(), b2.clone()], |v| {
        v[0].matmul(&v[1])
    });
    check("matmul batched", &[a3.clone(), b3.clone()], |v| {
        v[0].matmul(&v[1])
    });
    check("matmul shared lhs", &[a2.clone(), b3.clone()], |v| {
        v[0].matmul(&v[1])
    });
    check("matmul shared rhs", &[a3.clone(), b2.clone()], |v| {
        v[0].matmul(&v[1])
    });
    let at = rand(&[2, 4, 3], -1.0, 1.0, 35);
    let bt = rand(&[2, 5, 4], -1.0, 1.0, 36);
    check("matmul_t lhs", &[at.clone(), b3.clone()], |v| {
        v[0].matmul_t(&v[1], true, false)
    });
    check("matmul_t rhs", &[a3.clone(), bt.clone()], |v| {
        v[0].matmul_t(&v[1], false, true)
    });
    check("matmul_t both", &[at, bt], |v| {
        v[0].matmul_t(&v[1], true, true)
    });
}

#[test]
fn convolution_and_pooling() {
    let x = rand(&[2, 4, 5, 5], -1.0, 1.0, 41);
    check(
        "conv2d",
        &[
            x.clone(),
            rand(&[3, 4, 3, 3], -1.0, 1.0, 42),
            rand(&[3], -1.0, 1.0, 43),
        ],
        |v| v[0].conv2d(&v[1], Some(&v[2]), 1, 1, 1),
    );
    check(
        "conv2d_relu",
        &[
            x.clone(),
            rand(&[3, 4, 3, 3], -1.0, 1.0, 42),
            rand(&[3], -1.0, 1.0, 43),
        ],
        |v| v[0].conv2d_relu(&v[1], Some(&v[2]), 1, 1, 1),
    );
    check(
        "conv2d stride 2 no pad",
        &[x.clone(), rand(&[3, 4, 3, 3], -1.0, 1.0, 44)],
        |v| v[0].conv2d(&v[1], None, 2, 0, 1),
    );
    check(
        "conv2d groups",
        &[
            x.clone(),
            rand(&[6, 2, 3, 3], -1.0, 1.0, 45),
            rand(&[6], -1.0, 1.0, 46),
        ],
        |v| v[0].conv2d(&v[1], Some(&v[2]), 1, 1, 2),
    );
    check("max_pool2d", &[spread(&[2, 3, 4, 6], 47)], |v| {
        v[0].max_pool2d(2, 2)
    });
    // A bias that sends some pooled maxima below 0, so that the ReLU's gradient is 0 there.
    check(
        "max_pool2d_bias_relu",
        &[spread(&[2, 3, 4, 6], 48), rand(&[3], -0.5, 0.5, 49)],
        |v| v[0].max_pool2d_bias_relu(2, 2, &v[1]),
    );
    // The convolution joined to its pool, bias and ReLU (one op; the ops apart on the CPU): 6x6 outputs in 2x2
    // windows, gradients of the input, the weight and the bias.
    check(
        "conv2d_max_pool_bias_relu",
        &[
            rand(&[2, 3, 4, 4], -1.0, 1.0, 53),
            rand(&[5, 3, 3, 3], -1.0, 1.0, 54),
            rand(&[5], -0.5, 0.5, 55),
        ],
        |v| v[0].conv2d_max_pool_bias_relu(&v[1], &v[2], 2, 2),
    );
    // An input that needs no gradient (a first layer's images): the weight's and bias's from the pooled gradient.
    let images = Var::constant(rand(&[2, 3, 4, 4], -1.0, 1.0, 56));
    check(
        "conv2d_max_pool_bias_relu on constant images",
        &[
            rand(&[5, 3, 3, 3], -1.0, 1.0, 57),
            rand(&[5], -0.5, 0.5, 58),
        ],
        |v| images.conv2d_max_pool_bias_relu(&v[0], &v[1], 2, 2),
    );
    // A frozen weight (the input's gradient of a trained model): the input's and bias's, and no weight's.
    let frozen = Var::constant(rand(&[5, 3, 3, 3], -1.0, 1.0, 59));
    check(
        "conv2d_max_pool_bias_relu with a frozen weight",
        &[
            rand(&[2, 3, 4, 4], -1.0, 1.0, 60),
            rand(&[5], -0.5, 0.5, 61),
        ],
        |v| v[0].conv2d_max_pool_bias_relu(&frozen, &v[1], 2, 2),
    );
}

#[test]
fn losses() {
    let logits = rand(&[2, 5, 4], -2.0, 2.0, 51);
    let shared = Tensor::from_vec(vec![0i32, 3, 1, 2, 3], &[5], &DEV).unwrap();
    let own = Tensor::from_vec(vec![0i32, 3, 1, 2, 3, 1, 1, 0, 2, 2], &[2, 5], &DEV).unwrap();
    check(
        "cross_entropy shared labels",
        std::slice::from_ref(&logits),
        |v| loss::cross_entropy(&v[0], &shared),
    );
    check(
        "cross_entropy own labels",
        std::slice::from_ref(&logits),
        |v| loss::cross_entropy(&v[0], &own),
    );
    let target = rand(&[5, 4], -1.0, 1.0, 52);
    check("mse", std::slice::from_ref(&logits), |v| {
        loss::mse(&v[0], &target)
    });
    // the fused loss equals the unfused formula
    let l = loss::cross_entropy(&Var::constant(logits.clone()), &shared).unwrap();
    let lsm = logits.log_softmax_last().unwrap();
    let hot = Tensor::one_hot(&shared, 4, DType::F64).unwrap();
    let want = lsm
        .mul(&hot)
        .unwrap()
        .sum(2, false)
        .unwrap()
        .mean(1, false)
        .unwrap()
        .neg()
        .unwrap();
    for (a, b) in values(l.value()).iter().zip(values(&want)) {
        assert!((a - b).abs() < 1e-12);
    }
    // Backward straight from the loss (no seed of ones made or multiplied) equals the general path's.
    let grad_of = |f: &dyn Fn(&Var) -> Var| {
        let tape = Tape::new();
        let v = tape.watch(logits.clone());
        let grads = tape.backward(&f(&v)).unwrap();
        values(grads.get(&v).unwrap())
    };
    let direct = grad_of(&|v| loss::cross_entropy(v, &shared).unwrap());
    let general = grad_of(&|v| {
        loss::cross_entropy(v, &shared)
            .unwrap()
            .mul_scalar(1.0)
            .unwrap()
    });
    assert_eq!(direct.len(), logits.elem_count());
    for (a, b) in direct.iter().zip(&general) {
        assert!((a - b).abs() < 1e-15, "{a} vs {b}");
    }
}

/// Gradient of every parameter of a built model against central differences, perturbing parameters in place.
fn check_model(
    name: &str,
    toml: &str,
    input: &[usize],
    x: &Tensor,
    labels: &Tensor,
    members: usize,
) {
    let spec = ModelSpec::from_toml(toml).unwrap();
    let opts = BuildOptions {
        dtype: DType::F64,
        device: DEV,
        seeds: (0..members as u64).map(|s| 10 + s).collect(),
    };
    let model = spec
        .build(input, &opts)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let eval = |tape: &Tape| -> Var {
        let logits = model.forward(tape, x).unwrap();
        loss::cross_entropy(&logits, labels)
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let tape = Tape::new();
    let l = eval(&tape);
    tape.backward(&l).unwrap();
    for p in model.params() {
        let g = values(
            &p.grad()
                .unwrap_or_else(|| panic!("{name}: no gradient for {}", p.name())),
        );
        let base = values(p.value());
        let step = (base.len() / 12).max(1);
        for j in (0..base.len()).step_by(step) {
            let mut v = base.clone();
            v[j] += H;
            p.set(&Tensor::from_vec(v.clone(), p.shape(), &DEV).unwrap())
                .unwrap();
            let fp = eval(&Tape::new()).value().to_scalar::<f64>().unwrap();
            v[j] -= 2.0 * H;
            p.set(&Tensor::from_vec(v, p.shape(), &DEV).unwrap())
                .unwrap();
            let fm = eval(&Tape::new()).value().to_scalar::<f64>().unwrap();
            p.set(&Tensor::from_vec(base.clone(), p.shape(), &DEV).unwrap())
                .unwrap();
            let num = (fp - fm) / (2.0 * H);
            assert!(
                (num - g[j]).abs() <= 1e-5 * (1.0 + num.abs()),
                "{name}: {} [{j}]: tape {} vs {num}",
                p.name(),
                g[j]
            );
        }
    }
}

#[test]
fn layers_dense() {
    let x = rand(&[4, 6], -1.0, 1.0, 61);
    let y = Tensor::from_vec(vec![0i32, 2, 1, 2], &[4], &DEV).unwrap();
    for m in [1, 3] {
        check_model(
            "mlp relu",
            r#"layers = [{ linear = 5, act = "relu" }, { linear = 3 }]"#,
            &[6],
            &x,
            &y,
            m,
        );
        check_model(
            "mlp gelu tanh",
            r#"layers = [{ linear = 5, act = "gelu" }, { linear = 4, act = "tanh" }, { linear = 3 }]"#,
            &[6],
            &x,
            &y,
            m,
        );
        check_model(
            "layernorm",
            r#"layers = [{ linear = 5 }, { layernorm = true }, { act = "tanh" }, { linear = 3 }]"#,
            &[6],
            &x,
            &y,
            m,
        );
    }
}

#[test]
fn layers_conv() {
    let x = rand(&[2, 2 * 6 * 6], -1.0, 1.0, 71);
    let y = Tensor::from_vec(vec![1i32, 0], &[2], &DEV).unwrap();
    let spec = r#"layers = [{ conv = 3, kernel = 3, padding = 1, act = "tanh" }, { maxpool = 2 }, { conv = 2, kernel = 3, padding = 1 }, { flatten = true }, { linear = 2 }]"#;
    for m in [1, 2] {
        check_model("cnn", spec, &[2, 6, 6], &x, &y, m);
    }
}

#[test]
fn layers_embedding() {
    let ids = Tensor::from_vec(vec![0i32, 4, 2, 2, 1, 3], &[2, 3], &DEV).unwrap();
    let y = Tensor::from_vec(vec![1i32, 0], &[2], &DEV).unwrap();
    for m in [1, 2] {
        check_model(
            "embedding",
            r#"layers = [{ embedding = 3, vocab = 5 }, { linear = 2 }, { flatten = true }, { linear = 2 }]"#,
            &[3],
            &ids,
            &y,
            m,
        );
        check_model(
            "embedding_bag",
            r#"layers = [{ embedding_bag = 4, vocab = 5 }, { linear = 2 }]"#,
            &[3],
            &ids,
            &y,
            m,
        );
    }
}

#[test]
fn dropout_is_seeded_and_differentiated_through_its_mask() {
    let spec =
        ModelSpec::from_toml(r#"layers = [{ linear = 8 }, { dropout = 0.5 }, { linear = 3 }]"#)
            .unwrap();
    let opts = BuildOptions {
        dtype: DType::F64,
        device: DEV,
        seeds: vec![3],
    };
    let x = rand(&[4, 5], -1.0, 1.0, 81);
    let run = || {
        let model = spec.build(&[5], &opts).unwrap();
        let tape = Tape::new();
        let a = model.forward(&tape, &x).unwrap();
        let b = model.forward(&tape, &x).unwrap();
        (values(a.value()), values(b.value()))
    };
    let (a1, b1) = run();
    let (a2, _) = run();
    assert_eq!(a1, a2, "same seed, same masks");
    assert_ne!(a1, b1, "successive calls draw new masks");
    let zeros = a1.iter().filter(|v| **v == 0.0).count();
    assert!(zeros < a1.len(), "not everything dropped");
    // eval mode: identity, so the two calls agree
    let model = spec.build(&[5], &opts).unwrap();
    let tape = Tape::new();
    tape.set_training(false);
    let a = model.forward(&tape, &x).unwrap();
    let b = model.forward(&tape, &x).unwrap();
    assert_eq!(values(a.value()), values(b.value()));
    // gradient through a fixed mask: the dropout layer alone, mask draw reset between evaluations
    let d = cohort_autograd::nn::Dropout::new(0.3, 5).unwrap();
    check("dropout", &[rand(&[3, 4], -1.0, 1.0, 82)], |v| {
        d.set_calls(0);
        Ok(d.forward(&Tape::new(), Features::members(v[0].clone()))?
            .var)
    });
}

#[test]
fn fused_members_match_lone_models() {
    let spec = ModelSpec::from_toml(r#"layers = [{ conv = 2, kernel = 3, act = "relu" }, { maxpool = 2 }, { flatten = true }, { linear = 3 }]"#).unwrap();
    let x = rand(&[3, 36], -1.0, 1.0, 91);
    let y = Tensor::from_vec(vec![2i32, 0, 1], &[3], &DEV).unwrap();
    let fused = spec
        .build(
            &[1, 6, 6],
            &BuildOptions {
                dtype: DType::F64,
                device: DEV,
                seeds: vec![5, 6, 7],
            },
        )
        .unwrap();
    let tape = Tape::new();
    let out = fused.forward(&tape, &x).unwrap();
    tape.backward(&loss::cross_entropy(&out, &y).unwrap())
        .unwrap();
    for (m, seed) in [5u64, 6, 7].into_iter().enumerate() {
        let lone = spec
            .build(
                &[1, 6, 6],
                &BuildOptions {
                    dtype: DType::F64,
                    device: DEV,
                    seeds: vec![seed],
                },
            )
            .unwrap();
        let tape = Tape::new();
        let o = lone.forward(&tape, &x).unwrap();
        tape.backward(&loss::cross_entropy(&o, &y).unwrap())
            .unwrap();
        let fo = values(&out.value().narrow(0, m, 1).unwrap());
        for (a, b) in fo.iter().zip(values(o.value())) {
            assert!((a - b).abs() < 1e-12, "member {m} output");
        }
        for (pf, pl) in fused.params().iter().zip(lone.params()) {
            assert_eq!(pf.name(), pl.name());
            let gf = pf.grad().unwrap().narrow(0, m, 1).unwrap();
            for (a, b) in values(&gf).iter().zip(values(&pl.grad().unwrap())) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "member {m} gradient of {}",
                    pf.name()
                );
            }
            for (a, b) in values(&pf.member(m).unwrap())
                .iter()
                .zip(values(pl.value()))
            {
                assert_eq!(*a, b, "member {m} initial {}", pf.name());
            }
        }
    }
}
