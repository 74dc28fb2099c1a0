//! The [`Cohort`]: members, the units that train them, schedules, OOM recovery, control, checkpoints and reports.
//!
//! Every member trains in a *unit*: a model of `M` members built from one [`ModelSpec`] (`M = 1` for a member on its
//! own; `M > 1` for a fused group of same-spec members, issue 7), with its optimizer, its feed of batches and its
//! allocator tenant. Schedules pick units, a unit step is one optimizer step of each of its members, and everything
//! per member (loss, logs, checkpoints, pause, batch size, OOM events) stays per member: a member's checkpoint is its
//! own slice of the unit, and a unit can always be split, its members' parameters and optimizer state carried into
//! the new units (this is how a fused group splits in halves on OOM, how a paused member leaves its group, and how
//! a member moves to the CPU).
//!
//! Here: the run loop (a step's bookkeeping, members that are done or failed, an interrupt). Beside it, by concern:
//! `start` (a run started or resumed), `member` (a member's state, status, records and summary), `schedule` (which
//! units step next, behind one trait), `unit` (building, splitting, stepping and evaluating units), `checkpoints`
//! (a member's slice written and read back), `budget` (memory: budgets, hand-back, the process-wide limit, the live
//! snapshot), `oom` (the recovery plan, a pure function), `place` (members placed on the run's cards), `steer` (the
//! control file). Members are addressed by `MemberId`, their fixed place in the run; units by `UnitId`, unique to
//! each unit built.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use cohort_autograd::Model;
use cohort_data::Position;
use cohort_optim::{LossScaler, Optimizer, OptimizerState};
use cohort_tensor::{Device, HostRead, Precision, Tensor};

use crate::config::{CheckpointEvery, Config};
use crate::control::ControlFile;
use crate::dataset::DataSet;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::graph::Graphs;
use crate::memory::Tenant;
use crate::models::Models;
use crate::progress::Progress;
use crate::report::{Status, Summary};
use crate::run_dir::RunDir;
use member::{Counters, Due, MemberId, MemberRun, State};
use scaling::Scaling;
use schedule::{Seen, Steps, Turn};

mod budget;
mod checkpoints;
mod member;
mod oom;
mod place;
mod scaling;
mod schedule;
mod start;
mod steer;
mod trials;
mod unit;

/// A unit, unique for the run: the units a split or a move builds get new ids, so whatever holds an id never
/// addresses another unit by mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct UnitId(u64);

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
    /// Set to a signal's number (by the binary's SIGINT and SIGTERM handlers) to stop the run at the next step
    /// boundary: every member still training is checkpointed and its logs synced, and the outcome names the signal.
    pub interrupt: Option<Arc<AtomicUsize>>,
}

/// What a run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The summary; `None` when the run was halted by [`RunOptions::halt_after_steps`] or interrupted.
    pub summary: Option<Summary>,
    /// The signal that interrupted the run ([`RunOptions::interrupt`]), after every member was checkpointed.
    pub interrupted: Option<i32>,
}

/// A model of `M` members trained together (M = 1: one member on its own).
#[derive(Debug)]
struct Unit {
    id: UnitId,
    members: Vec<MemberId>,
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
    /// The precision policy its products run under (its members', which fuse only under one policy).
    precision: Precision,
    /// Under `f16`, the dynamic loss scale of its steps (one for the unit: a fused step's update runs for every
    /// member or for none); saved in each member's checkpoint.
    scaling: Option<Scaling>,
    /// Steps queued on the device whose losses (and loss scale) are not read back yet, oldest first.
    losses: VecDeque<Readings>,
}

/// What a step sends back to the host: its per-member losses and, under f16, the loss scale after it.
#[derive(Debug)]
struct Readings {
    losses: HostRead,
    scale: Option<HostRead>,
}

impl Readings {
    /// The reads of a step's `losses` and of `scaler`'s state, queued after it.
    fn of(losses: &Tensor, scaler: Option<&LossScaler>) -> Result<Readings> {
        Ok(Readings {
            losses: losses.read_later()?,
            scale: scaler.map(LossScaler::read_later).transpose()?,
        })
    }
}

/// Steps whose losses may still be on their way back: the host queues the next step meanwhile, but
/// never runs further ahead of the device than this.
const LOSSES_IN_FLIGHT: usize = 2;

/// What a unit step leaves for the bookkeeping.
struct StepOutcome {
    /// The per-member losses and the loss scale, on their way to the host.
    readings: Readings,
    /// Bytes the unit's tenant held at the height of the step.
    in_step: u64,
    /// Something worth an event (a capture, or why none).
    note: Option<String>,
}

/// One member's parameters and optimizer state, without the member dimension.
type MemberState = (Vec<(String, Tensor)>, OptimizerState);

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
    schedule: Box<dyn schedule::Schedule>,
    /// The id the next unit built gets.
    next_unit: std::cell::Cell<u64>,
    halted: bool,
    /// When the process's memory was last measured ([`Cohort::memory_tick`]).
    last_memory_tick: Option<Instant>,
    /// The process's device memory as last measured, and its peak (NVML's figure).
    last_process: Option<cohort_tensor::memory::ProcessMemory>,
    peak_process: u64,
    /// The "every member is paused" line was printed (until one runs again).
    said_all_paused: bool,
    /// The GPU's choices made by timing, saved with the run ([`crate::tuning`]).
    tuning: crate::tuning::TuningFile,
    /// A sweep's scheduler and its record (`[search]`).
    sweep: Option<crate::sweep::Sweep>,
    /// This round's validations, for the sweep to judge together at its end.
    validated: Vec<trials::Validated>,
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

    /// A one-line description: members, data, schedule, and precision policies other than fp32.
    pub fn describe(&self) -> String {
        let fused: usize = self.units.iter().filter(|u| u.members.len() > 1).count();
        let sets: Vec<String> = self
            .data
            .values()
            .map(|d| format!("{} ({})", d.name, d.described))
            .collect();
        let members = match &self.config.search {
            None => format!("{} members", self.members.len()),
            Some(s) => {
                let training = self
                    .members
                    .iter()
                    .filter(|m| m.state == State::Running)
                    .count();
                format!(
                    "a sweep of {} trials ({} on {}, {}: {training} start now)",
                    self.members.len(),
                    s.scheduler.name(),
                    s.metric.name(),
                    s.max_concurrent
                        .map_or("as many at once as memory admits".to_string(), |n| {
                            format!("at most {n} at once")
                        })
                )
            }
        };
        format!(
            "{members} on {}, schedule: {}{}{}",
            sets.join(", "),
            self.config.run.schedule,
            if fused > 0 {
                format!(" ({fused} fused group{})", if fused > 1 { "s" } else { "" })
            } else {
                String::new()
            },
            self.describe_precision()
        )
    }

    /// `, precision bf16` where every member has one policy other than fp32; `, precision bf16: cnn · f16: mlp-a,
    /// mlp-b (the others fp32)` where they differ (a count for more than three members); nothing when all are fp32.
    fn describe_precision(&self) -> String {
        let mut by: BTreeMap<Precision, Vec<&str>> = BTreeMap::new();
        for m in &self.members {
            by.entry(m.cfg.precision)
                .or_default()
                .push(m.cfg.name.as_str());
        }
        match by.keys().copied().collect::<Vec<_>>().as_slice() {
            [Precision::Fp32] | [] => String::new(),
            [only] => format!(", precision {only}"),
            _ => {
                let parts: Vec<String> = by
                    .iter()
                    .filter(|(p, _)| **p != Precision::Fp32)
                    .map(|(p, names)| match names.len() {
                        1..=3 => format!("{p}: {}", names.join(", ")),
                        n => format!("{p}: {n} members"),
                    })
                    .collect();
                let others = if by.contains_key(&Precision::Fp32) {
                    " (the others fp32)"
                } else {
                    ""
                };
                format!(", precision {}{others}", parts.join(" · "))
            }
        }
    }

    fn elapsed(&self) -> f64 {
        self.time_offset + self.started.elapsed().as_secs_f64()
    }

    /// After a step of unit `ui`: its losses, logs, epoch ends (evaluation), checkpoints, completion.
    fn after_step(&mut self, ui: usize, step: StepOutcome, dt: f64) -> Result<()> {
        self.units[ui].losses.push_back(step.readings);
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
            m.c.mem_high = m.c.mem_high.max(peak / m_count);
        }
        // The tenant's peak is read once a step and starts afresh: a record's high-water mark is its interval's.
        u.tenant.reset_peak();
        // Within a schedule's turn of many steps too (an epoch slice), the live snapshot stays fresh.
        self.memory_tick()?;
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
                .is_some_and(|n| step_now % n == 0)
            || members.iter().any(|&i| self.rung_due(i));
        let u = &self.units[ui];
        let scores = match &u.feed.data().val {
            Some(val) if eval_due => Some(Cohort::evaluate(u, val)?),
            _ => None,
        };
        let mut to_save = Vec::new();
        let mut best = Vec::new();
        for (j, (&i, due)) in members.iter().zip(dues).enumerate() {
            let lr = lrs.get(j).or(lrs.first()).copied().unwrap_or(0.0);
            let val = scores.as_ref().map(|s| s[j].clone());
            if let Some(v) = &val {
                let m = &mut self.members[i];
                m.c.val = Some(v.clone());
                m.c.val_step = Some(m.step);
                // Its best checkpoint, its early stop, the sweep's verdict (a pruned member is finalized next).
                if self.judge(i, v, epoch_ended)? {
                    best.push(i);
                }
            }
            // A member's last record is written when it is finalized, with its test scores.
            if (due.log || val.is_some()) && !due.complete {
                self.log(i, lr, val, None)?;
            }
            if due.checkpoint && !self.members[i].diverged {
                to_save.push(i);
            }
            if due.complete {
                self.members[i].state = State::Done;
            }
        }
        self.checkpoint(ui, &to_save)?;
        self.checkpoint_best(ui, &best)?;
        for &i in &members {
            self.show(i);
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
        let done: Vec<MemberId> = u
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
        // An f16 member's record of its loss scaling, before its last record.
        if let Some(scale) = u.scaling.as_ref().map(|s| s.seen.scale) {
            for &i in &done {
                let m = &self.members[i];
                let text = format!(
                    "f16 loss scaling: {} of {} steps skipped (gradients not finite); loss scale {scale} at the end",
                    m.c.skipped_steps, m.step
                );
                self.record_event(i, text, false)?;
            }
        }
        let mut best = Vec::new();
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
                if self.judge(i, &v[j], false)? {
                    best.push(i);
                }
            }
            let m = &mut self.members[i];
            m.c.test = test.as_ref().map(|t| t[j].clone());
            let lr = lrs.get(j).or(lrs.first()).copied().unwrap_or(0.0);
            let (val, test) = (m.c.val.clone(), m.c.test.clone());
            self.log(i, lr, val, test)?;
        }
        let to_save: Vec<MemberId> = done
            .iter()
            .copied()
            .filter(|&i| {
                let m = &self.members[i];
                m.cfg.checkpoint.every != CheckpointEvery::Never
                    && m.last_ckpt_step != Some(m.step)
                    && !m.diverged
            })
            .collect();
        self.checkpoint(ui, &to_save)?;
        self.checkpoint_best(ui, &best)?;
        for &i in &done {
            let m = &mut self.members[i];
            m.events.sync()?;
            m.metrics.sync()?;
            self.finalized(i)?;
            self.show(i);
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
        let rest: Vec<MemberId> = members
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

    /// [`Cohort::finalize_done`] for every unit.
    fn finalize_all_done(&mut self) -> Result<()> {
        let mut ui = 0;
        while ui < self.units.len() {
            if !self.finalize_done(ui)? {
                ui += 1;
            }
        }
        Ok(())
    }

    fn runnable(&self, ui: usize) -> bool {
        self.units[ui]
            .members
            .iter()
            .all(|&i| self.members[i].state == State::Running)
    }

    /// `memory-trace.json` and, with `plots` (a run that ended), `loss.png` and `memory.png`, from the members'
    /// records, read once (and, on a GPU, the process's).
    fn write_run_files(&self, plots: bool) -> Result<()> {
        let root = self.run.root();
        let total = crate::memory::device_total_bytes(&self.device)?;
        let members: Vec<(String, Option<u64>)> = self
            .members
            .iter()
            .map(|m| {
                (
                    m.cfg.name.clone(),
                    m.cfg.memory.limit.map(|l| l.bytes(total)),
                )
            })
            .collect();
        let records = crate::metrics::read_members(root, members.iter().map(|(n, _)| n.as_str()))?;
        let timeline = crate::memory_timeline::Timeline::of(root, &members, &records);
        crate::memory_trace::write(root, &timeline)?;
        if plots {
            let names: Vec<String> = members.into_iter().map(|(name, _)| name).collect();
            crate::plot::write_run_plots(root, &names, &records, &timeline)?;
        }
        Ok(())
    }

    /// The signal that asked the run to stop, if one did.
    fn interrupted(&self) -> Option<i32> {
        let signal = self.opts.interrupt.as_ref()?.load(Ordering::Relaxed);
        (signal != 0).then_some(signal as i32)
    }

    /// After an interruption: every member still training is checkpointed where it stands (unless its policy is
    /// `never`) and says so; every member's logs are synced.
    fn checkpoint_all(&mut self, signal: i32) -> Result<()> {
        for ui in 0..self.units.len() {
            self.take_losses(ui, true)?;
            let training: Vec<MemberId> = self.units[ui]
                .members
                .iter()
                .copied()
                .filter(|&i| self.members[i].state != State::Done)
                .collect();
            let to_save: Vec<MemberId> = training
                .iter()
                .copied()
                .filter(|&i| {
                    let m = &self.members[i];
                    m.cfg.checkpoint.every != CheckpointEvery::Never
                        && m.last_ckpt_step != Some(m.step)
                })
                .collect();
            self.checkpoint(ui, &to_save)?;
            for i in training {
                let saved = self.members[i].cfg.checkpoint.every != CheckpointEvery::Never;
                let step = self.members[i].step;
                let name = signal_name(signal);
                let text = if saved {
                    format!("interrupted by {name} at step {step}: checkpointed")
                } else {
                    format!(
                        "interrupted by {name} at step {step}: not checkpointed (checkpoint = \"never\")"
                    )
                };
                self.event(i, text)?;
            }
        }
        for m in &mut self.members {
            m.metrics.sync()?;
            m.events.sync()?;
        }
        Ok(())
    }

    /// The unit that trains member `i`, while one does.
    fn unit_of(&self, i: MemberId) -> Option<&Unit> {
        self.units.iter().find(|u| u.members.contains(&i))
    }

    /// Where unit `id` is in the list, while it exists.
    fn position(&self, id: UnitId) -> Option<usize> {
        self.units.iter().position(|u| u.id == id)
    }

    /// Steps of unit `id`, as many as `steps` says, while it exists unchanged (a split or an OOM recovery ends
    /// its turn) and can run.
    fn step_unit(&mut self, id: UnitId, steps: Steps) -> Result<()> {
        let (k, until_epoch_end) = match steps {
            Steps::Count(k) => (k, false),
            Steps::EpochEnd => (u32::MAX, true),
        };
        for _ in 0..k {
            let Some(ui) = self.position(id) else {
                return Ok(());
            };
            if !self.runnable(ui) || self.halted || self.interrupted().is_some() {
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

    /// One step of each of units `ids`, the steps running concurrently (on the CPU: separate models on separate
    /// cores), then each step's bookkeeping in turn, every unit found by its id (an earlier one's OOM recovery may
    /// have split it off the list). Every unit's step counts as started: a halt after N steps lets the others
    /// finish theirs, each step's time includes waiting for the slowest, and all units charge their step's memory
    /// at once.
    fn step_units_concurrently(&mut self, ids: &[UnitId]) -> Result<()> {
        let ready: Vec<Option<(u64, Position)>> = (0..self.units.len())
            .map(|ui| {
                (ids.contains(&self.units[ui].id) && self.runnable(ui))
                    .then(|| self.before_step(ui))
            })
            .collect();
        let results: Vec<_> = self
            .units
            .par_iter_mut()
            .zip(ready)
            .filter_map(|(u, before)| {
                let before = before?;
                let t0 = Instant::now();
                let r = Cohort::unit_step(u);
                Some((u.id, r, t0.elapsed().as_secs_f64(), before))
            })
            .collect();
        for (id, r, dt, before) in results {
            if let Some(ui) = self.position(id) {
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
        // Whatever goes wrong with this unit (its step, its logs, its checkpoints, its final evaluation) ends its
        // members alone; the others train on.
        match self.finish_unit_step(ui, r, dt, pos) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                self.fail_unit(ui, &e);
                return Ok(false);
            }
        }
        Ok(!(until_epoch_end
            && self.members[self.units[ui].members[0]].epochs_done > epochs_before))
    }

    /// The bookkeeping of unit `ui`'s step: logs and checkpoints, OOM recovery, members that are done. `false`
    /// when the unit is gone or changed (split, recovered, finalized).
    fn finish_unit_step(
        &mut self,
        ui: usize,
        r: Result<StepOutcome>,
        dt: f64,
        pos: Position,
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
        Ok(!self.finalize_done(ui)?)
    }

    /// Ends every member of unit `ui` on `e`, with the cause in the summary; the unit's memory goes back. Writing
    /// the event may fail too (a full disk): the member still ends, and the progress line says why.
    fn fail_unit(&mut self, ui: usize, e: &Error) {
        let members = self.units[ui].members.clone();
        let cause = e.to_string();
        let headline = cause.lines().next().unwrap_or("").to_string();
        for &i in &members {
            let m = &mut self.members[i];
            m.end(Status::Failed, Some(format!("failed: {headline}")));
            let text = format!(
                "failed at step {}: {cause}; the other members go on",
                m.step
            );
            if self.event(i, text.clone()).is_err() {
                let name = self.members[i].cfg.name.clone();
                self.progress.message(&format!("{name}: {text}"));
            }
            if let Err(e) = self.finalized(i) {
                self.progress.message(&format!("warning: {e}"));
            }
            self.show(i);
        }
        let device = self.units.remove(ui).device;
        let _ = self.handed_back(&members, device);
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
        self.progress.begin();
        for i in self.member_ids() {
            self.show(i);
        }
        self.started = Instant::now();
        while !self.halted
            && self.interrupted().is_none()
            && self.members.iter().any(|m| m.state != State::Done)
        {
            self.poll_control()?;
            self.memory_tick()?;
            // Members stopped through the control file get their final evaluation and checkpoint.
            self.finalize_all_done()?;
            // A sweep's waiting trials take the room that ended ones left.
            self.admit()?;
            if self
                .units
                .iter()
                .enumerate()
                .all(|(ui, _)| !self.runnable(ui))
            {
                if self.members.iter().all(|m| m.state == State::Done) {
                    break;
                }
                // Everyone left is paused: say so once, and wait for the control file.
                if !self.said_all_paused {
                    self.said_all_paused = true;
                    self.progress.message(&format!(
                        "every member still training is paused: set paused = false (or remove the key) in {} to \
                         continue, or stop = true to finish them",
                        self.control.path().display()
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            let seen: Vec<Seen> = self
                .units
                .iter()
                .enumerate()
                .map(|(ui, u)| Seen {
                    id: u.id,
                    members: u.members.clone(),
                    runnable: self.runnable(ui),
                    weight: self.members[u.members[0]].cfg.weight,
                })
                .collect();
            // On a GPU the units' kernels share one stream: their steps would not overlap.
            let concurrent = !self.units.iter().any(|u| u.device.is_cuda());
            match self.schedule.turn(&seen, concurrent) {
                Turn::Together(ids) => self.step_units_concurrently(&ids)?,
                Turn::InTurn(turns) => {
                    for (id, steps) in turns {
                        self.step_unit(id, steps)?;
                    }
                }
            }
            // Before anything else sees the round's end, an interrupt's checkpoints among them.
            self.settle()?;
        }
        if self.halted {
            return Ok(RunOutcome {
                run_dir: self.run.root().to_path_buf(),
                summary: None,
                interrupted: None,
            });
        }
        if let Some(signal) = self.interrupted() {
            // Members that ended in the last round (pruned, stopped early) get their final record and checkpoint.
            self.finalize_all_done()?;
            self.checkpoint_all(signal)?;
            self.write_run_files(false)?;
            self.progress.finish();
            return Ok(RunOutcome {
                run_dir: self.run.root().to_path_buf(),
                summary: None,
                interrupted: Some(signal),
            });
        }
        // Members the last round ended (pruned at its end) get their final record and checkpoint too.
        self.finalize_all_done()?;
        self.progress.finish();
        self.last_memory_tick = None;
        self.memory_tick()?;
        let summary = self.summary();
        summary.write(&self.run.root().join(crate::run_dir::SUMMARY_FILE))?;
        self.write_run_files(true)?;
        if summary.sweep.is_some() {
            let plot = self.run.root().join(crate::plot::sweep::REPORT_PLOT_FILE);
            crate::plot::sweep::write_report_plot(&plot, &summary)?;
        }
        Ok(RunOutcome {
            run_dir: self.run.root().to_path_buf(),
            summary: Some(summary),
            interrupted: None,
        })
    }
}

/// A signal's name as a user knows it (`SIGINT (Ctrl-C)`, `SIGTERM`).
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGINT => "SIGINT (Ctrl-C)",
        signal_hook::consts::SIGTERM => "SIGTERM",
        _ => "a signal",
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
