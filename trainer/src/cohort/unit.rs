//! Units: a model of `M` members with its optimizer, feed of batches and allocator tenant. Built from the members'
//! specs (same-spec members fused), from checkpoints where there are some; split when members leave; warmed up,
//! stepped (eagerly or by replaying a captured CUDA graph) and evaluated.

use std::collections::VecDeque;
use std::time::Instant;

use cohort_alloc::TenantLimits;
use cohort_autograd::nn::DropoutSpec;
use cohort_autograd::spec::LayerSpec;
use cohort_autograd::{BuildOptions, Model, ModelSpec, Shape, Tape};
use cohort_data::Position;
use cohort_data::Task;
use cohort_optim::{LossScale, OptimConfig, Optimizer, OptimizerState, Schedule};
use cohort_tensor::{DType, Device, Precision, Tensor};

use crate::checkpoint::Checkpoint;
use crate::config::{LrScheduleConfig, MemberConfig, MemberModel, ScheduleKind};
use crate::dataset::{DataSet, EvalSplit};
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::graph::{Graphs, StepGraph, backward_and_step};
use crate::memory::{Tenant, device_total_bytes};
use crate::models::Models;
use crate::objective::{Scores, Tally};
use crate::report::Status;

use super::{
    Cohort, LOSSES_IN_FLIGHT, MemberId, MemberState, Readings, Scaling, State, StepOutcome, Unit,
    UnitId, oom_of,
};

/// Why a member's model cannot train on its data, if it cannot: a layer that does not fit, token ids against float
/// features or the other way round, an embedding smaller than the vocabulary, a custom model nobody registered.
pub(super) fn misfit(cfg: &MemberConfig, data: &DataSet, models: &Models) -> Option<String> {
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
pub(super) fn output_misfit(out: &[usize], task: &Task, name: &str) -> Option<String> {
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
pub(super) fn activation_bytes(cfg: &MemberConfig, data: &[usize]) -> u64 {
    cfg.model.spec().map_or(0, |s| {
        s.activation_count(&s.input_for(data)).unwrap_or(0) as u64 * 2 * 4
    })
}

/// Bytes one member holds between steps for `params` parameters: the parameters, their gradients and the
/// optimizer's state slots, in f32.
pub(super) fn persistent_bytes(cfg: &MemberConfig, params: u64) -> u64 {
    params * 4 * (2 + cfg.optimizer.state_slots() as u64)
}

/// The learning-rate schedule of a member that trains `total` steps.
pub(super) fn lr_schedule(cfg: &MemberConfig, total: u64) -> Schedule {
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
pub(super) fn planned_steps(cfg: &MemberConfig, data: &DataSet) -> u64 {
    let s = u64::from(cfg.epochs) * data.batches_per_epoch(cfg.batch);
    cfg.max_steps.map_or(s, |m| m.min(s))
}

/// The top-level dropout layers of `spec` that fused members may differ in: those after its first layer with
/// parameters (before it the value has no member dimension to hold a rate per member).
fn member_dropouts(spec: &ModelSpec, data: &[usize]) -> Vec<usize> {
    let input = spec.input_for(data);
    let Ok(shapes) = spec.shapes(&input) else {
        return Vec::new();
    };
    let Some(first) = spec
        .layers
        .iter()
        .zip(&shapes)
        .position(|(l, s)| l.param_count(s) > 0)
    else {
        return Vec::new();
    };
    (first + 1..spec.layers.len())
        .filter(|&k| matches!(spec.layers[k], LayerSpec::Dropout(_)))
        .collect()
}

/// Each top-level dropout layer's rate for each of `specs` (the members of a unit), in layer order.
fn dropout_rates(specs: &[&ModelSpec]) -> Vec<Vec<f64>> {
    let layers = &specs[0].layers;
    (0..layers.len())
        .filter(|&k| matches!(layers[k], LayerSpec::Dropout(_)))
        .map(|k| {
            specs
                .iter()
                .map(|s| match &s.layers[k] {
                    LayerSpec::Dropout(d) => d.p,
                    _ => 0.0,
                })
                .collect()
        })
        .collect()
}

/// What members must share to be fused: everything but the learning rate, the seed and the rates of dropout
/// layers that hold a member dimension. The precision policy is the unit's, one for all of its products.
pub(super) fn fusion_key(cfg: &MemberConfig, data: &DataSet, graphs: bool) -> String {
    let mut opt = cfg.optimizer.clone();
    match &mut opt {
        OptimConfig::Sgd { lr, .. }
        | OptimConfig::Adam { lr, .. }
        | OptimConfig::AdamW { lr, .. } => {
            *lr = 0.0;
        }
    }
    // The schedule's shape: its floor (a rate) may differ, as the base rate may; each member keeps its own. A
    // captured CUDA graph scales every member's rate by one factor, so where steps replay graphs only members
    // with the same floor factor fuse (the others replay graphs of their own).
    let shape = match cfg.lr_schedule {
        LrScheduleConfig::Cosine { warmup, .. } if !graphs => LrScheduleConfig::Cosine {
            warmup,
            min_lr: 0.0,
        },
        LrScheduleConfig::Cosine { .. } => {
            return serde_json::json!({"members": fusion_key(cfg, data, false),
                "schedule": lr_schedule(cfg, planned_steps(cfg, data))})
            .to_string();
        }
        ref other => other.clone(),
    };
    let mut model = cfg.model.clone();
    if let MemberModel::Spec(spec) = &mut model {
        for k in member_dropouts(spec, &data.shape) {
            spec.layers[k] = LayerSpec::Dropout(DropoutSpec { p: 0.0 });
        }
    }
    serde_json::json!({
        "model": model,
        "optimizer": opt,
        "schedule": shape,
        "planned_steps": planned_steps(cfg, data),
        "batch": cfg.batch,
        "data": cfg.data,
        "weight": cfg.weight,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "oom": cfg.oom,
        "precision": cfg.precision.name(),
    })
    .to_string()
}

/// An evaluation batch as tensors on `device`: features `[n, prod(shape)]`, targets as the task has them.
pub(super) fn eval_tensors(
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

impl Unit {
    /// This unit, its loss scaler (under f16) going on from `saved` where there is one: a checkpoint's, or that of
    /// the unit it was split from. A unit under another policy has none, and takes none up.
    pub(super) fn with_scaler(mut self, saved: Option<LossScale>) -> Result<Unit> {
        if self.scaling.is_some()
            && let Some(s) = saved
        {
            self.scaling = Some(Scaling::new(s, &self.device)?);
        }
        Ok(self)
    }
}

impl Cohort {
    /// Groups members into units (fusing compatible ones) and builds them, from checkpoints where there are some.
    pub(super) fn build_units(&mut self, mut loaded: Vec<Option<Checkpoint>>) -> Result<()> {
        let mut groups: Vec<(String, Vec<MemberId>)> = Vec::new();
        for i in self.member_ids() {
            let m = &self.members[i];
            // Members that train and have no unit yet: all of them at the start, a sweep's admitted trials later.
            if matches!(m.state, State::Done | State::Queued) || self.unit_of(i).is_some() {
                continue;
            }
            // A checkpointed member fuses only with members at the same point (step, data position, batch, device).
            let mut key = self.fusion_group(i);
            if let Some(ck) = &loaded[i.0] {
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
            let mut scaler: Option<LossScale> = None;
            for &i in &g {
                match loaded[i.0].take() {
                    Some(ck) => {
                        // Members saved from one unit saved its one scaler; should they differ, the smallest
                        // scale is the one that overflows least.
                        if let Some(s) = ck.manifest.loss_scaler
                            && scaler.is_none_or(|t| s.scale < t.scale)
                        {
                            scaler = Some(s);
                        }
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
            let unit = self
                .build_unit(g.clone(), dev, &pos, batch, states, forwards)
                .and_then(|u| u.with_scaler(scaler));
            match unit {
                Ok(unit) => {
                    self.units.push(unit);
                    for &i in &g {
                        self.note_cpu_precision(i)?;
                    }
                }
                // Not even the parameters fit the budget: that member cannot train, the others can.
                Err(e) if oom_of(&e).is_some() => {
                    for &i in &g {
                        let m = &mut self.members[i];
                        m.c.oom_events += 1;
                        m.end(
                            Status::Failed,
                            Some("out of memory before its first step".into()),
                        );
                        let msg = format!(
                            "error: member \"{}\" does not fit its memory budget even before its first step: {e}",
                            m.cfg.name
                        );
                        self.progress.message(&msg);
                        self.finalized(i)?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.note_fusion();
        Ok(())
    }

    /// The key members that may fuse share (where they stand, their step and device, apart): their
    /// [`fusion_key`], or one of their own for a member that trains unfused.
    pub(super) fn fusion_group(&self, i: MemberId) -> String {
        let fusion = self.config.run.fuse && self.config.run.schedule != ScheduleKind::EpochSliced;
        let m = &self.members[i];
        if fusion && m.cfg.fuse && m.cfg.model.spec().is_some() {
            fusion_key(
                &m.cfg,
                &self.data[&m.cfg.data],
                self.device.is_cuda() && self.config.run.cuda_graphs,
            )
        } else {
            format!("single:{}", i.0)
        }
    }

    pub(super) fn note_fusion(&mut self) {
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
    pub(super) fn build_model(
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

    /// Says once, where member `i` trains on the CPU under a policy other than fp32, that the policy changes
    /// nothing there (it applies on CUDA; the CPU's products are fp32 whatever it says).
    pub(super) fn note_cpu_precision(&mut self, i: MemberId) -> Result<()> {
        let m = &self.members[i];
        let p = m.cfg.precision;
        if m.device != Device::Cpu || p == Precision::Fp32 || m.state == State::Done {
            return Ok(());
        }
        let mut text = format!("precision {p} has no effect on the CPU: its products run in fp32");
        if p == Precision::F16 {
            text.push_str(" (its loss is still scaled, which changes nothing there either)");
        }
        self.event(i, text)
    }

    /// Builds a unit of `members` on `device`, its feed at `pos`, from saved states when given (an f16 unit's loss
    /// scaler starts afresh: [`Unit::with_scaler`] continues a saved one).
    pub(super) fn build_unit(
        &self,
        members: Vec<MemberId>,
        device: Device,
        pos: &Position,
        batch: usize,
        states: Option<Vec<MemberState>>,
        forwards: u64,
    ) -> Result<Unit> {
        let first = &self.members[members[0]].cfg;
        let data = self.data[&first.data].clone();
        let spec = first.model.spec();
        // Every member's own spec: they may differ in dropout rates ([`fusion_key`]).
        let member_specs: Vec<&ModelSpec> = members
            .iter()
            .filter_map(|&i| self.members[i].cfg.model.spec())
            .collect();
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
        // A member on the CPU in a GPU run (pinned there, or moved there as a last resort) has no budget there: its
        // budget is for the card's memory.
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
                let schedules: Vec<Schedule> = members
                    .iter()
                    .map(|&i| lr_schedule(&self.members[i].cfg, planned))
                    .collect();
                if schedules.iter().any(|s| *s != schedules[0]) {
                    opt.set_member_schedules(schedules)?;
                }
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
            // Fused members may differ in the rates of dropout layers that hold the member dimension.
            if m > 1 && !member_specs.is_empty() {
                model.set_dropout_rates(dropout_rates(&member_specs));
            }
            Ok((model, opt))
        })?;
        let per_member = persistent_bytes(first, model.member_param_count() as u64);
        tenant.charge_persistent(per_member * m as u64)?;
        let act_bytes_per_example = activation_bytes(first, &data.shape) * m as u64;
        let prefetch = self.config.data[&first.data].prefetch * batch;
        let feed = Feed::open(data, pos, prefetch)?.with_device_prefetch(&device)?;
        // All members of a unit share one policy (it is part of the fusion key).
        let precision = first.precision;
        let scaling = (precision == Precision::F16)
            .then(|| Scaling::new(LossScale::default(), &device))
            .transpose()?;
        // A replay would draw a dropout layer's captured mask again.
        // An embedding reads its ids back to check them, which a graph cannot replay.
        let graphs = Graphs::new(
            device.is_cuda()
                && self.config.run.cuda_graphs
                && spec.is_some_and(|s| s.vocab().is_none())
                && member_specs.iter().all(|s| !s.draws_masks()),
        );
        let id = UnitId(self.next_unit.get());
        self.next_unit.set(id.0 + 1);
        Ok(Unit {
            id,
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
            precision,
            scaling,
            losses: VecDeque::new(),
        })
    }

    /// The parameters, buffers and optimizer state of the members at positions `js` of unit `u`, on the host.
    /// Each whole tensor is copied to the host once and the members' slices are cut there, so that checkpoints or
    /// a split take no device memory: under a tight limit a device-side slice could fail for want of the very
    /// memory the member is about to give back.
    pub(super) fn member_states(u: &Unit, js: &[usize]) -> Result<Vec<MemberState>> {
        let host = |(name, t): (String, Tensor)| -> Result<(String, Tensor)> {
            Ok((name, t.to_device(&Device::Cpu)?))
        };
        let params = u
            .model
            .state()
            .into_iter()
            .map(host)
            .collect::<Result<Vec<_>>>()?;
        let ostate = u.opt.state_dict();
        let ostate = OptimizerState {
            step: ostate.step,
            tensors: ostate
                .tensors
                .into_iter()
                .map(host)
                .collect::<Result<Vec<_>>>()?,
        };
        js.iter()
            .map(|&j| {
                let member = params
                    .iter()
                    .map(|(name, t)| {
                        let shape = t.shape();
                        Ok((name.clone(), t.narrow(0, j, 1)?.reshape(&shape[1..])?))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let o = if ostate.tensors.is_empty() {
                    ostate.clone()
                } else {
                    ostate.member(j)?
                };
                Ok((member, o))
            })
            .collect()
    }

    /// Splits unit `ui`: the members in `first` go into a new unit, the rest into another; both continue where the
    /// unit stood (same data position, batch, device, parameters and optimizer state).
    pub(super) fn split_unit(
        &mut self,
        ui: usize,
        first: &[MemberId],
        device: Device,
    ) -> Result<()> {
        self.take_losses(ui, true)?;
        let u = &self.units[ui];
        let pos = u.feed.position();
        let batch = u.batch;
        let mut a = (Vec::new(), Vec::new());
        let mut b = (Vec::new(), Vec::new());
        // On the host, so the old unit's device memory can go before the new units are built.
        let all: Vec<usize> = (0..u.members.len()).collect();
        let states = Cohort::member_states(u, &all)?;
        for (&i, s) in u.members.iter().zip(states) {
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
        let scaler = u.scaling.as_ref().map(Scaling::now).transpose()?;
        // Drop the old unit (and its memory) before building the new ones.
        self.units.remove(ui);
        let ua = self
            .build_unit(a.0, device, &pos, batch, Some(a.1), forwards)?
            .with_scaler(scaler)?;
        self.units.insert(ui, ua);
        if !b.0.is_empty() {
            let ub = self
                .build_unit(b.0, old_device, &pos, batch, Some(b.1), forwards)?
                .with_scaler(scaler)?;
            self.units.push(ub);
        }
        self.note_fusion();
        Ok(())
    }

    /// Moves member `i` out of its fused group into a unit of its own; returns its unit's index.
    pub(super) fn isolate(&mut self, i: MemberId) -> Result<Option<usize>> {
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
    pub(super) fn warm_up(&mut self) {
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
                // Under the unit's policy, so that the products it warms are those its steps run.
                let _p = u.precision.enter();
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
    pub(super) fn evaluate(u: &Unit, split: &EvalSplit) -> Result<Vec<Scores>> {
        let objective = &u.feed.data().objective;
        let mut tallies = vec![Tally::default(); u.members.len()];
        // In batches no larger than the training step's, which fits the member's budget (after an OOM its batch
        // has shrunk) and holds more than an inference pass.
        let chunk = u.batch.clamp(1, 500);
        let _p = u.precision.enter();
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
    /// for this batch size (captured here once a full batch has run eagerly), eager otherwise. Under the unit's
    /// precision policy, for this thread (units step on threads of their own on the CPU).
    pub(super) fn unit_step(u: &mut Unit) -> Result<StepOutcome> {
        let _p = u.precision.enter();
        let device = u.device;
        let (feed, batch) = (&mut u.feed, u.batch);
        let (x, y) = u.tenant.scope(|| feed.next_tensors(batch, &device))?;
        let n = y.shape().first().copied().unwrap_or(0);
        let mut note = None;
        if u.graphs.should_capture(n, u.batch, &u.opt) {
            let (model, opt, objective) = (&u.model, &mut u.opt, &u.feed.data().objective);
            let scaler = u.scaling.as_ref().map(|s| &s.scaler);
            let captured = u.tenant.scope(|| {
                StepGraph::capture(model, opt, objective, scaler, &device, x.copy()?, y.copy()?)
            });
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
        let scaler = u.scaling.as_ref().map(|s| &s.scaler);
        if let Some(g) = u.graphs.replayable(n, &u.opt) {
            let readings = u
                .tenant
                .scope(|| Readings::of(g.replay(&mut u.opt, &x, &y)?, scaler))?;
            u.forwards += 1;
            return Ok(StepOutcome {
                readings,
                in_step: u.tenant.usage().0,
                note,
            });
        }
        let _charge = u.tenant.charge_step(u.act_bytes_per_example * n as u64)?;
        let (model, opt, tenant, forwards) = (&u.model, &mut u.opt, &u.tenant, &mut u.forwards);
        let objective = &u.feed.data().objective;
        let (readings, in_step) = tenant.scope(|| -> Result<(Readings, u64)> {
            let tape = Tape::new();
            let logits = model.forward(&tape, &x)?;
            *forwards += 1;
            let l = objective.loss(&logits, &y)?;
            let result = backward_and_step(&tape, &l, opt, scaler);
            let in_step = tenant.usage().0;
            opt.zero_grad();
            result?;
            // The loss reported is the unscaled one.
            Ok((Readings::of(l.value(), scaler)?, in_step))
        })?;
        u.graphs.ran_eagerly(n, u.batch);
        Ok(StepOutcome {
            readings,
            in_step,
            note,
        })
    }

    /// Reads back unit `ui`'s queued losses into its members' counters: all of them when `all`,
    /// otherwise those that have arrived and any beyond [`LOSSES_IN_FLIGHT`]. Returns the seconds
    /// spent waiting (device time of steps already counted as taken).
    pub(super) fn take_losses(&mut self, ui: usize, all: bool) -> Result<f64> {
        let t0 = Instant::now();
        let mut diverged = Vec::new();
        let mut first_skip = Vec::new();
        let u = &mut self.units[ui];
        while let Some(front) = u.losses.front() {
            if !(all || front.losses.is_ready() || u.losses.len() > LOSSES_IN_FLIGHT) {
                break;
            }
            let Some(read) = u.losses.pop_front() else {
                break;
            };
            // The members' step counts ran ahead of this step by the steps queued after it.
            let behind = u.losses.len() as u64;
            if let (Some(scale), Some(scaling)) = (read.scale, u.scaling.as_mut()) {
                let skipped = scaling.took(&scale.wait::<f32>()?)?;
                for &i in &u.members {
                    let m = &mut self.members[i];
                    if skipped > 0 && m.c.skipped_steps == 0 {
                        first_skip.push((i, m.step.saturating_sub(behind), scaling.seen.scale));
                    }
                    m.c.skipped_steps += skipped;
                }
            }
            let losses = read.losses.wait::<f32>()?;
            for (j, &i) in u.members.iter().enumerate() {
                let loss = f64::from(losses.get(j).copied().unwrap_or(f32::NAN));
                let m = &mut self.members[i];
                m.c.loss_sum += loss;
                m.c.loss_n += 1;
                m.c.last_loss = loss;
                // A loss that is NaN or infinite ends its member alone (the others of a fused group go on
                // without it): it cannot recover, and its weights are not saved over the last good checkpoint.
                if !loss.is_finite() && m.state == State::Running {
                    m.diverged = true;
                    m.end(
                        Status::Failed,
                        Some(format!("loss became {loss} by step {}", m.step)),
                    );
                    diverged.push(i);
                }
            }
        }
        // The first skip is worth a line; later ones are counted (the summary and the final record say how many),
        // as a scale settling down skips a few in a row.
        for (i, step, scale) in first_skip {
            let text = format!(
                "step {step}: the f16 gradients overflowed, so the update was skipped and the loss scale halved to \
                 {scale} (skipped steps count as steps taken; later skips are counted, not logged)"
            );
            self.event(i, text)?;
        }
        for i in diverged {
            let why = self.members[i].c.stopped.clone().unwrap_or_default();
            self.event(
                i,
                format!("{why}: the member stops, its last checkpoint kept; the others go on"),
            )?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn members_under_different_precisions_never_share_a_fusion_key() {
        let member = |name: &str, lr: f64, extra: &str| {
            format!(
                "[[member]]\nname = \"{name}\"\nmodel = {{ layers = [{{ linear = 8, act = \"relu\" }}, {{ linear = 4 }}] }}\n\
                 data = \"blobs\"\noptimizer = {{ adam = {{ lr = {lr} }} }}\n{extra}\n"
            )
        };
        let text = format!(
            "[data.blobs]\nsource = {{ synthetic = {{ train = 64, test = 16, classes = 4, shape = [6] }} }}\n{}{}{}{}",
            member("a", 1e-3, ""),
            member("b", 3e-3, ""),
            member("c", 1e-3, "precision = \"bf16\""),
            member("d", 1e-3, "precision = \"f16\""),
        );
        let c = Config::parse(&text, "fuse.toml").unwrap();
        let data = DataSet::load(&c.data["blobs"], None).unwrap();
        for graphs in [false, true] {
            let keys: Vec<String> = c
                .members
                .iter()
                .map(|m| fusion_key(m, &data, graphs))
                .collect();
            assert_eq!(
                keys[0], keys[1],
                "a learning rate alone does not keep members apart"
            );
            assert_ne!(keys[0], keys[2], "fp32 and bf16");
            assert_ne!(keys[0], keys[3], "fp32 and f16");
            assert_ne!(keys[2], keys[3], "bf16 and f16");
        }
    }
}
