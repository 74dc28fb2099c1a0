//! A sweep's leaderboard: what `cohort report RUN` prints at a sweep's end, one row per trial, best first, then a
//! line of counts. Pure functions of a [`Summary`], so that a report can be made again from `summary.json` at any
//! time, long after the run's process is gone.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::report::{MemberSummary, Status, Summary};

/// The most characters of a table or array value (shown as JSON) a cell holds: a layer list would push every
/// column after it off the screen.
const MAX_VALUE: usize = 24;
/// The most characters of a failure reason the counts line holds.
const MAX_REASON: usize = 60;

/// The report of `summary`: for a sweep, the table of its trials, best first by its metric (members without a
/// metric after those with one, failed trials last), and the line
/// `64 trials: 11 completed, 51 pruned, 2 failed (out of memory at batch 8) · wall 3:12 · best t-017`; for a plain
/// run, its summary table ([`Summary`]'s `Display`).
pub fn leaderboard(summary: &Summary) -> String {
    let Some(sweep) = &summary.sweep else {
        return summary.to_string();
    };
    let best = best_trial(summary).map(|m| m.name.as_str());
    let dims = dimensions(summary);
    let mut rows = vec![
        std::iter::once("trial".to_string())
            .chain(dims.iter().map(|(name, _)| name.clone()))
            .chain(["status".into(), metric_header(&sweep.metric)])
            .chain(["epochs".into(), "checkpoint".into()])
            .collect::<Vec<_>>(),
    ];
    for m in ranked(summary) {
        let mut row = vec![m.name.clone()];
        for (name, log) in &dims {
            row.push(
                m.hyperparameters
                    .get(name)
                    .map_or("-".into(), |v| compact(v, *log)),
            );
        }
        row.push(m.status.to_string());
        row.push(metric(m).map_or("-".into(), |v| metric_value(&sweep.metric, v)));
        row.push(m.epochs.to_string());
        row.push(
            if best == Some(m.name.as_str()) {
                "best"
            } else {
                ""
            }
            .into(),
        );
        rows.push(row);
    }
    let mut out = table(&rows);
    out.push('\n');
    out.push_str(&counts(summary));
    out
}

/// The members best first: by their metric (highest first, lowest for a sweep whose mode is `min`), those without
/// one after those with one, failed trials last; ties keep the summary's (trial) order.
pub fn ranked(summary: &Summary) -> Vec<&MemberSummary> {
    let min = summary.sweep.as_ref().is_some_and(|s| s.mode == "min");
    let mut members: Vec<&MemberSummary> = summary.members.iter().collect();
    members.sort_by(|a, b| {
        let failed = |m: &MemberSummary| m.status == Status::Failed;
        failed(a)
            .cmp(&failed(b))
            .then_with(|| match (metric(a), metric(b)) {
                (Some(x), Some(y)) if min => x.total_cmp(&y),
                (Some(x), Some(y)) => y.total_cmp(&x),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            })
    });
    members
}

/// The sweep's best trial: the one its summary names, or the one marked best.
pub fn best_trial(summary: &Summary) -> Option<&MemberSummary> {
    let named = summary.sweep.as_ref().and_then(|s| s.best.as_deref());
    summary
        .members
        .iter()
        .find(|m| Some(m.name.as_str()) == named)
        .or_else(|| summary.members.iter().find(|m| m.best))
}

/// One member as `cohort report --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry<'a> {
    /// The member's (trial's) name.
    pub name: &'a str,
    /// How it ended.
    pub status: Status,
    /// Its hyper-parameters, by short name.
    pub hyperparameters: &'a BTreeMap<String, Value>,
    /// Its best value of the sweep's metric.
    pub metric: Option<f64>,
    /// Whether it is the sweep's best trial.
    pub best: bool,
}

/// The members as [`Entry`]s, in [`ranked`] order: the leaderboard for programs.
pub fn entries(summary: &Summary) -> Vec<Entry<'_>> {
    let best = best_trial(summary).map(|m| m.name.as_str());
    ranked(summary)
        .into_iter()
        .map(|m| Entry {
            name: &m.name,
            status: m.status,
            hyperparameters: &m.hyperparameters,
            metric: metric(m),
            best: best == Some(m.name.as_str()),
        })
        .collect()
}

/// A hyper-parameter's value in a cell: `2.1e-3` (always so on a log scale, `log`, so that a column reads alike),
/// `256`, `0.10`, strings as they are, tables and arrays as JSON cut to a few characters.
pub fn compact(value: &Value, log: bool) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(x)) => float(x, log),
            _ => n.to_string(),
        },
        Value::Null => "-".into(),
        Value::Bool(b) => b.to_string(),
        other => cut(&other.to_string(), MAX_VALUE),
    }
}

fn float(x: f64, log: bool) -> String {
    let a = x.abs();
    if log || (a != 0.0 && a < 0.01) || a >= 1e5 {
        format!("{x:.1e}")
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// A metric's value: accuracies (fractions) as `98.4 %`, anything else (a loss, a perplexity) as `0.1234`.
pub fn metric_value(metric: &str, v: f64) -> String {
    if is_fraction(metric) {
        format!("{:.1} %", v * 100.0)
    } else {
        format!("{v:.4}")
    }
}

fn is_fraction(metric: &str) -> bool {
    let m = metric.to_ascii_lowercase();
    m.contains("acc") || m.contains("top_k")
}

/// `val acc` for `val_accuracy`: the column's header.
fn metric_header(metric: &str) -> String {
    metric.replace("accuracy", "acc").replace('_', " ")
}

/// A member's metric, where it has a finite one (a NaN would sort anywhere).
fn metric(m: &MemberSummary) -> Option<f64> {
    m.best_metric.filter(|v| v.is_finite())
}

/// The columns of hyper-parameters, each with whether it is on a log scale: the sweep's dimensions in their order,
/// then any other hyper-parameter a member has (a grid value the sweep did not list).
fn dimensions(summary: &Summary) -> Vec<(String, bool)> {
    let listed = summary.sweep.iter().flat_map(|s| &s.dimensions);
    let mut out: Vec<(String, bool)> = listed
        .map(|d| (d.name.clone(), d.kind.starts_with("loguniform")))
        .collect();
    for m in &summary.members {
        for k in m.hyperparameters.keys() {
            if !out.iter().any(|(n, _)| n == k) {
                out.push((k.clone(), false));
            }
        }
    }
    out
}

/// `64 trials: 11 completed, 51 pruned, 2 failed (out of memory at batch 8) · wall 3:12 · best t-017`: failure
/// reasons grouped, each with its count unless one reason covers every failure.
fn counts(summary: &Summary) -> String {
    let ms = &summary.members;
    let count = |s: Status| ms.iter().filter(|m| m.status == s).count();
    let (completed, pruned, failed) = (
        count(Status::Completed),
        count(Status::Pruned),
        count(Status::Failed),
    );
    let n = ms.len();
    let mut line = format!(
        "{n} {}: {completed} completed",
        if n == 1 { "trial" } else { "trials" }
    );
    if pruned > 0 {
        let _ = write!(line, ", {pruned} pruned");
    }
    if failed > 0 {
        let _ = write!(line, ", {failed} failed");
        let mut reasons: Vec<(&str, usize)> = Vec::new();
        for m in ms.iter().filter(|m| m.status == Status::Failed) {
            let Some(why) = m.stopped.as_deref() else {
                continue;
            };
            let why = why.strip_prefix("failed: ").unwrap_or(why);
            match reasons.iter_mut().find(|(r, _)| *r == why) {
                Some((_, k)) => *k += 1,
                None => reasons.push((why, 1)),
            }
        }
        reasons.sort_by_key(|&(_, k)| std::cmp::Reverse(k));
        let listed: Vec<String> = match reasons.as_slice() {
            [] => Vec::new(),
            [(why, k)] if *k == failed => vec![cut(why, MAX_REASON)],
            _ => reasons
                .iter()
                .map(|(why, k)| format!("{k} {}", cut(why, MAX_REASON)))
                .collect(),
        };
        if !listed.is_empty() {
            let _ = write!(line, " ({})", listed.join(", "));
        }
    }
    let _ = write!(
        line,
        " · wall {}",
        crate::progress::clock(summary.wall_seconds)
    );
    if let Some(b) = best_trial(summary) {
        let _ = write!(line, " · best {}", b.name);
    }
    line
}

/// `s` in at most `n` characters, an ellipsis marking a cut.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// Rows as left-aligned columns two spaces apart, no trailing spaces.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut line = String::new();
        for (cell, w) in r.iter().zip(&widths) {
            let _ = write!(line, "{cell:<w$}  ");
        }
        out.push_str(line.trim_end());
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{Dimension, SweepSummary};

    /// A trial: its status, metric and hyper-parameters, everything else plain.
    pub(crate) fn member(
        name: &str,
        status: Status,
        best_metric: Option<f64>,
        hyperparameters: &[(&str, Value)],
    ) -> MemberSummary {
        MemberSummary {
            name: name.into(),
            status,
            trial: name.trim_start_matches("t-").parse().ok(),
            hyperparameters: hyperparameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            best_metric,
            best: false,
            best_checkpoint: None,
            data: "mnist".into(),
            steps: 100,
            epochs: if status == Status::Completed { 8 } else { 2 },
            final_loss: 0.1,
            test_accuracy: None,
            val_accuracy: best_metric,
            val_loss: None,
            val: None,
            test: None,
            peak_memory_bytes: 1 << 20,
            model_steps_per_s: 1000.0,
            oom_events: 0,
            precision: "fp32".into(),
            skipped_steps: None,
            batch: 128,
            device: "cpu".into(),
            fused_with: Vec::new(),
            stopped: match status {
                Status::Completed => None,
                Status::Pruned => Some("pruned at rung 1 (epoch 2)".into()),
                Status::Failed => Some("failed: out of memory at batch 8".into()),
            },
        }
    }

    /// A sweep over `dims` (name, kind) ranked by `metric` in `mode`, its best trial named, 192 s of wall time.
    pub(crate) fn sweep(
        members: Vec<MemberSummary>,
        metric: &str,
        mode: &str,
        dims: &[(&str, &str)],
        best: Option<&str>,
    ) -> Summary {
        let count = |s: Status| members.iter().filter(|m| m.status == s).count();
        let sweep = SweepSummary {
            metric: metric.into(),
            mode: mode.into(),
            scheduler: "asha".into(),
            dimensions: dims
                .iter()
                .map(|(name, kind)| Dimension {
                    name: name.to_string(),
                    kind: kind.to_string(),
                })
                .collect(),
            completed: count(Status::Completed),
            pruned: count(Status::Pruned),
            failed: count(Status::Failed),
            best: best.map(str::to_string),
        };
        Summary {
            run_dir: "runs/sweep".into(),
            device: "cpu".into(),
            schedule: "lockstep".into(),
            wall_seconds: 192.0,
            members,
            process_memory: None,
            peak_process_bytes: None,
            sweep: Some(sweep),
        }
    }

    fn the_sweep() -> Summary {
        use serde_json::json;
        let hp = |lr: f64, width: u64, dropout: f64, batch: u64| {
            vec![
                ("lr", json!(lr)),
                ("width", json!(width)),
                ("dropout", json!(dropout)),
                ("batch", json!(batch)),
            ]
        };
        let dims = [
            ("lr", "loguniform"),
            ("width", "choice"),
            ("dropout", "uniform"),
            ("batch", "grid"),
        ];
        sweep(
            vec![
                member(
                    "t-003",
                    Status::Pruned,
                    Some(0.952),
                    &hp(5.5e-3, 128, 0.0, 128),
                ),
                member("t-008", Status::Failed, None, &hp(1e-2, 512, 0.3, 256)),
                member(
                    "t-017",
                    Status::Completed,
                    Some(0.984),
                    &hp(2.1e-3, 256, 0.1, 128),
                ),
                member(
                    "t-041",
                    Status::Completed,
                    Some(0.981),
                    &hp(8e-4, 512, 0.2, 64),
                ),
                member("t-050", Status::Failed, None, &hp(3e-2, 512, 0.4, 256)),
            ],
            "val_accuracy",
            "max",
            &dims,
            Some("t-017"),
        )
    }

    fn names(s: &Summary) -> Vec<&str> {
        ranked(s).iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn the_table_ranks_best_first_and_ends_with_the_counts() {
        let text = leaderboard(&the_sweep());
        let want = "\
trial  lr      width  dropout  batch  status     val acc  epochs  checkpoint
t-017  2.1e-3  256    0.10     128    completed  98.4 %   8       best
t-041  8.0e-4  512    0.20     64     completed  98.1 %   8
t-003  5.5e-3  128    0.00     128    pruned     95.2 %   2
t-008  1.0e-2  512    0.30     256    failed     -        2
t-050  3.0e-2  512    0.40     256    failed     -        2
5 trials: 2 completed, 1 pruned, 2 failed (out of memory at batch 8) · wall 3:12 · best t-017";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn a_min_sweep_ranks_the_lowest_loss_first() {
        let m = |name, v| member(name, Status::Completed, Some(v), &[]);
        let mut s = sweep(
            vec![m("a", 0.30), m("b", 0.12), m("c", 0.25)],
            "val_loss",
            "min",
            &[],
            Some("b"),
        );
        assert_eq!(names(&s), ["b", "c", "a"]);
        let text = leaderboard(&s);
        let first = text.lines().nth(1).unwrap();
        assert!(
            first.starts_with("b ") && first.contains("0.1200"),
            "{text}"
        );
        assert!(text.lines().next().unwrap().contains("val loss"), "{text}");
        s.sweep.as_mut().unwrap().mode = "max".into();
        assert_eq!(names(&s), ["a", "c", "b"]);
    }

    #[test]
    fn members_without_a_metric_come_after_those_with_one_and_failed_ones_last() {
        let s = sweep(
            vec![
                member("failed-scored", Status::Failed, Some(0.99), &[]),
                member("unscored", Status::Pruned, None, &[]),
                member("failed", Status::Failed, None, &[]),
                member("nan", Status::Completed, Some(f64::NAN), &[]),
                member("scored", Status::Completed, Some(0.5), &[]),
            ],
            "val_accuracy",
            "max",
            &[],
            None,
        );
        assert_eq!(
            names(&s),
            ["scored", "unscored", "nan", "failed-scored", "failed"]
        );
        let text = leaderboard(&s);
        let last = text.lines().nth(5).unwrap();
        assert!(
            last.starts_with("failed ") && last.contains("  -  "),
            "{text}"
        );
        assert!(!text.contains("best"), "no best trial: {text}");
    }

    #[test]
    fn values_are_compact() {
        use serde_json::json;
        assert_eq!(compact(&json!(2.1e-3), false), "2.1e-3");
        assert_eq!(compact(&json!(0.05), true), "5.0e-2");
        assert_eq!(compact(&json!(256), true), "256");
        assert_eq!(compact(&json!(0.1), false), "0.10");
        assert_eq!(compact(&json!(0.0), false), "0.00");
        assert_eq!(compact(&json!(512.0), false), "512");
        assert_eq!(compact(&json!(2e6), false), "2.0e6");
        assert_eq!(compact(&json!("gelu"), false), "gelu");
        assert_eq!(compact(&json!(true), false), "true");
        assert_eq!(compact(&json!([64, 64]), false), "[64,64]");
        let layers = json!([{ "linear": 128, "act": "relu" }, { "linear": 10 }]);
        let shown = compact(&layers, false);
        assert_eq!(shown.chars().count(), MAX_VALUE);
        assert!(shown.starts_with("[{\"") && shown.ends_with('…'), "{shown}");
        assert_eq!(metric_value("val_accuracy", 0.9843), "98.4 %");
        assert_eq!(metric_value("val_top_k", 1.0), "100.0 %");
        assert_eq!(metric_value("val_loss", 0.123_44), "0.1234");
        assert_eq!(metric_header("val_accuracy"), "val acc");
    }

    #[test]
    fn the_counts_line_groups_failure_reasons() {
        let mut ms = vec![
            member("t-1", Status::Completed, Some(0.9), &[]),
            member("t-2", Status::Failed, None, &[]),
            member("t-3", Status::Failed, None, &[]),
            member("t-4", Status::Failed, Some(0.5), &[]),
            member("t-5", Status::Failed, None, &[]),
        ];
        ms[3].stopped = Some("failed: loss is not finite at step 40".into());
        ms[4].stopped = None;
        let mut s = sweep(ms, "val_accuracy", "max", &[], Some("t-1"));
        s.wall_seconds = 3725.0;
        let text = leaderboard(&s);
        assert_eq!(
            text.lines().last().unwrap(),
            "5 trials: 1 completed, 4 failed (2 out of memory at batch 8, 1 loss is not finite at step 40) · \
             wall 1:02:05 · best t-1"
        );
        let one = sweep(
            vec![member("t-1", Status::Completed, Some(0.9), &[])],
            "val_accuracy",
            "max",
            &[],
            None,
        );
        assert_eq!(
            leaderboard(&one).lines().last().unwrap(),
            "1 trial: 1 completed · wall 3:12"
        );
    }

    #[test]
    fn a_plain_run_is_its_summary_table() {
        let mut s = the_sweep();
        s.sweep = None;
        assert_eq!(leaderboard(&s), s.to_string());
    }

    #[test]
    fn json_entries_follow_the_ranking_and_mark_the_best() {
        let s = the_sweep();
        let e = entries(&s);
        assert_eq!(e[0].name, "t-017");
        assert!(e[0].best && !e[1].best);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v[0]["status"], "completed");
        assert_eq!(v[0]["metric"], 0.984);
        assert_eq!(v[0]["hyperparameters"]["width"], 256);
        assert_eq!(v[4]["status"], "failed");
        assert!(v[4]["metric"].is_null());
    }
}
