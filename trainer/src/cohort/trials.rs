//! A sweep's trials in the cohort: admitted as room frees (at most `max_concurrent`, or as many as the memory budget
//! admits by their estimated footprint), judged at every validation (their best checkpoint, their early stop, the
//! sweep's scheduler), and recorded as they end so that a resumed sweep does not train them again.

use super::unit::{activation_bytes, persistent_bytes, planned_steps};
use super::{Cohort, MemberId, State};
use crate::config::{Resource, SchedulerConfig};
use crate::error::Result;
use crate::memory::device_total_bytes;
use crate::objective::Scores;
use crate::report::{Status, bytes};
use crate::sweep::{Report, Verdict};
use crate::tensorboard::{Domain, HParamInfo};

/// A validation waiting for the sweep's verdict at the end of its round.
#[derive(Debug)]
pub(super) struct Validated {
    member: MemberId,
    value: f64,
    epochs: Option<u64>,
    step: u64,
    max: u64,
}

impl Cohort {
    /// What member `i` is expected to hold while it trains: its limit where it has one, else its parameters,
    /// gradients and optimizer state, one batch's activations and its prefetched batches.
    pub(super) fn footprint(&self, i: MemberId, total: u64) -> u64 {
        let cfg = &self.members[i].cfg;
        if let Some(l) = cfg.memory.limit {
            return l.bytes(total);
        }
        let d = &self.data[&cfg.data];
        let params = self.param_count(i);
        let example = d.shape.iter().product::<usize>() as u64 * 4;
        let prefetch = self.config.data[&cfg.data].prefetch as u64;
        let batch = self.members[i].batch as u64;
        persistent_bytes(cfg, params)
            + batch * (activation_bytes(cfg, &d.shape) + example * prefetch)
    }

    /// Member `i`'s parameters, from its spec (0 for a model a program builds: its size is known once built).
    pub(super) fn param_count(&self, i: MemberId) -> u64 {
        let cfg = &self.members[i].cfg;
        let shape = &self.data[&cfg.data].shape;
        cfg.model.spec().map_or(0, |s| {
            s.param_count(&s.input_for(shape)).unwrap_or(0) as u64
        })
    }

    /// Starts queued trials, in order, while there is room: fewer than `max_concurrent` train, and their estimated
    /// footprints fit the budget (the pool's limit, else the device's memory). One trial always may start when none
    /// trains: if it does not fit, its own OOM recovery says so, and only it fails. Trials admitted together that
    /// share a spec fuse.
    pub(super) fn admit(&mut self) -> Result<()> {
        let Some(search) = &self.config.search else {
            return Ok(());
        };
        let queued: Vec<MemberId> = self
            .member_ids()
            .filter(|&i| self.members[i].state == State::Queued)
            .collect();
        if queued.is_empty() {
            return Ok(());
        }
        let cap = search.max_concurrent.unwrap_or(usize::MAX);
        let total = device_total_bytes(&self.device)?;
        let budget = self.config.memory.limit.map_or(total, |l| l.bytes(total));
        let training: Vec<MemberId> = self
            .member_ids()
            .filter(|&i| matches!(self.members[i].state, State::Running | State::Paused))
            .collect();
        let mut used: u64 = training.iter().map(|&i| self.footprint(i, total)).sum();
        let mut admitted = Vec::new();
        for i in queued {
            let n = training.len() + admitted.len();
            let need = self.footprint(i, total);
            if n >= cap || (n > 0 && used + need > budget) {
                break;
            }
            used += need;
            admitted.push(i);
        }
        if admitted.is_empty() {
            return Ok(());
        }
        for &i in &admitted {
            self.members[i].state = State::Running;
        }
        self.build_units((0..self.members.len()).map(|_| None).collect())?;
        let running = training.len() + admitted.len();
        // The first trials start with the run, whose description says how many; later ones each say so.
        let first = self
            .members
            .iter()
            .all(|m| m.step == 0 && m.state != State::Done);
        for &i in &admitted {
            let text = format!(
                "started: {running} trial{} training, estimated {} of {}",
                if running == 1 { "" } else { "s" },
                bytes(used),
                bytes(budget)
            );
            self.record_event(i, text, !first)?;
            if !first {
                self.show(i);
            }
        }
        Ok(())
    }

    /// A validation of member `i` (`at_epoch_end`: its epoch's): its best metric, its early stop, the sweep's
    /// verdict. Whether it beat its best (its best checkpoint is then due).
    pub(super) fn judge(
        &mut self,
        i: MemberId,
        scores: &Scores,
        at_epoch_end: bool,
    ) -> Result<bool> {
        let Some(metric) = self.best_metric_of(i) else {
            return Ok(false);
        };
        let training = self.members[i].state == State::Running;
        let m = &mut self.members[i];
        let value = metric.of(scores);
        let improved = value.is_some_and(|v| {
            m.c.best_metric
                .is_none_or(|b| metric.mode.better(v, b, 0.0))
        });
        if improved {
            m.c.best_metric = value;
        }
        if let Some(es) = m.cfg.early_stopping
            && let Some(v) = es.metric.of(scores)
            && m.c
                .patience
                .observe(v, es.metric.mode, es.min_delta, es.patience)
            && training
        {
            let why = format!(
                "early stop: {} has not improved by more than {} in {} validations (best {:.4})",
                es.metric.name(),
                es.min_delta,
                es.patience,
                m.c.patience.best.unwrap_or(v)
            );
            m.end(Status::Completed, Some(why.clone()));
            self.event(i, why)?;
            return Ok(improved);
        }
        let (Some(search), Some(value), true) = (&self.config.search, value, training) else {
            return Ok(improved);
        };
        let m = &self.members[i];
        let max = match search.scheduler {
            SchedulerConfig::Asha {
                rung: Resource::Steps(_),
                ..
            }
            | SchedulerConfig::Median {
                grace: Resource::Steps(_),
                ..
            } => planned_steps(&m.cfg, &self.data[&m.cfg.data]),
            _ => u64::from(m.cfg.epochs),
        };
        self.validated.push(Validated {
            member: i,
            value,
            epochs: at_epoch_end.then_some(m.epochs_done),
            step: m.step,
            max,
        });
        Ok(improved)
    }

    /// The sweep's verdicts on the round's validations, judged together; the pruned trials end (their final
    /// record and checkpoint follow).
    pub(super) fn settle(&mut self) -> Result<()> {
        let Some(sweep) = &mut self.sweep else {
            return Ok(());
        };
        let round = std::mem::take(&mut self.validated);
        let reports: Vec<Report<'_>> = round
            .iter()
            .map(|v| Report {
                trial: &self.members[v.member].cfg.name,
                value: v.value,
                epochs: v.epochs,
                step: v.step,
                max: v.max,
            })
            .collect();
        let verdicts = sweep.judge(&reports)?;
        for (v, verdict) in round.iter().zip(verdicts) {
            let i = v.member;
            if let Verdict::Prune(why) = verdict
                && self.members[i].state == State::Running
            {
                // Recorded at once: a run killed before the trial's last checkpoint does not train it again.
                if let Some(sweep) = &mut self.sweep {
                    sweep.end(&self.members[i].cfg.name, Status::Pruned, Some(why.clone()))?;
                }
                self.members[i].end(Status::Pruned, Some(why.clone()));
                // The display prints the trial's last line, which says why.
                self.record_event(i, why, false)?;
                self.show(i);
            }
        }
        Ok(())
    }

    /// Whether the sweep wants member `i` validated now (a rung counted in steps).
    pub(super) fn rung_due(&self, i: MemberId) -> bool {
        let m = &self.members[i];
        self.sweep.as_ref().is_some_and(|s| {
            s.wants_validation(m.step, planned_steps(&m.cfg, &self.data[&m.cfg.data]))
        })
    }

    /// Member `i` has had its last record and checkpoint: a sweep notes how it ended, and so do its HParams.
    pub(super) fn finalized(&mut self, i: MemberId) -> Result<()> {
        let m = &mut self.members[i];
        m.finalized = true;
        if !m.cfg.hyperparameters.is_empty() {
            m.events.hparams_session_end(m.c.status.into())?;
        }
        if let Some(sweep) = &mut self.sweep {
            sweep.end(&m.cfg.name, m.c.status, m.c.stopped.clone())?;
        }
        Ok(())
    }

    /// TensorBoard's HParams data, where members have hyper-parameters (a sweep's trials, a grid's members): the
    /// experiment in the run directory (each dimension's domain: the interval its numbers span, or its values) and
    /// a session per member still to train, in its own event file.
    pub(super) fn write_hparams(&mut self) -> Result<()> {
        let mut values: std::collections::BTreeMap<&str, Vec<&serde_json::Value>> =
            Default::default();
        for m in &self.members {
            for (k, v) in &m.cfg.hyperparameters {
                values.entry(k.as_str()).or_default().push(v);
            }
        }
        if values.is_empty() {
            return Ok(());
        }
        let infos: Vec<HParamInfo> = values
            .into_iter()
            .map(|(name, vs)| {
                let sampled = self.config.search.as_ref().is_some_and(|s| {
                    s.dimensions.iter().any(|d| {
                        d.name == name && d.kind.contains("uniform") && !d.kind.contains("int")
                    })
                });
                let numbers: Vec<f64> = vs.iter().filter_map(|v| v.as_f64()).collect();
                let domain = if sampled && numbers.len() == vs.len() {
                    Domain::Interval {
                        min: numbers.iter().copied().fold(f64::MAX, f64::min),
                        max: numbers.iter().copied().fold(f64::MIN, f64::max),
                    }
                } else {
                    let mut distinct: Vec<serde_json::Value> = Vec::new();
                    for v in vs {
                        if !distinct.contains(v) {
                            distinct.push(v.clone());
                        }
                    }
                    Domain::Discrete(distinct)
                };
                HParamInfo {
                    name: name.to_string(),
                    domain,
                }
            })
            .collect();
        let metrics = ["val/accuracy", "val/loss", "test/accuracy", "train/loss"];
        crate::tensorboard::write_experiment(self.run.root(), &infos, &metrics)?;
        for m in &mut self.members {
            if !m.cfg.hyperparameters.is_empty() && !m.finalized {
                m.events.hparams_session_start(&m.cfg.hyperparameters, "")?;
            }
        }
        Ok(())
    }
}
