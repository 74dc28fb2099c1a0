//! The `cohort` binary end to end: the default job (one epoch here, to keep the suite short), `--help` of every
//! command, config errors, `cohort resume`, `cohort memory` and `cohort replay`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("..")
}

/// The `cohort` binary: beside the test's directory (cargo: target/<profile>/deps/.. ; the GPU bundle: tests/../bin),
/// else where cargo built it.
fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("COHORT_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent().and_then(Path::parent)
    {
        for p in [dir.join("bin").join("cohort"), dir.join("cohort")] {
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from(env!("CARGO_BIN_EXE_cohort"))
}

fn cohort(args: &[&str], cwd: &Path) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the cohort binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
#[cfg_attr(debug_assertions, ignore = "trains on MNIST; run in --release")]
fn the_default_job_trains_the_grid_and_the_cnn() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let o = cohort(
        &[
            "train",
            "--epochs",
            "1",
            "--name",
            "default",
            "--dir",
            runs.to_str().unwrap(),
            "--quiet",
        ],
        &workspace(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("default job: 5 members on mnist (7200 train / 800 val / 2000 test, from IDX"),
        "{out}"
    );
    assert!(
        out.contains("member")
            && out.contains("val")
            && out.contains("test")
            && out.contains("OOM events"),
        "{out}"
    );
    let run = runs.join("default");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    let members = summary["members"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "mlp-lr3e-4",
            "mlp-lr1e-3",
            "mlp-lr2e-3",
            "mlp-lr5e-3",
            "cnn"
        ]
    );
    for m in members {
        assert_eq!(m["steps"], 113, "{m}"); // one epoch of 7,200 at batch 64
        assert!(m["peak_memory_bytes"].as_u64().unwrap() > 0, "{m}");
        assert!(m["test_accuracy"].as_f64().unwrap() > 0.8, "{m}");
        assert!(m["val_accuracy"].as_f64().unwrap() > 0.8, "{m}");
        assert_eq!(m["val"]["examples"], 800, "{m}");
        assert!(m["val_loss"].as_f64().unwrap() > 0.0, "{m}");
    }
    let cnn = members.iter().find(|m| m["name"] == "cnn").unwrap();
    assert!(
        cnn["test_accuracy"].as_f64().unwrap() > 0.9,
        "one epoch of the CNN: {cnn}"
    );
    for f in [
        "config.toml",
        "loss.png",
        "memory.png",
        "cnn/metrics.jsonl",
        "cnn/checkpoints/ckpt-000113.json",
    ] {
        assert!(run.join(f).is_file(), "{f}");
    }

    // `cohort memory RUN_DIR` lists every member, from the records of the run that ended (and no device of its own:
    // `--device` is for `cohort memory` without a run).
    let o = cohort(&["memory", run.to_str().unwrap()], &workspace());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("not running")
            && out.contains("mlp-lr5e-3")
            && out.contains("cnn")
            && out.contains("reserved")
            && out.contains("peak"),
        "{out}"
    );
    let o = cohort(
        &["memory", run.to_str().unwrap(), "--device", "cpu"],
        &workspace(),
    );
    assert!(!o.status.success(), "{}", text(&o));

    // Resuming a finished run trains nothing more and reports the same members.
    let o = cohort(&["resume", run.to_str().unwrap(), "--quiet"], &workspace());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("cnn"), "{out}");
}

#[test]
fn every_command_has_help() {
    let cwd = workspace();
    for args in [
        vec!["--help"],
        vec!["train", "--help"],
        vec!["resume", "--help"],
        vec!["memory", "--help"],
        vec!["replay", "--help"],
    ] {
        let o = cohort(&args, &cwd);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Usage: cohort"),
            "{args:?}"
        );
    }
}

#[test]
fn a_bad_config_is_an_error_naming_the_file_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("bad.toml");
    std::fs::write(
        &p,
        "[[member]]\nname = \"mlp\"\nmodel = { layers = [{ linear = 10 }] }\noptimizer = { adam = { lr = \"fast\" } }\n",
    )
    .unwrap();
    let o = cohort(&["train", p.to_str().unwrap()], tmp.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "error: {}: [[member]] 1, key \"optimizer.adam.lr\": expected a number or a list of numbers, found \"fast\"",
            p.display()
        )),
        "{err}"
    );
    let o = cohort(&["resume", tmp.path().to_str().unwrap()], tmp.path());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not a cohort run directory"));
}

#[test]
fn replay_runs_an_allocator_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("trace.csv");
    std::fs::write(
        &p,
        "op,id,bytes\na,1,1048576\na,2,4096\nf,1,0\na,3,524288\nf,2,0\nf,3,0\n",
    )
    .unwrap();
    let o = cohort(
        &["replay", p.to_str().unwrap(), "--policy", "growth"],
        tmp.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("6 events") && out.contains("peak live") && out.contains("1.0 MiB"),
        "{out}"
    );
    let o = cohort(
        &["replay", tmp.path().join("missing.csv").to_str().unwrap()],
        tmp.path(),
    );
    assert!(!o.status.success());
}
