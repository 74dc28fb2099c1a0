//! What keeps a run's work safe on the CPU: logs on disk as they are written, an interrupt that checkpoints
//! every member, one member's failure kept to itself, strict resume, and the same bits with one thread or two.

mod common;

use common::{config, final_tensors, mlp, quiet, records};

use cohort_trainer::checkpoint::CheckpointDir;
use cohort_trainer::cohort::{Cohort, RunOptions, resume, train};
use cohort_trainer::config::Config;
use cohort_trainer::metrics::{self, MetricRecord};
use std::path::Path;

#[test]
fn records_reach_the_metrics_file_while_the_run_trains() {
    let tmp = tempfile::tempdir().unwrap();
    // 1,536 steps (3 epochs at batch 1), a record every 400 and at each epoch's end: a kilobyte or so in all,
    // which an 8 KiB buffer would have held to the end.
    let wide = "[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 256, act = \"relu\" }, { linear = 4 }] }\n\
                data = \"blobs\"\nbatch = 1\n";
    let c = config(tmp.path(), "live", "epochs = 3\nlog_every = 400", wide);
    let cohort = Cohort::new(c, quiet()).unwrap();
    let path = cohort.run_dir().join("m").join("metrics.jsonl");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let records = metrics::read(&path).unwrap();
                if !records.is_empty() {
                    return records.iter().map(|r| r.step).collect();
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Vec::new()
        })
    };
    let s = cohort.run().unwrap().summary.unwrap();
    done.store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(s.members[0].steps, 1536);
    // What the file held when a record first showed: the early ones only, not the whole run's at its end.
    let seen = watcher.join().unwrap();
    assert!(
        seen.first() == Some(&400) && seen.last().is_some_and(|&s| s < 1536),
        "records on disk when first seen: steps {seen:?}"
    );
}

#[test]
fn an_interrupt_checkpoints_every_member_and_the_resumed_run_ends_bit_identical() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let members = mlp("a", "batch = 16") + &mlp("b", "batch = 32\nseed = 3");
    let run_cfg = "epochs = 60\nfuse = false";
    let signal = Arc::new(AtomicUsize::new(0));
    let c = config(tmp.path(), "sig", run_cfg, &members);
    let cohort = Cohort::new(
        c,
        RunOptions {
            interrupt: Some(signal.clone()),
            ..RunOptions::default()
        },
    )
    .unwrap();
    let run = cohort.run_dir().to_path_buf();
    // SIGTERM (15) once a's first record is on disk, as a signal handler would set it.
    let watcher = {
        let (signal, path) = (signal.clone(), run.join("a").join("metrics.jsonl"));
        std::thread::spawn(move || {
            while metrics::read(&path).unwrap().is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            signal.store(15, Ordering::Relaxed);
        })
    };
    let out = cohort.run().unwrap();
    watcher.join().unwrap();
    assert_eq!(out.interrupted, Some(15));
    assert!(out.summary.is_none());
    for (m, full) in [("a", 1920), ("b", 960)] {
        let e: Vec<MetricRecord> = records(&run, m)
            .into_iter()
            .filter(|r| r.event.is_some())
            .collect();
        let last = e.last().unwrap_or_else(|| panic!("{m}: no event"));
        assert!(
            last.event
                .as_deref()
                .unwrap()
                .starts_with("interrupted by SIGTERM at step"),
            "{last:?}"
        );
        assert!(last.step < full, "{m} was stopped early, at {}", last.step);
        let ckpt = run
            .join(m)
            .join("checkpoints")
            .join(format!("ckpt-{:06}.json", last.step));
        assert!(ckpt.exists(), "{m}: a checkpoint at step {}", last.step);
    }
    // Resumed, it ends exactly where a run that was never interrupted does.
    let resumed = resume(&run, quiet()).unwrap();
    assert!(resumed.summary.is_some() && resumed.interrupted.is_none());
    let whole = train(config(tmp.path(), "whole", run_cfg, &members), quiet()).unwrap();
    for m in ["a", "b"] {
        assert_eq!(
            final_tensors(&run, m),
            final_tensors(&whole.run_dir, m),
            "{m}"
        );
    }
}

#[test]
fn a_member_whose_checkpoints_cannot_be_written_fails_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(
        tmp.path(),
        "isolated",
        "epochs = 2\nfuse = false",
        &(mlp("broken", "batch = 64") + &mlp("fine", "batch = 64")),
    );
    let cohort = Cohort::new(c, quiet()).unwrap();
    let run = cohort.run_dir().to_path_buf();
    // Its checkpoint folder replaced by a file: no write can succeed there, whoever runs the test.
    let ckpts = run.join("broken").join("checkpoints");
    std::fs::remove_dir_all(&ckpts).unwrap();
    std::fs::write(&ckpts, b"not a folder").unwrap();
    let s = cohort.run().unwrap().summary.unwrap();
    let broken = s.members.iter().find(|m| m.name == "broken").unwrap();
    let fine = s.members.iter().find(|m| m.name == "fine").unwrap();
    let why = broken.stopped.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("failed:") && why.contains("checkpoints"),
        "{why}"
    );
    assert!(
        broken.steps < 16,
        "it stopped at its first checkpoint, step {}",
        broken.steps
    );
    assert_eq!(
        (fine.steps, fine.stopped.as_deref()),
        (16, None),
        "the other member trained to its end"
    );
    assert!(fine.test_accuracy.is_some());
    assert_eq!(s.failures(), vec![("broken", why)]);
    let e: Vec<String> = records(&run, "broken")
        .into_iter()
        .filter_map(|r| r.event)
        .collect();
    assert!(
        e.iter().any(|e| e.contains("the other members go on")),
        "{e:?}"
    );
}

#[test]
fn a_member_whose_loss_diverges_stops_alone_and_keeps_its_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let wild = mlp(
        "wild",
        "batch = 64\noptimizer = { sgd = { lr = 1000, momentum = 0.9 } }\ncheckpoint = { every = \"4 steps\", keep = 2 }",
    );
    let c = config(
        tmp.path(),
        "nan",
        "epochs = 3",
        &(wild + &mlp("calm", "batch = 64")),
    );
    let out = train(c, quiet()).unwrap();
    let s = out.summary.unwrap();
    let wild = s.members.iter().find(|m| m.name == "wild").unwrap();
    let calm = s.members.iter().find(|m| m.name == "calm").unwrap();
    let why = wild.stopped.as_deref().unwrap_or_default();
    assert!(why.starts_with("loss became"), "{why}");
    assert!(wild.steps < 24);
    assert_eq!(calm.steps, 24, "the other member trained to its end");
    assert_eq!(s.failures().len(), 1);
    // Whatever checkpoint it has holds finite weights: none was written after its loss went bad.
    let dir = out.run_dir.join("wild").join("checkpoints");
    if let Some(newest) = CheckpointDir::new(&dir, 2).unwrap().load_latest().unwrap() {
        for (name, t) in &newest.checkpoint.tensors {
            let values: &[f32] = bytemuck::cast_slice(&t.data);
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{name} holds non-finite values"
            );
        }
    }
}

#[test]
fn paused_members_run_again_once_the_control_file_no_longer_pauses_them() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(
        tmp.path(),
        "paused",
        "epochs = 1\nfuse = false",
        &(mlp("a", "batch = 64") + &mlp("b", "batch = 64")),
    );
    let cohort = Cohort::new(c, quiet()).unwrap();
    let run = cohort.run_dir().to_path_buf();
    let control = run.join("control.toml");
    std::fs::write(&control, "[a]\npaused = true\n[b]\npaused = true\n").unwrap();
    // Once both are paused, the keys go: removing one unpauses a, an empty file unpauses b.
    let editor = {
        let (control, run) = (control.clone(), run.clone());
        std::thread::spawn(move || {
            let paused = |m: &str| {
                metrics::read(&run.join(m).join("metrics.jsonl"))
                    .unwrap()
                    .iter()
                    .any(|r| r.event.as_deref() == Some("paused through the control file"))
            };
            while !(paused("a") && paused("b")) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            std::fs::write(&control, "[a]\nbatch = 64\n[b]\npaused = true\n").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(400));
            std::fs::write(&control, "").unwrap();
        })
    };
    let s = cohort.run().unwrap().summary.unwrap();
    editor.join().unwrap();
    assert!(
        s.members.iter().all(|m| m.steps == 8),
        "{:?}",
        s.members.iter().map(|m| m.steps).collect::<Vec<_>>()
    );
    for m in ["a", "b"] {
        let e: Vec<String> = records(&run, m)
            .into_iter()
            .filter_map(|r| r.event)
            .collect();
        assert!(e.iter().any(|e| e.starts_with("resumed")), "{m}: {e:?}");
    }
}

#[test]
fn resume_refuses_changed_data_a_changed_member_set_and_an_edited_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(
        tmp.path(),
        "strict",
        "epochs = 1\nfuse = false",
        &(mlp("a", "batch = 64") + &mlp("b", "batch = 64")),
    );
    let out = train(c, quiet()).unwrap();
    let path = out.run_dir.join("config.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    let resume_with = |text: String| {
        std::fs::write(&path, text).unwrap();
        Cohort::resume(&out.run_dir, quiet())
            .unwrap_err()
            .to_string()
    };
    // A data setting that decides the batches (the shuffle buffer): refused, saying what changed.
    let e = resume_with(original.replace("shuffle = 512", "shuffle = 17"));
    assert!(
        e.contains("[data.blobs] shuffle:") && e.contains("17 now"),
        "{e}"
    );
    // A member renamed (a grid value changed): the old one would be abandoned, the new one never ran.
    let e = resume_with(original.replace("name = \"b\"", "name = \"c\""));
    assert!(
        e.contains("\"b\" has checkpoints here but is not in the config"),
        "{e}"
    );
    assert!(
        e.contains("\"c\" is in the config but never ran here"),
        "{e}"
    );
    // An edited manifest is refused like a corrupt one.
    std::fs::write(&path, &original).unwrap();
    let ck = out.run_dir.join("a").join("checkpoints");
    let manifest = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"batch\": 64", "\"batch\": 32")).unwrap();
    let e = Cohort::resume(&out.run_dir, quiet())
        .unwrap_err()
        .to_string();
    assert!(e.contains("the manifest was edited or is corrupt"), "{e}");
}

/// A small CNN on image-shaped synthetic data (its weight gradient is a sum over the batch).
fn cnn_config(dir: &Path, name: &str) -> Config {
    config(
        dir,
        name,
        "epochs = 2",
        "[data.pics]\nsource = { synthetic = { train = 256, test = 64, classes = 4, shape = [2, 8, 8] } }\n\
         shuffle = 256\nseed = 9\n\
         [[member]]\nname = \"cnn\"\ndata = \"pics\"\nbatch = 32\ncheckpoint = { every = 5, keep = 2 }\n\
         model = { layers = [{ conv = 6, kernel = 3, act = \"relu\" }, { maxpool = 2 }, { flatten = true }, \
         { linear = 4 }] }\n",
    )
}

#[test]
fn a_cnn_trains_to_the_same_bits_with_one_thread_or_two_and_resumes_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let in_pool = |threads: usize, name: &str| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| train(cnn_config(tmp.path(), name), quiet()).unwrap())
    };
    let one = in_pool(1, "one");
    let two = in_pool(2, "two");
    assert_eq!(
        final_tensors(&one.run_dir, "cnn"),
        final_tensors(&two.run_dir, "cnn")
    );
    // Killed after 11 steps (its last checkpoint at 10) with the default thread count, then resumed.
    let halted = train(
        cnn_config(tmp.path(), "halted"),
        RunOptions {
            halt_after_steps: Some(11),
            ..quiet()
        },
    )
    .unwrap();
    assert!(halted.summary.is_none());
    resume(&halted.run_dir, quiet()).unwrap();
    assert_eq!(
        final_tensors(&one.run_dir, "cnn"),
        final_tensors(&halted.run_dir, "cnn")
    );
}
