//! What the trainer's integration tests share: a member's last checkpoint, and two checkpoints compared.
// Each test crate compiles this module and uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use cohort_trainer::checkpoint::CheckpointDir;

/// The tensors of the latest valid checkpoint in the checkpoint directory `dir`, by name.
pub fn checkpoint_tensors(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let ck = CheckpointDir::new(dir.to_path_buf(), 100).unwrap();
    let latest = ck.load_latest().unwrap().expect("a checkpoint");
    latest
        .checkpoint
        .tensors
        .into_iter()
        .map(|(k, v)| (k, v.data))
        .collect()
}

/// Member `member`'s last checkpoint in the run directory `run`.
pub fn final_tensors(run: &Path, member: &str) -> BTreeMap<String, Vec<u8>> {
    checkpoint_tensors(&run.join(member).join("checkpoints"))
}

/// The same tensor names, and f32 values within a relative 1e-4.
pub fn assert_close(a: &BTreeMap<String, Vec<u8>>, b: &BTreeMap<String, Vec<u8>>, what: &str) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (k, va) in a {
        let fa: &[f32] = bytemuck::cast_slice(va);
        let fb: &[f32] = bytemuck::cast_slice(&b[k]);
        let worst = fa
            .iter()
            .zip(fb)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "{what} {k}: max relative difference {worst}");
    }
}
