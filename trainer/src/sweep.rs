//! A sweep's decisions: which trials go on at each validation (ASHA's rungs, the median rule), a member's early
//! stop, and the state that makes a resumed sweep decide as the interrupted one did (`sweep.json`, rewritten with
//! every decision). The rules are pure functions of what they see, tested on recorded metric sequences; [`Sweep`]
//! keeps the record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Mode, Resource, SchedulerConfig, SearchConfig};
use crate::error::{Error, Result};
use crate::report::Status;

/// The file a sweep's decisions are kept in, in the run directory.
pub const SWEEP_FILE: &str = "sweep.json";

/// What a validation means for a trial.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// It trains on.
    Continue,
    /// The scheduler ends it, for this reason.
    Prune(String),
}

/// ASHA's rungs: `first × reduction^k` for every `k` whose rung lies below `max` (the full budget, where a trial
/// completes rather than being promoted).
pub fn rungs(first: u64, reduction: u64, max: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut r = first.max(1);
    while r < max {
        out.push(r);
        r = r.saturating_mul(reduction.max(2));
    }
    out
}

/// Whether `value` goes on from a rung where `earlier` were recorded before it: it must be among the top
/// `⌊n / η⌋` of the `n` values there, its own included. While fewer than η have arrived that number is 0, and then
/// only a value at least as good as every earlier one goes on (Optuna's successive halving does the same: a trial
/// cannot wait at a rung for others to arrive).
pub fn promoted(value: f64, earlier: &[f64], reduction: u64, mode: Mode) -> bool {
    let mut all: Vec<f64> = earlier.iter().copied().chain([value]).collect();
    // Best first.
    all.sort_by(|a, b| match mode {
        Mode::Max => b.total_cmp(a),
        Mode::Min => a.total_cmp(b),
    });
    let top = (all.len() / reduction.max(2) as usize).max(1);
    let cut = all[top - 1];
    match mode {
        Mode::Max => value >= cut,
        Mode::Min => value <= cut,
    }
}

/// The median rule: whether a trial whose best value so far is `best` stops, given `others`, the other trials'
/// means of their values up to the same point.
pub fn below_median(best: f64, others: &[f64], mode: Mode) -> bool {
    if others.is_empty() {
        return false;
    }
    let mut v = others.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    mode.better(median, best, 0.0)
}

/// A member's early stop: the best value seen and the validations since it improved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Patience {
    /// The best value so far.
    pub best: Option<f64>,
    /// Validations since it was last improved on.
    pub since: u32,
}

impl Patience {
    /// Takes a validation's `value`; whether the member stops (`patience` validations without an improvement of
    /// more than `min_delta`).
    pub fn observe(&mut self, value: f64, mode: Mode, min_delta: f64, patience: u32) -> bool {
        match self.best {
            Some(b) if !mode.better(value, b, min_delta) => self.since += 1,
            _ => {
                self.best = Some(value);
                self.since = 0;
            }
        }
        self.since >= patience
    }
}

/// A trial's validation, as a scheduler sees it.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The trial.
    pub trial: &'a str,
    /// The sweep's metric.
    pub value: f64,
    /// Its epochs done, when the validation ended an epoch.
    pub epochs: Option<u64>,
    /// Its steps.
    pub step: u64,
    /// Its full budget in the scheduler's unit (epochs or steps).
    pub max: u64,
}

/// A trial's arrival at a rung.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Arrival {
    trial: String,
    value: f64,
    promoted: bool,
}

/// What a sweep has decided so far: kept in `sweep.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Record {
    /// Each rung's arrivals (by its resource), in the order they came.
    rungs: BTreeMap<u64, Vec<Arrival>>,
    /// Each trial's validations: `(resource, value)`.
    history: BTreeMap<String, Vec<(u64, f64)>>,
    /// Trials that ended, how and why: a resumed sweep does not train them again, even those that failed before
    /// their first checkpoint.
    #[serde(default)]
    ended: BTreeMap<String, (Status, Option<String>)>,
}

/// A running sweep's scheduler and its record.
#[derive(Debug)]
pub struct Sweep {
    scheduler: SchedulerConfig,
    mode: Mode,
    metric: &'static str,
    record: Record,
    path: PathBuf,
}

impl Sweep {
    /// The sweep of `search`, its record in `root`: read back when `resuming` (a resumed sweep decides as the
    /// interrupted one did), else started afresh.
    ///
    /// # Errors
    /// A record that cannot be read or parsed.
    pub fn open(root: &Path, search: &SearchConfig, resuming: bool) -> Result<Sweep> {
        let path = root.join(SWEEP_FILE);
        let record = match std::fs::read(&path) {
            Ok(bytes) if resuming => serde_json::from_slice(&bytes)
                .map_err(|e| Error::json(path.display().to_string(), e))?,
            Err(e) if resuming && e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&path, e));
            }
            _ => Record::default(),
        };
        Ok(Sweep {
            scheduler: search.scheduler,
            mode: search.metric.mode,
            metric: search.metric.name(),
            record,
            path,
        })
    }

    /// Where a trial stands in the scheduler's unit: `epochs` (counted only at an epoch's end) or `step`.
    fn resource(unit: Resource, epochs: Option<u64>, step: u64) -> Option<u64> {
        match unit {
            Resource::Epochs(_) => epochs,
            Resource::Steps(_) => Some(step),
        }
    }

    /// Whether the scheduler wants a validation at `step` (a rung counted in steps falls there).
    pub fn wants_validation(&self, step: u64, max_steps: u64) -> bool {
        match self.scheduler {
            SchedulerConfig::Asha {
                rung: Resource::Steps(first),
                reduction,
            } => rungs(first, reduction, max_steps).contains(&step),
            _ => false,
        }
    }

    /// The validations of one round (every trial that stepped since the last round), judged together: trials
    /// that reach a rung in the same round compete with each other as well as with those before them, which a
    /// process that trains them side by side can do (a trial-per-process tool sees one at a time). Returns each
    /// one's verdict, and records them.
    ///
    /// # Errors
    /// The record cannot be written.
    pub fn judge(&mut self, round: &[Report<'_>]) -> Result<Vec<Verdict>> {
        let verdicts = match self.scheduler {
            SchedulerConfig::None => vec![Verdict::Continue; round.len()],
            SchedulerConfig::Asha { rung, reduction } => self.asha(round, rung, reduction),
            SchedulerConfig::Median { grace, min_trials } => self.median(round, grace, min_trials),
        };
        if !round.is_empty() {
            self.save()?;
        }
        Ok(verdicts)
    }

    fn asha(&mut self, round: &[Report<'_>], rung: Resource, reduction: u64) -> Vec<Verdict> {
        let (first, unit) = match rung {
            Resource::Epochs(n) => (n, "epoch"),
            Resource::Steps(n) => (n, "step"),
        };
        let place = |r: &Report<'_>| {
            let at = Sweep::resource(rung, r.epochs, r.step)?;
            let k = rungs(first, reduction, r.max)
                .iter()
                .position(|&x| x == at)?;
            Some((at, k))
        };
        // First every new arrival takes its place at its rung; a resumed trial that comes to a rung again keeps
        // the decision it got.
        let mut new = vec![false; round.len()];
        for (j, r) in round.iter().enumerate() {
            if let Some((at, _)) = place(r) {
                let arrivals = self.record.rungs.entry(at).or_default();
                if !arrivals.iter().any(|a| a.trial == r.trial) {
                    arrivals.push(Arrival {
                        trial: r.trial.to_string(),
                        value: r.value,
                        promoted: false,
                    });
                    new[j] = true;
                }
            }
        }
        round
            .iter()
            .zip(new)
            .map(|(r, new)| {
                let Some((at, k)) = place(r) else {
                    return Verdict::Continue;
                };
                let arrivals = self.record.rungs.get_mut(&at).expect("placed above");
                let n = arrivals.len();
                if new {
                    let others: Vec<f64> = arrivals
                        .iter()
                        .filter(|a| a.trial != r.trial)
                        .map(|a| a.value)
                        .collect();
                    let p = promoted(r.value, &others, reduction, self.mode);
                    if let Some(a) = arrivals.iter_mut().find(|a| a.trial == r.trial) {
                        a.promoted = p;
                    }
                }
                let a = arrivals.iter().find(|a| a.trial == r.trial).expect("placed above");
                if a.promoted {
                    Verdict::Continue
                } else {
                    Verdict::Prune(format!(
                        "pruned at rung {k} ({unit} {at}): {} {:.4} not in the top 1/{reduction} of the {n} \
                         trial{} there",
                        self.metric,
                        a.value,
                        if n == 1 { "" } else { "s" }
                    ))
                }
            })
            .collect()
    }

    fn median(&mut self, round: &[Report<'_>], grace: Resource, min_trials: usize) -> Vec<Verdict> {
        let first = match grace {
            Resource::Epochs(n) | Resource::Steps(n) => n,
        };
        for r in round {
            if let Some(at) = Sweep::resource(grace, r.epochs, r.step) {
                let mine = self.record.history.entry(r.trial.to_string()).or_default();
                mine.retain(|&(x, _)| x != at);
                mine.push((at, r.value));
            }
        }
        round
            .iter()
            .map(|r| {
                let Some(at) = Sweep::resource(grace, r.epochs, r.step) else {
                    return Verdict::Continue;
                };
                let mine = &self.record.history[r.trial];
                let best = mine
                    .iter()
                    .map(|&(_, v)| v)
                    .reduce(|a, b| if self.mode.better(a, b, 0.0) { a } else { b })
                    .unwrap_or(r.value);
                let others: Vec<f64> = self
                    .record
                    .history
                    .iter()
                    .filter(|(t, h)| t.as_str() != r.trial && h.iter().any(|&(x, _)| x >= at))
                    .map(|(_, h)| {
                        let upto: Vec<f64> =
                            h.iter().filter(|&&(x, _)| x <= at).map(|&(_, v)| v).collect();
                        upto.iter().sum::<f64>() / upto.len().max(1) as f64
                    })
                    .collect();
                if at >= first && others.len() >= min_trials && below_median(best, &others, self.mode) {
                    Verdict::Prune(format!(
                        "stopped by the median rule at {at}: best {} {best:.4} worse than the median of {} other \
                         trials' means",
                        self.metric,
                        others.len()
                    ))
                } else {
                    Verdict::Continue
                }
            })
            .collect()
    }

    /// Records that `trial` ended.
    ///
    /// # Errors
    /// The record cannot be written.
    pub fn end(&mut self, trial: &str, status: Status, why: Option<String>) -> Result<()> {
        self.record.ended.insert(trial.to_string(), (status, why));
        self.save()
    }

    /// How `trial` ended, if it did.
    pub fn ended(&self, trial: &str) -> Option<&(Status, Option<String>)> {
        self.record.ended.get(trial)
    }

    fn save(&self) -> Result<()> {
        let json =
            serde_json::to_vec_pretty(&self.record).map_err(|e| Error::json("sweep record", e))?;
        crate::checkpoint::replace_file(&self.path, &json, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Metric;

    #[test]
    fn rungs_grow_by_the_reduction_below_the_full_budget() {
        assert_eq!(rungs(1, 3, 9), [1, 3]);
        assert_eq!(rungs(1, 3, 10), [1, 3, 9]);
        assert_eq!(rungs(2, 2, 16), [2, 4, 8]);
        assert_eq!(rungs(5, 3, 5), Vec::<u64>::new());
    }

    #[test]
    fn asha_promotes_the_top_third_of_what_has_arrived() {
        let max = Mode::Max;
        // The first arrivals: only a value as good as every earlier one goes on.
        assert!(promoted(0.5, &[], 3, max));
        assert!(!promoted(0.4, &[0.5], 3, max));
        assert!(promoted(0.6, &[0.5], 3, max));
        // Six there: the top two go on.
        let six = [0.9, 0.8, 0.7, 0.6, 0.5];
        assert!(promoted(0.85, &six, 3, max));
        assert!(!promoted(0.75, &six, 3, max));
        // A loss: lower is better.
        assert!(promoted(0.1, &[0.3, 0.2, 0.5], 2, Mode::Min));
        assert!(!promoted(0.4, &[0.3, 0.2, 0.5], 2, Mode::Min));
    }

    /// A round of one validation.
    fn one(s: &mut Sweep, trial: &str, value: f64, epochs: Option<u64>, max: u64) -> Verdict {
        let r = Report {
            trial,
            value,
            epochs,
            step: 0,
            max,
        };
        s.judge(&[r]).unwrap().remove(0)
    }

    fn search(scheduler: SchedulerConfig) -> SearchConfig {
        SearchConfig {
            trials: 6,
            seed: 0,
            max_concurrent: None,
            metric: Metric {
                score: crate::config::Score::Accuracy,
                mode: Mode::Max,
            },
            scheduler,
            dimensions: Vec::new(),
        }
    }

    #[test]
    fn a_recorded_sweep_prunes_as_asha_says_and_a_resumed_one_decides_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let asha = SchedulerConfig::Asha {
            rung: Resource::Epochs(1),
            reduction: 3,
        };
        let cfg = search(asha);
        // Six trials' validation accuracy at epochs 1, 3 (rungs) and 2 (none), as a run would report them.
        let curves = [
            ("t0", [0.90, 0.93, 0.95]),
            ("t1", [0.80, 0.85, 0.88]),
            ("t2", [0.95, 0.96, 0.97]),
            ("t3", [0.70, 0.75, 0.80]),
            ("t4", [0.92, 0.94, 0.94]),
            ("t5", [0.60, 0.61, 0.62]),
        ];
        let mut sweep = Sweep::open(dir.path(), &cfg, false).unwrap();
        let mut alive: Vec<&str> = curves.iter().map(|c| c.0).collect();
        for (e, epoch) in [1u64, 2, 3].iter().enumerate() {
            for (name, curve) in &curves {
                if !alive.contains(name) {
                    continue;
                }
                let v = one(&mut sweep, name, curve[e], Some(*epoch), 9);
                if let Verdict::Prune(why) = v {
                    assert!(why.contains(&format!("epoch {epoch}")), "{why}");
                    alive.retain(|n| n != name);
                }
            }
        }
        // Epoch 1: t0 goes on as the first, t2 as the best so far; t1, t3, t4 (1 of 5 goes on: t2) and t5 (2 of
        // 6: t2 and t0) fall. Epoch 3: t0 first, then t2, the better.
        assert_eq!(alive, ["t0", "t2"]);
        // Resumed: the same record, the same decisions for a trial arriving again, and a new arrival judged
        // against what was there.
        let mut again = Sweep::open(dir.path(), &cfg, true).unwrap();
        assert_eq!(again.record, sweep.record);
        assert_eq!(
            one(&mut again, "t2", 0.0, Some(3), 9),
            Verdict::Continue,
            "t2 was promoted at epoch 3: a replay gets that, whatever it scores"
        );
        assert!(matches!(
            one(&mut again, "t9", 0.5, Some(1), 9),
            Verdict::Prune(_)
        ));
        let fresh = Sweep::open(dir.path(), &cfg, false).unwrap();
        assert!(fresh.record.rungs.is_empty(), "a new run starts afresh");
    }

    #[test]
    fn trials_arriving_together_compete_with_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = search(SchedulerConfig::Asha {
            rung: Resource::Steps(100),
            reduction: 3,
        });
        let mut s = Sweep::open(dir.path(), &cfg, false).unwrap();
        assert!(s.wants_validation(100, 1000) && s.wants_validation(300, 1000));
        assert!(!s.wants_validation(200, 1000) && !s.wants_validation(1000, 1000));
        let names = ["a", "b", "c", "d", "e", "f"];
        let values = [0.5, 0.9, 0.6, 0.8, 0.7, 0.4];
        let round: Vec<Report<'_>> = names
            .iter()
            .zip(values)
            .map(|(&trial, value)| Report {
                trial,
                value,
                epochs: None,
                step: 100,
                max: 1000,
            })
            .collect();
        let v = s.judge(&round).unwrap();
        let on: Vec<&str> = names
            .iter()
            .zip(&v)
            .filter(|(_, v)| **v == Verdict::Continue)
            .map(|(n, _)| *n)
            .collect();
        // The top third of the six: not "a", which alone (arriving first) would have gone on.
        assert_eq!(on, ["b", "d"]);
        let Verdict::Prune(why) = &v[0] else { panic!() };
        assert!(
            why.contains("rung 0 (step 100)") && why.contains("of the 6 trials"),
            "{why}"
        );
    }

    #[test]
    fn the_median_rule_stops_a_trial_below_the_others_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = search(SchedulerConfig::Median {
            grace: Resource::Epochs(2),
            min_trials: 2,
        });
        let mut s = Sweep::open(dir.path(), &cfg, false).unwrap();
        for (t, v) in [("a", [0.9, 0.92]), ("b", [0.8, 0.85])] {
            for (e, x) in v.iter().enumerate() {
                assert_eq!(
                    one(&mut s, t, *x, Some(e as u64 + 1), 10),
                    Verdict::Continue
                );
            }
        }
        // Epoch 1 is within the grace; at epoch 2 the others' means are 0.91 and 0.825: median 0.8675.
        assert_eq!(one(&mut s, "c", 0.5, Some(1), 10), Verdict::Continue);
        assert!(matches!(
            one(&mut s, "c", 0.86, Some(2), 10),
            Verdict::Prune(_)
        ));
        assert_eq!(one(&mut s, "d", 0.88, Some(2), 10), Verdict::Continue);
        assert!(below_median(0.1, &[0.2, 0.3], Mode::Max));
        assert!(!below_median(0.1, &[0.2, 0.3], Mode::Min));
    }

    #[test]
    fn patience_counts_validations_without_a_real_improvement() {
        let mut p = Patience::default();
        let seq = [0.50, 0.40, 0.395, 0.41, 0.399];
        let stops: Vec<bool> = seq
            .iter()
            .map(|&v| p.observe(v, Mode::Min, 0.01, 3))
            .collect();
        // 0.395 improves on 0.40 by less than min_delta: it does not count.
        assert_eq!(stops, [false, false, false, false, true]);
        assert_eq!(p.best, Some(0.40));
    }
}
