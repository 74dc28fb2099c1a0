//! `cargo xtask profile`: where the time and memory of one fused cohort training step go, per phase (forward, loss,
//! backward, optimizer; wall time with the device drained between phases, and on a GPU each phase's peak over the
//! memory held before the step) and, on a GPU with `COHORT_CUDA_PROFILE=1`, per kernel (GPU time from timing events
//! around every launch and cuBLAS call). The model is the cohort benchmark's MLP, or the `cnn`, `resnet`,
//! `cotrain` (the text classifier) or `transformer` (its widest member) part's on its batch, in any precision.

use anyhow::Result;
use std::time::{Duration, Instant};

use cohort_autograd::{ModelSpec, Tape, loss};
use cohort_tensor::{Device, Precision, Tensor, memory};

use crate::cohort::{self, Trainee};

/// The models a profile can take: the bench parts' own.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Model {
    /// The cohort benchmark's MLP on MNIST-shaped rows.
    Mlp,
    /// The `cnn` part's image CNN on its batch of 128 images 3x64x64.
    Cnn,
    /// The `resnet` part's ResNet on its batch of 128 images 3x32x32.
    Resnet,
    /// The `cotrain` part's text classifier on its batch of 128 documents of 200 tokens.
    Text,
    /// The `transformer` part's widest language model (4 heads, width 256) on its batch of 32 sequences of 128.
    Transformer,
}

#[derive(clap::Args)]
pub struct Args {
    /// Members of the fused model, one profile each.
    #[arg(long, value_delimiter = ',', default_value = "1,128")]
    n: Vec<usize>,
    /// Timed steps per profile.
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Profile on the CPU even where a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// The model profiled.
    #[arg(long, value_enum, default_value = "mlp")]
    model: Model,
    /// Its precision policy: fp32, tf32, bf16 or f16.
    #[arg(long, default_value_t = Precision::Fp32)]
    precision: Precision,
}

impl Model {
    /// `members` fused members of the model, and the batch they train on.
    fn trainee(self, members: usize, device: Device) -> Result<(Trainee, Tensor, Tensor)> {
        let tenant = cohort_alloc::TenantId::DEFAULT;
        let images = |spec: &str, side: usize| -> Result<_> {
            let (x, y) = cohort::images(128, side, device)?;
            Ok((ModelSpec::from_toml(spec)?, vec![3, side, side], x, y))
        };
        let (spec, input, x, y) = match self {
            Model::Mlp => {
                let (x, y) = cohort::batches(device)?.swap_remove(0);
                return Ok((Trainee::new(members, 0, device, tenant)?, x, y));
            }
            Model::Text => crate::cotrain::text_model(device)?,
            Model::Transformer => crate::transformer::widest_model(device)?,
            Model::Cnn => images(crate::cnn::CNN, 64)?,
            Model::Resnet => images(crate::resnet::RESNET, 32)?,
        };
        let t = Trainee::from_spec(&spec, &input, members, 0, device, tenant)?;
        Ok((t, x, y))
    }
}

pub fn run(args: &Args) -> Result<()> {
    let device = if args.cpu {
        Device::Cpu
    } else {
        Device::best()
    };
    let _policy = args.precision.enter();
    for &n in &args.n {
        let (mut t, x, y) = args.model.trainee(n, device)?;
        for _ in 0..5 {
            t.step(&x, &y)?;
        }
        device.synchronize()?;
        println!(
            "profile of {:?} in {} on {device}",
            args.model, args.precision
        );
        phases(&mut t, &x, &y, device, n, args.steps)?;
        if let Device::Cuda(ordinal) = device {
            memory_by_phase(&mut t, &x, &y, device)?;
            tuning(ordinal)?;
            kernels(&mut t, &x, &y, device, ordinal, args.steps)?;
            graph(&mut t, &x, &y, device, args.steps)?;
        }
    }
    Ok(())
}

fn phases(
    t: &mut Trainee,
    x: &Tensor,
    y: &Tensor,
    device: Device,
    n: usize,
    steps: usize,
) -> Result<()> {
    let mut spent = [Duration::ZERO; 4];
    let mut lap = |k: usize, since: &mut Instant| -> Result<()> {
        device.synchronize()?;
        spent[k] += since.elapsed();
        *since = Instant::now();
        Ok(())
    };
    for _ in 0..steps {
        let mut at = Instant::now();
        let tape = Tape::new();
        let logits = t.model.forward(&tape, x)?;
        lap(0, &mut at)?;
        let l = loss::cross_entropy(&logits, y)?;
        lap(1, &mut at)?;
        tape.backward(&l)?;
        lap(2, &mut at)?;
        t.opt.step()?;
        t.opt.zero_grad();
        lap(3, &mut at)?;
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6 / steps as f64;
    let total: Duration = spent.iter().sum();
    println!(
        "profile {device} n={n}: {:.0} µs/step drained (forward {:.0}, loss {:.0}, backward {:.0}, optimizer {:.0})",
        us(total),
        us(spent[0]),
        us(spent[1]),
        us(spent[2]),
        us(spent[3])
    );
    Ok(())
}

/// One step's memory, phase by phase: each phase's peak, and what it leaves held, over what the device held before
/// the step (parameters, optimizer state, the batch, caches), as the allocator counts live blocks.
fn memory_by_phase(t: &mut Trainee, x: &Tensor, y: &Tensor, device: Device) -> Result<()> {
    let alloc = memory::allocator(&device)?;
    device.synchronize()?;
    let base = alloc.stats().counters.in_use;
    alloc.reset_peak();
    let mut marks = Vec::new();
    let mut mark = |phase: &'static str| {
        let c = alloc.stats().counters;
        marks.push((
            phase,
            c.peak_in_use.saturating_sub(base),
            c.in_use as i64 - base as i64,
        ));
        alloc.reset_peak();
    };
    let tape = Tape::new();
    let logits = t.model.forward(&tape, x)?;
    mark("forward");
    let l = loss::cross_entropy(&logits, y)?;
    mark("loss");
    tape.backward(&l)?;
    drop((logits, l));
    mark("backward");
    t.opt.step()?;
    t.opt.zero_grad();
    mark("optimizer");
    let mib = |b: f64| b / f64::from(1 << 20);
    let phases: Vec<String> = marks
        .iter()
        .map(|(phase, peak, held)| {
            format!(
                "{phase} peak +{:.1}, then +{:.1}",
                mib(*peak as f64),
                mib(*held as f64)
            )
        })
        .collect();
    println!(
        "  memory (MiB over the {:.1} held before the step): {}",
        mib(base as f64),
        phases.join("; ")
    );
    Ok(())
}

/// The products and convolutions the warm-up steps tuned: the heuristic's pick against the fastest, and the
/// workspace the one kept runs with.
fn tuning(ordinal: usize) -> Result<()> {
    for t in cohort_tensor::cuda::gemm_tuning(ordinal)? {
        let heuristic = t
            .heuristic_us
            .map_or("failed".to_string(), |h| format!("{h:.1} µs"));
        println!(
            "  tuned {}: heuristic's pick {heuristic}, kept {:.1} µs (candidate {} of {}) with {:.1} MiB of workspace",
            t.label,
            t.best_us,
            t.best_index + 1,
            t.candidates,
            t.workspace as f64 / f64::from(1 << 20)
        );
    }
    Ok(())
}

fn kernels(
    t: &mut Trainee,
    x: &Tensor,
    y: &Tensor,
    device: Device,
    ordinal: usize,
    steps: usize,
) -> Result<()> {
    cohort_tensor::cuda::kernel_profile(ordinal)?;
    let alloc = memory::allocator(&device)?;
    let before = alloc.stats().counters;
    let (mut issue, mut wait) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..steps {
        let at = Instant::now();
        t.step(x, y)?;
        issue += at.elapsed();
        let at = Instant::now();
        device.synchronize()?;
        wait += at.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / steps as f64;
    let after = alloc.stats().counters;
    let delta = |a: u64, b: u64| (a - b) as f64 / steps as f64;
    println!(
        "  host: {:.0} µs/step issuing the step, then {:.0} µs waiting for the device; allocator per step: {:.1} map \
         calls, {:.1} page moves, {:.1} page creates, {:.1} source reserves",
        per(issue),
        per(wait),
        delta(after.map_calls, before.map_calls),
        delta(after.page_moves, before.page_moves),
        delta(after.page_creates, before.page_creates),
        delta(after.source_reserves, before.source_reserves),
    );
    let table = cohort_tensor::cuda::kernel_profile(ordinal)?;
    if table.is_empty() {
        println!("  (set COHORT_CUDA_PROFILE=1 for GPU time per kernel)");
        return Ok(());
    }
    let gpu: f64 = table.iter().map(|k| k.total_ms).sum::<f64>() * 1e3 / steps as f64;
    let launches: usize = table.iter().map(|k| k.calls).sum();
    println!(
        "  {gpu:.0} µs/step GPU time in {:.0} launches/step",
        launches as f64 / steps as f64
    );
    for k in &table {
        println!(
            "  {:>8.1} µs/step {:>5.1}/step  {}",
            k.total_ms * 1e3 / steps as f64,
            k.calls as f64 / steps as f64,
            k.label
        );
    }
    Ok(())
}

/// The same step captured as a CUDA graph: host time to queue a step (copying the batch into the static inputs,
/// one replay), then the wait for the device.
fn graph(t: &mut Trainee, x: &Tensor, y: &Tensor, device: Device, steps: usize) -> Result<()> {
    let (sx, sy) = (x.copy()?, y.copy()?);
    let (graph, ()) = cohort_tensor::cuda::capture(&device, || t.step(&sx, &sy))?;
    device.synchronize()?;
    let at = Instant::now();
    for _ in 0..steps {
        sx.assign_(x)?;
        sy.assign_(y)?;
        graph.replay()?;
    }
    let issue = at.elapsed();
    device.synchronize()?;
    let total = at.elapsed();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / steps as f64;
    println!(
        "  graph: {:.0} µs/step, of which the host queues a step in {:.0} µs",
        per(total),
        per(issue)
    );
    Ok(())
}
