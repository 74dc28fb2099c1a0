//! Members: what each one is and has (its config, logs, checkpoint folder, counters, state), its status line, its
//! records (`metrics.jsonl` and TensorBoard scalars, events), what its step calls for, and its part of the summary.

use crate::checkpoint::CheckpointDir;
use crate::config::{CheckpointEvery, MemberConfig};
use crate::error::Result;
use crate::metrics::{MetricRecord, MetricsWriter};
use crate::objective::Scores;
use crate::progress::MemberStatus;
use crate::report::{MemberSummary, Status, Summary, SweepSummary};
use crate::run_dir::MemberLock;
use crate::tensorboard::EventWriter;
use cohort_tensor::{Device, Precision};

use super::Cohort;

/// A member, by its place in the run's list of members, which is fixed for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct MemberId(pub(super) usize);

impl std::ops::Index<MemberId> for Vec<MemberRun> {
    type Output = MemberRun;
    fn index(&self, i: MemberId) -> &MemberRun {
        &self[i.0]
    }
}

impl std::ops::IndexMut<MemberId> for Vec<MemberRun> {
    fn index_mut(&mut self, i: MemberId) -> &mut MemberRun {
        &mut self[i.0]
    }
}

/// Where a member stands.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum State {
    /// A sweep's trial waiting for room: it has no unit yet.
    Queued,
    Running,
    Paused,
    Done,
}

/// A member's trainer-side state (saved in its checkpoints' `trainer_state`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub(super) struct Counters {
    pub(super) loss_sum: f64,
    pub(super) loss_n: u64,
    pub(super) last_loss: f64,
    pub(super) train_time: f64,
    pub(super) steps_timed: u64,
    pub(super) oom_events: u64,
    /// Steps whose update the f16 loss scaler skipped (gradients not finite); steps taken all the same.
    pub(super) skipped_steps: u64,
    pub(super) peak_mem: u64,
    /// The tenant's high-water mark since the member's last record (its share): a record's `mem_peak_bytes`.
    #[serde(skip)]
    pub(super) mem_high: u64,
    pub(super) val: Option<Scores>,
    /// The step of the last validation.
    pub(super) val_step: Option<u64>,
    pub(super) test: Option<Scores>,
    pub(super) time: f64,
    pub(super) stopped: Option<String>,
    /// How it ended (while it trains: completed, should it end now).
    pub(super) status: Status,
    /// The best value of the metric its best checkpoint is kept by (the sweep's, else its early stop's).
    pub(super) best_metric: Option<f64>,
    /// Its early stop's count.
    pub(super) patience: crate::sweep::Patience,
}

#[derive(Debug)]
pub(super) struct MemberRun {
    pub(super) cfg: MemberConfig,
    pub(super) events: EventWriter,
    pub(super) metrics: MetricsWriter,
    pub(super) ckpt: CheckpointDir,
    /// Its checkpoint of its best validation (`checkpoints/best/`), beside the newest ones.
    pub(super) best_ckpt: CheckpointDir,
    pub(super) _lock: MemberLock,
    pub(super) step: u64,
    pub(super) epochs_done: u64,
    pub(super) batch: usize,
    pub(super) state: State,
    pub(super) c: Counters,
    pub(super) log_mark: (f64, u64),
    pub(super) mem_now: u64,
    pub(super) device: Device,
    pub(super) fused_with: Vec<String>,
    pub(super) last_ckpt_step: Option<u64>,
    pub(super) finalized: bool,
    /// Its loss stopped being finite: it ends, and its last checkpoint (of finite weights) is kept as the newest.
    pub(super) diverged: bool,
}

/// What a member's step calls for ([`Cohort::due`]).
pub(super) struct Due {
    pub(super) log: bool,
    pub(super) checkpoint: bool,
    pub(super) complete: bool,
}

impl MemberRun {
    /// Ends the member: `status`, and why, where it did not simply complete.
    pub(super) fn end(&mut self, status: Status, why: Option<String>) {
        self.state = State::Done;
        self.c.status = status;
        if why.is_some() {
            self.c.stopped = why;
        }
    }
}

impl Cohort {
    pub(super) fn status(&self, i: MemberId) -> MemberStatus {
        let m = &self.members[i];
        let d = &self.data[&m.cfg.data];
        // Steps left: the rest of this epoch and the epochs after it, at the member's current batch size.
        let consumed = self.unit_of(i).map_or(m.epochs_done * d.train_len, |u| {
            let p = u.feed.position();
            p.epoch * d.train_len + p.index
        });
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
            State::Queued => note.push_str("queued"),
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
                if m.state == State::Done {
                    m.epochs_done
                } else {
                    (m.epochs_done + 1).min(u64::from(m.cfg.epochs))
                },
                u64::from(m.cfg.epochs),
            ),
            loss: m.c.last_loss,
            steps_per_s: sps,
            mem_bytes: m.mem_now,
            scores: m.c.val.as_ref().map(|v| format!("val {}", v.headline())),
            note,
            active: matches!(m.state, State::Running | State::Paused),
        }
    }

    pub(super) fn event(&mut self, i: MemberId, text: String) -> Result<()> {
        self.record_event(i, text, true)
    }

    /// Writes an event to member `i`'s records, and with `say` to the display too.
    pub(super) fn record_event(&mut self, i: MemberId, text: String, say: bool) -> Result<()> {
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
            mem_peak_bytes: None,
            mem_reserve_bytes: None,
            mem_limit_bytes: None,
            test_accuracy: None,
            val: None,
            test: None,
            event: Some(text.clone()),
        };
        m.metrics.write(&r)?;
        tracing::info!(member = %m.cfg.name, "{text}");
        if say {
            self.progress.message(&format!("{}: {text}", m.cfg.name));
        }
        Ok(())
    }

    /// Logs member `i` (a metrics record and TensorBoard scalars).
    pub(super) fn log(
        &mut self,
        i: MemberId,
        lr: f64,
        val: Option<Scores>,
        test: Option<Scores>,
    ) -> Result<()> {
        let time = self.elapsed();
        let mem = self.member_memory(i);
        let loss_scale = self
            .unit_of(i)
            .and_then(|u| u.scaling.as_ref())
            .map(|s| s.seen.scale);
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
            mem_peak_bytes: Some(mem.high_water),
            mem_reserve_bytes: (mem.reserve > 0).then_some(mem.reserve),
            mem_limit_bytes: mem.limit,
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
            ("memory/reserved", mem.reserved() as f32),
        ];
        if let Some(scale) = loss_scale {
            scalars.push(("train/loss_scale", scale as f32));
        }
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
        m.c.mem_high = 0;
        m.log_mark = (m.c.train_time, m.step);
        Ok(())
    }

    /// What member `i`'s step just taken calls for (`epoch_ended`: its unit's epoch ended with it).
    pub(super) fn due(&self, i: MemberId, epoch_ended: bool) -> Due {
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

    /// Shows member `i`'s status in the progress display.
    pub(super) fn show(&mut self, i: MemberId) {
        let s = self.status(i);
        self.progress.update(i.0, s);
    }

    /// Every member's id, in the run's order.
    pub(super) fn member_ids(&self) -> impl Iterator<Item = MemberId> + use<> {
        (0..self.members.len()).map(MemberId)
    }

    /// The metric a member's best checkpoint is kept by: the sweep's, else its early stop's.
    pub(super) fn best_metric_of(&self, i: MemberId) -> Option<crate::config::Metric> {
        let m = &self.members[i];
        self.config
            .search
            .as_ref()
            .map(|s| s.metric)
            .or(m.cfg.early_stopping.map(|e| e.metric))
    }

    /// The sweep's best member by its best metric, among those that completed where any did (as Optuna and Ray
    /// Tune pick theirs: a pruned trial's figure comes from a shorter training).
    fn best_member(&self) -> Option<MemberId> {
        let metric = self.config.search.as_ref()?.metric;
        let any_completed = self
            .members
            .iter()
            .any(|m| m.c.status == Status::Completed && m.c.best_metric.is_some());
        self.member_ids()
            .filter(|&i| !any_completed || self.members[i].c.status == Status::Completed)
            .filter_map(|i| self.members[i].c.best_metric.map(|v| (i, v)))
            .reduce(|a, b| {
                if metric.mode.better(b.1, a.1, 0.0) {
                    b
                } else {
                    a
                }
            })
            .map(|(i, _)| i)
    }

    pub(super) fn summary(&self) -> Summary {
        let best = self.best_member();
        let sweep = self.config.search.as_ref().map(|s| {
            let count = |st: Status| self.members.iter().filter(|m| m.c.status == st).count();
            SweepSummary {
                metric: s.metric.name().to_string(),
                mode: if s.metric.mode == crate::config::Mode::Max {
                    "max"
                } else {
                    "min"
                }
                .to_string(),
                scheduler: s.scheduler.name().to_string(),
                dimensions: s.dimensions.clone(),
                completed: count(Status::Completed),
                pruned: count(Status::Pruned),
                failed: count(Status::Failed),
                best: best.map(|i| self.members[i].cfg.name.clone()),
            }
        });
        let root = self.run.root();
        Summary {
            sweep,
            run_dir: self.run.root().display().to_string(),
            device: self.device.to_string(),
            schedule: self.config.run.schedule.to_string(),
            wall_seconds: self.started.elapsed().as_secs_f64(),
            members: self
                .member_ids()
                .map(|i| (i, &self.members[i]))
                .map(|(i, m)| MemberSummary {
                    name: m.cfg.name.clone(),
                    status: m.c.status,
                    trial: m.cfg.trial,
                    hyperparameters: m.cfg.hyperparameters.clone(),
                    best_metric: m.c.best_metric,
                    best: best == Some(i),
                    best_checkpoint: m
                        .best_ckpt
                        .steps()
                        .ok()
                        .and_then(|s| s.last().copied())
                        .map(|s| {
                            let p = m.best_ckpt.tensors_path(s);
                            p.strip_prefix(root).unwrap_or(&p).display().to_string()
                        }),
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
                    precision: m.cfg.precision.name().to_string(),
                    skipped_steps: (m.cfg.precision == Precision::F16).then_some(m.c.skipped_steps),
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
