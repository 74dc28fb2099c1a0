//! The `cohort` binary under SIGTERM and SIGINT: the first checkpoints every member, says how to resume and exits
//! with 128 + the signal's number.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("long.toml");
    let text = format!(
        "[run]\nname = \"long\"\ndir = \"{}\"\ndevice = \"cpu\"\nwarmup = false\nepochs = 100000\n\
         [data.blobs]\nsource = {{ synthetic = {{ train = 512, test = 64, classes = 4, shape = [16] }} }}\n\
         [[member]]\nname = \"m\"\nmodel = {{ layers = [{{ linear = 32, act = \"relu\" }}, {{ linear = 4 }}] }}\n\
         data = \"blobs\"\nbatch = 16\n",
        dir.join("runs").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts a run that would train for hours, waits for its first record, sends `signal`, and gives the exit code
/// and what it printed.
fn interrupted_by(signal: &str) -> (Option<i32>, String, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    // A bundle carried to a GPU machine says where its binary is; cargo's path is of the build machine.
    let bin = std::env::var("CARGO_BIN_EXE_cohort").unwrap_or(env!("CARGO_BIN_EXE_cohort").into());
    let child = Command::new(bin)
        .args(["train", cfg.to_str().unwrap(), "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = tmp
        .path()
        .join("runs")
        .join("long")
        .join("m")
        .join("metrics.jsonl");
    let t0 = Instant::now();
    while std::fs::metadata(&metrics).map_or(true, |m| m.len() == 0) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no record within a minute"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let kill = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let dir = tmp.keep();
    (out.status.code(), text, dir)
}

#[test]
fn sigterm_and_sigint_checkpoint_every_member_and_say_how_to_resume() {
    for (signal, code, name) in [("-TERM", 143, "SIGTERM"), ("-INT", 130, "SIGINT")] {
        let (status, stderr, dir) = interrupted_by(signal);
        assert_eq!(status, Some(code), "{stderr}");
        assert!(
            stderr.contains(&format!("interrupted by {name}")),
            "{stderr}"
        );
        assert!(stderr.contains("cohort resume"), "{stderr}");
        let ckpts: Vec<_> =
            std::fs::read_dir(dir.join("runs").join("long").join("m").join("checkpoints"))
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .collect();
        assert!(!ckpts.is_empty(), "the member was checkpointed");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
