//! What the trainer's integration tests share: runs on small synthetic data, a member's records and last
//! checkpoint, and two checkpoints compared.
// Each test crate compiles this module and uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use cohort_trainer::checkpoint::CheckpointDir;
use cohort_trainer::cohort::RunOptions;
use cohort_trainer::config::Config;
use cohort_trainer::metrics::{self, MetricRecord};

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

/// `[data.blobs]`: 512 training and 128 test examples of 16 features in 4 classes.
pub const DATA: &str = r#"
[data.blobs]
source = { synthetic = { train = 512, test = 128, classes = 4, shape = [16] } }
shuffle = 512
prefetch = 2
seed = 3
"#;

pub fn config(dir: &Path, name: &str, run: &str, members: &str) -> Config {
    config_on("cpu", dir, name, run, members)
}

pub fn config_on(device: &str, dir: &Path, name: &str, run: &str, members: &str) -> Config {
    let text = format!(
        "[run]\nname = \"{name}\"\ndir = \"{}\"\ndevice = \"{device}\"\nwarmup = false\n{run}\n{DATA}\n{members}",
        dir.display()
    );
    Config::parse(&text, &format!("{name}.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// The CUDA tests that compare two runs elementwise take turns. Concurrent runs tune the same products under each
/// other's load and may keep different algorithms; Adam turns the last-bit difference of a near-zero gradient into
/// a whole step, so two runs compared this way must use the same ones. (Cohorts do share a GPU safely: see
/// `other_threads_wait_while_a_graph_is_captured` in cohort-tensor.)
static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn gpu_turn() -> std::sync::MutexGuard<'static, ()> {
    GPU.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn quiet() -> RunOptions {
    RunOptions::default()
}

pub fn mlp(name: &str, extra: &str) -> String {
    format!(
        "[[member]]\nname = \"{name}\"\nmodel = {{ layers = [{{ linear = 32, act = \"relu\" }}, {{ linear = 4 }}] }}\n\
         data = \"blobs\"\n{extra}\n"
    )
}

pub fn records(run: &Path, member: &str) -> Vec<MetricRecord> {
    metrics::read(&run.join(member).join("metrics.jsonl")).unwrap()
}
