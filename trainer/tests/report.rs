//! `cohort report RUN` as a user runs it: the built binary on a run directory holding a sweep's summary.json
//! (written by hand, so that no training is needed), and on directories that hold none.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use cohort_trainer::report::{Dimension, MemberSummary, Status, Summary, SweepSummary};
use serde_json::json;

/// `cohort ARGS…`, its output.
fn cohort(args: &[&str]) -> Output {
    // A bundle carried to another machine says where its binary is; cargo's path is of the build machine.
    let bin = std::env::var("CARGO_BIN_EXE_cohort").unwrap_or(env!("CARGO_BIN_EXE_cohort").into());
    Command::new(bin).args(args).output().unwrap()
}

fn trial(
    name: &str,
    status: Status,
    metric: Option<f64>,
    lr: f64,
    width: u64,
    act: &str,
    stopped: Option<&str>,
) -> MemberSummary {
    let hyperparameters: BTreeMap<String, serde_json::Value> = [
        ("lr".to_string(), json!(lr)),
        ("width".to_string(), json!(width)),
        ("act".to_string(), json!(act)),
    ]
    .into();
    MemberSummary {
        name: name.into(),
        status,
        trial: name.trim_start_matches("t-").parse().ok(),
        hyperparameters,
        best_metric: metric,
        best: false,
        best_checkpoint: metric.map(|_| format!("{name}/checkpoints/ckpt-000100.safetensors")),
        data: "mnist".into(),
        steps: 100,
        epochs: if status == Status::Completed { 8 } else { 2 },
        final_loss: 0.1,
        test_accuracy: None,
        val_accuracy: metric,
        val_loss: None,
        val: None,
        test: None,
        peak_memory_bytes: 1 << 20,
        model_steps_per_s: 900.0,
        oom_events: u64::from(status == Status::Failed),
        precision: "fp32".into(),
        skipped_steps: None,
        batch: 128,
        device: "cpu".into(),
        fused_with: Vec::new(),
        stopped: stopped.map(str::to_string),
    }
}

/// Six trials of a sweep over lr (log-uniform), width (a choice) and the activation (a choice of strings): the
/// best, t-017, listed in the middle; two failed of the same cause, one without a score.
fn sweep_summary(dir: &Path) -> Summary {
    let pruned = Some("pruned at rung 1 (epoch 2): val_accuracy 0.912 below the cut 0.941");
    let oom = Some("failed: out of memory at batch 8");
    let mut members = vec![
        trial(
            "t-003",
            Status::Pruned,
            Some(0.952),
            5.5e-3,
            128,
            "relu",
            pruned,
        ),
        trial("t-008", Status::Failed, None, 2e-2, 1024, "gelu", oom),
        trial(
            "t-017",
            Status::Completed,
            Some(0.984),
            2.1e-3,
            256,
            "gelu",
            None,
        ),
        trial(
            "t-022",
            Status::Pruned,
            Some(0.931),
            1.2e-4,
            64,
            "tanh",
            pruned,
        ),
        trial(
            "t-041",
            Status::Completed,
            Some(0.981),
            8e-4,
            512,
            "relu",
            None,
        ),
        trial(
            "t-050",
            Status::Failed,
            Some(0.900),
            3e-2,
            1024,
            "relu",
            oom,
        ),
    ];
    members[2].best = true;
    Summary {
        run_dir: dir.display().to_string(),
        device: "cpu".into(),
        schedule: "lockstep".into(),
        wall_seconds: 192.4,
        members,
        process_memory: None,
        peak_process_bytes: None,
        sweep: Some(SweepSummary {
            metric: "val_accuracy".into(),
            mode: "max".into(),
            scheduler: "asha".into(),
            dimensions: [("lr", "loguniform"), ("width", "choice"), ("act", "choice")]
                .iter()
                .map(|(name, kind)| Dimension {
                    name: name.to_string(),
                    kind: kind.to_string(),
                })
                .collect(),
            completed: 2,
            pruned: 2,
            failed: 2,
            best: Some("t-017".into()),
        }),
    }
}

/// A run directory holding `summary`'s summary.json (and the config every run has).
fn run_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("sweep");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), "").unwrap();
    let json = serde_json::to_vec_pretty(&sweep_summary(&dir)).unwrap();
    std::fs::write(dir.join("summary.json"), json).unwrap();
    dir
}

#[test]
fn report_prints_the_leaderboard_best_first_and_writes_report_png() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path());
    let out = cohort(&["report", dir.to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "trial",
            "lr",
            "width",
            "act",
            "status",
            "val",
            "acc",
            "epochs",
            "checkpoint"
        ]
    );
    let first: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        first,
        [
            "t-017",
            "2.1e-3",
            "256",
            "gelu",
            "completed",
            "98.4",
            "%",
            "8",
            "best"
        ]
    );
    assert_the_sweeps_rows(&lines);
    let png = dir.join("report.png");
    assert_eq!(lines[8], format!("plots: {}", png.display()));
    assert_eq!(lines.len(), 9, "{stdout}");
    let img = image::open(&png).expect("report.png decodes").to_rgb8();
    assert_eq!(img.dimensions(), (960, 540));
    let drawn = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    assert!(
        drawn > 10_000,
        "report.png has axes and markers: {drawn} pixels drawn"
    );
}

#[test]
fn report_json_lists_the_members_best_first() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path());
    let out = cohort(&["report", dir.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members = v.as_array().unwrap();
    assert_eq!(members.len(), 6);
    assert_eq!(members[0]["name"], "t-017");
    assert_eq!(members[0]["best"], true);
    assert_eq!(members[0]["metric"], 0.984);
    assert_eq!(members[0]["hyperparameters"]["act"], "gelu");
    assert_eq!(members[5]["status"], "failed");
    assert!(members[5]["metric"].is_null());
    assert!(members[1..].iter().all(|m| m["best"] == false));
    assert!(
        !dir.join("report.png").exists(),
        "--json prints and writes nothing else"
    );
}

#[test]
fn report_without_a_summary_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let stderr = |out: Output| {
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    // Not a run directory at all.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = stderr(cohort(&["report", empty.to_str().unwrap()]));
    assert!(e.contains("is not a cohort run directory"), "{e}");
    // A run that has not finished.
    let unfinished = tmp.path().join("unfinished");
    std::fs::create_dir(&unfinished).unwrap();
    std::fs::write(unfinished.join("config.toml"), "").unwrap();
    let e = stderr(cohort(&["report", unfinished.to_str().unwrap()]));
    assert!(e.contains("has not finished"), "{e}");
    assert!(
        e.contains(&format!("cohort resume {}", unfinished.display())),
        "{e}"
    );
    // No directory there.
    let e = stderr(cohort(&[
        "report",
        tmp.path().join("nowhere").to_str().unwrap(),
    ]));
    assert!(e.contains("no such directory"), "{e}");
}

/// The sweep's trials split between two shard directories, as `--shard 1/2` and `--shard 2/2` would leave them.
fn shard_dirs(root: &Path) -> [std::path::PathBuf; 2] {
    let whole = sweep_summary(root);
    [1, 2].map(|i| {
        let dir = root.join(format!("sweep-shard{i}of2"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.toml"), "").unwrap();
        let mut share = whole.clone();
        share.run_dir = dir.display().to_string();
        share.members = whole
            .members
            .iter()
            .enumerate()
            .filter(|(p, _)| p % 2 == i - 1)
            .map(|(_, m)| MemberSummary {
                best: false,
                ..m.clone()
            })
            .collect();
        let sweep = share.sweep.as_mut().unwrap();
        // Each shard names its own best; the merged report finds the best of all.
        sweep.best = share
            .members
            .iter()
            .filter(|m| m.status == Status::Completed)
            .map(|m| m.name.clone())
            .next();
        std::fs::write(
            dir.join("summary.json"),
            serde_json::to_vec_pretty(&share).unwrap(),
        )
        .unwrap();
        dir
    })
}

#[test]
fn report_merges_the_shards_of_a_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let [a, b] = shard_dirs(tmp.path());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = cohort(&["report", a, b]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // As one run's report of the whole sweep: best first, one row per trial, the counts of all of them.
    assert_the_sweeps_rows(&lines);
    assert!(lines[1].ends_with("best"), "{}", lines[1]);
    assert_eq!(lines[8], "merged from 2 run directories");

    let json = cohort(&["report", a, b, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let best: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["best"] == true)
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(best, ["t-017"]);

    // The same shard twice is refused, naming the member and both directories.
    let twice = cohort(&["report", a, a]);
    assert!(!twice.status.success());
    let e = String::from_utf8(twice.stderr).unwrap();
    assert!(
        e.contains("is in both") && e.contains("sweep-shard1of2"),
        "{e}"
    );
}

/// The trial rows of the test sweep's report, best first, and its closing count.
fn assert_the_sweeps_rows(lines: &[&str]) {
    let order: Vec<&str> = lines[1..7]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        order,
        ["t-017", "t-041", "t-003", "t-022", "t-050", "t-008"]
    );
    assert_eq!(
        lines[7],
        "6 trials: 2 completed, 2 pruned, 2 failed (out of memory at batch 8) · wall 3:12 · best t-017"
    );
}
