//! The cohort throughput benchmark: N MLPs (784-128-10, Adam 1e-3, batch 256, data resident on the device)
//! trained in the alternating loop (one model after another each step) and fused (one model with N members),
//! in model-steps per second, with each member's peak memory where the device has an allocator.
//!
//! It mirrors ../shared/bench/torch_mlp_cohort.py step for step, so the two figures compare directly. On the CPU the
//! loop's separate models step concurrently, as the trainer runs them (and as JAX's asynchronous dispatch overlaps
//! the reference's loop). On a GPU two more schedules replay the same steps captured as CUDA graphs
//! ([`graph_schedules`]).

use anyhow::{Context, Result};
use cohort_alloc::{TenantId, TenantLimits};
use cohort_autograd::{BuildOptions, Model, ModelSpec, Tape, loss};
use cohort_optim::{OptimConfig, Optimizer};
use cohort_tensor::memory::{self, DeviceAllocator};
use cohort_tensor::{DType, Device, Tensor};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rayon::prelude::*;

const B: usize = 256;
const ROWS: usize = 16384;
const MLP: &str = r#"layers = [{ linear = 128, act = "relu" }, { linear = 10 }]"#;

/// One model (or one fused group) with its optimizer.
pub(crate) struct Trainee {
    pub(crate) model: Model,
    pub(crate) opt: Optimizer,
    tenant: cohort_alloc::TenantId,
}

impl Trainee {
    /// The benchmark's MLP.
    pub(crate) fn new(
        members: usize,
        seed: u64,
        device: Device,
        tenant: cohort_alloc::TenantId,
    ) -> Result<Trainee> {
        Trainee::from_spec(
            &ModelSpec::from_toml(MLP)?,
            &[784],
            members,
            seed,
            device,
            tenant,
        )
    }

    /// Any model of a spec, for examples of shape `input`, with Adam 1e-3, its memory charged to `tenant`.
    pub(crate) fn from_spec(
        spec: &ModelSpec,
        input: &[usize],
        members: usize,
        seed: u64,
        device: Device,
        tenant: cohort_alloc::TenantId,
    ) -> Result<Trainee> {
        memory::with_tenant(tenant, || {
            let model = spec.build(input, &BuildOptions::new(members, seed, device))?;
            let opt = Optimizer::new(OptimConfig::adam(1e-3), model.params())?;
            Ok(Trainee { model, opt, tenant })
        })
    }

    /// One training step on `x` against class labels `y`: `[B]` for logits `[M, B, C]`, or `[B, ..]` for logits
    /// `[M, B, .., C]` (a score per position, as a language model's), which count as `[M, rows, C]` against the
    /// labels' `rows` values, as the trainer's next-token objective takes them.
    pub(crate) fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<()> {
        memory::with_tenant(self.tenant, || {
            let tape = Tape::new();
            let logits = self.model.forward(&tape, x)?;
            let s = logits.shape().to_vec();
            let l = if s.len() > 3 {
                let rows = y.elem_count();
                let flat = logits.reshape(&[s[0], rows, s[s.len() - 1]])?;
                loss::cross_entropy(&flat, &y.reshape(&[rows])?)?
            } else {
                loss::cross_entropy(&logits, y)?
            };
            tape.backward(&l)?;
            self.opt.step()?;
            self.opt.zero_grad();
            Ok(())
        })
    }

    /// Takes `other`'s parameters, optimizer buffers and step count (same model, same optimizer), each copied into
    /// this trainee's own tensors: a graph captured over them keeps reading and writing the same memory.
    fn take_state(&mut self, other: &Trainee) -> Result<()> {
        for (mine, theirs) in self.model.params().iter().zip(other.model.params()) {
            mine.value().assign_(theirs.value())?;
        }
        let (mine, theirs) = (self.opt.state_dict(), other.opt.state_dict());
        anyhow::ensure!(
            mine.tensors.len() == theirs.tensors.len(),
            "the optimizers' buffers do not match"
        );
        for ((_, a), (_, b)) in mine.tensors.iter().zip(&theirs.tensors) {
            a.assign_(b)?;
        }
        self.opt.set_steps(other.opt.steps());
        Ok(())
    }

    /// Every parameter's values, on the host.
    fn values(&self) -> Result<Vec<Vec<f32>>> {
        self.model
            .params()
            .iter()
            .map(|p| Ok(p.value().to_vec::<f32>()?))
            .collect()
    }
}

/// The Euclidean distance between two models' parameters.
fn distance(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// Classes of the workloads' labels.
pub(crate) const CLASSES: usize = 10;

/// The image parts' fixed batch: `[batch, 3, side, side]` uniform images (seed 0) and their labels.
pub(crate) fn images(batch: usize, side: usize, device: Device) -> Result<(Tensor, Tensor)> {
    let x = Tensor::rand_uniform(&[batch, 3, side, side], 0.0, 1.0, DType::F32, 0, &device)?;
    Ok((x, labels(batch, CLASSES, device)?))
}

/// `count` class ids below `classes`, spread over them (a fixed pseudo-random sequence), as i32 of shape
/// `[count]`.
pub(crate) fn labels(count: usize, classes: usize, device: Device) -> Result<Tensor> {
    let y: Vec<i32> = (0..count)
        .map(|i| ((i * 7919) % classes.max(1)) as i32)
        .collect();
    Ok(Tensor::from_vec(y, &[count], &device)?)
}

/// The benchmark's resident data, cut into batches of 256 once (as the reference slices a
/// resident tensor).
pub fn batches(device: Device) -> Result<Vec<(Tensor, Tensor)>> {
    let x = Tensor::rand_uniform(&[ROWS, 784], 0.0, 1.0, DType::F32, 0, &device)?;
    let y = labels(ROWS, 10, device)?;
    (0..ROWS / B)
        .map(|i| Ok((x.narrow(0, i * B, B)?, y.narrow(0, i * B, B)?)))
        .collect()
}

/// A tenant of its own on a GPU (so that its peak is the model's); the default one on the CPU.
pub(crate) fn tenant(device: Device, name: &str) -> Result<cohort_alloc::TenantId> {
    Ok(match device {
        Device::Cpu => cohort_alloc::TenantId::DEFAULT,
        Device::Cuda(_) => memory::allocator(&device)?.add_tenant(name, TenantLimits::default())?,
    })
}

/// The most some tenants held at one moment over a stretch of steps, as `torch.cuda.max_memory_allocated()` after
/// `reset_peak_memory_stats()` counts it: the allocator-wide peak, restarted at [`start`](Self::start), less what the
/// other tenants held then (the batches, the runtime's workspaces: constant over the stretch, in which nothing else
/// runs). Not the sum of the tenants' own peaks, which counts a loop's step temporaries once per model although
/// they never coexist.
pub(crate) struct ConcurrentPeak {
    alloc: Arc<dyn DeviceAllocator>,
    others: u64,
}

impl ConcurrentPeak {
    /// Restarts the allocator's peak and notes what lies outside `tenants`; `None` on the CPU (no allocator) or
    /// without tenants.
    pub(crate) fn start(device: Device, tenants: &[TenantId]) -> Option<ConcurrentPeak> {
        let alloc = memory::allocator(&device)
            .ok()
            .filter(|_| !tenants.is_empty())?;
        alloc.reset_peak();
        let report = alloc.stats();
        let measured: u64 = report
            .tenants
            .iter()
            .filter(|t| tenants.contains(&t.id))
            .map(|t| t.in_use)
            .sum();
        Some(ConcurrentPeak {
            others: report.counters.in_use.saturating_sub(measured),
            alloc,
        })
    }

    /// The tenants' concurrent peak since [`start`](Self::start), in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.alloc
            .stats()
            .counters
            .peak_in_use
            .saturating_sub(self.others)
    }
}

/// Times `step` for at least `budget` after `warmup` untimed calls; returns calls per second.
pub(crate) fn rate(
    device: Device,
    warmup: usize,
    budget: Duration,
    mut step: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    for i in 0..warmup {
        step(i)?;
    }
    device.synchronize()?;
    let start = Instant::now();
    let mut done = 0;
    while done < 3 || start.elapsed() < budget {
        step(warmup + done)?;
        done += 1;
        if done % 16 == 0 {
            device.synchronize()?;
        }
    }
    device.synchronize()?;
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Untimed steps of each schedule before its rate and peak are measured.
const WARMUP: usize = 5;

/// Separate models the loop schedules go up to, as the reference's loop does.
const MAX_LOOP_MODELS: usize = 64;

/// Runs the loop and fused schedules for every N in `ns` (the loop stops at [`MAX_LOOP_MODELS`]).
pub fn run(device: Device, ns: &[usize], budget: Duration) -> Result<Vec<Value>> {
    let data = batches(device)?;
    let mut rows = Vec::new();
    for (k, &n) in ns.iter().enumerate() {
        for schedule in ["loop", "fused"] {
            if schedule == "loop" && n > MAX_LOOP_MODELS {
                continue;
            }
            let tag = format!("{schedule}-{n}-{k}");
            let mut group: Vec<Trainee> = if schedule == "loop" {
                (0..n)
                    .map(|i| {
                        Trainee::new(1, i as u64, device, tenant(device, &format!("{tag}-{i}"))?)
                    })
                    .collect::<Result<_>>()?
            } else {
                vec![Trainee::new(n, 0, device, tenant(device, &tag)?)?]
            };
            let tenants: Vec<_> = group.iter().map(|t| t.tenant).collect();
            let mut step = |i: usize| {
                let (x, y) = &data[i % data.len()];
                if device.is_cuda() {
                    group.iter_mut().try_for_each(|t| t.step(x, y))
                } else {
                    // as the trainer's lockstep schedule: separate CPU models step concurrently
                    group.par_iter_mut().try_for_each(|t| t.step(x, y))
                }
            };
            // The warm-up before the peak's start, as `Timing::measure`: one-off allocations (the runtime's
            // workspaces, made at a first use) are not the models'.
            (0..WARMUP).try_for_each(&mut step)?;
            device.synchronize()?;
            let peak = ConcurrentPeak::start(device, &tenants);
            let steps_per_s = rate(device, 0, budget, |i| step(WARMUP + i))?;
            let peak = peak.map(|p| p.bytes() as f64 / n as f64);
            let model_steps = steps_per_s * n as f64;
            println!(
                "cohort {schedule:5} n={n:3}: {model_steps:10.0} model-steps/s{}",
                peak.map(|p| format!("  peak/member={:.2} MiB", p / (1 << 20) as f64))
                    .unwrap_or_default()
            );
            rows.push(json!({ "schedule": schedule, "n": n, "model_steps_per_s": model_steps, "peak_bytes_per_member": peak }));
        }
        rows.extend(graph_schedules(device, n, budget, &data));
    }
    Ok(rows)
}

/// The cohort benchmark's graph schedules, on a GPU: each training step (forward, backward, Adam) captured as a CUDA
/// graph after three eager warm-up steps, then per step the batch copied into the graphs' static input tensors and
/// every graph replayed (one launch each). `loop-graph` captures each of `n` separate models and replays them on
/// [`LANES`] concurrent streams, `fused-graph` the one model of `n` members. Timed like the eager schedules; a
/// schedule is only reported if its replays train as eager steps do. Prints a line per schedule and returns the
/// benchmark rows (with the error where a capture failed, so the other figures still come out); nothing on the CPU.
pub fn graph_schedules(
    device: Device,
    n: usize,
    budget: Duration,
    data: &[(Tensor, Tensor)],
) -> Vec<Value> {
    if !device.is_cuda() {
        return Vec::new();
    }
    let mut rows = Vec::new();
    for (schedule, models, members) in [("loop-graph", n, 1), ("fused-graph", 1, n)] {
        if models > MAX_LOOP_MODELS {
            continue;
        }
        rows.push(match graph_rate(device, models, members, budget, data) {
            Ok(model_steps) => {
                println!("cohort {schedule} n={n:3}: {model_steps:10.0} model-steps/s");
                json!({ "schedule": schedule, "n": n, "model_steps_per_s": model_steps })
            }
            Err(e) => {
                println!("cohort {schedule} n={n:3}: failed: {e:#}");
                json!({ "schedule": schedule, "n": n, "error": format!("{e:#}") })
            }
        });
    }
    rows
}

/// Streams the separate models' graphs replay on: small models leave most of the GPU idle one at a time.
const LANES: usize = 8;

fn graph_rate(
    device: Device,
    models: usize,
    members: usize,
    budget: Duration,
    data: &[(Tensor, Tensor)],
) -> Result<f64> {
    let (x0, y0) = data.first().context("no batches to replay")?;
    let build = |seed| Trainee::new(members, seed, device, cohort_alloc::TenantId::DEFAULT);
    let trainees = (0..models as u64).map(build).collect::<Result<_>>()?;
    let twins = [build(0)?, build(0)?];
    let captured = Captured::new(trainees, twins, x0, y0, &data[..data.len().min(4)])?;
    let steps_per_s = rate(device, 5, budget, |i| {
        let (bx, by) = &data[i % data.len()];
        captured.x.assign_(bx)?;
        captured.y.assign_(by)?;
        captured.replay()
    })?;
    Ok(steps_per_s * (models * members) as f64)
}

/// Distances between parameters after a [`Captured`] check, relative to how far its steps moved them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Drift {
    /// The replayed trainee from the first eager twin.
    pub(crate) replay: f64,
    /// The two eager twins from each other.
    pub(crate) eager: f64,
}

impl Drift {
    /// The larger of each distance.
    pub(crate) fn worst(self, other: Drift) -> Drift {
        Drift {
            replay: self.replay.max(other.replay),
            eager: self.eager.max(other.eager),
        }
    }
}

/// Trainees whose training steps (forward, backward, Adam) are captured as CUDA graphs reading the static inputs
/// `x`, `y`: a step is the batch assigned to those (where it changes) and [`Captured::replay`].
pub(crate) struct Captured {
    /// The captured trainees, kept alive: the graphs read and write their parameters and optimizer state.
    _trainees: Vec<Trainee>,
    graphs: Vec<cohort_tensor::cuda::CudaGraph>,
    /// How far the check's replays ended from its eager steps, and the eager twins from each other, each over how
    /// far those steps moved the parameters (see [`Captured::new`]).
    pub(crate) drift: Drift,
    /// The static inputs: copies of the first batch, with storage of their own.
    pub(crate) x: Tensor,
    pub(crate) y: Tensor,
}

impl Captured {
    /// Three eager warm-up steps of each trainee (and of `twins`, two eager copies of the first) on `(x0, y0)`,
    /// then each step captured. A rate is only worth reporting if the replays train as eager steps do: on each batch
    /// of `check`, the first trainee and the second twin take the first twin's parameters and optimizer state, then
    /// the first graph is replayed and both twins step eagerly. Each replayed step must end on the first twin's
    /// parameters up to a small fraction of how far that step moved them, or, where eager steps do not repeat
    /// themselves, no farther than twice the distance between the twins (cuDNN's and cuBLAS's fastest algorithms
    /// need not sum in one order, and a TF32 or 16-bit product rounds that difference up). One step from one state
    /// at a time: over several steps, training magnifies any such difference (Adam's normalised step flips on a
    /// gradient near zero), and a replay would be judged by a chaotic distance instead of its own step.
    ///
    /// # Errors
    /// When a capture is refused, or the replays do not train as eager steps do.
    pub(crate) fn new(
        mut trainees: Vec<Trainee>,
        mut twins: [Trainee; 2],
        x0: &Tensor,
        y0: &Tensor,
        check: &[(Tensor, Tensor)],
    ) -> Result<Captured> {
        let device = twins[0].model.device();
        let (x, y) = (x0.copy()?, y0.copy()?);
        for _ in 0..3 {
            trainees.iter_mut().try_for_each(|t| t.step(&x, &y))?;
            twins.iter_mut().try_for_each(|t| t.step(&x, &y))?;
        }
        let graphs = trainees
            .iter_mut()
            .map(|t| Ok(cohort_tensor::cuda::capture(&device, || t.step(&x, &y))?.0))
            .collect::<Result<Vec<_>>>()?;
        let mut drift = Drift::default();
        for (bx, by) in check {
            let [first, second] = &mut twins;
            trainees[0].take_state(first)?;
            second.take_state(first)?;
            let before = twins[0].values()?;
            x.assign_(bx)?;
            y.assign_(by)?;
            graphs[0].replay()?;
            twins.iter_mut().try_for_each(|t| t.step(bx, by))?;
            let (replayed, eager, again) = (
                trainees[0].values()?,
                twins[0].values()?,
                twins[1].values()?,
            );
            let (apart, moved, spread) = (
                distance(&replayed, &eager),
                distance(&eager, &before),
                distance(&eager, &again),
            );
            anyhow::ensure!(
                apart <= (0.05 * moved).max(2.0 * spread),
                "a graph replay diverges from the eager step (from one state they end {apart:.2e} apart; the \
                 step moved the parameters {moved:.2e}, and two eager runs of it ended {spread:.2e} apart)"
            );
            drift = drift.worst(Drift {
                replay: apart / moved,
                eager: spread / moved,
            });
        }
        x.assign_(x0)?;
        y.assign_(y0)?;
        Ok(Captured {
            _trainees: trainees,
            graphs,
            drift,
            x,
            y,
        })
    }

    /// One training step of every trainee: their graphs replayed on [`LANES`] concurrent streams.
    pub(crate) fn replay(&self) -> Result<()> {
        Captured::replay_together(&[self])
    }

    /// One training step of every trainee of `groups` (each with static inputs of its own): all their graphs
    /// replayed on [`LANES`] concurrent streams.
    pub(crate) fn replay_together(groups: &[&Captured]) -> Result<()> {
        let all: Vec<_> = groups.iter().flat_map(|g| &g.graphs).collect();
        Ok(cohort_tensor::cuda::replay_concurrently(&all, LANES)?)
    }
}
