//! The `resnet` part of `cargo xtask bench`: a small ResNet on CIFAR-shaped data, N = 1, 4 and 16 members trained
//! together in one process on one GPU, in cohort's loop (N separate models, one after another) and fused (one model
//! of N members), eagerly and replayed as CUDA graphs, beside PyTorch training the same N models in its loop
//! (eagerly and as one CUDA graph of the whole loop) and as one `torch.func` model (`functional_call` + `vmap` of
//! `grad` over stacked parameters, a fused Adam over the stacks; eagerly and as a CUDA graph), in fp32, tf32 and
//! bf16 (`bench/torch_resnet.py`).
//!
//! The model, defined once on each side (here as a cohort model spec, there as `nn.Module`s): input `[128, 3, 32,
//! 32]`; a stem conv 3x3 3→32 pad 1 without bias, batch norm, ReLU; three residual blocks, each conv 3x3 (no bias),
//! batch norm, ReLU, conv 3x3 (no bias), batch norm, plus the shortcut, ReLU: 32→32 at 32x32, 32→64 stride 2 (to
//! 16x16) and 64→128 stride 2 (to 8x8), the last two with a 1x1 strided convolution (with bias) as the shortcut;
//! global average pool; linear 128→10; cross-entropy; Adam 1e-3. Batch norm trains on the batch's statistics and
//! keeps running ones (PyTorch's vmap form alone keeps none: `torch.func` cannot update them in place, and its
//! documentation's recipe is to drop them). About 0.31 M parameters; a step of one model is some 38 GFLOP. All
//! members read one fixed batch resident on the device.
//!
//! Rates are model-steps per second (a loop step of N models is N of them); timing as the [`workload`] module
//! says. The peak per member is the tenants' (the models, their Adam state and the batch) over N; PyTorch's
//! `max_memory_allocated()` over N. GPU-only.

use std::path::Path;

use anyhow::Result;
use cohort_autograd::ModelSpec;
use cohort_tensor::{Device, Precision, memory};
use serde_json::{Value, json};

use crate::cnn::PRECISIONS;
use crate::cohort::{self, Trainee};
use crate::workload::{self, Job, Table, Timing};

/// The benchmark's model (PyTorch's is `resnet()` in `bench/torch_resnet.py`).
pub(crate) const RESNET: &str = r#"layers = [
    { conv = 32, kernel = 3, padding = 1, bias = false }, { batchnorm = true, act = "relu" },
    { residual = [
        { conv = 32, kernel = 3, padding = 1, bias = false }, { batchnorm = true, act = "relu" },
        { conv = 32, kernel = 3, padding = 1, bias = false }, { batchnorm = true },
    ], act = "relu" },
    { residual = [
        { conv = 64, kernel = 3, stride = 2, padding = 1, bias = false }, { batchnorm = true, act = "relu" },
        { conv = 64, kernel = 3, padding = 1, bias = false }, { batchnorm = true },
    ], act = "relu" },
    { residual = [
        { conv = 128, kernel = 3, stride = 2, padding = 1, bias = false }, { batchnorm = true, act = "relu" },
        { conv = 128, kernel = 3, padding = 1, bias = false }, { batchnorm = true },
    ], act = "relu" },
    { global_avgpool = true }, { linear = 10 },
]"#;

/// cohort's schedules: N separate models or one of N members, each eager or replayed as CUDA graphs.
const SCHEDULES: [&str; 4] = ["loop", "fused", "loop-graph", "fused-graph"];

/// Shapes and timing, passed as they are to the PyTorch script so both sides run the same.
struct Workload {
    batch: usize,
    /// Images are `side` x `side`.
    side: usize,
    ns: Vec<usize>,
    timing: Timing,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        Workload {
            batch: 128,
            side: 32,
            ns: vec![1, 4, 16],
            timing: Timing::new(quick),
        }
    }

    fn script_args(&self) -> Vec<String> {
        let ns: Vec<String> = self.ns.iter().map(usize::to_string).collect();
        let mut args = workload::flags(&[
            ("--batch", self.batch.to_string()),
            ("--side", self.side.to_string()),
            ("--ns", ns.join(",")),
        ]);
        args.extend(self.timing.script_args());
        args
    }
}

/// The part's report: our rows, and the reference's JSON (or why there is none); `script` as [`crate::cnn::run`]'s.
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if let Some(skipped) = workload::gpu_only("resnet", device) {
        return Ok(skipped);
    }
    let w = Workload::new(quick);
    println!(
        "\nresnet benchmark on {device}: stem + 3 residual blocks (32, 64, 128) with batch norm + linear, Adam, \
         batch {} of 3x{}x{}, N = {:?}",
        w.batch, w.side, w.side, w.ns
    );
    let mut ours = Vec::new();
    for p in PRECISIONS {
        for &n in &w.ns {
            for schedule in SCHEDULES {
                ours.push(measure(device, p, n, schedule, &w).unwrap_or_else(|e| {
                    println!("cohort {p} n={n} {schedule}: failed: {e:#}");
                    json!({ "precision": p.name(), "n": n, "schedule": schedule, "error": format!("{e:#}") })
                }));
            }
        }
    }
    let theirs = workload::reference_or_error(script, &w.script_args());
    print!("\n{}", table(&ours, &theirs));
    let t = &w.timing;
    Ok(json!({
        "batch": w.batch, "side": w.side, "ns": w.ns, "warmup": t.warmup, "windows": t.windows,
        "window_s": t.window.as_secs_f64(), "cohort": ours, "pytorch": theirs,
    }))
}

/// One row: `n` members under `schedule` in `precision` on one fixed batch, in model-steps/s, with the peak per
/// member where the step is eager (a graph's memory is the capture's, outside the tenants).
fn measure(
    device: Device,
    precision: Precision,
    n: usize,
    schedule: &str,
    w: &Workload,
) -> Result<Value> {
    let spec = ModelSpec::from_toml(RESNET)?;
    let tag = format!("resnet-{precision}-{n}-{schedule}");
    let data = cohort::tenant(device, &format!("{tag}-data"))?;
    let (x, y) = memory::with_tenant(data, || cohort::images(w.batch, w.side, device))?;
    let fused = schedule.starts_with("fused");
    let (models, members) = if fused { (1, n) } else { (n, 1) };
    let (spec, input) = (&spec, [3, w.side, w.side]);
    let jobs: Vec<Job> = (0..models as u64)
        .map(|seed| Job {
            build: Box::new(move |tenant| {
                Trainee::from_spec(spec, &input, members, seed, device, tenant)
            }),
            x: &x,
            y: &y,
            members,
        })
        .collect();
    let form = if schedule.ends_with("graph") {
        "graph"
    } else {
        "eager"
    };
    let _policy = precision.enter();
    let label = format!("{precision} n={n:2} {schedule:<11}");
    let figures = workload::train_together(device, &w.timing, form, &tag, data, &jobs, &label)?;
    Ok(workload::row(
        json!({ "precision": precision.name(), "n": n, "schedule": schedule }),
        figures,
    ))
}

/// One line per precision, N and schedule, beside each of PyTorch's forms; the peak beside PyTorch's eager peak of
/// the same family (a loop's beside its loop's, fused beside vmap).
fn table(ours: &[Value], theirs: &Value) -> String {
    Table {
        join: &["precision", "n"],
        shown: &["schedule"],
        rate: "model_steps_per_s",
        rate_header: "cohort model-steps/s",
        forms: &[
            ("loop", "PyTorch loop"),
            ("loop-graph", "loop graph"),
            ("vmap", "vmap"),
            ("vmap-graph", "vmap graph"),
        ],
        peak: "peak_bytes_per_member",
        peak_form: |r| match r["schedule"].as_str() {
            Some(s) if s.starts_with("fused") => "vmap",
            _ => "loop",
        },
    }
    .render(ours, theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_gets_the_same_workload() {
        let args = Workload::new(true).script_args().join(" ");
        assert_eq!(
            args,
            "--batch 128 --side 32 --ns 1,4,16 --warmup 5 --windows 3 --window-s 0.25"
        );
    }

    #[test]
    fn spec_is_the_documented_resnet() {
        let spec = ModelSpec::from_toml(RESNET).unwrap();
        let shapes = spec.shapes(&[3, 32, 32]).unwrap();
        assert_eq!(shapes.last().unwrap().dims(), [10]);
        // stem 864 + 2 BN (64); block 1: 2 x 9216 + 2 BN (128); block 2: 18432 + 36864 + BN 256 + 1x1 2112;
        // block 3: 73728 + 147456 + BN 512 + 1x1 8320; linear 1290
        let expected = 864
            + 64
            + (2 * 9216 + 128)
            + (18432 + 36864 + 256 + 2112)
            + (73728 + 147456 + 512 + 8320)
            + 1290;
        assert_eq!(spec.param_count(&[3, 32, 32]).unwrap(), expected);
    }

    /// The cohort side on the CPU, shrunk: every schedule that runs there steps (the graph ones need CUDA).
    #[test]
    fn cohort_side_steps_on_the_cpu() {
        let w = Workload {
            batch: 2,
            side: 8,
            ns: vec![2],
            timing: Timing {
                warmup: 1,
                windows: 2,
                window: std::time::Duration::ZERO,
            },
        };
        for schedule in ["loop", "fused"] {
            let row = measure(Device::Cpu, Precision::Fp32, 2, schedule, &w).unwrap();
            assert_eq!(row["schedule"], schedule);
            assert!(row["model_steps_per_s"].as_f64().unwrap() > 0.0);
            assert_eq!(row["windows"].as_array().unwrap().len(), 2);
            assert!(row["peak_bytes_per_member"].is_null());
        }
        assert!(measure(Device::Cpu, Precision::Fp32, 2, "fused-graph", &w).is_err());
    }
}
