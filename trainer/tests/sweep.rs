//! Sweeps on the bundled digits, on the CPU: trials sampled the same under a seed and named by index, clear errors
//! for bad search spaces, ASHA pruning with trials admitted as others end (by count and by the memory budget), the
//! best trial and its best checkpoint, early stopping, and an interrupted sweep resumed to the same result.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cohort_trainer::cohort::{RunOptions, resume, train};
use cohort_trainer::config::Config;
use cohort_trainer::metrics::MetricRecord;
use cohort_trainer::report::{Status, Summary};

/// A sweep of small MLPs: `trials` trials, `extra` appended to `[search]`, `member` appended to the member table.
fn sweep(dir: &Path, name: &str, search: &str, member: &str) -> String {
    format!(
        r#"[run]
name = "{name}"
dir = "{d}/runs"
device = "cpu"
warmup = false
epochs = 3
seed = 0

[data.mnist]
source = {{ idx = "data/mnist" }}
val = 0.1

[search]
seed = 5
scheduler = {{ asha = {{ rung = "1 epoch", reduction = 3 }} }}
{search}

[[member]]
name = "mlp"
model = {{ layers = [{{ linear = {{ choice = [16, 32], name = "width" }}, act = "relu" }}, {{ linear = 10 }}] }}
optimizer = {{ adam = {{ lr = {{ loguniform = [1e-4, 3e-2] }} }} }}
batch = {{ choice = [128, 256] }}
{member}
"#,
        d = dir.display()
    )
}

fn parse(text: &str) -> Config {
    Config::parse(text, "sweep.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn records(run: &Path, member: &str) -> Vec<MetricRecord> {
    std::fs::read_to_string(run.join(member).join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The most trials training at once, from each trial's first and last record times.
fn most_at_once(run: &Path, s: &Summary) -> usize {
    let spans: Vec<(f64, f64)> = s
        .members
        .iter()
        .map(|m| {
            let r = records(run, &m.name);
            (r[0].time, r.last().unwrap().time)
        })
        .collect();
    spans
        .iter()
        .map(|&(a, _)| spans.iter().filter(|&&(b, e)| b <= a && a < e).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn trials_are_sampled_the_same_under_a_seed_and_named_by_index() {
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(dir.path(), "s", "trials = 12", "");
    let (a, b) = (parse(&text), parse(&text));
    let names: Vec<&str> = a.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), 12);
    assert_eq!(names[0], "mlp-t000");
    assert_eq!(names[11], "mlp-t011");
    for (x, y) in a.members.iter().zip(&b.members) {
        assert_eq!(x.hyperparameters, y.hyperparameters);
        assert_eq!(
            x.config_hash(),
            y.config_hash(),
            "the same trial, the same identity"
        );
    }
    let lrs: Vec<f64> = a.members.iter().map(|m| m.optimizer.lr()).collect();
    for (m, lr) in a.members.iter().zip(&lrs) {
        assert_eq!(m.hyperparameters["lr"], serde_json::json!(lr));
        assert!((1e-4..=3e-2).contains(lr));
        assert!([128, 256].contains(&m.batch));
        assert_eq!(m.trial, Some(m.name[5..].parse().unwrap()));
    }
    let widths: std::collections::BTreeSet<String> = a
        .members
        .iter()
        .map(|m| m.hyperparameters["width"].to_string())
        .collect();
    assert_eq!(widths.len(), 2, "12 draws of two widths give both");
    let dims: Vec<(&str, &str)> = a
        .search
        .as_ref()
        .unwrap()
        .dimensions
        .iter()
        .map(|d| (d.name.as_str(), d.kind.as_str()))
        .collect();
    assert_eq!(
        dims,
        [
            ("batch", "choice"),
            ("width", "choice"),
            ("lr", "loguniform")
        ]
    );
    // Another seed, other values; more trials keep the first ones (a stream per trial).
    let other = parse(&text.replace("seed = 5", "seed = 6"));
    let other_lrs: Vec<f64> = other.members.iter().map(|m| m.optimizer.lr()).collect();
    assert_ne!(lrs, other_lrs);
    let more = parse(&text.replace("trials = 12", "trials = 20"));
    assert_eq!(
        more.members[..12]
            .iter()
            .map(|m| m.optimizer.lr())
            .collect::<Vec<_>>(),
        lrs
    );
    // A table may sample its own number of trials; one without a search space may not ask for any.
    let own = parse(&sweep(dir.path(), "own", "trials = 12", "trials = 3"));
    assert_eq!(own.members.len(), 3);
    assert_eq!(own.members[2].name, "mlp-t002");
    let fixed = text
        .replace("{ choice = [16, 32], name = \"width\" }", "16")
        .replace("{ loguniform = [1e-4, 3e-2] }", "1e-3")
        .replace("{ choice = [128, 256] }", "128");
    let e = Config::parse(&format!("{fixed}trials = 2\n"), "sweep.toml").unwrap_err();
    assert_eq!(e.key, "trials");
    assert!(e.message.contains("no search space"), "{e}");
    let e = Config::parse(
        &sweep(dir.path(), "bad", "trials = 2", "trials = \"many\""),
        "sweep.toml",
    )
    .unwrap_err();
    assert_eq!(e.key, "trials");
    // A grid list inside a sampled table expands within each trial.
    let grid = parse(&sweep(dir.path(), "g", "trials = 2", "seed = [1, 2]"));
    let names: Vec<&str> = grid.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "mlp-t000-seed1",
            "mlp-t000-seed2",
            "mlp-t001-seed1",
            "mlp-t001-seed2"
        ]
    );
    assert_eq!(
        grid.members[1].hyperparameters["seed"],
        serde_json::json!(2)
    );
}

#[test]
fn bad_search_spaces_name_the_key_and_what_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let base = sweep(dir.path(), "s", "trials = 4", "");
    let err = |text: &str| Config::parse(text, "sweep.toml").unwrap_err();
    let e = err(&base
        .replace("[search]\nseed = 5", "[other]\nseed = 5")
        .replace("scheduler = ", "x = "));
    assert!(
        e.to_string().contains("the top level") || e.message.contains("[search]"),
        "{e}"
    );
    let no_search = base.replace("[search]\nseed = 5\n", "").replace(
        "scheduler = { asha = { rung = \"1 epoch\", reduction = 3 } }\ntrials = 4\n",
        "",
    );
    let e = err(&no_search);
    assert!(
        e.message.contains("needs a [search] table") && e.message.contains("trials = 16"),
        "{e}"
    );
    let e = err(&base.replace("loguniform = [1e-4, 3e-2]", "loguniform = [0, 3e-2]"));
    assert_eq!(e.key, "optimizer.adam.lr");
    assert!(e.message.contains("0 < low < high"), "{e}");
    let e = err(&base.replace("choice = [128, 256]", "choice = []"));
    assert_eq!(e.key, "batch");
    let e = err(&base.replace("trials = 4", "trials = 4\nmetric = \"test_accuracy\""));
    assert_eq!((e.section.as_str(), e.key.as_str()), ("[search]", "metric"));
    assert!(e.message.contains("validation scores only"), "{e}");
    let e = err(&base.replace("reduction = 3", "reduction = 1"));
    assert_eq!(e.key, "scheduler.asha.reduction");
    let fixed = base
        .replace("{ choice = [16, 32], name = \"width\" }", "16")
        .replace("{ loguniform = [1e-4, 3e-2] }", "1e-3")
        .replace("{ choice = [128, 256] }", "128");
    let e = err(&fixed);
    assert_eq!((e.section.as_str(), e.key.as_str()), ("[search]", "trials"));
    assert!(
        e.message.contains("no [[member]] table has a search space"),
        "{e}"
    );
}

#[test]
fn asha_prunes_trials_and_waiting_trials_take_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(dir.path(), "asha", "trials = 9\nmax_concurrent = 3", "");
    let out = train(parse(&text), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    let run = out.run_dir;
    let sw = s.sweep.as_ref().unwrap();
    assert_eq!(
        (sw.metric.as_str(), sw.mode.as_str(), sw.scheduler.as_str()),
        ("val_accuracy", "max", "asha")
    );
    assert_eq!(sw.completed + sw.pruned + sw.failed, 9);
    assert!(
        sw.pruned >= 3 && sw.completed >= 1 && sw.failed == 0,
        "{sw:?}"
    );
    assert!(s.failures().is_empty(), "pruned trials did not fail");
    for m in &s.members {
        assert_eq!(m.hyperparameters.len(), 3, "{}", m.name);
        match m.status {
            Status::Pruned => {
                assert!(
                    m.epochs < 3,
                    "{} pruned at a rung below the full budget",
                    m.name
                );
                assert!(
                    m.stopped.as_deref().unwrap().starts_with("pruned at rung"),
                    "{:?}",
                    m.stopped
                );
            }
            Status::Completed => assert_eq!(m.epochs, 3),
            Status::Failed => panic!("{} failed", m.name),
        }
    }
    // The best: a completed trial with the highest best validation accuracy, its best checkpoint on disk.
    let best: Vec<_> = s.members.iter().filter(|m| m.best).collect();
    assert_eq!(best.len(), 1);
    let top = s
        .members
        .iter()
        .filter(|m| m.status == Status::Completed)
        .map(|m| m.best_metric.unwrap())
        .fold(f64::MIN, f64::max);
    assert_eq!(best[0].best_metric, Some(top));
    assert_eq!(sw.best.as_deref(), Some(best[0].name.as_str()));
    let ckpt = run.join(best[0].best_checkpoint.as_ref().unwrap());
    assert!(ckpt.is_file(), "{}", ckpt.display());
    assert!(ckpt.starts_with(run.join(&best[0].name).join("checkpoints").join("best")));
    // Never more than three at once, and the later trials started as earlier ones ended.
    assert_eq!(most_at_once(&run, &s), 3);
    let first_end = s.members[..3]
        .iter()
        .map(|m| records(&run, &m.name).last().unwrap().time)
        .fold(f64::MAX, f64::min);
    let last_start = records(&run, &s.members[8].name)[0].time;
    assert!(
        last_start >= first_end,
        "trial 8 started at {last_start}, before any of the first three ended ({first_end})"
    );
    let started = records(&run, &s.members[8].name)
        .into_iter()
        .find_map(|r| r.event.filter(|e| e.starts_with("started")));
    assert!(
        started.is_some_and(|e| e.contains("3 trials training")),
        "the ninth trial says it started"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(
        record["rungs"]["1"].as_array().unwrap().len(),
        9,
        "every trial reached the first rung"
    );
    // TensorBoard's HParams data: the experiment in the run's root, a session started and ended in every trial's
    // event file (bench/tb_hparams_check.py reads them with TensorBoard's own code).
    let holds = |dir: &Path, what: &str| {
        std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
                && std::fs::read(e.path())
                    .unwrap()
                    .windows(what.len())
                    .any(|w| w == what.as_bytes())
        })
    };
    assert!(holds(&run, "_hparams_/experiment"));
    for m in &s.members {
        assert!(
            holds(&run.join(&m.name), "_hparams_/session_start_info"),
            "{}",
            m.name
        );
        assert!(
            holds(&run.join(&m.name), "_hparams_/session_end_info"),
            "{}",
            m.name
        );
    }
}

#[test]
fn the_memory_budget_admits_as_many_trials_as_fit_and_freed_memory_goes_to_the_next() {
    let dir = tempfile::tempdir().unwrap();
    // Each trial's limit is its footprint for admission: 40 MiB of a 100 MiB pool admits two at a time.
    let text = sweep(
        dir.path(),
        "budget",
        "trials = 6",
        "memory = { limit = \"40MiB\" }",
    )
    .replace(
        "[data.mnist]",
        "[memory]\nlimit = \"100MiB\"\n\n[data.mnist]",
    );
    let out = train(parse(&text), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    assert_eq!(most_at_once(&out.run_dir, &s), 2);
    let sw = s.sweep.as_ref().unwrap();
    assert_eq!(sw.failed, 0, "{:?}", s.failures());
    assert_eq!(sw.completed + sw.pruned, 6);
    // Every trial held memory of its own while it trained, and none beyond its limit.
    for m in &s.members {
        assert!(
            m.peak_memory_bytes > 0 && m.peak_memory_bytes <= 40 << 20,
            "{}: {}",
            m.name,
            m.peak_memory_bytes
        );
    }
}

#[test]
fn early_stopping_ends_a_member_whose_metric_stops_improving() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"[run]
name = "early"
dir = "{d}/runs"
device = "cpu"
warmup = false
epochs = 5

[data.mnist]
source = {{ idx = "data/mnist" }}
val = 0.1

[[member]]
name = "patient"
model = {{ layers = [{{ linear = 16, act = "relu" }}, {{ linear = 10 }}] }}
optimizer = {{ adam = {{ lr = 1e-3 }} }}
batch = 256
early_stopping = {{ metric = "val_loss", patience = 1, min_delta = 10.0 }}
"#,
        d = dir.path().display()
    );
    let out = train(parse(&text), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    let m = &s.members[0];
    // No change of val_loss beats 10: the second validation is one without improvement.
    assert_eq!(m.epochs, 2);
    assert_eq!(m.status, Status::Completed);
    assert!(
        m.stopped
            .as_deref()
            .unwrap()
            .starts_with("early stop: val_loss"),
        "{:?}",
        m.stopped
    );
    assert!(
        out.run_dir
            .join(m.best_checkpoint.as_ref().unwrap())
            .is_file()
    );
    assert!(s.failures().is_empty());
}

/// What a sweep ended on, trial by trial: status, epochs, steps and best metric.
fn outcome(s: &Summary) -> BTreeMap<String, (Status, u64, u64, Option<f64>, bool)> {
    s.members
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                (m.status, m.epochs, m.steps, m.best_metric, m.best),
            )
        })
        .collect()
}

#[test]
fn an_interrupted_sweep_resumes_to_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let whole = sweep(dir.path(), "whole", "trials = 6\nmax_concurrent = 4", "");
    let a = train(parse(&whole), RunOptions::default())
        .unwrap()
        .summary
        .unwrap();
    let cut = whole.replace("name = \"whole\"", "name = \"cut\"");
    // Interrupted once the first rung's decisions are on disk, as a Ctrl-C would.
    let flag = Arc::new(AtomicUsize::new(0));
    let run = dir.path().join("runs").join("cut");
    let watcher = {
        let (flag, record) = (flag.clone(), run.join("sweep.json"));
        std::thread::spawn(move || {
            while !record.exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            flag.store(2, Ordering::Relaxed);
        })
    };
    let opts = RunOptions {
        interrupt: Some(flag),
        ..RunOptions::default()
    };
    let first = train(parse(&cut), opts).unwrap();
    watcher.join().unwrap();
    assert_eq!(
        first.interrupted,
        Some(2),
        "the run stopped on the interrupt"
    );
    assert!(first.summary.is_none());
    let b = resume(&run, RunOptions::default())
        .unwrap()
        .summary
        .unwrap();
    assert_eq!(outcome(&a), outcome(&b));
    let rec = |name: &str| -> serde_json::Value {
        serde_json::from_slice(
            &std::fs::read(dir.path().join("runs").join(name).join("sweep.json")).unwrap(),
        )
        .unwrap()
    };
    assert_eq!(
        rec("whole")["rungs"],
        rec("cut")["rungs"],
        "the same promotions, in the same order"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_a_budget_for_two_trials_trains_six_in_turn_and_none_runs_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 64 MiB a trial of a 160 MiB pool: two at a time, each new trial on the pages the ended ones gave back.
    let text = sweep(
        dir.path(),
        "cuda-budget",
        "trials = 6",
        "memory = { limit = \"64MiB\" }",
    )
    .replace("device = \"cpu\"", "device = \"cuda\"")
    .replace(
        "[data.mnist]",
        "[memory]\nlimit = \"160MiB\"\n\n[data.mnist]",
    );
    let out = train(parse(&text), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    assert_eq!(most_at_once(&out.run_dir, &s), 2);
    let sw = s.sweep.as_ref().unwrap();
    assert_eq!(
        (sw.failed, sw.completed + sw.pruned),
        (0, 6),
        "{:?}",
        s.failures()
    );
    for m in &s.members {
        assert!(
            m.device.starts_with("cuda"),
            "{} trained on {}",
            m.name,
            m.device
        );
        assert!(
            m.peak_memory_bytes > 0 && m.peak_memory_bytes <= 64 << 20,
            "{}",
            m.peak_memory_bytes
        );
    }
    let pool = s
        .process_memory
        .as_ref()
        .expect("a GPU run reports its pool");
    assert!(
        pool.pool_limit <= 160 << 20,
        "the pool's limit {}",
        pool.pool_limit
    );
    assert!(pool.pool_reserved <= pool.pool_limit);
}

#[test]
fn a_trial_that_runs_out_of_memory_fails_alone_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // A 2 MiB budget per trial: a batch of 128 fits, one of 2,048 (6 MiB of pixels alone) does not, and with
    // oom = "fail" such a trial fails instead of shrinking.
    let text = sweep(
        dir.path(),
        "oom",
        "trials = 8\nmax_concurrent = 4",
        "memory = { limit = \"2MiB\" }\noom = \"fail\"",
    )
    .replace("{ choice = [128, 256] }", "{ choice = [128, 2048] }");
    let out = train(parse(&text), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    let big: Vec<_> = s
        .members
        .iter()
        .filter(|m| m.hyperparameters["batch"] == 2048)
        .collect();
    let small: Vec<_> = s
        .members
        .iter()
        .filter(|m| m.hyperparameters["batch"] == 128)
        .collect();
    assert!(
        !big.is_empty() && !small.is_empty(),
        "8 draws of two batches give both"
    );
    for m in &big {
        assert_eq!(m.status, Status::Failed, "{}", m.name);
        assert!(
            m.stopped.as_deref().unwrap().contains("out of memory"),
            "{:?}",
            m.stopped
        );
        assert!(!m.best);
    }
    // The others trained through it: each reached the first rung or its end, none lost a step to it.
    for m in &small {
        assert_ne!(m.status, Status::Failed, "{}: {:?}", m.name, m.stopped);
        assert!(m.epochs >= 1 && m.best_metric.is_some(), "{}", m.name);
    }
    let sw = s.sweep.as_ref().unwrap();
    assert_eq!(sw.failed, big.len());
    assert!(sw.best.is_some());
    assert_eq!(
        s.failures().len(),
        big.len(),
        "failed trials are the run's failures"
    );
}

#[test]
fn a_sweep_killed_without_warning_resumes_and_keeps_its_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(dir.path(), "crash", "trials = 6\nmax_concurrent = 4", "");
    // Stopped as a crash would, in the second epoch of the fastest trials: after the first rung's decisions, with
    // no final checkpoint and no summary.
    let opts = RunOptions {
        halt_after_steps: Some(40),
        ..RunOptions::default()
    };
    let first = train(parse(&text), opts).unwrap();
    assert!(first.summary.is_none());
    let run = first.run_dir;
    let read = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(run.join("sweep.json")).unwrap()).unwrap()
    };
    let before = read();
    let pruned_before: Vec<String> = before["ended"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| v[0] == "pruned")
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        !pruned_before.is_empty(),
        "the first rung pruned trials before the crash"
    );
    let s = resume(&run, RunOptions::default())
        .unwrap()
        .summary
        .unwrap();
    for name in &pruned_before {
        let m = s.members.iter().find(|m| &m.name == name).unwrap();
        assert_eq!(
            m.status,
            Status::Pruned,
            "{name} stays pruned, not trained again"
        );
        assert_eq!(m.epochs, 1, "{name}");
    }
    // The first rung's decisions stand: every trial that was judged there before the crash was judged the same.
    let after = read();
    for a in before["rungs"]["1"].as_array().unwrap() {
        let same = after["rungs"]["1"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["trial"] == a["trial"])
            .unwrap();
        assert_eq!(a["promoted"], same["promoted"], "{}", a["trial"]);
    }
    let sw = s.sweep.unwrap();
    assert_eq!((sw.completed + sw.pruned, sw.failed), (6, 0));
}

#[test]
fn a_sweep_without_a_validation_split_is_refused_before_it_trains() {
    let dir = tempfile::tempdir().unwrap();
    let text = sweep(dir.path(), "noval", "trials = 2", "").replace("val = 0.1\n", "");
    let e = train(parse(&text), RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mlp-t000")
            && e.contains("ranks trials by val_accuracy")
            && e.contains("val = 0.1"),
        "{e}"
    );
}

#[test]
fn rungs_in_steps_validate_at_their_steps_and_the_median_rule_stops_trials() {
    let dir = tempfile::tempdir().unwrap();
    // ASHA on rungs of 20 and 60 steps (batches of 128: 57 steps an epoch): validations fall at the rungs.
    let steps = sweep(dir.path(), "steps", "trials = 6", "")
        .replace("rung = \"1 epoch\"", "rung = 20")
        .replace("{ choice = [128, 256] }", "128");
    let out = train(parse(&steps), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    let sw = s.sweep.as_ref().unwrap();
    assert!(sw.pruned >= 3, "{sw:?}");
    for m in s.members.iter().filter(|m| m.status == Status::Pruned) {
        let why = m.stopped.as_deref().unwrap();
        assert!(
            why.contains("(step 20)") || why.contains("(step 60)"),
            "{why}"
        );
        assert!(
            m.steps == 20 || m.steps == 60,
            "{}: {} steps",
            m.name,
            m.steps
        );
        let validated: Vec<u64> = records(&out.run_dir, &m.name)
            .into_iter()
            .filter(|r| r.val.is_some())
            .map(|r| r.step)
            .collect();
        assert!(
            validated.contains(&20),
            "{}: validated at {validated:?}",
            m.name
        );
    }
    // The median rule from the second epoch on, among at least two others.
    let median = sweep(dir.path(), "median", "trials = 8", "")
        .replace(
            "{ asha = { rung = \"1 epoch\", reduction = 3 } }",
            "{ median = { grace = \"2 epochs\", min_trials = 2 } }",
        )
        .replace("epochs = 3", "epochs = 4");
    let s = train(parse(&median), RunOptions::default())
        .unwrap()
        .summary
        .unwrap();
    let sw = s.sweep.as_ref().unwrap();
    assert_eq!(sw.scheduler, "median");
    assert!(sw.pruned >= 1 && sw.completed >= 1, "{sw:?}");
    for m in s.members.iter().filter(|m| m.status == Status::Pruned) {
        assert!(m.epochs >= 2, "{}: stopped within the grace", m.name);
        assert!(
            m.stopped
                .as_deref()
                .unwrap()
                .starts_with("stopped by the median rule"),
            "{:?}",
            m.stopped
        );
    }
}

#[test]
fn trials_that_differ_only_in_dropout_rates_train_fused() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"[run]
name = "dropout"
dir = "{d}/runs"
device = "cpu"
warmup = false
epochs = 1

[data.mnist]
source = {{ idx = "data/mnist" }}
val = 0.1

[[member]]
name = "after"
model = {{ layers = [{{ linear = 32, act = "relu" }}, {{ dropout = [0.0, 0.2, 0.5] }}, {{ linear = 10 }}] }}
optimizer = {{ adam = {{ lr = 2e-3 }} }}
batch = 128

[[member]]
name = "before"
model = {{ layers = [{{ dropout = [0.0, 0.2] }}, {{ linear = 32, act = "relu" }}, {{ linear = 10 }}] }}
optimizer = {{ adam = {{ lr = 2e-3 }} }}
batch = 128
"#,
        d = dir.path().display()
    );
    let s = train(parse(&text), RunOptions::default())
        .unwrap()
        .summary
        .unwrap();
    let m = |name: &str| s.members.iter().find(|m| m.name == name).unwrap();
    // After the first layer with parameters each member keeps its own rate in one fused model ...
    assert_eq!(
        m("after-dropout0").fused_with,
        ["after-dropout0.2", "after-dropout0.5"]
    );
    // ... and trains at it: the higher the rate, the higher the training loss of one epoch.
    let loss = |n: &str| m(n).final_loss;
    assert!(
        loss("after-dropout0") < loss("after-dropout0.5"),
        "{} vs {}",
        loss("after-dropout0"),
        loss("after-dropout0.5")
    );
    for n in ["after-dropout0", "after-dropout0.2", "after-dropout0.5"] {
        assert!(
            m(n).val_accuracy.unwrap() > 0.85,
            "{n}: {:?}",
            m(n).val_accuracy
        );
    }
    // Before it the input has no member dimension: members with other rates there train apart.
    assert!(m("before-dropout0").fused_with.is_empty());
}
