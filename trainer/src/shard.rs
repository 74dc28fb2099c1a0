//! A grid or a sweep shared among hosts: `cohort train --shard I/N` (`[run] shard = "I/N"`) trains the I-th of N
//! shares of the config's members, and `cohort report` merges the shards' run directories into one report. One
//! cohort per host, started by the cluster's own scheduler (a Slurm job array, a Kubernetes indexed Job): cohort
//! keeps no cluster state of its own.
//!
//! A share is every N-th member of the config's expansion (grid points and sampled trials, in file order),
//! starting at the I-th: the expansion is a pure function of the config text and its seed, so every host, given
//! the same config, computes the same list, and the N shares cover it with each member in exactly one, their sizes
//! differing by at most one.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use crate::report::{Status, Summary};

/// The I-th of N shares (`index` from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which share, 1 to `count`.
    pub index: usize,
    /// How many shares.
    pub count: usize,
}

impl Shard {
    /// The form a shard is written in, for messages.
    pub const ACCEPTED: &'static str = "\"I/N\": the I-th of N shares, 1 ≤ I ≤ N, e.g. \"1/4\"";

    /// Whether the member at `position` in the config's expansion (from 0) is in this share.
    pub fn keeps(&self, position: usize) -> bool {
        position % self.count == self.index - 1
    }

    /// This share of `members` (the config's expansion, in order).
    ///
    /// # Errors
    /// When the share is empty: more shares than members.
    pub fn select<T>(&self, members: Vec<T>) -> Result<Vec<T>, String> {
        let total = members.len();
        let kept: Vec<T> = members
            .into_iter()
            .enumerate()
            .filter(|(p, _)| self.keeps(*p))
            .map(|(_, m)| m)
            .collect();
        if kept.is_empty() {
            return Err(format!(
                "shard {self} has no member: the config expands to {total} member{}, so use at most {total} \
                 shards",
                if total == 1 { "" } else { "s" }
            ));
        }
        Ok(kept)
    }

    /// The suffix of this shard's run directory, so that shards writing to one shared file system never meet.
    pub fn dir_suffix(&self) -> String {
        format!("shard{}of{}", self.index, self.count)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    /// `"I/N"`; the message says what was found and what to write.
    fn from_str(s: &str) -> Result<Shard, String> {
        let parsed = s.split_once('/').and_then(|(i, n)| {
            let (i, n) = (i.trim().parse().ok()?, n.trim().parse().ok()?);
            (1..=n).contains(&i).then_some(Shard { index: i, count: n })
        });
        parsed.ok_or_else(|| format!("expected {}, found \"{s}\"", Shard::ACCEPTED))
    }
}

impl Serialize for Shard {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The shards' summaries as one: every member once, the sweep's counts over all of them, its best trial the best
/// of all shards (by the rule a run applies: the best completed trial where any completed), the wall time the
/// longest shard's (they ran side by side). `sources` name the summaries (their run directories) in messages.
///
/// # Errors
/// A member in two summaries (a shard trained twice, or runs of different configs), summaries of a sweep and of a
/// plain run together, or sweeps ranked by different metrics.
pub fn merge(summaries: Vec<(String, Summary)>) -> Result<Summary, String> {
    let mut parts = summaries.into_iter();
    let Some((first_source, mut merged)) = parts.next() else {
        return Err("no run directory to report".into());
    };
    let mut source_of: Vec<(String, String)> = merged
        .members
        .iter()
        .map(|m| (m.name.clone(), first_source.clone()))
        .collect();
    for (source, s) in parts {
        match (&mut merged.sweep, &s.sweep) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                if (a.metric.as_str(), a.mode.as_str()) != (b.metric.as_str(), b.mode.as_str()) {
                    return Err(format!(
                        "{first_source} ranks its trials by {} ({}), {source} by {} ({}): merge the shards of one \
                         sweep only",
                        a.metric, a.mode, b.metric, b.mode
                    ));
                }
                for d in &b.dimensions {
                    if !a.dimensions.iter().any(|x| x.name == d.name) {
                        a.dimensions.push(d.clone());
                    }
                }
            }
            _ => {
                return Err(format!(
                    "{first_source} and {source} are not both sweeps: merge the shards of one grid or sweep only"
                ));
            }
        }
        for m in s.members {
            if let Some((_, other)) = source_of.iter().find(|(n, _)| *n == m.name) {
                return Err(format!(
                    "member \"{}\" is in both {other} and {source}: a shard ran twice, or the runs are of different \
                     configs; report each shard once",
                    m.name
                ));
            }
            source_of.push((m.name.clone(), source.clone()));
            merged.members.push(m);
        }
        merged.run_dir = format!("{} + {}", merged.run_dir, s.run_dir);
        if !merged.device.split(", ").any(|d| d == s.device) {
            merged.device = format!("{}, {}", merged.device, s.device);
        }
        merged.wall_seconds = merged.wall_seconds.max(s.wall_seconds);
        merged.peak_process_bytes = merged.peak_process_bytes.max(s.peak_process_bytes);
        // One process's measurement does not describe the others'.
        merged.process_memory = None;
    }
    // Trials in the order they were sampled, whichever shard trained them.
    merged
        .members
        .sort_by_key(|m| m.trial.unwrap_or(usize::MAX));
    if let Some(sweep) = &mut merged.sweep {
        let count = |st: Status| merged.members.iter().filter(|m| m.status == st).count();
        (sweep.completed, sweep.pruned, sweep.failed) = (
            count(Status::Completed),
            count(Status::Pruned),
            count(Status::Failed),
        );
        let min = sweep.mode == "min";
        let any_completed = merged
            .members
            .iter()
            .any(|m| m.status == Status::Completed && m.best_metric.is_some());
        let best = merged
            .members
            .iter()
            .filter(|m| !any_completed || m.status == Status::Completed)
            .filter_map(|m| m.best_metric.map(|v| (m.name.clone(), v)))
            .reduce(|a, b| {
                let better = if min { b.1 < a.1 } else { b.1 > a.1 };
                if better { b } else { a }
            })
            .map(|(name, _)| name);
        for m in &mut merged.members {
            m.best = best.as_deref() == Some(m.name.as_str());
        }
        sweep.best = best;
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::config::Config;
    use crate::leaderboard::tests::{member, sweep};
    use crate::leaderboard::{entries, leaderboard};

    #[test]
    fn shards_parse() {
        assert_eq!("2/4".parse(), Ok(Shard { index: 2, count: 4 }));
        assert_eq!(" 1 / 1 ".parse(), Ok(Shard { index: 1, count: 1 }));
        for bad in ["0/4", "5/4", "2of4", "2/", "/4", "-1/4", "1/0"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains(&format!("found \"{bad}\"")), "{e}");
            assert!(e.contains("\"1/4\""), "{e}");
        }
    }

    /// A sweep of 7 sampled trials times a grid of 2 batch sizes: 14 members.
    const SWEEP: &str = "[run]\nseed = 3\n[search]\ntrials = 7\n[data.d]\n\
                         source = { synthetic = { train = 64, test = 16, classes = 2, shape = [4] } }\nval = 0.25\n\
                         [[member]]\nname = \"t\"\ndata = \"d\"\nmodel = { layers = [{ linear = 2 }] }\n\
                         optimizer = { adam = { lr = { loguniform = [1e-4, 1e-1] } } }\nbatch = [8, 16]\n";

    fn names(text: &str) -> Vec<String> {
        Config::parse(text, "s.toml")
            .unwrap()
            .members
            .into_iter()
            .map(|m| m.name)
            .collect()
    }

    #[test]
    fn the_shards_of_a_sweep_are_the_whole_sweep_each_trial_once() {
        let whole = names(SWEEP);
        assert_eq!(whole.len(), 14);
        for n in [1, 2, 3, 5, 14] {
            let mut seen = Vec::new();
            for i in 1..=n {
                let shard =
                    names(&SWEEP.replace("[run]\n", &format!("[run]\nshard = \"{i}/{n}\"\n")));
                // Every host computes the same share from the same config.
                assert_eq!(
                    shard,
                    names(&SWEEP.replace("[run]\n", &format!("[run]\nshard = \"{i}/{n}\"\n")))
                );
                assert!(
                    shard.len() == whole.len() / n || shard.len() == whole.len().div_ceil(n),
                    "shard {i}/{n}: {shard:?}"
                );
                seen.extend(shard);
            }
            let distinct: BTreeSet<&String> = seen.iter().collect();
            assert_eq!(distinct.len(), seen.len(), "a member in two of {n} shards");
            assert_eq!(
                distinct,
                whole.iter().collect::<BTreeSet<_>>(),
                "{n} shards miss members"
            );
        }
    }

    #[test]
    fn a_shard_without_members_is_refused() {
        let e = Config::parse(
            &SWEEP.replace("[run]\n", "[run]\nshard = \"15/15\"\n"),
            "s.toml",
        )
        .unwrap_err();
        assert_eq!((e.section.as_str(), e.key.as_str()), ("[run]", "shard"));
        assert!(e.message.contains("expands to 14 members"), "{e}");
        let e = Config::parse(
            &SWEEP.replace("[run]\n", "[run]\nshard = \"3of4\"\n"),
            "s.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "shard");
        assert!(e.message.contains("found \"3of4\""), "{e}");
    }

    #[test]
    fn shards_merge_into_one_report() {
        let hp = |lr: f64| vec![("lr", serde_json::json!(lr))];
        let dims = [("lr", "loguniform")];
        let a = sweep(
            vec![
                member("t-000", Status::Completed, Some(0.91), &hp(1e-3)),
                member("t-002", Status::Failed, None, &hp(1e-1)),
            ],
            "val_accuracy",
            "max",
            &dims,
            Some("t-000"),
        );
        let mut b = sweep(
            vec![
                member("t-001", Status::Completed, Some(0.95), &hp(3e-3)),
                member("t-003", Status::Pruned, Some(0.97), &hp(5e-3)),
            ],
            "val_accuracy",
            "max",
            &dims,
            Some("t-001"),
        );
        b.wall_seconds = 300.0;
        let merged = merge(vec![("a".into(), a.clone()), ("b".into(), b.clone())]).unwrap();
        let order: Vec<&str> = merged.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(order, ["t-000", "t-001", "t-002", "t-003"]);
        let s = merged.sweep.as_ref().unwrap();
        assert_eq!((s.completed, s.pruned, s.failed), (2, 1, 1));
        // The best completed trial of either shard, though a pruned one scored higher.
        assert_eq!(s.best.as_deref(), Some("t-001"));
        let best: Vec<&str> = merged
            .members
            .iter()
            .filter(|m| m.best)
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(best, ["t-001"]);
        assert_eq!(merged.wall_seconds, 300.0);
        let ranked: Vec<&str> = entries(&merged).iter().map(|e| e.name).collect();
        assert_eq!(ranked, ["t-003", "t-001", "t-000", "t-002"]);
        let board = leaderboard(&merged);
        assert!(
            board.contains("4 trials: 2 completed, 1 pruned, 1 failed"),
            "{board}"
        );
        assert!(board.contains("best t-001"), "{board}");

        let e = merge(vec![("a".into(), a.clone()), ("again".into(), a.clone())]).unwrap_err();
        assert!(e.contains("\"t-000\" is in both a and again"), "{e}");
        let mut by_loss = b.clone();
        by_loss.sweep.as_mut().unwrap().metric = "val_loss".into();
        let e = merge(vec![("a".into(), a.clone()), ("b".into(), by_loss)]).unwrap_err();
        assert!(e.contains("val_loss"), "{e}");
        let mut plain = b;
        plain.sweep = None;
        let e = merge(vec![("a".into(), a), ("b".into(), plain)]).unwrap_err();
        assert!(e.contains("not both sweeps"), "{e}");
    }
}
