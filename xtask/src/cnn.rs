//! The `cnn` part of `cargo xtask bench`: an image CNN trained on one GPU under each precision policy (fp32, tf32,
//! bf16), beside PyTorch training the same model in the same precision (`bench/torch_cnn.py`), eagerly and with
//! the whole step captured as one CUDA graph. The MLP of the cohort part is too small to load a GPU; convolutions
//! are where cuDNN, the precision policy and the allocator's workspace handling meet a workload people train.
//!
//! The model, defined once on each side (here as a cohort model spec, there as an `nn.Sequential`): input
//! `[128, 3, 64, 64]`; conv 3x3 3→64 pad 1 + ReLU; maxpool 2; conv 3x3 64→128 pad 1 + ReLU; maxpool 2; conv 3x3
//! 128→128 pad 1 + ReLU; global average pool; linear 128→10; cross-entropy; Adam 1e-3. One fixed batch lives on
//! the device, so the figures are the step's compute, not its input. Both sides time alike: warm-up steps untimed
//! (cuDNN's algorithm choices are made in them), then windows of [`cohort::rate`]'s form, the median window's rate
//! the figure ([`workload`]). The peak is the allocator's over the timed steps: for cohort the tenant that holds the model, its
//! Adam state and the batch; for PyTorch `torch.cuda.max_memory_allocated()`, which holds the same.
//!
//! GPU-only: a step is some 90 GFLOP, a second or more on a CPU, and the policies differ only on CUDA.

use std::path::Path;

use anyhow::Result;
use cohort_alloc::TenantId;
use cohort_autograd::ModelSpec;
use cohort_tensor::{Device, Precision, Tensor, memory};
use serde_json::{Value, json};

use crate::cohort::{self, Captured, Trainee};
use crate::workload::{self, Measured, Table, Timing, mib};

/// The benchmark's model (PyTorch's is the `nn.Sequential` of `bench/torch_cnn.py`).
pub(crate) const CNN: &str = r#"layers = [
    { conv = 64, kernel = 3, padding = 1, act = "relu" }, { maxpool = 2 },
    { conv = 128, kernel = 3, padding = 1, act = "relu" }, { maxpool = 2 },
    { conv = 128, kernel = 3, padding = 1, act = "relu" },
    { global_avgpool = true }, { linear = 10 },
]"#;

/// The policies compared; f16 is left out: it needs loss scaling, which changes the step on both sides.
pub(crate) const PRECISIONS: [Precision; 3] = [Precision::Fp32, Precision::Tf32, Precision::Bf16];

/// Shapes and timing, passed as they are to the PyTorch script so both sides run the same.
struct Workload {
    batch: usize,
    /// Images are `side` x `side`.
    side: usize,
    timing: Timing,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        Workload {
            batch: 128,
            side: 64,
            timing: Timing::new(quick),
        }
    }

    fn script_args(&self) -> Vec<String> {
        let mut args = workload::flags(&[
            ("--batch", self.batch.to_string()),
            ("--side", self.side.to_string()),
        ]);
        args.extend(self.timing.script_args());
        args
    }
}

/// The part's report: our rows, and the reference's JSON (or why there is none). `script` is the PyTorch script
/// and the interpreter to run it with (`--reference`). Nothing on the CPU, and a message instead of an error where
/// the GPU is missing: the other parts' figures still come out.
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if let Some(skipped) = workload::gpu_only("cnn", device) {
        return Ok(skipped);
    }
    let w = Workload::new(quick);
    println!(
        "\ncnn benchmark on {device}: 3 convs (64, 128, 128) + pools + linear, Adam, batch {} of 3x{}x{}",
        w.batch, w.side, w.side
    );
    let ours: Vec<Value> = PRECISIONS
        .into_iter()
        .flat_map(|p| {
            let eager = measure(device, p, &w);
            let graph = measure_graph(device, p, &w);
            [("eager", eager), ("graph", graph)].map(|(form, row)| {
                row.unwrap_or_else(|e| {
                    println!("cohort {p} {form}: failed: {e:#}");
                    json!({ "precision": p.name(), "form": form, "error": format!("{e:#}") })
                })
            })
        })
        .collect();
    let theirs = workload::reference_or_error(script, &w.script_args());
    print!("\n{}", table(&ours, &theirs));
    let t = &w.timing;
    Ok(json!({
        "batch": w.batch, "side": w.side, "warmup": t.warmup, "windows": t.windows,
        "window_s": t.window.as_secs_f64(), "cohort": ours, "pytorch": theirs,
    }))
}

/// The one fixed batch, `[batch, 3, side, side]` uniform images and their labels, charged to `tenant`.
fn batch(device: Device, tenant: TenantId, w: &Workload) -> Result<(Tensor, Tensor)> {
    memory::with_tenant(tenant, || cohort::images(w.batch, w.side, device))
}

/// The model, fresh, its memory charged to `tenant`.
fn trainee(device: Device, tenant: TenantId, w: &Workload) -> Result<Trainee> {
    let spec = ModelSpec::from_toml(CNN)?;
    Trainee::from_spec(&spec, &[3, w.side, w.side], 1, 0, device, tenant)
}

/// One policy's eager row: a fresh model on the one fixed batch, its steps/s (the median window's), images/s, each
/// window's rate, and its tenant's peak over the timed steps (none on the CPU, which has no allocator).
fn measure(device: Device, precision: Precision, w: &Workload) -> Result<Value> {
    let tenant = cohort::tenant(device, &format!("cnn-{precision}"))?;
    let (x, y) = batch(device, tenant, w)?;
    let mut t = trainee(device, tenant, w)?;
    let _policy = precision.enter();
    let m = w.timing.measure(device, &[tenant], || t.step(&x, &y))?;
    Ok(row(precision, "eager", w, &m))
}

/// One policy's graph row: the same step captured as one CUDA graph ([`Captured`], checked against eager steps)
/// and replayed, as PyTorch's graph form; no peak (a graph's memory is its capture's pool, outside the tenants).
fn measure_graph(device: Device, precision: Precision, w: &Workload) -> Result<Value> {
    let (x, y) = batch(device, TenantId::DEFAULT, w)?;
    let _policy = precision.enter();
    let build = || trainee(device, TenantId::DEFAULT, w);
    let check = vec![(x.clone(), y.clone()); 4];
    let captured = Captured::new(vec![build()?], [build()?, build()?], &x, &y, &check)?;
    let m = w.timing.measure(device, &[], || captured.replay())?;
    Ok(row(precision, "graph", w, &m))
}

/// A row of ours, printed as it is made.
fn row(precision: Precision, form: &str, w: &Workload, m: &Measured) -> Value {
    let steps_per_s = m.rate;
    println!(
        "cohort {precision} {form}: {steps_per_s:8.1} steps/s {:9.0} images/s{}",
        steps_per_s * w.batch as f64,
        m.peak
            .map(|p| format!("  peak {:.1} MiB", mib(p as f64)))
            .unwrap_or_default()
    );
    json!({
        "precision": precision.name(), "form": form, "steps_per_s": steps_per_s,
        "images_per_s": steps_per_s * w.batch as f64, "windows": m.windows, "peak_bytes": m.peak,
    })
}

/// The comparison, one line per policy and form of ours (see [`Table::render`]); the peak beside PyTorch's eager
/// one.
fn table(ours: &[Value], theirs: &Value) -> String {
    Table {
        join: &["precision"],
        shown: &["form"],
        rate: "steps_per_s",
        rate_header: "cohort steps/s",
        forms: &[("eager", "PyTorch eager"), ("graph", "PyTorch CUDA graph")],
        peak: "peak_bytes",
        peak_form: |_| "eager",
    }
    .render(ours, theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_joins_the_reference_by_precision_and_form() {
        let ours = [
            json!({ "precision": "fp32", "form": "eager", "steps_per_s": 200.0, "peak_bytes": 100u64 << 20 }),
            json!({ "precision": "bf16", "form": "eager", "error": "no bf16 kernel" }),
        ];
        let stdout = "torch 2.5\n{\"torch\": \"2.5\", \"rows\": [\
            {\"precision\": \"fp32\", \"form\": \"eager\", \"steps_per_s\": 100.0, \"peak_bytes\": 209715200},\
            {\"precision\": \"fp32\", \"form\": \"graph\", \"steps_per_s\": 400.0, \"peak_bytes\": 104857600},\
            {\"precision\": \"bf16\", \"form\": \"graph\", \"error\": \"capture failed\"}]}\n";
        let theirs = workload::parse_reference(stdout).unwrap();
        let t = table(&ours, &theirs);
        let fp32 = t.lines().find(|l| l.starts_with("fp32")).unwrap();
        let cells: Vec<&str> = fp32.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "fp32", "eager", "200.0", "100.0", "2.00x", "400.0", "0.50x", "100.0", "200.0",
                "0.50x"
            ]
        );
        let bf16 = t.lines().find(|l| l.starts_with("bf16")).unwrap();
        assert_eq!(bf16.split_whitespace().filter(|c| *c == "-").count(), 8);
        assert!(
            t.contains("cohort bf16 eager: failed: no bf16 kernel"),
            "{t}"
        );
        assert!(
            t.contains("PyTorch bf16 graph: failed: capture failed"),
            "{t}"
        );
        let missing = table(&ours, &json!({ "error": "no torch" }));
        assert!(
            missing.contains("PyTorch: did not run: no torch"),
            "{missing}"
        );
    }

    #[test]
    fn script_gets_the_same_workload() {
        let args = Workload::new(true).script_args().join(" ");
        assert_eq!(
            args,
            "--batch 128 --side 64 --warmup 5 --windows 3 --window-s 0.25"
        );
    }

    /// The cohort side end to end on the CPU, shrunk: the spec builds for the shape and every policy steps.
    #[test]
    fn cohort_side_steps_on_the_cpu() {
        let w = Workload {
            batch: 2,
            side: 8,
            timing: Timing {
                warmup: 1,
                windows: 2,
                window: std::time::Duration::ZERO,
            },
        };
        for p in PRECISIONS {
            let row = measure(Device::Cpu, p, &w).unwrap();
            assert_eq!(row["precision"], p.name());
            assert!(row["steps_per_s"].as_f64().unwrap() > 0.0);
            assert_eq!(row["windows"].as_array().unwrap().len(), 2);
            assert!(row["peak_bytes"].is_null());
        }
    }
}
