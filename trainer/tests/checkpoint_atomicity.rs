//! Checkpoint writes are atomic: a writer killed at any moment leaves every checkpoint it had finished valid, and
//! a torn or corrupt newest checkpoint is detected and the previous one used.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use cohort_trainer::checkpoint::{Checkpoint, CheckpointDir, FORMAT, Manifest, TensorData};

const CHILD_ENV: &str = "COHORT_CHECKPOINT_CHILD_DIR";

fn checkpoint(step: u64, elems: usize) -> Checkpoint {
    let mut tensors = BTreeMap::new();
    let w: Vec<f32> = (0..elems).map(|i| (i as u64 + step) as f32).collect();
    tensors.insert(
        "model.layers.0.weight".to_string(),
        TensorData::f32(&[elems], &w),
    );
    tensors.insert(
        "optim.layers.0.weight.exp_avg".to_string(),
        TensorData::f32(&[elems], &w),
    );
    Checkpoint {
        manifest: Manifest {
            format: FORMAT,
            member: "m".into(),
            vocabulary: None,
            step,
            epoch: 0,
            batch: 64,
            device: "cpu".into(),
            data_position: serde_json::json!({ "index": step }),
            rng: serde_json::json!([step]),
            config_hash: "0".into(),
            config: serde_json::json!({}),
            trainer_state: serde_json::json!({}),
            tensors_file: String::new(),
            tensors_bytes: 0,
            checksum: String::new(),
            wall_time: 0.0,
            data_settings: serde_json::Value::Null,
            manifest_checksum: String::new(),
            loss_scaler: None,
        },
        tensors,
    }
}

/// The writer process: saves 16 MiB checkpoints at steps 2, 3, … until it is killed.
#[test]
#[ignore = "helper process of killed_writers_leave_the_previous_checkpoint_valid"]
fn checkpoint_writer_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let ck = CheckpointDir::new(dir, 1000).unwrap();
    for step in 2.. {
        ck.save(&mut checkpoint(step, 2 << 20)).unwrap();
    }
}

#[test]
fn killed_writers_leave_the_previous_checkpoint_valid() {
    let exe = std::env::current_exe().unwrap();
    for (round, delay_ms) in [5u64, 40, 90, 160, 250].into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("checkpoints");
        let ck = CheckpointDir::new(&dir, 1000).unwrap();
        ck.save(&mut checkpoint(1, 1024)).unwrap();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "checkpoint_writer_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL: no destructor, no flush
        child.wait().unwrap();

        // Every checkpoint whose manifest exists verifies, step 1 among them, whatever the moment of the kill.
        let ck = CheckpointDir::new(&dir, 1000).unwrap();
        let steps = ck.steps().unwrap();
        assert_eq!(steps[0], 1, "round {round}: {steps:?}");
        for &s in &steps {
            let c = ck
                .load(s)
                .unwrap_or_else(|e| panic!("round {round}, step {s}: {e}"));
            assert_eq!(c.manifest.step, s);
        }
        let latest = ck.load_latest().unwrap().unwrap();
        assert_eq!(latest.checkpoint.manifest.step, *steps.last().unwrap());
        assert!(latest.skipped.is_empty(), "{:?}", latest.skipped);
        let w = latest.checkpoint.tensors["model.layers.0.weight"]
            .to_f32()
            .unwrap();
        assert_eq!(w[0], latest.checkpoint.manifest.step as f32);
        // The killed writer's temporary files were cleaned up on reopening.
        let leftovers: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

#[test]
fn a_torn_newest_checkpoint_falls_back_to_the_previous() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = CheckpointDir::new(tmp.path(), 3).unwrap();
    for s in [100, 200] {
        ck.save(&mut checkpoint(s, 4096)).unwrap();
    }
    // Truncate the newest tensors file as a crash during a non-atomic write would.
    let p = ck.tensors_path(200);
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() / 2]).unwrap();
    let latest = ck.load_latest().unwrap().unwrap();
    assert_eq!(latest.checkpoint.manifest.step, 100);
    assert_eq!(latest.skipped.len(), 1);
    assert!(
        latest.skipped[0].contains("torn write"),
        "{}",
        latest.skipped[0]
    );
    // A manifest that is not JSON is reported the same way.
    std::fs::write(ck.manifest_path(200), b"{ not json").unwrap();
    let latest = ck.load_latest().unwrap().unwrap();
    assert_eq!(latest.checkpoint.manifest.step, 100);
    assert!(
        latest.skipped[0].contains("manifest is not valid"),
        "{}",
        latest.skipped[0]
    );
    // All corrupt: an error that says so.
    std::fs::write(ck.manifest_path(100), b"").unwrap();
    let e = ck.load_latest().unwrap_err().to_string();
    assert!(e.contains("every checkpoint is corrupt"), "{e}");
}

#[test]
fn the_tensors_file_is_plain_safetensors() {
    // The published layout: u64 LE header length, a JSON header {name: {dtype, shape, data_offsets}}, the data.
    let tmp = tempfile::tempdir().unwrap();
    let ck = CheckpointDir::new(tmp.path(), 3).unwrap();
    ck.save(&mut checkpoint(7, 6)).unwrap();
    let b = std::fs::read(ck.tensors_path(7)).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let w = &header["model.layers.0.weight"];
    assert_eq!(w["dtype"], "F32");
    assert_eq!(w["shape"], serde_json::json!([6]));
    let [start, end] = [
        w["data_offsets"][0].as_u64().unwrap(),
        w["data_offsets"][1].as_u64().unwrap(),
    ];
    assert_eq!(end - start, 24);
    let data = &b[8 + n + start as usize..8 + n + end as usize];
    assert_eq!(f32::from_le_bytes(data[..4].try_into().unwrap()), 7.0);
    assert_eq!(header["__metadata__"]["step"], "7");
}
