//! The layers beyond the model spec (batch norm, pools, residuals, attention, transformer blocks, positions): finite
//! differences in f64 on the CPU for every parameter, fused members against lone models, batch-norm statistics
//! against PyTorch's formula, causal and padding masks, shape errors; the fused-vs-lone check and a training step
//! against the CPU on every device.
//! On a GPU: `cargo test -p cohort-autograd --features cohort-tensor/cuda --test layers -- --include-ignored`.

use cohort_autograd::nn::{
    Activation, ActivationKind, AvgPool2d, BatchNorm, Conv2d, Embedding, Features, Flatten,
    GlobalAvgPool, Layout, Linear, MaxPool2d, Module, MultiHeadAttention, PoolMode,
    PositionalEmbedding, Residual, SequencePool, Sequential, TransformerBlock,
};
use cohort_autograd::{Error, Param, Result, Tape, Var};
use cohort_tensor::{DType, Device, Tensor};

const CPU: Device = Device::Cpu;
const H: f64 = 1e-6;

fn rand(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_uniform(shape, -1.0, 1.0, DType::F64, seed, &CPU).unwrap()
}

/// The elements as f64 on the host.
fn host(t: &Tensor) -> Vec<f64> {
    t.to_device(&CPU)
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec::<f64>())
        .expect("reading a tensor back")
}

fn ids(v: Vec<i32>, shape: &[usize], dev: &Device) -> Tensor {
    Tensor::from_vec(v, shape, dev).unwrap()
}

/// Seeds of layer `i` (distinct per layer, the same for member `m` whatever the number of members).
fn layer(seeds: &[u64], i: u64) -> Vec<u64> {
    seeds.iter().map(|&s| s.wrapping_mul(1000) + i).collect()
}

/// `sum(out * r)` of the network's output seen per member.
fn objective(net: &dyn Module, tape: &Tape, x: Features, m: usize, r: &Tensor) -> Result<Var> {
    let out = net.forward(tape, x)?.into_members(m)?;
    out.mul(&Var::constant(r.clone()))?.sum_all()
}

/// Every parameter's gradient (about a dozen elements each) and a float input's against central differences.
fn check_net(name: &str, net: &dyn Module, x: &Features, m: usize, training: bool) {
    for (_, p) in net.params() {
        p.zero_grad();
    }
    let tape = Tape::new();
    tape.set_training(training);
    let float_input = x.var.dtype() == DType::F64;
    let xin = if float_input {
        tape.watch(x.var.value().clone())
    } else {
        x.var.clone()
    };
    let feats = |v: Var| Features::new(v, x.layout).with_mask(x.mask.clone());
    let out = net
        .forward(&tape, feats(xin.clone()))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_members(m)
        .unwrap();
    let r = rand(out.shape(), 99);
    let l = out
        .mul(&Var::constant(r.clone()))
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = tape.backward(&l).unwrap();
    let f = |xt: &Tensor| -> f64 {
        let t = Tape::new();
        t.set_training(training);
        objective(net, &t, feats(Var::constant(xt.clone())), m, &r)
            .unwrap()
            .value()
            .to_scalar::<f64>()
            .unwrap()
    };
    let close = |num: f64, got: f64, what: &str| {
        assert!(
            (num - got).abs() <= 1e-5 * (1.0 + num.abs()),
            "{name}: {what}: tape {got} vs finite difference {num}"
        );
    };
    let params = net.params();
    assert!(!params.is_empty(), "{name}: no parameters");
    for (pname, p) in params {
        let g = host(
            &p.grad()
                .unwrap_or_else(|| panic!("{name}: no gradient for {pname}")),
        );
        let base = host(p.value());
        for j in (0..base.len()).step_by((base.len() / 12).max(1)) {
            let mut v = base.clone();
            v[j] += H;
            p.set(&Tensor::from_vec(v.clone(), p.shape(), &CPU).unwrap())
                .unwrap();
            let fp = f(x.var.value());
            v[j] -= 2.0 * H;
            p.set(&Tensor::from_vec(v, p.shape(), &CPU).unwrap())
                .unwrap();
            let fm = f(x.var.value());
            p.set(&Tensor::from_vec(base.clone(), p.shape(), &CPU).unwrap())
                .unwrap();
            close((fp - fm) / (2.0 * H), g[j], &format!("{pname} [{j}]"));
        }
    }
    if float_input {
        let g = host(grads.get(&xin).expect("input gradient"));
        let base = host(x.var.value());
        let s = x.var.shape();
        for j in (0..base.len()).step_by((base.len() / 16).max(1)) {
            let mut v = base.clone();
            v[j] += H;
            let fp = f(&Tensor::from_vec(v.clone(), s, &CPU).unwrap());
            v[j] -= 2.0 * H;
            let fm = f(&Tensor::from_vec(v, s, &CPU).unwrap());
            close((fp - fm) / (2.0 * H), g[j], &format!("input [{j}]"));
        }
    }
}

fn seq(layers: Vec<Box<dyn Module>>) -> Sequential {
    let mut s = Sequential::new();
    for l in layers {
        s.push_boxed(l);
    }
    s
}

fn tanh() -> Box<dyn Module> {
    Box::new(Activation(ActivationKind::Tanh))
}

fn bn(c: usize, m: usize, dt: DType, dev: &Device) -> Result<Box<dyn Module>> {
    Ok(Box::new(BatchNorm::new(
        c,
        BatchNorm::EPS,
        BatchNorm::MOMENTUM,
        m,
        dt,
        dev,
    )?))
}

#[allow(clippy::too_many_arguments)]
fn conv(
    i: usize,
    o: usize,
    k: usize,
    st: usize,
    p: usize,
    s: &[u64],
    dt: DType,
    dev: &Device,
) -> Result<Box<dyn Module>> {
    Ok(Box::new(Conv2d::new(i, o, k, st, p, 1.0, s, dt, dev)?))
}

fn linear(
    i: usize,
    o: usize,
    bias: bool,
    s: &[u64],
    dt: DType,
    dev: &Device,
) -> Result<Box<dyn Module>> {
    Ok(Box::new(Linear::new(i, o, bias, 1.0, s, dt, dev)?))
}

// ---------------------------------------------------------------- networks shared by several tests

/// Batch norm on a shared image and on packed features, max pool with overlapping windows, average pool, global
/// average pool, a head.
fn conv_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    let m = seeds.len();
    Ok(seq(vec![
        bn(2, m, dt, dev)?,
        conv(2, 3, 3, 1, 1, &layer(seeds, 1), dt, dev)?,
        bn(3, m, dt, dev)?,
        tanh(),
        Box::new(MaxPool2d::new(3, 2)),
        Box::new(AvgPool2d::new(2, 1)),
        Box::new(GlobalAvgPool::new(m)),
        linear(3, 2, true, &layer(seeds, 2), dt, dev)?,
    ]))
}

fn conv_input(dt: DType, dev: &Device) -> Result<Features> {
    Ok(Features::shared(Var::constant(
        rand(&[3, 2, 7, 7], 11).to_dtype(dt)?.to_device(dev)?,
    )))
}

/// Residual blocks on images: a projected one (strided) from a shared image, an identity one on packed features.
fn residual_conv_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    let m = seeds.len();
    let inner = seq(vec![
        conv(2, 4, 3, 2, 1, &layer(seeds, 1), dt, dev)?,
        bn(4, m, dt, dev)?,
        tanh(),
        conv(4, 4, 3, 1, 1, &layer(seeds, 2), dt, dev)?,
    ]);
    let proj = conv(2, 4, 1, 2, 0, &layer(seeds, 3), dt, dev)?;
    let inner2 = seq(vec![
        conv(4, 4, 3, 1, 1, &layer(seeds, 4), dt, dev)?,
        tanh(),
    ]);
    Ok(seq(vec![
        Box::new(Residual::new(inner, Some(proj), m)),
        Box::new(Residual::new(inner2, None, m)),
        Box::new(GlobalAvgPool::new(m)),
        linear(4, 3, true, &layer(seeds, 5), dt, dev)?,
    ]))
}

fn residual_conv_input(dt: DType, dev: &Device) -> Result<Features> {
    Ok(Features::shared(Var::constant(
        rand(&[2, 2, 6, 6], 12).to_dtype(dt)?.to_device(dev)?,
    )))
}

/// Identity residuals on a shared input and on per-member features, batch norm on dense features, a projected
/// residual (a Linear without bias).
fn residual_dense_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    let m = seeds.len();
    Ok(seq(vec![
        Box::new(Residual::new(
            seq(vec![linear(4, 4, true, &layer(seeds, 1), dt, dev)?, tanh()]),
            None,
            m,
        )),
        linear(4, 6, true, &layer(seeds, 2), dt, dev)?,
        bn(6, m, dt, dev)?,
        tanh(),
        Box::new(Residual::new(
            seq(vec![
                linear(6, 6, true, &layer(seeds, 3), dt, dev)?,
                tanh(),
                linear(6, 6, true, &layer(seeds, 4), dt, dev)?,
            ]),
            None,
            m,
        )),
        Box::new(Residual::new(
            seq(vec![linear(6, 3, true, &layer(seeds, 5), dt, dev)?]),
            Some(linear(6, 3, false, &layer(seeds, 6), dt, dev)?),
            m,
        )),
        linear(3, 2, true, &layer(seeds, 7), dt, dev)?,
    ]))
}

fn dense_input(dt: DType, dev: &Device) -> Result<Features> {
    Ok(Features::shared(Var::constant(
        rand(&[5, 4], 13).to_dtype(dt)?.to_device(dev)?,
    )))
}

/// Token ids (padding id 0 at the ends), learned positions, a bidirectional and a causal transformer block, a
/// mean over the real tokens, a head.
fn transformer_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    Ok(seq(vec![
        Box::new(Embedding::new(7, 8, &layer(seeds, 1), dt, dev)?.with_padding(0)),
        Box::new(PositionalEmbedding::new(6, 8, &layer(seeds, 2), dt, dev)?),
        Box::new(TransformerBlock::new(
            8,
            2,
            12,
            0.0,
            false,
            &layer(seeds, 3),
            dt,
            dev,
        )?),
        Box::new(TransformerBlock::new(
            8,
            4,
            12,
            0.0,
            true,
            &layer(seeds, 4),
            dt,
            dev,
        )?),
        Box::new(SequencePool::new(PoolMode::Mean)),
        linear(8, 3, true, &layer(seeds, 5), dt, dev)?,
    ]))
}

fn token_input(_dt: DType, dev: &Device) -> Result<Features> {
    Ok(Features::shared(Var::constant(ids(
        vec![3, 1, 4, 0, 0, 2, 6, 5, 3, 1],
        &[2, 5],
        dev,
    ))))
}

/// Attention (causal) on per-member sequences with per-member padding masks, batch norm on `[M, B, L, D]`, the
/// first position, a head.
fn attention_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    let m = seeds.len();
    Ok(seq(vec![
        bn(6, m, dt, dev)?,
        Box::new(MultiHeadAttention::new(
            6,
            3,
            true,
            &layer(seeds, 1),
            dt,
            dev,
        )?),
        Box::new(MultiHeadAttention::new(
            6,
            2,
            false,
            &layer(seeds, 2),
            dt,
            dev,
        )?),
        Box::new(SequencePool::new(PoolMode::First)),
        linear(6, 2, true, &layer(seeds, 3), dt, dev)?,
    ]))
}

/// Per-member sequences `[M, 2, 4, 6]` whose last positions are padding, differently per member.
fn attention_input(m: usize, dt: DType, dev: &Device) -> Result<Features> {
    let x = rand(&[m, 2, 4, 6], 14).to_dtype(dt)?.to_device(dev)?;
    let mask: Vec<f64> = (0..m * 2 * 4)
        .map(|i| {
            let (mi, bi, t) = (i / 8, (i / 4) % 2, i % 4);
            if t + (mi + bi) % 2 < 4 { 1.0 } else { 0.0 }
        })
        .collect();
    let mask = Tensor::from_vec(mask, &[m, 2, 4], &CPU)?
        .to_dtype(dt)?
        .to_device(dev)?;
    Ok(Features::members(Var::constant(x)).with_mask(Some(mask)))
}

/// Per-member images `[M, 2, 2, 4, 4]`: batch norm and average pooling in the members layout.
fn members_image_net(seeds: &[u64], dt: DType, dev: &Device) -> Result<Sequential> {
    let m = seeds.len();
    Ok(seq(vec![
        bn(2, m, dt, dev)?,
        Box::new(AvgPool2d::new(2, 2)),
        Box::new(MaxPool2d::new(2, 1)),
        Box::new(Flatten::new(m)),
        linear(2, 2, true, &layer(seeds, 1), dt, dev)?,
    ]))
}

fn members_image_input(m: usize, dt: DType, dev: &Device) -> Result<Features> {
    Ok(Features::members(Var::constant(
        rand(&[m, 2, 2, 4, 4], 15).to_dtype(dt)?.to_device(dev)?,
    )))
}

type Build = fn(&[u64], DType, &Device) -> Result<Sequential>;

/// Each network with its input for `m` members (a per-member input is cut to member `m` for a lone model).
fn networks(m: usize, dt: DType, dev: &Device) -> Result<Vec<(&'static str, Build, Features)>> {
    Ok(vec![
        ("conv", conv_net as Build, conv_input(dt, dev)?),
        (
            "residual conv",
            residual_conv_net,
            residual_conv_input(dt, dev)?,
        ),
        ("residual dense", residual_dense_net, dense_input(dt, dev)?),
        ("transformer", transformer_net, token_input(dt, dev)?),
        ("attention", attention_net, attention_input(m, dt, dev)?),
        (
            "members image",
            members_image_net,
            members_image_input(m, dt, dev)?,
        ),
    ])
}

// ---------------------------------------------------------------- gradients

#[test]
fn every_new_layer_matches_finite_differences() {
    for m in [1, 2] {
        let seeds: Vec<u64> = (0..m as u64).map(|s| 20 + s).collect();
        for (name, build, x) in networks(m, DType::F64, &CPU).unwrap() {
            let net = build(&seeds, DType::F64, &CPU).unwrap();
            check_net(&format!("{name} M={m} training"), &net, &x, m, true);
            // Evaluation after the training steps above moved the running statistics off their start.
            check_net(&format!("{name} M={m} eval"), &net, &x, m, false);
        }
    }
}

#[test]
fn single_layers_match_finite_differences() {
    let dt = DType::F64;
    for m in [1, 3] {
        let seeds: Vec<u64> = (0..m as u64).map(|s| 30 + s).collect();
        // batch norm straight on packed features, and on shared dense sequences
        let packed = Features::packed(Var::constant(rand(&[3, 2 * m, 3, 3], 31)));
        check_net(
            "batchnorm packed",
            &seq(vec![bn(2, m, dt, &CPU).unwrap()]),
            &packed,
            m,
            true,
        );
        let shared_seq = Features::shared(Var::constant(rand(&[2, 3, 4], 32)));
        check_net(
            "batchnorm shared dense",
            &seq(vec![bn(4, m, dt, &CPU).unwrap()]),
            &shared_seq,
            m,
            true,
        );
        // attention on a shared float sequence, with a shared padding mask
        let mask = Tensor::from_vec(vec![1.0f64, 1.0, 0.0, 1.0, 1.0, 1.0], &[2, 3], &CPU).unwrap();
        let attn = MultiHeadAttention::new(4, 2, false, &seeds, dt, &CPU).unwrap();
        check_net(
            "attention shared",
            &attn,
            &shared_seq.clone().with_mask(Some(mask.clone())),
            m,
            true,
        );
        // a transformer block with its MLP, causal, on a shared sequence
        let block = TransformerBlock::new(4, 1, 5, 0.0, true, &seeds, dt, &CPU).unwrap();
        check_net("transformer shared", &block, &shared_seq, m, true);
        // positions added to a shared sequence; the mean pool over a shared mask
        let pos = PositionalEmbedding::new(4, 4, &seeds, dt, &CPU).unwrap();
        let pooled = seq(vec![
            Box::new(pos),
            Box::new(SequencePool::new(PoolMode::Mean)),
        ]);
        check_net(
            "positional + mean pool",
            &pooled,
            &shared_seq.clone().with_mask(Some(mask)),
            m,
            true,
        );
    }
}

// ---------------------------------------------------------------- fused members against lone models

/// Member `m` of a fused network of seeds `[5, 6, 7]` has the output, gradients, initial parameters and (after
/// the step) buffers of a lone network of seed `5 + m`.
fn fused_members_match_lone_models(dev: &Device) -> Result<()> {
    let (dt, tol) = if dev.is_cuda() {
        (DType::F32, 1e-5)
    } else {
        (DType::F64, 1e-12)
    };
    let seeds = [5u64, 6, 7];
    let m = seeds.len();
    for (name, build, x) in networks(m, dt, dev)? {
        let fused = build(&seeds, dt, dev)?;
        let tape = Tape::new();
        let out = fused.forward(&tape, x.clone())?.into_members(m)?;
        let r = Tensor::rand_uniform(out.shape(), -1.0, 1.0, dt, 77, dev)?;
        tape.backward(&out.mul(&Var::constant(r.clone()))?.sum_all()?)?;
        for (mi, &seed) in seeds.iter().enumerate() {
            let lone = build(&[seed], dt, dev)?;
            let xl = match x.layout {
                Layout::Members => Features::members(Var::constant(
                    x.var.value().narrow(0, mi, 1)?,
                ))
                .with_mask(match &x.mask {
                    Some(k) => Some(k.narrow(0, mi, 1)?),
                    None => None,
                }),
                _ => x.clone(),
            };
            let tape = Tape::new();
            let o = lone.forward(&tape, xl)?.into_members(1)?;
            tape.backward(&o.mul(&Var::constant(r.narrow(0, mi, 1)?))?.sum_all()?)?;
            let near = |a: &[f64], b: &[f64], what: &str| {
                assert_eq!(a.len(), b.len(), "{name}: member {mi} {what}: sizes");
                for (j, (p, q)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (p - q).abs() <= tol * (1.0 + q.abs()),
                        "{name}: member {mi} {what} [{j}]: fused {p}, lone {q}"
                    );
                }
            };
            near(
                &host(&out.value().narrow(0, mi, 1)?),
                &host(o.value()),
                "output",
            );
            let pair = |f: Vec<(String, Param)>, l: Vec<(String, Param)>| {
                assert_eq!(f.len(), l.len(), "{name}: parameter counts");
                f.into_iter().zip(l)
            };
            for ((nf, pf), (nl, pl)) in pair(fused.params(), lone.params()) {
                assert_eq!(nf, nl);
                assert_eq!(pf.name(), nf, "{name}: a parameter's own name");
                let gf = pf.grad().expect("fused gradient").narrow(0, mi, 1)?;
                near(&host(&gf), &host(&pl.grad().expect("lone gradient")), &nf);
                assert_eq!(
                    host(&pf.member(mi)?),
                    host(&pl.member(0)?),
                    "{name}: initial {nf}"
                );
            }
            for ((nf, pf), (nl, pl)) in pair(fused.buffers(), lone.buffers()) {
                assert_eq!(nf, nl);
                near(&host(&pf.member(mi)?), &host(&pl.member(0)?), &nf);
            }
        }
    }
    Ok(())
}

/// A training step of the conv and transformer networks in f32 gives this device the CPU's output and gradients
/// (parameters copied from a CPU build); every parameter gets a finite, nonzero gradient.
fn training_step_matches_cpu(dev: &Device) -> Result<()> {
    let seeds = [3u64, 4];
    let step = |build: Build, x: &Features, on: &Device| -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
        let net = build(&seeds, DType::F32, on)?;
        let reference = build(&seeds, DType::F32, &CPU)?;
        for ((_, p), (_, q)) in net.params().into_iter().zip(reference.params()) {
            p.set(q.value())?;
        }
        let xv = Var::constant(x.var.value().to_device(on)?);
        let mask = match &x.mask {
            Some(k) => Some(k.to_device(on)?),
            None => None,
        };
        let tape = Tape::new();
        let out = net
            .forward(&tape, Features::new(xv, x.layout).with_mask(mask))?
            .into_members(2)?;
        let r = Tensor::rand_uniform(out.shape(), -1.0, 1.0, DType::F32, 5, &CPU)?.to_device(on)?;
        tape.backward(&out.mul(&Var::constant(r))?.sum_all()?)?;
        let grads = net
            .params()
            .iter()
            .map(|(_, p)| host(&p.grad().expect("a gradient")))
            .collect();
        Ok((host(out.value()), grads))
    };
    for (name, build, x) in [
        ("conv", conv_net as Build, conv_input(DType::F32, &CPU)?),
        (
            "transformer",
            transformer_net,
            token_input(DType::F32, &CPU)?,
        ),
        (
            "attention",
            attention_net,
            attention_input(2, DType::F32, &CPU)?,
        ),
    ] {
        let (out, grads) = step(build, &x, dev)?;
        let (want_out, want_grads) = step(build, &x, &CPU)?;
        let near = |a: &[f64], b: &[f64], what: &str| {
            assert_eq!(a.len(), b.len());
            for (j, (p, q)) in a.iter().zip(b).enumerate() {
                assert!(
                    p.is_finite() && (p - q).abs() <= 1e-3 * (1.0 + q.abs()),
                    "{name} on {dev:?}: {what} [{j}]: {p}, cpu {q}"
                );
            }
        };
        near(&out, &want_out, "output");
        for (i, (g, w)) in grads.iter().zip(&want_grads).enumerate() {
            near(g, w, &format!("gradient {i}"));
            assert!(
                g.iter().any(|v| *v != 0.0),
                "{name}: gradient {i} is all zeros"
            );
        }
    }
    Ok(())
}

macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $name() -> cohort_autograd::Result<()> {
                    super::$name(&cohort_tensor::Device::Cpu)
                }
            )*
        }
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU"]
                fn $name() -> cohort_autograd::Result<()> {
                    super::$name(&cohort_tensor::Device::Cuda(0))
                }
            )*
        }
    };
}

device_tests!(fused_members_match_lone_models, training_step_matches_cpu);

// ---------------------------------------------------------------- batch norm

/// Per (member, channel) mean and unbiased variance of `[M, N, C]` values.
fn stats(v: &[f64], m: usize, n: usize, c: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut mean, mut var) = (vec![0.0; m * c], vec![0.0; m * c]);
    for mi in 0..m {
        for ci in 0..c {
            let xs: Vec<f64> = (0..n).map(|i| v[(mi * n + i) * c + ci]).collect();
            let mu = xs.iter().sum::<f64>() / n as f64;
            mean[mi * c + ci] = mu;
            var[mi * c + ci] = xs.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / (n - 1) as f64;
        }
    }
    (mean, var)
}

fn assert_near(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    for (j, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol, "{what} [{j}]: {a}, want {b}");
    }
}

#[test]
fn batchnorm_running_statistics_follow_pytorch() {
    let (m, b, c) = (2, 5, 3);
    let norm = BatchNorm::new(c, 1e-5, 0.1, m, DType::F64, &CPU).unwrap();
    // Members see different inputs (member 1's shifted and scaled).
    let x0 = rand(&[1, b, c], 41);
    let x1 = x0.mul_scalar(3.0).unwrap().add_scalar(2.0).unwrap();
    let x = Tensor::cat(&[&x0, &x1], 0).unwrap();
    let storage = norm.running_mean().value().clone();
    let tape = Tape::new();
    let y = norm
        .forward(&tape, Features::members(Var::constant(x.clone())))
        .unwrap();
    let (mean, var) = stats(&host(&x), m, b, c);
    let rm: Vec<f64> = mean.iter().map(|v| 0.1 * v).collect();
    let rv: Vec<f64> = var.iter().map(|v| 0.9 + 0.1 * v).collect();
    assert_near(
        &host(norm.running_mean().value()),
        &rm,
        1e-12,
        "running_mean",
    );
    assert_near(&host(norm.running_var().value()), &rv, 1e-12, "running_var");
    assert!(
        storage.same_storage(norm.running_mean().value()),
        "updated in place"
    );
    let got = host(norm.running_mean().value());
    assert!(
        (got[0] - got[c]).abs() > 0.1,
        "members keep their own statistics"
    );
    // training normalizes with the batch's biased variance
    let yv = host(y.var.value());
    for mi in 0..m {
        for ci in 0..c {
            let k = mi * c + ci;
            let biased = var[k] * (b - 1) as f64 / b as f64;
            let want = (host(&x)[mi * b * c + ci] - mean[k]) / (biased + 1e-5).sqrt();
            assert!(
                (yv[mi * b * c + ci] - want).abs() < 1e-10,
                "training output"
            );
        }
    }
    // a second step moves them again; evaluation neither moves them nor uses the batch
    let _ = norm
        .forward(&tape, Features::members(Var::constant(x.clone())))
        .unwrap();
    let rm2: Vec<f64> = rm
        .iter()
        .zip(&mean)
        .map(|(r, v)| 0.9 * r + 0.1 * v)
        .collect();
    assert_near(
        &host(norm.running_mean().value()),
        &rm2,
        1e-12,
        "running_mean after two steps",
    );
    let before = host(norm.running_var().value());
    tape.set_training(false);
    let e = norm
        .forward(&tape, Features::members(Var::constant(x.clone())))
        .unwrap();
    assert_eq!(
        host(norm.running_var().value()),
        before,
        "evaluation keeps the statistics"
    );
    let ev = host(e.var.value());
    let want = (host(&x)[0] - rm2[0]) / (before[0] + 1e-5).sqrt();
    assert!(
        (ev[0] - want).abs() < 1e-12,
        "evaluation uses the running statistics"
    );
    assert!(
        (ev[0] - yv[0]).abs() > 1e-3,
        "train and eval outputs differ"
    );
}

#[test]
fn batchnorm_statistics_of_packed_and_shared_images() {
    let (m, b, c, hw) = (2, 3, 2, 4);
    // packed [B, M*C, 2, 2]: statistics per (member, channel) over B, H, W
    let x = rand(&[b, m * c, 2, 2], 42);
    let norm = BatchNorm::new(c, 1e-5, 0.1, m, DType::F64, &CPU).unwrap();
    let y = norm
        .forward(&Tape::new(), Features::packed(Var::constant(x.clone())))
        .unwrap();
    assert_eq!((y.layout, y.var.shape()), (Layout::Packed, x.shape()));
    let xv = host(&x);
    // as [M, N, C] with N = B*H*W
    let mut per = vec![0.0; m * b * hw * c];
    for bi in 0..b {
        for mi in 0..m {
            for ci in 0..c {
                for p in 0..hw {
                    per[(mi * b * hw + bi * hw + p) * c + ci] =
                        xv[((bi * m + mi) * c + ci) * hw + p];
                }
            }
        }
    }
    let (mean, var) = stats(&per, m, b * hw, c);
    assert_near(
        &host(norm.running_mean().value()),
        &mean.iter().map(|v| 0.1 * v).collect::<Vec<_>>(),
        1e-12,
        "packed running_mean",
    );
    assert_near(
        &host(norm.running_var().value()),
        &var.iter().map(|v| 0.9 + 0.1 * v).collect::<Vec<_>>(),
        1e-12,
        "packed running_var",
    );
    // a shared image gives every member the same statistics and packed outputs
    let shared = rand(&[b, c, 2, 2], 43);
    let norm = BatchNorm::new(c, 1e-5, 0.1, m, DType::F64, &CPU).unwrap();
    let y = norm
        .forward(&Tape::new(), Features::shared(Var::constant(shared)))
        .unwrap();
    assert_eq!(
        (y.layout, y.var.shape()),
        (Layout::Packed, &[b, m * c, 2, 2][..])
    );
    let rm = host(norm.running_mean().value());
    assert_eq!(rm[..c], rm[c..], "shared input, shared statistics");
    assert!(rm.iter().any(|v| *v != 0.0));
}

#[test]
fn buffers_are_named_like_parameters_and_get_no_gradient() {
    let dt = DType::F64;
    let inner = seq(vec![
        conv(1, 2, 3, 1, 1, &[1], dt, &CPU).unwrap(),
        bn(2, 1, dt, &CPU).unwrap(),
    ]);
    let net = seq(vec![
        Box::new(Residual::new(inner, None, 1)),
        bn(2, 1, dt, &CPU).unwrap(),
    ]);
    let names: Vec<String> = net.buffers().iter().map(|(_, p)| p.name()).collect();
    assert_eq!(
        names,
        [
            "layers.0.inner.layers.1.running_mean",
            "layers.0.inner.layers.1.running_var",
            "layers.1.running_mean",
            "layers.1.running_var"
        ]
    );
    let params: Vec<String> = net.params().iter().map(|(_, p)| p.name()).collect();
    assert_eq!(params[0], "layers.0.inner.layers.0.weight");
    assert!(params.iter().all(|n| !n.contains("running")), "{params:?}");
    // A shortcut of one channel meets two: the residual refuses it below; with two channels the step runs.
    let x = Features::shared(Var::constant(rand(&[2, 1, 4, 4], 44)));
    let err = net.forward(&Tape::new(), x).unwrap_err().to_string();
    assert!(err.contains("projection"), "{err}");
    let inner = seq(vec![
        conv(2, 2, 3, 1, 1, &[1], dt, &CPU).unwrap(),
        bn(2, 1, dt, &CPU).unwrap(),
    ]);
    let net = seq(vec![Box::new(Residual::new(inner, None, 1))]);
    let tape = Tape::new();
    let y = net
        .forward(
            &tape,
            Features::shared(Var::constant(rand(&[2, 2, 4, 4], 45))),
        )
        .unwrap();
    tape.backward(&y.var.sum_all().unwrap()).unwrap();
    for (n, p) in net.buffers() {
        assert!(p.grad().is_none(), "{n} got a gradient");
    }
    assert!(net.params().iter().all(|(_, p)| p.grad().is_some()));
}

// ---------------------------------------------------------------- masks

#[test]
fn causal_attention_ignores_later_tokens() {
    let x = rand(&[2, 1, 5, 4], 51);
    // the same sequences with positions 3.. changed
    let mut v = host(&x);
    for (i, e) in v.iter_mut().enumerate() {
        if (i / 4) % 5 >= 3 {
            *e += 0.5;
        }
    }
    let x2 = Tensor::from_vec(v, &[2, 1, 5, 4], &CPU).unwrap();
    for causal in [true, false] {
        let attn = MultiHeadAttention::new(4, 2, causal, &[1, 2], DType::F64, &CPU).unwrap();
        let block = TransformerBlock::new(4, 2, 6, 0.0, causal, &[3, 4], DType::F64, &CPU).unwrap();
        let net = seq(vec![Box::new(attn), Box::new(block)]);
        let run = |t: &Tensor| {
            let y = net
                .forward(&Tape::new(), Features::members(Var::constant(t.clone())))
                .unwrap();
            host(&y.var.value().narrow(2, 0, 3).unwrap())
        };
        let (a, b) = (run(&x), run(&x2));
        let same = a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-12);
        assert_eq!(same, causal, "causal {causal}: positions 0..3 unchanged");
    }
}

/// Token ids through an embedding, positions, attention and a transformer block, then a mean pool.
fn padded_net() -> Sequential {
    let dt = DType::F64;
    seq(vec![
        Box::new(
            Embedding::new(6, 4, &[1, 2], dt, &CPU)
                .unwrap()
                .with_padding(0),
        ),
        Box::new(PositionalEmbedding::new(8, 4, &[3, 4], dt, &CPU).unwrap()),
        Box::new(MultiHeadAttention::new(4, 2, false, &[5, 6], dt, &CPU).unwrap()),
        Box::new(TransformerBlock::new(4, 2, 6, 0.0, false, &[7, 8], dt, &CPU).unwrap()),
    ])
}

#[test]
fn padding_does_not_reach_real_tokens() {
    let net = padded_net();
    let run = |t: Vec<i32>, mask: Option<Tensor>| {
        let l = t.len();
        let x = Features::shared(Var::constant(ids(t, &[1, l], &CPU))).with_mask(mask);
        net.forward(&Tape::new(), x).unwrap()
    };
    // a padded sequence's real positions are the unpadded sequence's
    let short = run(vec![3, 1, 4], None);
    let padded = run(vec![3, 1, 4, 0, 0], None);
    assert_eq!(
        padded.mask.as_ref().map(host),
        Some(vec![1.0, 1.0, 1.0, 0.0, 0.0])
    );
    let real = host(&padded.var.value().narrow(2, 0, 3).unwrap());
    assert_near(&real, &host(short.var.value()), 1e-12, "real positions");
    // ...and the mean pool over real tokens is the unpadded sequence's mean
    let pool = SequencePool::new(PoolMode::Mean);
    let a = pool.forward(&Tape::new(), padded).unwrap();
    let b = pool.forward(&Tape::new(), short).unwrap();
    assert_near(
        &host(a.var.value()),
        &host(b.var.value()),
        1e-12,
        "mean pool",
    );
    // changing the ids under a given mask changes nothing at the real positions (the embedding passes it on)
    let net = seq(vec![
        Box::new(Embedding::new(6, 4, &[1, 2], DType::F64, &CPU).unwrap()),
        Box::new(MultiHeadAttention::new(4, 2, false, &[5, 6], DType::F64, &CPU).unwrap()),
    ]);
    let mask = Tensor::from_vec(vec![1.0f64, 1.0, 0.0, 1.0], &[1, 4], &CPU).unwrap();
    let run = |t: Vec<i32>| {
        let x =
            Features::shared(Var::constant(ids(t, &[1, 4], &CPU))).with_mask(Some(mask.clone()));
        host(
            &net.forward(&Tape::new(), x)
                .unwrap()
                .var
                .value()
                .narrow(2, 0, 2)
                .unwrap(),
        )
    };
    let (a, b) = (run(vec![2, 5, 1, 3]), run(vec![2, 5, 4, 3]));
    assert_near(&a, &b, 1e-12, "real positions under a changed padded id");
    let c = run(vec![2, 5, 1, 4]);
    assert!(
        a.iter().zip(&c).any(|(p, q)| (p - q).abs() > 1e-6),
        "a real token's change shows"
    );
}

// ---------------------------------------------------------------- shapes and errors

fn shape_error(r: Result<Features>) -> String {
    match r {
        Err(e @ Error::Shape { .. }) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn errors_name_the_shapes() {
    let dt = DType::F64;
    let e = MultiHeadAttention::new(6, 4, false, &[1], dt, &CPU)
        .unwrap_err()
        .to_string();
    assert!(e.contains("4 heads") && e.contains("width 6"), "{e}");
    assert!(TransformerBlock::new(6, 4, 8, 0.0, false, &[1], dt, &CPU).is_err());
    let attn = MultiHeadAttention::new(4, 2, false, &[1, 2], dt, &CPU).unwrap();
    let dense = Features::members(Var::constant(rand(&[2, 3, 4], 61)));
    let e = shape_error(attn.forward(&Tape::new(), dense));
    assert!(
        e.contains("needs a sequence") && e.contains("embedding"),
        "{e}"
    );
    let image = Features::shared(Var::constant(rand(&[2, 4, 3, 3], 62)));
    assert!(shape_error(attn.forward(&Tape::new(), image)).contains("needs a sequence"));
    let block = TransformerBlock::new(4, 2, 8, 0.0, false, &[1, 2], dt, &CPU).unwrap();
    let flat = Features::members(Var::constant(rand(&[2, 3, 4], 63)));
    assert!(shape_error(block.forward(&Tape::new(), flat)).contains("needs a sequence"));
    // residual: inner 4 -> 5 without a projection
    let res = Residual::new(
        seq(vec![linear(4, 5, true, &[1], dt, &CPU).unwrap()]),
        None,
        1,
    );
    let e = shape_error(res.forward(
        &Tape::new(),
        Features::shared(Var::constant(rand(&[3, 4], 64))),
    ));
    assert!(
        e.contains("[1, 3, 5]") && e.contains("[3, 4]") && e.contains("projection"),
        "{e}"
    );
    // positions: a sequence longer than the table
    let pos = PositionalEmbedding::new(3, 4, &[1], dt, &CPU).unwrap();
    let e = shape_error(pos.forward(
        &Tape::new(),
        Features::shared(Var::constant(rand(&[2, 5, 4], 65))),
    ));
    assert!(e.contains("length 5") && e.contains("max_len 3"), "{e}");
    // batch norm of the wrong width, and of one value per channel while training
    let norm = BatchNorm::new(3, 1e-5, 0.1, 1, dt, &CPU).unwrap();
    assert!(
        shape_error(norm.forward(
            &Tape::new(),
            Features::shared(Var::constant(rand(&[2, 4], 66)))
        ))
        .contains("3 channels")
    );
    let e = shape_error(norm.forward(
        &Tape::new(),
        Features::shared(Var::constant(rand(&[1, 3], 67))),
    ));
    assert!(e.contains("more than one value"), "{e}");
    // pools: windows larger than the image, pooling a non-sequence
    let e = shape_error(AvgPool2d::new(5, 1).forward(
        &Tape::new(),
        Features::shared(Var::constant(rand(&[1, 1, 4, 4], 68))),
    ));
    assert!(e.contains("5x5"), "{e}");
    let e = shape_error(SequencePool::new(PoolMode::Mean).forward(
        &Tape::new(),
        Features::members(Var::constant(rand(&[1, 2, 3], 69))),
    ));
    assert!(e.contains("expected a sequence"), "{e}");
}

#[test]
fn pools_compute_what_they_say() {
    // 1 x 1 x 3 x 3 image 0..9: 2x2 windows, stride 1
    let x = Tensor::from_vec(
        (0..9).map(f64::from).collect::<Vec<_>>(),
        &[1, 1, 3, 3],
        &CPU,
    )
    .unwrap();
    let feats = || Features::shared(Var::constant(x.clone()));
    let avg = AvgPool2d::new(2, 1).forward(&Tape::new(), feats()).unwrap();
    assert_eq!(host(avg.var.value()), [2.0, 3.0, 5.0, 6.0]);
    let max = MaxPool2d::new(2, 1).forward(&Tape::new(), feats()).unwrap();
    assert_eq!(host(max.var.value()), [4.0, 5.0, 7.0, 8.0]);
    let g = GlobalAvgPool::new(2)
        .forward(&Tape::new(), feats())
        .unwrap();
    assert_eq!((g.layout, g.var.shape()), (Layout::Members, &[2, 1, 1][..]));
    assert_eq!(host(g.var.value()), [4.0, 4.0]);
    // sequences [1, 1, 3, 2]: the first position, the mean of the real ones
    let s = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 9.0, 9.0], &[1, 1, 3, 2], &CPU).unwrap();
    let mask = Tensor::from_vec(vec![1.0f64, 1.0, 0.0], &[1, 3], &CPU).unwrap();
    let sf = || Features::members(Var::constant(s.clone())).with_mask(Some(mask.clone()));
    let first = SequencePool::new(PoolMode::First)
        .forward(&Tape::new(), sf())
        .unwrap();
    assert_eq!(host(first.var.value()), [1.0, 2.0]);
    let mean = SequencePool::new(PoolMode::Mean)
        .forward(&Tape::new(), sf())
        .unwrap();
    assert_eq!(host(mean.var.value()), [2.0, 3.0]);
    assert!(mean.mask.is_none(), "pooling consumes the mask");
}

#[test]
fn swap_adjacent_permutes() {
    let x = Tensor::from_vec(
        (0..24).map(f64::from).collect::<Vec<_>>(),
        &[2, 3, 2, 2],
        &CPU,
    )
    .unwrap();
    let y = Var::constant(x).swap_adjacent(1).unwrap();
    assert_eq!(y.shape(), &[2, 2, 3, 2]);
    let v = host(y.value());
    for a in 0..2 {
        for b in 0..2 {
            for c in 0..3 {
                for d in 0..2 {
                    let want = ((a * 3 + c) * 2 + b) * 2 + d;
                    assert_eq!(v[((a * 2 + b) * 3 + c) * 2 + d], want as f64);
                }
            }
        }
    }
    assert!(Var::constant(rand(&[2, 3], 1)).swap_adjacent(1).is_err());
}
