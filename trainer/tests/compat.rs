//! Runs written by earlier versions still resume: `tests/fixtures/v0.1` is a run that cohort 0.1 interrupted at
//! step 12, with the step-16 checkpoints that version wrote when it went on.

mod common;

use std::path::Path;

use common::assert_close;

use cohort_trainer::checkpoint::CheckpointDir;
use cohort_trainer::cohort::{RunOptions, resume};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn a_v0_1_run_resumes_to_the_parameters_it_would_have_reached() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("v0.1");
    copy_dir(&fixture.join("run"), &run);
    let summary = resume(&run, RunOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .summary
        .unwrap();
    for m in ["mlp", "cnn"] {
        let member = summary.members.iter().find(|s| s.name == m).unwrap();
        assert_eq!(member.steps, 16, "{m}");
        let got = CheckpointDir::new(run.join(m).join("checkpoints"), 10)
            .unwrap()
            .load_latest()
            .unwrap()
            .unwrap()
            .checkpoint;
        let want = CheckpointDir::new(fixture.join("expected").join(m), 10)
            .unwrap()
            .load_latest()
            .unwrap()
            .unwrap()
            .checkpoint;
        assert_eq!(got.manifest.step, 16);
        assert_eq!(got.manifest.config_hash, want.manifest.config_hash, "{m}");
        let tensors = |c: cohort_trainer::checkpoint::Checkpoint| {
            c.tensors.into_iter().map(|(k, v)| (k, v.data)).collect()
        };
        assert_close(&tensors(got), &tensors(want), m);
    }
}
