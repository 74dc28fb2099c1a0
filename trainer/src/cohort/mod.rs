//! The [`Cohort`]: members, the units that train them, schedules, OOM recovery, control, checkpoints and reports.
//!
//! Every member trains in a *unit*: a model of `M` members built from one [`ModelSpec`] (`M = 1` for a member on its
//! own; `M > 1` for a fused group of same-spec members, issue 7), with its optimizer, its feed of batches and its
//! allocator tenant. Schedules pick units, a unit step is one optimizer step of each of its members, and everything
//! per member (loss, logs, checkpoints, pause, batch size, OOM events) stays per member: a member's checkpoint is its
//! own slice of the unit, and a unit can always be split, its members' parameters and optimizer state carried into
//! the new units (this is how a fused group splits in halves on OOM, how a paused member leaves its group, and how
//! a member moves to the CPU).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use cohort_alloc::TenantLimits;
use cohort_autograd::{BuildOptions, Model, Shape, Tape};
use cohort_data::Position;
use cohort_data::Task;
use cohort_optim::{OptimConfig, Optimizer, OptimizerState, Schedule};
use cohort_tensor::{DType, Device, HostRead, Tensor};
use safetensors::tensor::Dtype;

use crate::checkpoint::{Checkpoint, CheckpointDir, FORMAT, Manifest, TensorData};
use crate::config::{
    CheckpointEvery, Config, LrScheduleConfig, MemberConfig, MemberModel, ScheduleKind,
};
use crate::control::ControlFile;

mod budget;
use crate::dataset::{DataSet, EvalSplit};
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::graph::{Graphs, StepGraph};
use crate::memory::{Tenant, device_total_bytes};
use crate::metrics::{MetricRecord, MetricsWriter};
use crate::models::Models;
use crate::objective::{Scores, Tally};
use crate::progress::{MemberStatus, Progress};
use crate::report::{MemberSummary, Summary};
use crate::run_dir::{MemberLock, RunDir};
use crate::tensorboard::EventWriter;

/// How a run is driven (not part of the config: presentation and test hooks).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Show progress lines on stderr.
    pub progress: bool,
    /// Stop abruptly (no final checkpoint, no summary), as a crash would, once any member has taken this many
    /// steps. For tests of `cohort resume`.
    pub halt_after_steps: Option<u64>,
    /// The models `model = { custom = "NAME" }` members name.
    pub models: Models,
}

/// What a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The summary; `None` when the run was halted by [`RunOptions::halt_after_steps`].
    pub summary: Option<Summary>,
}

/// Where a member stands.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Running,
    Paused,
    Done,
}

/// A member's trainer-side state (saved in its checkpoints' `trainer_state`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct Counters {
    loss_sum: f64,
    loss_n: u64,
    last_loss: f64,
    train_time: f64,
    steps_timed: u64,
    oom_events: u64,
    peak_mem: u64,
    val: Option<Scores>,
    /// The step of the last validation.
    val_step: Option<u64>,
    test: Option<Scores>,
    time: f64,
    stopped: Option<String>,
}

#[derive(Debug)]
struct MemberRun {
    cfg: MemberConfig,
    events: EventWriter,
    metrics: MetricsWriter,
    ckpt: CheckpointDir,
    _lock: MemberLock,
    step: u64,
    epochs_done: u64,
    batch: usize,
    state: State,
    c: Counters,
    log_mark: (f64, u64),
    mem_now: u64,
    device: Device,
    fused_with: Vec<String>,
    last_ckpt_step: Option<u64>,
    finalized: bool,
}

/// A model of `M` members trained together (M = 1: one member on its own).
#[derive(Debug)]
struct Unit {
    members: Vec<usize>,
    model: Model,
    opt: Optimizer,
    feed: Feed,
    device: Device,
    tenant: Tenant,
    batch: usize,
    act_bytes_per_example: u64,
    /// Training-mode forward passes: the position in every dropout layer's mask sequence (part of exact resume).
    forwards: u64,
    /// Whether its steps replay a CUDA graph.
    graphs: Graphs,
    /// Per-member losses of steps queued on the device, oldest first, not yet read back.
    losses: VecDeque<HostRead>,
}

/// Steps whose losses may still be on their way back: the host queues the next step meanwhile, but
/// never runs further ahead of the device than this.
const LOSSES_IN_FLIGHT: usize = 2;

/// What a member's step calls for ([`Cohort::due`]).
struct Due {
    log: bool,
    checkpoint: bool,
    complete: bool,
}

/// What a unit step leaves for the bookkeeping.
struct StepOutcome {
    /// The per-member losses, on their way to the host.
    losses: HostRead,
    /// Bytes the unit's tenant held at the height of the step.
    in_step: u64,
    /// Something worth an event (a capture, or why none).
    note: Option<String>,
}

/// One member's parameters and optimizer state, without the member dimension.
type MemberState = (Vec<(String, Tensor)>, OptimizerState);

/// Why a member's model cannot train on its data, if it cannot: a layer that does not fit, token ids against float
/// features or the other way round, an embedding smaller than the vocabulary, a custom model nobody registered.
fn misfit(cfg: &MemberConfig, data: &DataSet, models: &Models) -> Option<String> {
    let (name, shape) = (&data.name, &data.shape);
    let spec = match (&cfg.model, data.token_ids) {
        (MemberModel::Custom(model), _) => {
            return (!models.contains(model)).then(|| models.unknown(model));
        }
        (MemberModel::Spec(s), None) if s.vocab().is_some() => {
            return Some(format!(
                "layer 0 takes token ids, but [data.{name}] holds float features (give it a text or tokens \
                 source) (the data \"{name}\" has examples of shape {shape:?})"
            ));
        }
        (MemberModel::Spec(s), Some(ids)) => match s.vocab() {
            None => Err(format!(
                "[data.{name}] holds token ids: start the model with {{ embedding = D, vocab = {ids} }}"
            )),
            Some(v) if v < ids => Err(format!(
                "layer 0 (embedding): vocab = {v} is smaller than the {ids} ids of [data.{name}]'s vocabulary"
            )),
            Some(_) => Ok(s),
        },
        (MemberModel::Spec(s), None) => Ok(s),
    };
    let reason = match spec.and_then(|s| {
        let shapes = s.shapes(&s.input_for(shape)).map_err(|e| e.to_string())?;
        Ok(shapes.last().map(Shape::dims).unwrap_or_default())
    }) {
        Err(reason) => reason,
        Ok(out) => output_misfit(&out, data.objective.task(), name)?,
    };
    Some(format!(
        "{reason} (the data \"{name}\" has examples of shape {shape:?})"
    ))
}

/// Why a model's output of shape `out` (one example's) cannot be scored against `task`'s targets, if it cannot.
fn output_misfit(out: &[usize], task: &Task, name: &str) -> Option<String> {
    let last = out.last().copied().unwrap_or(0);
    match task {
        Task::Classify { classes } if out.len() == 1 && last >= classes.len() => None,
        Task::Classify { classes } => Some(format!(
            "the model gives scores of shape {out:?} and [data.{name}] has {} classes: end it with \
             {{ linear = {} }}",
            classes.len(),
            classes.len()
        )),
        Task::Regress { width } if out == [*width] => None,
        Task::Regress { width } => Some(format!(
            "the model gives outputs of shape {out:?} and [data.{name}]'s targets have {width} values: end it \
             with {{ linear = {width} }}"
        )),
        Task::NextToken { vocab } if out.len() == 2 && last >= *vocab => None,
        Task::NextToken { vocab } => Some(format!(
            "the model gives scores of shape {out:?} and [data.{name}] asks for a score per position for \
             each of {vocab} tokens: end it with {{ linear = {vocab} }} and no pooling"
        )),
    }
}

/// Bytes of one example's activations and their gradients (f32) for host accounting: the spec's estimate, none for a
/// custom model (whose activations the spec cannot see).
fn activation_bytes(cfg: &MemberConfig, data: &[usize]) -> u64 {
    cfg.model.spec().map_or(0, |s| {
        s.activation_count(&s.input_for(data)).unwrap_or(0) as u64 * 2 * 4
    })
}

/// The learning-rate schedule of a member that trains `total` steps.
fn lr_schedule(cfg: &MemberConfig, total: u64) -> Schedule {
    match cfg.lr_schedule {
        LrScheduleConfig::Constant => Schedule::Constant,
        LrScheduleConfig::Step { every, gamma } => Schedule::Step { every, gamma },
        LrScheduleConfig::Cosine { warmup, min_lr } => {
            let cos = Schedule::Cosine {
                total: total.saturating_sub(warmup).max(1),
                min_factor: (min_lr / cfg.optimizer.lr()).min(1.0),
            };
            if warmup > 0 {
                Schedule::Warmup {
                    steps: warmup,
                    then: Box::new(cos),
                }
            } else {
                cos
            }
        }
    }
}

/// Steps a member takes in total with its configured batch.
fn planned_steps(cfg: &MemberConfig, data: &DataSet) -> u64 {
    let s = u64::from(cfg.epochs) * data.batches_per_epoch(cfg.batch);
    cfg.max_steps.map_or(s, |m| m.min(s))
}

/// What members must share to be fused: everything but the learning rate and the seed.
fn fusion_key(cfg: &MemberConfig, data: &DataSet) -> String {
    let mut opt = cfg.optimizer.clone();
    match &mut opt {
        OptimConfig::Sgd { lr, .. }
        | OptimConfig::Adam { lr, .. }
        | OptimConfig::AdamW { lr, .. } => {
            *lr = 0.0;
        }
    }
    serde_json::json!({
        "model": cfg.model,
        "optimizer": opt,
        "schedule": lr_schedule(cfg, planned_steps(cfg, data)),
        "batch": cfg.batch,
        "data": cfg.data,
        "weight": cfg.weight,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "oom": cfg.oom,
    })
    .to_string()
}

/// An evaluation batch as tensors on `device`: features `[n, prod(shape)]`, targets as the task has them.
fn eval_tensors(
    (x, y): (cohort_data::Array, cohort_data::Array),
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let n = x.shape().first().copied().unwrap_or(0);
    let per = x.elem_count() / n.max(1);
    Ok((
        x.reshape(&[n, per])?.to_tensor(device)?,
        y.to_tensor(device)?,
    ))
}

/// The allocator's out-of-memory error inside `e`, if that is what it is.
fn oom_of(e: &Error) -> Option<&cohort_alloc::Error> {
    use cohort_autograd::Error as A;
    use cohort_optim::Error as O;
    use cohort_tensor::Error as T;
    let a = match e {
        Error::Alloc(a)
        | Error::Tensor(T::Alloc(a))
        | Error::Autograd(A::Tensor(T::Alloc(a)))
        | Error::Optim(O::Tensor(T::Alloc(a)))
        | Error::Optim(O::Autograd(A::Tensor(T::Alloc(a)))) => a,
        _ => return None,
    };
    a.is_out_of_memory().then_some(a)
}

fn tensor_data(t: &Tensor) -> Result<TensorData> {
    let t = t.to_device(&Device::Cpu)?;
    let (dtype, data) = match t.dtype() {
        DType::F32 => (
            Dtype::F32,
            bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
        ),
        DType::F64 => (
            Dtype::F64,
            bytemuck::cast_slice(&t.to_vec::<f64>()?).to_vec(),
        ),
        DType::I32 => (
            Dtype::I32,
            bytemuck::cast_slice(&t.to_vec::<i32>()?).to_vec(),
        ),
        _ => {
            let t = t.to_dtype(DType::F32)?;
            (
                Dtype::F32,
                bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
            )
        }
    };
    Ok(TensorData {
        dtype,
        shape: t.shape().to_vec(),
        data,
    })
}

fn tensor_from(d: &TensorData, path: &Path) -> Result<Tensor> {
    let bad = |m: String| Error::Checkpoint {
        path: path.to_path_buf(),
        message: m,
    };
    match d.dtype {
        Dtype::F32 => {
            let v: Vec<f32> = d.to_f32().map_err(bad)?;
            Ok(Tensor::from_vec(v, &d.shape, &Device::Cpu)?)
        }
        Dtype::F64 => {
            let v: Vec<f64> = d
                .data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            Ok(Tensor::from_vec(v, &d.shape, &Device::Cpu)?)
        }
        other => Err(bad(format!(
            "tensor of dtype {other:?}: cohort saves f32 and f64"
        ))),
    }
}

/// Compares two config identities key by key.
fn differences(saved: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(a), Some(b)) = (saved.as_object(), now.as_object()) {
        for (k, va) in a {
            let vb = b.get(k).cloned().unwrap_or(serde_json::Value::Null);
            if *va != vb {
                out.push(format!("{k}: {va} in the checkpoint, {vb} now"));
            }
        }
        for (k, vb) in b {
            if !a.contains_key(k) {
                out.push(format!("{k}: absent in the checkpoint, {vb} now"));
            }
        }
    } else if saved != now {
        out.push(format!("{saved} in the checkpoint, {now} now"));
    }
    out
}

/// A running cohort.
#[derive(Debug)]
pub struct Cohort {
    config: Config,
    run: RunDir,
    device: Device,
    data: BTreeMap<String, Arc<DataSet>>,
    members: Vec<MemberRun>,
    units: Vec<Unit>,
    progress: Progress,
    control: ControlFile,
    started: Instant,
    time_offset: f64,
    opts: RunOptions,
    slice_cursor: usize,
    halted: bool,
    /// When the process's memory was last measured ([`Cohort::memory_tick`]).
    last_memory_tick: Option<Instant>,
    /// The process's device memory as last measured, and its peak (NVML's figure).
    last_process: Option<cohort_tensor::memory::ProcessMemory>,
    peak_process: u64,
}

impl Cohort {
    /// Starts a new run of `config`.
    ///
    /// # Errors
    /// Shared member directories, missing data, a device that cannot be used, I/O errors.
    pub fn new(config: Config, opts: RunOptions) -> Result<Cohort> {
        let run = RunDir::create(&config)?;
        Cohort::start(config, run, opts, false)
    }

    /// Resumes the run in `dir` from its members' latest valid checkpoints.
    ///
    /// # Errors
    /// Not a run directory, an incompatible config, I/O errors.
    pub fn resume(dir: &Path, opts: RunOptions) -> Result<Cohort> {
        let run = RunDir::open(dir)?;
        let config = Config::from_file(&run.config_path())?;
        Cohort::start(config, run, opts, true)
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        self.run.root()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A one-line description: members, data, schedule.
    pub fn describe(&self) -> String {
        let fused: usize = self.units.iter().filter(|u| u.members.len() > 1).count();
        let sets: Vec<String> = self
            .data
            .values()
            .map(|d| format!("{} ({})", d.name, d.described))
            .collect();
        format!(
            "{} members on {}, schedule: {}{}",
            self.members.len(),
            sets.join(", "),
            self.config.run.schedule,
            if fused > 0 {
                format!(" ({fused} fused group{})", if fused > 1 { "s" } else { "" })
            } else {
                String::new()
            }
        )
    }

    fn start(config: Config, run: RunDir, opts: RunOptions, resuming: bool) -> Result<Cohort> {
        budget::apply_memory_env(&config);
        crate::kernel_cache::configure();
        let device = Device::parse(&config.run.device)?;
        let config_dir = run
            .config_dir()
            .or_else(|| Path::new(&config.file).parent().map(Path::to_path_buf));
        let mut data = BTreeMap::new();
        for m in &config.members {
            if !data.contains_key(&m.data) {
                let d = DataSet::load(&config.data[&m.data], config_dir.as_deref())?;
                data.insert(m.data.clone(), Arc::new(d));
            }
        }
        // Every model fits its data before a member starts.
        for cfg in &config.members {
            if let Some(reason) = misfit(cfg, &data[&cfg.data], &opts.models) {
                return Err(Error::Model {
                    member: cfg.name.clone(),
                    reason,
                });
            }
        }
        for d in data.values() {
            if let Some(words) = &d.vocabulary {
                run.write_vocabulary(&d.name, words)?;
            }
        }
        // Lock every member directory first: two members (or runs) never share one.
        let mut members = Vec::new();
        let mut loaded: Vec<Option<Checkpoint>> = Vec::new();
        let mut messages = Vec::new();
        let mut time_offset: f64 = 0.0;
        for cfg in &config.members {
            let dir = run.member_dir(&cfg.name);
            let lock = MemberLock::acquire(&dir)?;
            let ckpt = CheckpointDir::new(run.checkpoint_dir(&cfg.name), cfg.checkpoint.keep)?;
            let latest = if resuming { ckpt.load_latest()? } else { None };
            let checkpoint = match latest {
                Some(l) => {
                    for s in &l.skipped {
                        messages.push(format!(
                            "warning: member \"{}\": skipping a corrupt checkpoint: {s}",
                            cfg.name
                        ));
                    }
                    let m = &l.checkpoint.manifest;
                    if m.config_hash != cfg.config_hash() {
                        return Err(Error::IncompatibleResume {
                            member: cfg.name.clone(),
                            differences: differences(&m.config, &cfg.identity()),
                        });
                    }
                    let words = m.vocabulary.clone().map(cohort_data::Vocabulary::reindexed);
                    if words.is_some() && words != data[&cfg.data].vocabulary {
                        return Err(Error::IncompatibleResume {
                            member: cfg.name.clone(),
                            differences: vec![format!(
                                "the vocabulary of [data.{}]: its training text changed",
                                cfg.data
                            )],
                        });
                    }
                    Some(l.checkpoint)
                }
                None => None,
            };
            let d = &data[&cfg.data];
            let (step, pos, batch, c, dev) = match &checkpoint {
                Some(ck) => {
                    let m = &ck.manifest;
                    let pos: Position = serde_json::from_value(m.data_position.clone())
                        .map_err(|e| Error::json("checkpoint data position", e))?;
                    let c: Counters =
                        serde_json::from_value(m.trainer_state.clone()).unwrap_or_default();
                    let dev = if m.device == "cpu" {
                        Device::Cpu
                    } else {
                        device
                    };
                    (m.step, pos, m.batch, c, dev)
                }
                None => (
                    0,
                    Position::default(),
                    cfg.batch,
                    Counters::default(),
                    device,
                ),
            };
            time_offset = time_offset.max(c.time);
            let metrics = MetricsWriter::open(&dir, resuming.then_some(step))?;
            let events = EventWriter::create(&dir)?;
            let epochs_done = d.epochs_done(&pos);
            let done =
                epochs_done >= u64::from(cfg.epochs) || cfg.max_steps.is_some_and(|s| step >= s);
            members.push(MemberRun {
                cfg: cfg.clone(),
                events,
                metrics,
                ckpt,
                _lock: lock,
                step,
                epochs_done,
                batch,
                state: if done { State::Done } else { State::Running },
                log_mark: (c.train_time, step),
                c,
                mem_now: 0,
                device: dev,
                fused_with: Vec::new(),
                last_ckpt_step: checkpoint.as_ref().map(|c| c.manifest.step),
                finalized: done,
            });
            loaded.push(checkpoint);
        }
        let names: Vec<String> = members.iter().map(|m| m.cfg.name.clone()).collect();
        let mut cohort = Cohort {
            control: ControlFile::new(run.control_path()),
            progress: Progress::new(&names, opts.progress),
            config,
            run,
            device,
            data,
            members,
            units: Vec::new(),
            started: Instant::now(),
            time_offset,
            opts,
            slice_cursor: 0,
            halted: false,
            last_memory_tick: None,
            last_process: None,
            peak_process: 0,
        };
        for m in messages {
            cohort.progress.message(&m);
        }
        cohort.build_units(loaded)?;
        Ok(cohort)
    }

    /// Groups members into units (fusing compatible ones) and builds them, from checkpoints where there are some.
    fn build_units(&mut self, mut loaded: Vec<Option<Checkpoint>>) -> Result<()> {
        let fusion = self.config.run.fuse && self.config.run.schedule != ScheduleKind::EpochSliced;
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.state == State::Done {
                continue;
            }
            // A checkpointed member fuses only with members at the same point (step, data position, batch, device).
            let mut key = if fusion && m.cfg.fuse && m.cfg.model.spec().is_some() {
                fusion_key(&m.cfg, &self.data[&m.cfg.data])
            } else {
                format!("single:{i}")
            };
            if let Some(ck) = &loaded[i] {
                let mf = &ck.manifest;
                key.push_str(&format!(
                    "|{}|{}|{}|{}",
                    mf.step, mf.data_position, mf.batch, mf.device
                ));
            }
            key.push_str(&format!("|{}", m.device));
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, g)) => g.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        for (_, g) in groups {
            let mut states = Vec::new();
            let mut pos = Position::default();
            let mut forwards = 0;
            for &i in &g {
                match loaded[i].take() {
                    Some(ck) => {
                        pos = serde_json::from_value(ck.manifest.data_position.clone())
                            .map_err(|e| Error::json("checkpoint data position", e))?;
                        forwards = ck
                            .manifest
                            .rng
                            .get("dropout_forwards")
                            .and_then(serde_json::Value::as_u64)
                            .unwrap_or(0);
                        states.push(Some(self.state_from_checkpoint(&ck, i)?));
                    }
                    None => states.push(None),
                }
            }
            let states = if states.iter().all(Option::is_some) {
                Some(states.into_iter().flatten().collect())
            } else {
                None
            };
            let dev = self.members[g[0]].device;
            let batch = self.members[g[0]].batch;
            match self.build_unit(g.clone(), dev, &pos, batch, states, forwards) {
                Ok(unit) => self.units.push(unit),
                // Not even the parameters fit the budget: that member cannot train, the others can.
                Err(e) if oom_of(&e).is_some() => {
                    for &i in &g {
                        let m = &mut self.members[i];
                        m.state = State::Done;
                        m.finalized = true;
                        m.c.oom_events += 1;
                        m.c.stopped = Some("out of memory".into());
                        let msg = format!(
                            "error: member \"{}\" does not fit its memory budget even before its first step: {e}",
                            m.cfg.name
                        );
                        self.progress.message(&msg);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.note_fusion();
        Ok(())
    }

    fn state_from_checkpoint(&self, ck: &Checkpoint, i: usize) -> Result<MemberState> {
        let path = self.members[i].ckpt.tensors_path(ck.manifest.step);
        let mut params = Vec::new();
        let mut bufs = Vec::new();
        for (name, t) in &ck.tensors {
            if let Some(n) = name.strip_prefix("model.") {
                params.push((n.to_string(), tensor_from(t, &path)?));
            } else if let Some(n) = name.strip_prefix("optim.") {
                bufs.push((n.to_string(), tensor_from(t, &path)?));
            }
        }
        let step = ck
            .manifest
            .trainer_state
            .get("optimizer_step")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(ck.manifest.step);
        Ok((
            params,
            OptimizerState {
                step,
                tensors: bufs,
            },
        ))
    }

    fn note_fusion(&mut self) {
        for u in &self.units {
            let names: Vec<String> = u
                .members
                .iter()
                .map(|&i| self.members[i].cfg.name.clone())
                .collect();
            for &i in &u.members {
                self.members[i].fused_with = names
                    .iter()
                    .filter(|n| **n != self.members[i].cfg.name)
                    .cloned()
                    .collect();
            }
        }
    }

    /// A member's model of `opts.seeds.len()` members, for examples of shape `data`.
    fn build_model(
        &self,
        cfg: &MemberConfig,
        data: &[usize],
        opts: &BuildOptions,
    ) -> Result<Model> {
        match &cfg.model {
            MemberModel::Spec(spec) => Ok(spec.build(&spec.input_for(data), opts)?),
            MemberModel::Custom(name) => {
                self.opts
                    .models
                    .build(name, data, opts)
                    .map_err(|reason| Error::Model {
                        member: cfg.name.clone(),
                        reason,
                    })
            }
        }
    }

    /// Builds a unit of `members` on `device`, its feed at `pos`, from saved states when given.
    fn build_unit(
        &self,
        members: Vec<usize>,
        device: Device,
        pos: &Position,
        batch: usize,
        states: Option<Vec<MemberState>>,
        forwards: u64,
    ) -> Result<Unit> {
        let first = &self.members[members[0]].cfg;
        let data = self.data[&first.data].clone();
        let spec = first.model.spec();
        let seeds: Vec<u64> = members.iter().map(|&i| self.members[i].cfg.seed).collect();
        let m = members.len();
        let total = device_total_bytes(&device)?;
        let limits: Vec<Option<u64>> = members
            .iter()
            .map(|&i| self.members[i].cfg.memory.limit.map(|l| l.bytes(total)))
            .collect();
        let mut limit: Option<u64> = limits.iter().copied().sum();
        let mut reserve: u64 = members
            .iter()
            .map(|&i| {
                self.members[i]
                    .cfg
                    .memory
                    .reserve
                    .map_or(0, |r| r.bytes(total))
            })
            .sum();
        // A member that moved to the CPU as a last resort has no budget there.
        if device == Device::Cpu && self.device.is_cuda() {
            limit = None;
            reserve = 0;
        }
        let group_name = if m == 1 {
            first.name.clone()
        } else {
            format!(
                "fused:{}",
                members
                    .iter()
                    .map(|&i| self.members[i].cfg.name.as_str())
                    .collect::<Vec<_>>()
                    .join("+")
            )
        };
        let mut tenant = Tenant::new(&device, &group_name, TenantLimits { limit, reserve })?;
        let opts = BuildOptions {
            dtype: DType::F32,
            device,
            seeds,
        };
        let (model, opt) = tenant.scope(|| -> Result<(Model, Optimizer)> {
            let model = self.build_model(first, &data.shape, &opts)?;
            let planned = planned_steps(first, &data);
            let mut opt = Optimizer::new(first.optimizer.clone(), model.params())?
                .with_schedule(lr_schedule(first, planned));
            if m > 1 {
                let lrs: Vec<f64> = members
                    .iter()
                    .map(|&i| self.members[i].cfg.optimizer.lr())
                    .collect();
                opt.set_member_lrs(&lrs)?;
            }
            if let Some(states) = &states {
                let step = states.first().map_or(0, |s| s.1.step);
                opt.load_state_dict(&OptimizerState {
                    step,
                    tensors: Vec::new(),
                })?;
                for (j, (params, ostate)) in states.iter().enumerate() {
                    // Saved states live on the host; the parameters may be on a GPU.
                    let params = params
                        .iter()
                        .map(|(n, t)| Ok((n.clone(), t.to_device(&device)?)))
                        .collect::<Result<Vec<_>>>()?;
                    model.load_member(j, &params)?;
                    if !ostate.tensors.is_empty() {
                        opt.load_member_state(j, ostate)?;
                    }
                }
            }
            // Dropout layers draw their n-th mask from (seed, n): continue where the saved (or split) unit left.
            model.set_masks_drawn(forwards);
            Ok((model, opt))
        })?;
        let per_member =
            model.member_param_count() as u64 * 4 * (2 + first.optimizer.state_slots() as u64);
        tenant.charge_persistent(per_member * m as u64)?;
        let act_bytes_per_example = activation_bytes(first, &data.shape) * m as u64;
        let prefetch = self.config.data[&first.data].prefetch * batch;
        let feed = Feed::open(data, pos, prefetch)?.with_device_prefetch(&device)?;
        // A replay would draw a dropout layer's captured mask again.
        // An embedding reads its ids back to check them, which a graph cannot replay.
        let graphs = Graphs::new(
            device.is_cuda()
                && self.config.run.cuda_graphs
                && spec.is_some_and(|s| !s.draws_masks() && s.vocab().is_none()),
        );
        Ok(Unit {
            act_bytes_per_example,
            members,
            model,
            opt,
            feed,
            device,
            tenant,
            batch,
            forwards,
            graphs,
            losses: VecDeque::new(),
        })
    }

    /// Member `j` of unit `u`'s parameters and optimizer state.
    /// Member `j`'s parameters, buffers and optimizer state, on the host. Whole tensors are copied to the host
    /// before the member's slice is cut, so that a checkpoint or a split takes no device memory: under a tight
    /// limit a device-side slice could fail for want of the very memory the member is about to give back.
    fn member_state(u: &Unit, j: usize) -> Result<MemberState> {
        let host = |(name, t): (String, Tensor)| -> Result<(String, Tensor)> {
            Ok((name, t.to_device(&Device::Cpu)?))
        };
        let member = |(name, t): (String, Tensor)| -> Result<(String, Tensor)> {
            let shape = t.shape().to_vec();
            Ok((name, t.narrow(0, j, 1)?.reshape(&shape[1..])?))
        };
        let params = u
            .model
            .state()
            .into_iter()
            .map(|p| host(p).and_then(member))
            .collect::<Result<Vec<_>>>()?;
        let ostate = u.opt.state_dict();
        let o = OptimizerState {
            step: ostate.step,
            tensors: ostate
                .tensors
                .into_iter()
                .map(host)
                .collect::<Result<Vec<_>>>()?,
        };
        let o = if o.tensors.is_empty() {
            o
        } else {
            o.member(j)?
        };
        Ok((params, o))
    }

    /// Splits unit `ui`: the members in `first` go into a new unit, the rest into another; both continue where the
    /// unit stood (same data position, batch, device, parameters and optimizer state).
    fn split_unit(&mut self, ui: usize, first: &[usize], device: Device) -> Result<()> {
        self.take_losses(ui, true)?;
        let u = &self.units[ui];
        let pos = u.feed.position();
        let batch = u.batch;
        let mut a = (Vec::new(), Vec::new());
        let mut b = (Vec::new(), Vec::new());
        for (j, &i) in u.members.iter().enumerate() {
            // On the host, so the old unit's device memory can go before the new units are built.
            let s = Cohort::member_state(u, j)?;
            if first.contains(&i) {
                a.0.push(i);
                a.1.push(s);
            } else {
                b.0.push(i);
                b.1.push(s);
            }
        }
        let old_device = u.device;
        let forwards = u.forwards;
        // Drop the old unit (and its memory) before building the new ones.
        self.units.remove(ui);
        let ua = self.build_unit(a.0, device, &pos, batch, Some(a.1), forwards)?;
        self.units.insert(ui, ua);
        if !b.0.is_empty() {
            let ub = self.build_unit(b.0, old_device, &pos, batch, Some(b.1), forwards)?;
            self.units.push(ub);
        }
        self.note_fusion();
        Ok(())
    }

    /// Moves member `i` out of its fused group into a unit of its own; returns its unit's index.
    fn isolate(&mut self, i: usize) -> Result<Option<usize>> {
        let Some(ui) = self.units.iter().position(|u| u.members.contains(&i)) else {
            return Ok(None);
        };
        if self.units[ui].members.len() > 1 {
            let dev = self.units[ui].device;
            self.split_unit(ui, &[i], dev)?;
        }
        Ok(self.units.iter().position(|u| u.members.contains(&i)))
    }

    /// Runs every unit's warm-up step: a forward and backward pass on a small batch of test examples, gradients
    /// discarded (the parameters do not change), so kernels are compiled and caches filled before timing starts.
    fn warm_up(&mut self) {
        for u in &self.units {
            let d = u.feed.data();
            let Some(split) = d.test.as_ref().or(d.val.as_ref()).filter(|s| !s.is_empty()) else {
                continue;
            };
            let r = u.tenant.scope(|| -> Result<()> {
                let Some(batch) = split.batches(8).iter().next() else {
                    return Ok(());
                };
                let (x, y) = eval_tensors(batch?, &u.device)?;
                let tape = Tape::new();
                // Inference mode: dropout draws no mask, so its sequence (part of exact resume) is untouched.
                tape.set_training(false);
                let l = d.objective.loss(&u.model.forward(&tape, &x)?, &y)?;
                tape.backward(&l)?;
                u.model.zero_grad();
                u.device.synchronize()?;
                Ok(())
            });
            if let Err(e) = r {
                u.model.zero_grad();
                let names: Vec<&str> = u
                    .members
                    .iter()
                    .map(|&i| self.members[i].cfg.name.as_str())
                    .collect();
                self.progress.message(&format!(
                    "warning: warm-up of {} failed ({e}); training goes on",
                    names.join(", ")
                ));
            }
        }
    }

    /// The scores of every member of unit `u` on `split`.
    fn evaluate(u: &Unit, split: &EvalSplit) -> Result<Vec<Scores>> {
        let objective = &u.feed.data().objective;
        let mut tallies = vec![Tally::default(); u.members.len()];
        // In batches no larger than the training step's, which fits the member's budget (after an OOM its batch
        // has shrunk) and holds more than an inference pass.
        let chunk = u.batch.clamp(1, 500);
        u.tenant.scope(|| -> Result<()> {
            for batch in split.batches(chunk).iter() {
                let (x, y) = eval_tensors(batch?, &u.device)?;
                let tape = Tape::new();
                tape.set_training(false);
                let out = tape.no_grad(|| u.model.forward(&tape, &x))?;
                objective.tally(&out, &y, &mut tallies)?;
            }
            Ok(())
        })?;
        Ok(tallies.iter().map(|t| objective.scores(t)).collect())
    }

    /// One optimizer step of every member of unit `u`: replayed from its CUDA graph where it has one
    /// for this batch size (captured here once a full batch has run eagerly), eager otherwise.
    fn unit_step(u: &mut Unit) -> Result<StepOutcome> {
        let device = u.device;
        let (feed, batch) = (&mut u.feed, u.batch);
        let (x, y) = u.tenant.scope(|| feed.next_tensors(batch, &device))?;
        let n = y.shape().first().copied().unwrap_or(0);
        let mut note = None;
        if u.graphs.should_capture(n, u.batch, &u.opt) {
            let (model, opt, objective) = (&u.model, &mut u.opt, &u.feed.data().objective);
            let captured = u
                .tenant
                .scope(|| StepGraph::capture(model, opt, objective, &device, x.copy()?, y.copy()?));
            u.graphs = match captured {
                Ok(g) => {
                    note = Some(format!(
                        "training step captured as a CUDA graph (batch {n}, {} of graph memory): \
                         one launch per step from here",
                        crate::report::bytes(g.pool_bytes())
                    ));
                    Graphs::Ready(Box::new(g))
                }
                Err(e) => {
                    note = Some(format!(
                        "the training step could not be captured as a CUDA graph, so it runs \
                         eagerly: {e}"
                    ));
                    Graphs::Off
                }
            };
        }
        if let Some(g) = u.graphs.replayable(n) {
            let losses = u.tenant.scope(|| -> Result<HostRead> {
                Ok(g.replay(&mut u.opt, &x, &y)?.read_later()?)
            })?;
            u.forwards += 1;
            return Ok(StepOutcome {
                losses,
                in_step: u.tenant.usage().0,
                note,
            });
        }
        let _charge = u.tenant.charge_step(u.act_bytes_per_example * n as u64)?;
        let (model, opt, tenant, forwards) = (&u.model, &mut u.opt, &u.tenant, &mut u.forwards);
        let objective = &u.feed.data().objective;
        let (losses, in_step) = tenant.scope(|| -> Result<(HostRead, u64)> {
            let tape = Tape::new();
            let logits = model.forward(&tape, &x)?;
            *forwards += 1;
            let l = objective.loss(&logits, &y)?;
            let result = tape
                .backward(&l)
                .map_err(Error::from)
                .and_then(|_| opt.step().map_err(Error::from));
            let in_step = tenant.usage().0;
            opt.zero_grad();
            result?;
            Ok((l.value().read_later()?, in_step))
        })?;
        u.graphs.ran_eagerly(n, u.batch);
        Ok(StepOutcome {
            losses,
            in_step,
            note,
        })
    }

    /// Reads back unit `ui`'s queued losses into its members' counters: all of them when `all`,
    /// otherwise those that have arrived and any beyond [`LOSSES_IN_FLIGHT`]. Returns the seconds
    /// spent waiting (device time of steps already counted as taken).
    fn take_losses(&mut self, ui: usize, all: bool) -> Result<f64> {
        let t0 = Instant::now();
        let u = &mut self.units[ui];
        while let Some(front) = u.losses.front() {
            if !(all || front.is_ready() || u.losses.len() > LOSSES_IN_FLIGHT) {
                break;
            }
            let Some(read) = u.losses.pop_front() else {
                break;
            };
            let losses = read.wait::<f32>()?;
            for (j, &i) in u.members.iter().enumerate() {
                let loss = f64::from(losses.get(j).copied().unwrap_or(f32::NAN));
                let c = &mut self.members[i].c;
                c.loss_sum += loss;
                c.loss_n += 1;
                c.last_loss = loss;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    fn elapsed(&self) -> f64 {
        self.time_offset + self.started.elapsed().as_secs_f64()
    }

    fn status(&self, i: usize) -> MemberStatus {
        let m = &self.members[i];
        let d = &self.data[&m.cfg.data];
        // Steps left: the rest of this epoch and the epochs after it, at the member's current batch size.
        let consumed = self.units.iter().find(|u| u.members.contains(&i)).map_or(
            m.epochs_done * d.train_len,
            |u| {
                let p = u.feed.position();
                p.epoch * d.train_len + p.index
            },
        );
        let left = (u64::from(m.cfg.epochs) * d.train_len).saturating_sub(consumed);
        let mut total = if m.state == State::Done {
            m.step
        } else {
            m.step + left.div_ceil(m.batch.max(1) as u64)
        };
        if let Some(s) = m.cfg.max_steps {
            total = total.min(s);
        }
        let steps = m.step.saturating_sub(m.log_mark.1) as f64;
        let dt = m.c.train_time - m.log_mark.0;
        let sps = if dt > 0.0 && steps > 0.0 {
            steps / dt
        } else if m.c.train_time > 0.0 {
            m.c.steps_timed as f64 / m.c.train_time
        } else {
            0.0
        };
        let mut note = String::new();
        match m.state {
            State::Paused => note.push_str("paused"),
            State::Done => note.push_str(m.c.stopped.as_deref().unwrap_or("done")),
            State::Running => {}
        }
        if !m.fused_with.is_empty() && m.state == State::Running {
            note.push_str(&format!("fused ×{}", m.fused_with.len() + 1));
        }
        if m.device != self.device {
            note.push_str(&format!(" on {}", m.device));
        }
        MemberStatus {
            name: m.cfg.name.clone(),
            step: m.step,
            total_steps: total.max(m.step),
            epoch: (
                (m.epochs_done + 1).min(u64::from(m.cfg.epochs)),
                u64::from(m.cfg.epochs),
            ),
            loss: m.c.last_loss,
            steps_per_s: sps,
            mem_bytes: m.mem_now,
            scores: m.c.val.as_ref().map(|v| format!("val {}", v.headline())),
            note,
        }
    }

    fn event(&mut self, i: usize, text: String) -> Result<()> {
        let m = &mut self.members[i];
        let r = MetricRecord {
            step: m.step,
            epoch: m.epochs_done,
            time: self.time_offset + self.started.elapsed().as_secs_f64(),
            loss: m.c.last_loss,
            lr: 0.0,
            batch: m.batch,
            steps_per_s: 0.0,
            mem_bytes: m.mem_now,
            test_accuracy: None,
            val: None,
            test: None,
            event: Some(text.clone()),
        };
        m.metrics.write(&r)?;
        tracing::info!(member = %m.cfg.name, "{text}");
        self.progress.message(&format!("{}: {text}", m.cfg.name));
        Ok(())
    }

    /// Writes member `i`'s checkpoint from unit `ui` (its slice, `j`).
    fn checkpoint(&mut self, ui: usize, i: usize) -> Result<()> {
        let u = &self.units[ui];
        let j = u.members.iter().position(|&x| x == i).unwrap_or(0);
        let (params, ostate) = Cohort::member_state(u, j)?;
        let mut tensors = BTreeMap::new();
        for (n, t) in &params {
            tensors.insert(format!("model.{n}"), tensor_data(t)?);
        }
        for (n, t) in &ostate.tensors {
            tensors.insert(format!("optim.{n}"), tensor_data(t)?);
        }
        let pos = u.feed.position();
        let forwards = u.forwards;
        let time = self.elapsed();
        let m = &mut self.members[i];
        m.c.time = time;
        let mut trainer_state =
            serde_json::to_value(&m.c).map_err(|e| Error::json("trainer state", e))?;
        trainer_state["optimizer_step"] = serde_json::json!(ostate.step);
        let mut ck = Checkpoint {
            manifest: Manifest {
                format: FORMAT,
                member: m.cfg.name.clone(),
                step: m.step,
                epoch: m.epochs_done,
                batch: m.batch,
                device: m.device.to_string(),
                data_position: serde_json::to_value(pos)
                    .map_err(|e| Error::json("data position", e))?,
                rng: serde_json::json!({
                    "seed": m.cfg.seed,
                    "data_epoch": pos.epoch,
                    "data_index": pos.index,
                    "dropout_forwards": forwards,
                }),
                config_hash: m.cfg.config_hash(),
                config: m.cfg.identity(),
                vocabulary: self.data[&m.cfg.data].vocabulary.clone(),
                trainer_state,
                tensors_file: String::new(),
                tensors_bytes: 0,
                checksum: String::new(),
                wall_time: crate::tensorboard::now(),
            },
            tensors,
        };
        m.ckpt.save(&mut ck)?;
        m.last_ckpt_step = Some(m.step);
        Ok(())
    }

    /// Logs member `i` (a metrics record and TensorBoard scalars).
    fn log(&mut self, i: usize, lr: f64, val: Option<Scores>, test: Option<Scores>) -> Result<()> {
        let time = self.elapsed();
        let m = &mut self.members[i];
        let loss = if m.c.loss_n > 0 {
            m.c.loss_sum / m.c.loss_n as f64
        } else {
            m.c.last_loss
        };
        let steps = m.step.saturating_sub(m.log_mark.1);
        let dt = m.c.train_time - m.log_mark.0;
        let sps = if dt > 0.0 { steps as f64 / dt } else { 0.0 };
        if m.c.loss_n > 0 {
            m.c.last_loss = loss;
        }
        let r = MetricRecord {
            step: m.step,
            epoch: m.epochs_done,
            time,
            loss,
            lr,
            batch: m.batch,
            steps_per_s: sps,
            mem_bytes: m.mem_now,
            test_accuracy: test.as_ref().and_then(|t| t.accuracy),
            val,
            test,
            event: None,
        };
        m.metrics.write(&r)?;
        let mut scalars = vec![
            ("train/loss", loss as f32),
            ("train/lr", lr as f32),
            ("train/batch", m.batch as f32),
            ("train/steps_per_s", sps as f32),
            ("memory/bytes", m.mem_now as f32),
        ];
        let mut scored = Vec::new();
        for (split, s) in [("val", &r.val), ("test", &r.test)] {
            let Some(s) = s else { continue };
            let named = [
                ("loss", Some(s.loss)),
                ("accuracy", s.accuracy),
                ("top_k", s.top_k),
                ("perplexity", s.perplexity),
            ];
            for (name, v) in named {
                if let Some(v) = v {
                    scored.push((format!("{split}/{name}"), v as f32));
                }
            }
        }
        scalars.extend(scored.iter().map(|(t, v)| (t.as_str(), *v)));
        m.events.scalars(m.step, &scalars)?;
        m.c.loss_sum = 0.0;
        m.c.loss_n = 0;
        m.log_mark = (m.c.train_time, m.step);
        Ok(())
    }

    /// What member `i`'s step just taken calls for (`epoch_ended`: its unit's epoch ended with it).
    fn due(&self, i: usize, epoch_ended: bool) -> Due {
        let m = &self.members[i];
        let complete = m.epochs_done >= u64::from(m.cfg.epochs)
            || m.cfg.max_steps.is_some_and(|s| m.step >= s);
        let checkpoint = match m.cfg.checkpoint.every {
            CheckpointEvery::Steps(n) => m.step % n == 0,
            CheckpointEvery::Epochs(k) => epoch_ended && m.epochs_done % u64::from(k) == 0,
            CheckpointEvery::End | CheckpointEvery::Never => false,
        };
        Due {
            log: m.step % self.config.run.log_every == 0 || epoch_ended || complete,
            checkpoint: checkpoint && !complete,
            complete,
        }
    }

    /// After a step of unit `ui`: its losses, logs, epoch ends (evaluation), checkpoints, completion.
    fn after_step(&mut self, ui: usize, step: StepOutcome, dt: f64) -> Result<()> {
        self.units[ui].losses.push_back(step.losses);
        let u = &self.units[ui];
        let epochs_now = u.feed.data().epochs_done(&u.feed.position());
        let members = u.members.clone();
        let epoch_ended = members
            .iter()
            .any(|&i| epochs_now > self.members[i].epochs_done);
        for &i in &members {
            let m = &mut self.members[i];
            m.step += 1;
            m.epochs_done = m.epochs_done.max(epochs_now);
        }
        let dues: Vec<Due> = members.iter().map(|&i| self.due(i, epoch_ended)).collect();
        // A step that logs or checkpoints a member needs every loss so far.
        let all = dues.iter().any(|d| d.log || d.checkpoint);
        let dt = dt + self.take_losses(ui, all)?;
        let u = &self.units[ui];
        let lrs = u.opt.current_lrs();
        let (_, peak) = u.tenant.usage();
        let m_count = u.members.len() as u64;
        for &i in &members {
            let m = &mut self.members[i];
            m.c.train_time += dt;
            m.c.steps_timed += 1;
            m.mem_now = step.in_step / m_count;
            m.c.peak_mem = m.c.peak_mem.max(peak / m_count);
        }
        if let Some(note) = step.note {
            for &i in &members {
                self.event(i, note.clone())?;
            }
        }
        // Validation at every epoch's end, and every `eval_every` steps if asked.
        let step_now = self.members[members[0]].step;
        let eval_due = epoch_ended
            || self
                .config
                .run
                .eval_every
                .is_some_and(|n| step_now % n == 0);
        let u = &self.units[ui];
        let scores = match &u.feed.data().val {
            Some(val) if eval_due => Some(Cohort::evaluate(u, val)?),
            _ => None,
        };
        for (j, (&i, due)) in members.iter().zip(dues).enumerate() {
            let lr = lrs.get(j).or(lrs.first()).copied().unwrap_or(0.0);
            let val = scores.as_ref().map(|s| s[j].clone());
            if val.is_some() {
                let m = &mut self.members[i];
                m.c.val.clone_from(&val);
                m.c.val_step = Some(m.step);
            }
            // A member's last record is written when it is finalized, with its test scores.
            if (due.log || val.is_some()) && !due.complete {
                self.log(i, lr, val, None)?;
            }
            if due.checkpoint {
                self.checkpoint(ui, i)?;
            }
            if due.complete {
                self.members[i].state = State::Done;
            }
            let s = self.status(i);
            self.progress.update(i, s);
        }
        if let Some(h) = self.opts.halt_after_steps
            && members.iter().any(|&i| self.members[i].step >= h)
        {
            self.halted = true;
        }
        Ok(())
    }

    /// Final evaluation and checkpoint of the members of unit `ui` that are done; drops the unit when all are.
    fn finalize_done(&mut self, ui: usize) -> Result<bool> {
        let u = &self.units[ui];
        let done: Vec<usize> = u
            .members
            .iter()
            .copied()
            .filter(|&i| self.members[i].state == State::Done && !self.members[i].finalized)
            .collect();
        if done.is_empty() {
            return Ok(false);
        }
        self.take_losses(ui, true)?;
        let u = &self.units[ui];
        let data = u.feed.data().clone();
        // The test split, once, at the end; and validation where the last epoch's did not already score it.
        let test = data
            .test
            .as_ref()
            .map(|t| Cohort::evaluate(u, t))
            .transpose()?;
        let val_missing = done.iter().any(|&i| {
            let m = &self.members[i];
            m.c.val_step != Some(m.step)
        });
        let val = match &data.val {
            Some(v) if val_missing => Some(Cohort::evaluate(u, v)?),
            _ => None,
        };
        let members = u.members.clone();
        let lrs = u.opt.current_lrs();
        for (j, &i) in members.iter().enumerate() {
            if !done.contains(&i) {
                continue;
            }
            let m = &mut self.members[i];
            if let Some(v) = &val
                && m.c.val_step != Some(m.step)
            {
                m.c.val = Some(v[j].clone());
                m.c.val_step = Some(m.step);
            }
            m.c.test = test.as_ref().map(|t| t[j].clone());
            let lr = lrs.get(j).or(lrs.first()).copied().unwrap_or(0.0);
            let (val, test) = (m.c.val.clone(), m.c.test.clone());
            self.log(i, lr, val, test)?;
            let m = &self.members[i];
            if m.cfg.checkpoint.every != CheckpointEvery::Never && m.last_ckpt_step != Some(m.step)
            {
                self.checkpoint(ui, i)?;
            }
            let m = &mut self.members[i];
            m.events.flush()?;
            m.metrics.flush()?;
            m.finalized = true;
            let s = self.status(i);
            self.progress.update(i, s);
        }
        if members
            .iter()
            .all(|&i| self.members[i].state == State::Done)
        {
            let device = self.units.remove(ui).device;
            self.handed_back(&members, device)?;
            return Ok(true);
        }
        // Some members of a fused group stopped early: the others go on without them.
        let rest: Vec<usize> = members
            .iter()
            .copied()
            .filter(|i| !done.contains(i))
            .collect();
        let dev = self.units[ui].device;
        self.split_unit(ui, &rest, dev)?;
        if let Some(k) = self
            .units
            .iter()
            .position(|u| u.members.iter().all(|i| done.contains(i)))
        {
            let device = self.units.remove(k).device;
            self.handed_back(&done, device)?;
        }
        Ok(true)
    }

    /// Applies a changed control file.
    fn poll_control(&mut self) -> Result<()> {
        let wanted = match self.control.poll() {
            Ok(Some(w)) => w,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.progress
                    .message(&format!("warning: control file ignored: {e}"));
                return Ok(());
            }
        };
        if wanted.trim {
            self.trim_all()?;
        }
        for (name, c) in wanted.members {
            let Some(i) = self.members.iter().position(|m| m.cfg.name == name) else {
                let known: Vec<&str> = self.members.iter().map(|m| m.cfg.name.as_str()).collect();
                self.progress.message(&format!(
                    "warning: {}: no member \"{name}\" (members: {})",
                    self.control.path().display(),
                    known.join(", ")
                ));
                continue;
            };
            if self.members[i].state == State::Done {
                continue;
            }
            if c.stop {
                self.isolate(i)?;
                self.members[i].state = State::Done;
                self.members[i].c.stopped = Some("stopped".into());
                self.event(i, "stopped through the control file".into())?;
                continue;
            }
            if c.limit.is_some() || c.reserve.is_some() {
                self.resize_member(i, c.limit, c.reserve)?;
            }
            if let Some(b) = c.batch
                && b != self.members[i].batch
            {
                if let Some(ui) = self.isolate(i)? {
                    let old = self.units[ui].batch;
                    self.units[ui].batch = b;
                    self.members[i].batch = b;
                    self.event(i, format!("batch {old} -> {b} through the control file"))?;
                }
            }
            match (c.paused, &self.members[i].state) {
                (Some(true), State::Running) => {
                    self.isolate(i)?;
                    self.members[i].state = State::Paused;
                    self.event(i, "paused through the control file".into())?;
                }
                (Some(false), State::Paused) => {
                    self.members[i].state = State::Running;
                    self.event(i, "resumed through the control file".into())?;
                }
                _ => {}
            }
            let s = self.status(i);
            self.progress.update(i, s);
        }
        Ok(())
    }

    fn runnable(&self, ui: usize) -> bool {
        self.units[ui]
            .members
            .iter()
            .all(|&i| self.members[i].state == State::Running)
    }

    /// Up to `k` steps of unit `ui`; stops early at an epoch end when `until_epoch_end`. Returns whether the unit
    /// still exists at `ui` afterwards (it may be replaced by a split).
    fn step_unit(&mut self, ui: usize, k: u32, until_epoch_end: bool) -> Result<()> {
        for _ in 0..k {
            if ui >= self.units.len() || !self.runnable(ui) || self.halted {
                return Ok(());
            }
            let before = self.before_step(ui);
            let t0 = Instant::now();
            let r = Cohort::unit_step(&mut self.units[ui]);
            let dt = t0.elapsed().as_secs_f64();
            if !self.finish_step(ui, r, dt, before, until_epoch_end)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// One step of every runnable unit, the steps running concurrently (on the CPU: separate models on separate
    /// cores, as JAX's asynchronous dispatch overlaps them), then each step's bookkeeping in the sequential order.
    /// Every unit's step counts as started: a halt after N steps lets the others finish theirs, each step's time
    /// includes waiting for the slowest, and all units charge their step's memory at once.
    fn step_units_concurrently(&mut self) -> Result<()> {
        let ready: Vec<Option<(u64, Position)>> = (0..self.units.len())
            .map(|ui| self.runnable(ui).then(|| self.before_step(ui)))
            .collect();
        let mut results: Vec<_> = self
            .units
            .par_iter_mut()
            .zip(&ready)
            .map(|(u, r)| {
                r.as_ref().map(|_| {
                    let t0 = Instant::now();
                    let r = Cohort::unit_step(u);
                    (r, t0.elapsed().as_secs_f64())
                })
            })
            .collect();
        // Highest index first: a unit split by an OOM recovery never shifts the ones still to be handled.
        for (ui, before) in ready.into_iter().enumerate().rev() {
            if let (Some(before), Some((r, dt))) = (before, results[ui].take()) {
                self.finish_step(ui, r, dt, before, false)?;
            }
        }
        Ok(())
    }

    /// What [`Cohort::finish_step`] needs from before unit `ui`'s step: its epochs done and its feed's position.
    fn before_step(&self, ui: usize) -> (u64, Position) {
        let u = &self.units[ui];
        (self.members[u.members[0]].epochs_done, u.feed.position())
    }

    /// Logs unit `ui`'s step (or recovers from its OOM); whether the unit may take another step now.
    fn finish_step(
        &mut self,
        ui: usize,
        r: Result<StepOutcome>,
        dt: f64,
        (epochs_before, pos): (u64, Position),
        until_epoch_end: bool,
    ) -> Result<bool> {
        match r {
            Ok(step) => self.after_step(ui, step, dt)?,
            Err(e) => {
                let Some(oom) = oom_of(&e) else {
                    return Err(e);
                };
                self.units[ui].feed.seek(&pos)?;
                match self.recover(ui, oom) {
                    Ok(()) => {}
                    Err(Error::OutOfMemory { member, message }) => {
                        // The member is lost; the others go on.
                        self.progress.message(&format!(
                            "error: member \"{member}\" ran out of memory: {message}"
                        ));
                        self.finalize_done(ui)?;
                    }
                    Err(other) => return Err(other),
                }
                return Ok(false);
            }
        }
        if self.finalize_done(ui)? {
            return Ok(false);
        }
        Ok(!(until_epoch_end
            && self.members[self.units[ui].members[0]].epochs_done > epochs_before))
    }

    /// Trains until every member is done (or the run is halted); returns the summary (`None` when halted).
    ///
    /// # Errors
    /// Any error other than a member's unrecoverable OOM (which stops that member only).
    pub fn run(mut self) -> Result<RunOutcome> {
        if self.config.run.warmup {
            self.warm_up();
        }
        // The warm-up loaded the kernel modules: what lies outside the pool is measured again at once.
        self.memory_tick()?;
        for i in 0..self.members.len() {
            let s = self.status(i);
            self.progress.update(i, s);
        }
        self.started = Instant::now();
        while !self.halted && self.members.iter().any(|m| m.state != State::Done) {
            self.poll_control()?;
            self.memory_tick()?;
            // Members stopped through the control file get their final evaluation and checkpoint.
            let mut ui = 0;
            while ui < self.units.len() {
                if !self.finalize_done(ui)? {
                    ui += 1;
                }
            }
            if self
                .units
                .iter()
                .enumerate()
                .all(|(ui, _)| !self.runnable(ui))
            {
                if self.members.iter().all(|m| m.state == State::Done) {
                    break;
                }
                // Everyone left is paused: wait for the control file.
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            match self.config.run.schedule {
                // Separate CPU models step concurrently; on a GPU the units' kernels share one stream anyway.
                ScheduleKind::Lockstep if !self.units.iter().any(|u| u.device.is_cuda()) => {
                    self.step_units_concurrently()?;
                }
                ScheduleKind::Lockstep => {
                    let n = self.units.len();
                    for ui in (0..n).rev() {
                        self.step_unit(ui, 1, false)?;
                    }
                }
                ScheduleKind::Weighted => {
                    let n = self.units.len();
                    for ui in (0..n).rev() {
                        if ui < self.units.len() {
                            let w = self.members[self.units[ui].members[0]].cfg.weight;
                            self.step_unit(ui, w, false)?;
                        }
                    }
                }
                ScheduleKind::EpochSliced => {
                    let n = self.units.len();
                    let start = self.slice_cursor % n.max(1);
                    let pick = (0..n)
                        .map(|k| (start + k) % n)
                        .find(|&ui| self.runnable(ui));
                    if let Some(ui) = pick {
                        let id = self.units[ui].members[0];
                        self.step_unit(ui, u32::MAX, true)?;
                        // Next slice: the unit after this one (found by member, the list may have changed).
                        let now = self
                            .units
                            .iter()
                            .position(|u| u.members.contains(&id))
                            .unwrap_or(ui);
                        self.slice_cursor = now + 1;
                    }
                }
            }
        }
        if self.halted {
            return Ok(RunOutcome {
                run_dir: self.run.root().to_path_buf(),
                summary: None,
            });
        }
        self.progress.finish();
        self.last_memory_tick = None;
        self.memory_tick()?;
        let summary = self.summary();
        summary.write(&self.run.root().join(crate::run_dir::SUMMARY_FILE))?;
        crate::plot::write_run_plots(
            self.run.root(),
            &self
                .members
                .iter()
                .map(|m| m.cfg.name.clone())
                .collect::<Vec<_>>(),
        )?;
        Ok(RunOutcome {
            run_dir: self.run.root().to_path_buf(),
            summary: Some(summary),
        })
    }

    fn summary(&self) -> Summary {
        Summary {
            run_dir: self.run.root().display().to_string(),
            device: self.device.to_string(),
            schedule: self.config.run.schedule.to_string(),
            wall_seconds: self.started.elapsed().as_secs_f64(),
            members: self
                .members
                .iter()
                .map(|m| MemberSummary {
                    name: m.cfg.name.clone(),
                    data: m.cfg.data.clone(),
                    steps: m.step,
                    epochs: m.epochs_done,
                    final_loss: m.c.last_loss,
                    test_accuracy: m.c.test.as_ref().and_then(|t| t.accuracy),
                    val_accuracy: m.c.val.as_ref().and_then(|v| v.accuracy),
                    val_loss: m.c.val.as_ref().map(|v| v.loss),
                    val: m.c.val.clone(),
                    test: m.c.test.clone(),
                    peak_memory_bytes: m.c.peak_mem,
                    model_steps_per_s: if m.c.train_time > 0.0 {
                        m.c.steps_timed as f64 / m.c.train_time
                    } else {
                        0.0
                    },
                    oom_events: m.c.oom_events,
                    batch: m.batch,
                    device: m.device.to_string(),
                    fused_with: m.fused_with.clone(),
                    stopped: m.c.stopped.clone(),
                })
                .collect(),
            process_memory: self.last_process.clone(),
            peak_process_bytes: (self.peak_process > 0).then_some(self.peak_process),
        }
    }
}

/// Starts a new run of `config` and trains it to the end.
///
/// # Errors
/// As [`Cohort::new`] and [`Cohort::run`].
pub fn train(config: Config, opts: RunOptions) -> Result<RunOutcome> {
    Cohort::new(config, opts)?.run()
}

/// Resumes the run in `dir` and trains it to the end.
///
/// # Errors
/// As [`Cohort::resume`] and [`Cohort::run`].
pub fn resume(dir: &Path, opts: RunOptions) -> Result<RunOutcome> {
    Cohort::resume(dir, opts)?.run()
}
