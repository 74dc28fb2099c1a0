//! `--shard I/N` end to end on the CPU, as `[run] shard` set on the command line: each share trains in a run
//! directory of its own, the shares together train every member of the grid exactly once, a share resumes as
//! itself (its saved config names it), and the shares' summaries merge into one report.

mod common;

use std::collections::BTreeSet;

use cohort_trainer::cohort::{RunOptions, resume, train};
use cohort_trainer::shard::merge;

/// A grid of 3 learning rates × 2 batch sizes: 6 members.
const GRID: &str = r#"
[[member]]
name = "mlp"
data = "blobs"
model = { layers = [{ linear = 8, act = "relu" }, { linear = 4 }] }
optimizer = { adam = { lr = [1e-3, 3e-3, 1e-2] } }
batch = [16, 32]
checkpoint = { every = "end" }
"#;

#[test]
fn shards_train_the_whole_grid_once_and_merge_into_one_report() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = common::config(tmp.path(), "grid", "steps = 3", GRID);
    let all: BTreeSet<String> = whole.members.iter().map(|m| m.name.clone()).collect();
    assert_eq!(all.len(), 6);
    let mut trained = Vec::new();
    let mut summaries = Vec::new();
    for i in 1..=2 {
        let share = whole
            .with_run_override("shard", toml::Value::String(format!("{i}/2")))
            .unwrap();
        let out = train(share, RunOptions::default()).unwrap();
        assert_eq!(
            out.run_dir.file_name().unwrap().to_string_lossy(),
            format!("grid-shard{i}of2")
        );
        let s = out.summary.unwrap();
        assert_eq!(s.members.len(), 3, "shard {i}/2");
        assert!(s.members.iter().all(|m| m.steps == 3));
        let names: Vec<String> = s.members.iter().map(|m| m.name.clone()).collect();
        // Resumed, the share is the share: its members, no other member of the grid.
        let again = resume(&out.run_dir, RunOptions::default()).unwrap();
        let resumed: Vec<String> = again
            .summary
            .unwrap()
            .members
            .iter()
            .map(|m| m.name.clone())
            .collect();
        assert_eq!(resumed, names);
        trained.extend(names);
        summaries.push((out.run_dir.display().to_string(), s));
    }
    let once: BTreeSet<String> = trained.iter().cloned().collect();
    assert_eq!(
        once.len(),
        trained.len(),
        "a member trained twice: {trained:?}"
    );
    assert_eq!(once, all);
    let merged = merge(summaries).unwrap();
    let names: BTreeSet<String> = merged.members.iter().map(|m| m.name.clone()).collect();
    assert_eq!(names, all);
    assert!(merged.run_dir.contains("grid-shard1of2") && merged.run_dir.contains("grid-shard2of2"));
}
