//! `[search]`: a sweep. Values in `[[member]]` tables may be search spaces — `{ loguniform = [1e-4, 1e-1] }`,
//! `{ uniform = [0.0, 0.3] }`, `{ int = [1, 4] }`, `{ loguniform_int = [16, 512] }`, `{ choice = [...] }`, each with
//! an optional `name` for its column — and every table that has one is sampled `trials` times from a seeded stream
//! per trial, so the same config always gives the same trials (a resumed sweep samples them again). A trial is named
//! by its index (`mlp-t017`); its values are recorded as its hyper-parameters. Grid lists expand within each trial.
//! The table also names the metric trials are ranked by, the scheduler that prunes them (ASHA, median stopping) and
//! how many train at once.

use std::collections::BTreeMap;

use cohort_autograd::spec::describe;
use cohort_data::rng::{Rng, mix};
use toml::{Table, Value};

use super::grid::{Place, dotted, labels, set_path, walk};
use super::{CResult, ConfigError, Section, parse_every};
use crate::objective::Scores;
use crate::report::Dimension;

/// The keys of a search space's table.
const SPACES: [&str; 5] = ["loguniform", "uniform", "int", "loguniform_int", "choice"];

/// A sampled dimension's distribution.
#[derive(Debug, Clone, PartialEq)]
enum Distribution {
    LogUniform(f64, f64),
    Uniform(f64, f64),
    Int(i64, i64),
    LogInt(i64, i64),
    Choice(Vec<Value>),
}

impl Distribution {
    fn kind(&self) -> &'static str {
        match self {
            Distribution::LogUniform(..) => "loguniform",
            Distribution::Uniform(..) => "uniform",
            Distribution::Int(..) => "int",
            Distribution::LogInt(..) => "loguniform-int",
            Distribution::Choice(_) => "choice",
        }
    }

    fn sample(&self, rng: &mut Rng) -> Value {
        // 53 random bits as a float in [0, 1).
        let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        match self {
            Distribution::LogUniform(a, b) => Value::Float(round(
                (a.ln() + unit() * (b.ln() - a.ln())).exp().clamp(*a, *b),
            )),
            Distribution::Uniform(a, b) => Value::Float(round(a + unit() * (b - a))),
            Distribution::Int(a, b) => Value::Integer(a + rng.below((b - a + 1) as u64) as i64),
            Distribution::LogInt(a, b) => {
                let (la, lb) = ((*a as f64 - 0.5).ln(), (*b as f64 + 0.5).ln());
                let v = (la + unit() * (lb - la)).exp().round() as i64;
                Value::Integer(v.clamp(*a, *b))
            }
            Distribution::Choice(values) => values[rng.below(values.len() as u64) as usize].clone(),
        }
    }
}

/// Four significant digits: a sampled value reads back as written (config, names, the report).
fn round(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    format!("{v:.3e}").parse().unwrap_or(v)
}

/// A search space found in a `[[member]]` table.
#[derive(Debug, Clone)]
struct Space {
    place: Place,
    label: String,
    dist: Distribution,
}

/// A split's score a sweep or an early stop watches: `val_accuracy`, `val_loss`, `val_top_k`, `val_perplexity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Score {
    /// Accuracy (higher is better).
    Accuracy,
    /// The loss (lower is better).
    Loss,
    /// Top-k accuracy (higher is better).
    TopK,
    /// Perplexity (lower is better).
    Perplexity,
}

/// Which way a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Higher is better.
    Max,
    /// Lower is better.
    Min,
}

impl Mode {
    /// Whether `a` is better than `b` by more than `delta`.
    pub fn better(self, a: f64, b: f64, delta: f64) -> bool {
        match self {
            Mode::Max => a > b + delta,
            Mode::Min => a < b - delta,
        }
    }
}

/// A validation metric and its direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Metric {
    /// The score.
    pub score: Score,
    /// Which way is better.
    pub mode: Mode,
}

impl Metric {
    const ACCEPTED: &'static str = "\"val_accuracy\", \"val_loss\", \"val_top_k\" or \"val_perplexity\" (validation scores only: ranking on \
         the test split would make its figures optimistic)";

    /// The metric's name in records and reports.
    pub fn name(&self) -> &'static str {
        match self.score {
            Score::Accuracy => "val_accuracy",
            Score::Loss => "val_loss",
            Score::TopK => "val_top_k",
            Score::Perplexity => "val_perplexity",
        }
    }

    /// Its value in a validation's scores, where the task has it.
    pub fn of(&self, s: &Scores) -> Option<f64> {
        match self.score {
            Score::Accuracy => s.accuracy,
            Score::Loss => Some(s.loss),
            Score::TopK => s.top_k,
            Score::Perplexity => s.perplexity,
        }
        .filter(|v| v.is_finite())
    }

    fn parse(name: &str, mode: Option<&str>) -> Option<Metric> {
        let score = match name {
            "val_accuracy" => Score::Accuracy,
            "val_loss" => Score::Loss,
            "val_top_k" => Score::TopK,
            "val_perplexity" => Score::Perplexity,
            _ => return None,
        };
        let mode = match mode {
            Some("max") => Mode::Max,
            Some("min") => Mode::Min,
            Some(_) => return None,
            None if matches!(score, Score::Accuracy | Score::TopK) => Mode::Max,
            None => Mode::Min,
        };
        Some(Metric { score, mode })
    }
}

/// A training budget a rung is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// Epochs.
    Epochs(u64),
    /// Optimizer steps.
    Steps(u64),
}

/// What ends trials early.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerConfig {
    /// Every trial trains to its end.
    None,
    /// Asynchronous successive halving: rungs at `rung × reduction^k`; a trial reaching a rung goes on only in
    /// the top `1 / reduction` of the trials that reached it so far.
    Asha {
        /// The first rung.
        rung: Resource,
        /// The reduction factor η.
        reduction: u64,
    },
    /// Median stopping: from `grace` on, at each validation a trial whose best so far is worse than the median of
    /// the other trials' means up to the same point stops.
    Median {
        /// Validations before this never stop a trial.
        grace: Resource,
        /// The fewest other trials to compare with.
        min_trials: usize,
    },
}

impl SchedulerConfig {
    /// Its name in the summary.
    pub fn name(&self) -> &'static str {
        match self {
            SchedulerConfig::None => "none",
            SchedulerConfig::Asha { .. } => "asha",
            SchedulerConfig::Median { .. } => "median",
        }
    }
}

/// `[search]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SearchConfig {
    /// Trials sampled from each `[[member]]` table that has a search space (unless it sets its own `trials`).
    pub trials: usize,
    /// The sampling seed.
    pub seed: u64,
    /// At most this many trials train at once; the others wait, and start as trials end. `None`: as many as the
    /// memory budget admits by their estimated footprint.
    pub max_concurrent: Option<usize>,
    /// The metric trials are ranked (and pruned) by.
    pub metric: Metric,
    /// What prunes trials.
    pub scheduler: SchedulerConfig,
    /// The dimensions searched, sampled and grid, in the order first seen.
    pub dimensions: Vec<Dimension>,
}

/// A member's early stop: it ends when `metric` has not improved by `min_delta` for `patience` validations.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EarlyStopping {
    /// The metric watched.
    pub metric: Metric,
    /// Validations without improvement before it stops.
    pub patience: u32,
    /// The least change that counts as an improvement.
    pub min_delta: f64,
}

fn resource(s: &Section<'_>, k: &str) -> CResult<Option<Resource>> {
    let accepted = "\"N epoch(s)\", \"N step(s)\" or a number of steps";
    match s.take(k) {
        None => Ok(None),
        Some(Value::Integer(i)) if *i > 0 => Ok(Some(Resource::Steps(*i as u64))),
        Some(Value::String(v)) => match parse_every(v) {
            Some(super::CheckpointEvery::Epochs(n)) => Ok(Some(Resource::Epochs(u64::from(n)))),
            Some(super::CheckpointEvery::Steps(n)) => Ok(Some(Resource::Steps(n))),
            _ => Err(s.error(k, format!("expected {accepted}, found \"{v}\""))),
        },
        Some(v) => Err(s.error(k, format!("expected {accepted}, found {}", describe(v)))),
    }
}

fn metric(s: &Section<'_>, default: &str) -> CResult<Metric> {
    let name = s.str("metric", Metric::ACCEPTED)?.unwrap_or(default);
    let mode = s.str("mode", "\"max\" or \"min\"")?;
    Metric::parse(name, mode).ok_or_else(|| match mode {
        Some(m) if m != "max" && m != "min" => s.error(
            "mode",
            format!("expected \"max\" or \"min\", found \"{m}\""),
        ),
        _ => s.error(
            "metric",
            format!("expected {}, found \"{name}\"", Metric::ACCEPTED),
        ),
    })
}

/// Reads `[search]`; `seed` is the run's, the default sampling seed.
pub(super) fn parse_search(s: &Section<'_>, seed: u64) -> CResult<SearchConfig> {
    let trials = s.u64("trials", 1)?.unwrap_or(1) as usize;
    let seed = s.u64("seed", 0)?.unwrap_or(seed);
    let max_concurrent = s.u64("max_concurrent", 1)?.map(|n| n as usize);
    let metric = metric(s, "val_accuracy")?;
    let accepted = "\"none\", { asha = { rung = \"1 epoch\", reduction = 3 } } or { median = { grace = \"1 epoch\", \
                    min_trials = 3 } }";
    let scheduler = match s.variant("scheduler", "none, asha, median")? {
        None | Some(("none", _)) => SchedulerConfig::None,
        Some(("asha", Value::Table(t))) => {
            let a = s.sub("scheduler.asha", t);
            let c = SchedulerConfig::Asha {
                rung: resource(&a, "rung")?.unwrap_or(Resource::Epochs(1)),
                reduction: a.u64("reduction", 2)?.unwrap_or(3),
            };
            a.finish()?;
            c
        }
        Some(("median", Value::Table(t))) => {
            let m = s.sub("scheduler.median", t);
            let c = SchedulerConfig::Median {
                grace: resource(&m, "grace")?.unwrap_or(Resource::Epochs(1)),
                min_trials: m.u64("min_trials", 1)?.unwrap_or(3) as usize,
            };
            m.finish()?;
            c
        }
        Some((other, _)) => {
            return Err(s.error(
                "scheduler",
                format!("expected {accepted}, found \"{other}\""),
            ));
        }
    };
    s.finish()?;
    Ok(SearchConfig {
        trials,
        seed,
        max_concurrent,
        metric,
        scheduler,
        dimensions: Vec::new(),
    })
}

/// Reads a member's `early_stopping = { metric = "val_loss", patience = 3, min_delta = 0.0 }`.
pub(super) fn parse_early_stopping(s: &Section<'_>) -> CResult<Option<EarlyStopping>> {
    let Some(t) = s.table("early_stopping")? else {
        return Ok(None);
    };
    let e = s.sub("early_stopping", t);
    let stop = EarlyStopping {
        metric: metric(&e, "val_loss")?,
        patience: e.u64("patience", 1)?.unwrap_or(3) as u32,
        min_delta: e
            .f64_in("min_delta", 0.0, f64::MAX, "a change ≥ 0")?
            .unwrap_or(0.0),
    };
    e.finish()?;
    Ok(Some(stop))
}

/// The search spaces of a `[[member]]` table, in key order.
fn spaces(file: &str, section: &str, t: &Table) -> CResult<Vec<Space>> {
    let mut found: Vec<(Place, Table)> = Vec::new();
    walk(t, &mut Vec::new(), &mut |place, v| match v {
        Value::Table(sub)
            if sub.keys().any(|k| SPACES.contains(&k.as_str()))
                && sub
                    .keys()
                    .all(|k| SPACES.contains(&k.as_str()) || k == "name") =>
        {
            found.push((place.clone(), sub.clone()));
            false
        }
        _ => true,
    });
    let err = |place: &Place, message: String| ConfigError {
        file: file.to_string(),
        section: section.to_string(),
        key: dotted(place),
        message,
    };
    let mut out = Vec::new();
    let places: Vec<&Place> = found.iter().map(|(p, _)| p).collect();
    let default_labels = labels(&places);
    for ((place, sub), label) in found.iter().zip(default_labels) {
        let kinds: Vec<&String> = sub.keys().filter(|k| *k != "name").collect();
        if kinds.len() != 1 {
            return Err(err(
                place,
                format!("a search space has one kind, found {}", kinds.len()),
            ));
        }
        let kind = kinds[0].as_str();
        let v = &sub[kind];
        let pair = |v: &Value| -> Option<(f64, f64)> {
            let num = |x: &Value| match x {
                Value::Float(f) => Some(*f),
                Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match v {
                Value::Array(a) if a.len() == 2 => Some((num(&a[0])?, num(&a[1])?)),
                _ => None,
            }
        };
        let ints = |v: &Value| -> Option<(i64, i64)> {
            match v {
                Value::Array(a) if a.len() == 2 => Some((a[0].as_integer()?, a[1].as_integer()?)),
                _ => None,
            }
        };
        let bad = |what: &str| {
            err(
                place,
                format!("{{ {kind} = ... }} expects {what}, found {}", describe(v)),
            )
        };
        let dist = match kind {
            "loguniform" => match pair(v) {
                Some((a, b)) if a > 0.0 && a < b => Distribution::LogUniform(a, b),
                _ => return Err(bad("[low, high] with 0 < low < high")),
            },
            "uniform" => match pair(v) {
                Some((a, b)) if a < b => Distribution::Uniform(a, b),
                _ => return Err(bad("[low, high] with low < high")),
            },
            "int" => match ints(v) {
                Some((a, b)) if a <= b => Distribution::Int(a, b),
                _ => return Err(bad("[low, high], integers with low ≤ high (both included)")),
            },
            "loguniform_int" => match ints(v) {
                Some((a, b)) if a > 0 && a <= b => Distribution::LogInt(a, b),
                _ => {
                    return Err(bad(
                        "[low, high], integers with 0 < low ≤ high (both included)",
                    ));
                }
            },
            _ => match v {
                Value::Array(a) if !a.is_empty() => Distribution::Choice(a.clone()),
                _ => return Err(bad("a non-empty list of values")),
            },
        };
        let label = match sub.get("name") {
            None => label,
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            Some(other) => {
                return Err(err(
                    place,
                    format!(
                        "a search space's name is a string, found {}",
                        describe(other)
                    ),
                ));
            }
        };
        out.push(Space {
            place: place.clone(),
            label,
            dist,
        });
    }
    Ok(out)
}

/// One sampled trial of a table: its index in the sweep, its values by label, and its table.
pub(super) struct Trial {
    pub(super) index: Option<usize>,
    pub(super) values: BTreeMap<String, Value>,
    pub(super) table: Table,
}

/// The trials of `[[member]]` table `table_index` (0-based): one per trial with its sampled values where it has
/// search spaces (indices from `*next`, which advances), else the table itself. Also notes each sampled
/// dimension in `search.dimensions`.
pub(super) fn trials(
    file: &str,
    section: &str,
    t: &Table,
    table_index: usize,
    search: Option<&mut SearchConfig>,
    next: &mut usize,
) -> CResult<Vec<Trial>> {
    let spaces = spaces(file, section, t)?;
    if spaces.is_empty() {
        return Ok(vec![Trial {
            index: None,
            values: BTreeMap::new(),
            table: t.clone(),
        }]);
    }
    let Some(search) = search else {
        return Err(ConfigError {
            file: file.to_string(),
            section: section.to_string(),
            key: dotted(&spaces[0].place),
            message: format!(
                "a search space ({{ {} = ... }}) needs a [search] table saying how many trials to sample, e.g.\n  \
                 [search]\n  trials = 16",
                spaces[0].dist.kind().replace('-', "_")
            ),
        });
    };
    for s in &spaces {
        note_dimension(search, &s.label, s.dist.kind());
    }
    let mut out = Vec::new();
    for _ in 0..table_trials(t).unwrap_or(search.trials) {
        let index = *next;
        *next += 1;
        // A stream per (table, trial): a trial's values do not depend on how many trials came before it.
        let mut rng = Rng::new(mix(mix(search.seed, table_index as u64), index as u64));
        let mut table = t.clone();
        let mut values = BTreeMap::new();
        for s in &spaces {
            let v = s.dist.sample(&mut rng);
            set_path(&mut table, &s.place, v.clone());
            values.insert(s.label.clone(), v);
        }
        out.push(Trial {
            index: Some(index),
            values,
            table,
        });
    }
    Ok(out)
}

/// A table's own `trials = N`, where it sets one (a bad value is `parse_member`'s error to report).
pub(super) fn table_trials(t: &Table) -> Option<usize> {
    t.get("trials")
        .and_then(Value::as_integer)
        .filter(|&n| n > 0)
        .map(|n| n as usize)
}

/// Records a dimension once, by label.
pub(super) fn note_dimension(search: &mut SearchConfig, name: &str, kind: &str) {
    if !search.dimensions.iter().any(|d| d.name == name) {
        search.dimensions.push(Dimension {
            name: name.to_string(),
            kind: kind.to_string(),
        });
    }
}

/// A trial's name: `mlp-t017` (three digits at least, enough for the sweep's last index).
pub(super) fn trial_name(base: &str, index: usize, total: usize) -> String {
    let digits = total.saturating_sub(1).max(1).to_string().len().max(3);
    format!("{base}-t{index:0digits$}")
}

/// A TOML value as a hyper-parameter's JSON.
pub(super) fn json(v: &Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_distribution_stays_in_its_range_and_a_seed_gives_the_same_values() {
        let dists = [
            Distribution::LogUniform(1e-4, 1e-1),
            Distribution::Uniform(0.0, 0.3),
            Distribution::Int(1, 4),
            Distribution::LogInt(16, 512),
            Distribution::Choice(vec![Value::Integer(64), Value::Integer(128)]),
        ];
        let mut rng = Rng::new(7);
        let mut seen_ints = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            for d in &dists {
                let v = d.sample(&mut rng);
                match (d, &v) {
                    (Distribution::LogUniform(a, b), Value::Float(f))
                    | (Distribution::Uniform(a, b), Value::Float(f)) => {
                        assert!(f >= a && f <= b, "{f} outside [{a}, {b}]");
                    }
                    (Distribution::Int(a, b), Value::Integer(i)) => {
                        assert!(i >= a && i <= b);
                        seen_ints.insert(*i);
                    }
                    (Distribution::LogInt(a, b), Value::Integer(i)) => assert!(i >= a && i <= b),
                    (Distribution::Choice(c), v) => assert!(c.contains(v)),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(seen_ints.len(), 4, "both ends of an int range are drawn");
        // Log-uniform: about as many draws below the geometric middle (1e-2.5) as above.
        let mut rng = Rng::new(1);
        let below = (0..4000)
            .filter(|_| {
                Distribution::LogUniform(1e-4, 1e-1)
                    .sample(&mut rng)
                    .as_float()
                    .unwrap()
                    < 10f64.powf(-2.5)
            })
            .count();
        assert!(
            (1800..2200).contains(&below),
            "{below} of 4000 below the middle"
        );
        let draw = |seed| Distribution::Uniform(0.0, 1.0).sample(&mut Rng::new(seed));
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }

    #[test]
    fn names_are_padded_to_the_sweep() {
        assert_eq!(trial_name("mlp", 17, 64), "mlp-t017");
        assert_eq!(trial_name("t", 5, 2000), "t-t0005");
        assert_eq!(round(0.002_134_567), 0.002_135);
    }
}
