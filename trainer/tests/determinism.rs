//! Same bits every time: `[run] deterministic = true` on a GPU (fixed product algorithms, ordered sums), and the
//! product algorithms a GPU run chose by timing saved in `tuning.json` and taken up by its resume. The CPU's own
//! determinism (any thread count, kill and resume) is in `reliability.rs`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{config_on, final_tensors, gpu_turn, mlp, quiet, records};

use cohort_trainer::cohort::{RunOptions, resume, train};
use cohort_trainer::config::Config;

/// A fused pair of MLPs, an MLP whose SGD rate halves every 3 steps, and a small CNN (a convolution, overlapping
/// max-pool windows) with checkpoints every 5 steps, for 2 epochs.
fn job(device: &str, dir: &Path, name: &str, deterministic: bool) -> Config {
    let cnn = "[data.pics]\nsource = { synthetic = { train = 256, test = 64, classes = 4, shape = [2, 8, 8] } }\n\
               shuffle = 256\nseed = 9\n\
               [[member]]\nname = \"cnn\"\ndata = \"pics\"\nbatch = 32\ncheckpoint = { every = 5, keep = 2 }\n\
               model = { layers = [{ conv = 6, kernel = 3, act = \"relu\" }, { maxpool = 3, stride = 2 }, \
               { flatten = true }, { linear = 4 }] }\n";
    let mlps = mlp(
        "g",
        "batch = 32\noptimizer = { adam = { lr = [1e-2, 3e-3] } }\ncheckpoint = { every = 5, keep = 2 }",
    ) + &mlp(
        "s",
        "batch = 32\noptimizer = { sgd = { lr = 0.05, momentum = 0.9 } }\n\
         lr_schedule = { step = { every = 3, gamma = 0.5 } }\ncheckpoint = { every = 5, keep = 2 }",
    );
    config_on(
        device,
        dir,
        name,
        &format!("epochs = 2\ndeterministic = {deterministic}"),
        &format!("{mlps}\n{cnn}"),
    )
}

const MEMBERS: [&str; 4] = ["g-lr0.01", "g-lr3e-3", "s", "cnn"];

/// Trains `job` to the end, and again killed after 7 steps (its last checkpoints at 5) and resumed.
fn full_and_resumed(
    device: &str,
    dir: &Path,
    deterministic: bool,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let full = train(job(device, dir, "full", deterministic), quiet()).unwrap();
    let halted = train(
        job(device, dir, "halted", deterministic),
        RunOptions {
            halt_after_steps: Some(7),
            ..quiet()
        },
    )
    .unwrap();
    assert!(halted.summary.is_none());
    resume(&halted.run_dir, quiet()).unwrap();
    (full.run_dir, halted.run_dir)
}

#[test]
fn deterministic_is_a_boolean_and_changes_nothing_on_the_cpu() {
    // The mode is process-wide: a GPU test's run beside this one would see it flip (and time its convolutions).
    let _turn = gpu_turn();
    let tmp = tempfile::tempdir().unwrap();
    let e = Config::parse(
        "[run]\ndeterministic = \"yes\"\n[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 4 }] }\n",
        "bad.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("deterministic"), "{e}");
    let on = train(job("cpu", tmp.path(), "on", true), quiet()).unwrap();
    let off = train(job("cpu", tmp.path(), "off", false), quiet()).unwrap();
    for m in MEMBERS {
        assert_eq!(
            final_tensors(&on.run_dir, m),
            final_tensors(&off.run_dir, m),
            "{m}"
        );
    }
    assert!(
        !on.run_dir.join(cohort_trainer::tuning::FILE).exists(),
        "nothing is tuned on the CPU"
    );
}

/// Under `deterministic = true` two fresh runs, and a run killed and resumed, end on the same bits on a GPU: the
/// products run on the heuristics' picks (not whichever algorithm timed fastest), the max-pool's backward sums
/// overlapping windows in a fixed order, and steps replayed from CUDA graphs give the eager steps' bits (a resumed
/// run's first step is eager; the scheduled member's steps run eagerly once its rate moves from the capture's).
#[test]
#[ignore = "needs a CUDA GPU"]
fn under_deterministic_fresh_and_resumed_runs_end_on_the_same_bits_on_cuda() {
    let _turn = gpu_turn();
    let tmp = tempfile::tempdir().unwrap();
    let (full, resumed) = full_and_resumed("cuda:0", tmp.path(), true);
    let again = train(job("cuda:0", tmp.path(), "again", true), quiet()).unwrap();
    for m in MEMBERS {
        let captured = |run: &Path| {
            records(run, m)
                .iter()
                .filter_map(|r| r.event.as_deref())
                .any(|e| e.contains("captured as a CUDA graph"))
        };
        assert!(
            captured(&full) && captured(&resumed),
            "{m}: steps replayed from graphs"
        );
        let a = final_tensors(&full, m);
        assert!(!a.is_empty());
        for (what, run) in [
            ("killed and resumed", &resumed),
            ("a second fresh run", &again.run_dir),
        ] {
            let b = final_tensors(run, m);
            let differ: Vec<&String> = a.keys().filter(|k| a.get(*k) != b.get(*k)).collect();
            assert!(
                differ.is_empty(),
                "member {m}, {what}: these tensors differ: {differ:?}"
            );
        }
    }
}

/// Without `deterministic`, a GPU run keeps the product algorithms it chose by timing in `tuning.json` (written
/// with its checkpoints), and its resume, in a new process, takes them up instead of timing afresh. Choices made
/// on another GPU are refused with a reason.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_run_saves_its_product_choices_and_its_resume_takes_them_up() {
    let _turn = gpu_turn();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("tuned.toml");
    std::fs::write(
        &cfg,
        format!(
            "[run]\nname = \"tuned\"\ndir = \"{}\"\ndevice = \"cuda:0\"\nepochs = 100\n\
             [data.blobs]\nsource = {{ synthetic = {{ train = 512, test = 64, classes = 4, shape = [16] }} }}\n\
             [[member]]\nname = \"m\"\nmodel = {{ layers = [{{ linear = 32, act = \"relu\" }}, {{ linear = 4 }}] }}\n\
             data = \"blobs\"\nbatch = 16\ncheckpoint = {{ every = 5 }}\n",
            tmp.path().join("runs").display()
        ),
    )
    .unwrap();
    let bin = std::env::var("CARGO_BIN_EXE_cohort").unwrap_or(env!("CARGO_BIN_EXE_cohort").into());
    let child = Command::new(&bin)
        .args(["train", cfg.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = tmp.path().join("runs").join("tuned");
    let tuning = run.join(cohort_trainer::tuning::FILE);
    let t0 = Instant::now();
    while !tuning.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no tuning.json within a minute"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(130));
    let saved: cohort_tensor::GemmChoices =
        serde_json::from_str(&std::fs::read_to_string(&tuning).unwrap()).unwrap();
    assert!(!saved.entries.is_empty(), "the run's products are recorded");
    let out = Command::new(&bin)
        .args(["resume", run.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let taken = format!(
        "{} product algorithm choices taken from",
        saved.entries.len()
    );
    assert!(
        text.contains(&taken),
        "the resume takes up every saved choice:\n{text}"
    );
    let mut foreign = saved.clone();
    foreign.device.name = "some other GPU".into();
    let e = cohort_tensor::cuda::adopt_gemm_choices(0, &foreign)
        .unwrap_err()
        .to_string();
    assert!(e.contains("some other GPU") && e.contains("afresh"), "{e}");
}
