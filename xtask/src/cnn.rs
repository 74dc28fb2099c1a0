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
//! the figure. The peak is the allocator's over the timed steps: for cohort the tenant that holds the model, its
//! Adam state and the batch; for PyTorch `torch.cuda.max_memory_allocated()`, which holds the same.
//!
//! GPU-only: a step is some 90 GFLOP, a second or more on a CPU, and the policies differ only on CUDA.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cohort_autograd::ModelSpec;
use cohort_tensor::{DType, Device, Precision, Tensor, memory};
use serde_json::{Value, json};

use crate::bench::median;
use crate::cohort::{self, Trainee};

/// The benchmark's model (PyTorch's is the `nn.Sequential` of `bench/torch_cnn.py`).
const CNN: &str = r#"layers = [
    { conv = 64, kernel = 3, padding = 1, act = "relu" }, { maxpool = 2 },
    { conv = 128, kernel = 3, padding = 1, act = "relu" }, { maxpool = 2 },
    { conv = 128, kernel = 3, padding = 1, act = "relu" },
    { global_avgpool = true }, { linear = 10 },
]"#;

/// The policies compared; f16 is left out: it needs loss scaling, which changes the step on both sides.
const PRECISIONS: [Precision; 3] = [Precision::Fp32, Precision::Tf32, Precision::Bf16];

/// Shapes and timing, passed as they are to the PyTorch script so both sides run the same.
struct Workload {
    batch: usize,
    /// Images are `side` x `side`.
    side: usize,
    warmup: usize,
    windows: usize,
    window: Duration,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        Workload {
            batch: 128,
            side: 64,
            warmup: if quick { 5 } else { 10 },
            windows: if quick { 3 } else { 5 },
            window: Duration::from_millis(if quick { 250 } else { 1000 }),
        }
    }

    fn script_args(&self) -> Vec<String> {
        let pairs = [
            ("--batch", self.batch.to_string()),
            ("--side", self.side.to_string()),
            ("--warmup", self.warmup.to_string()),
            ("--windows", self.windows.to_string()),
            ("--window-s", self.window.as_secs_f64().to_string()),
        ];
        pairs
            .into_iter()
            .flat_map(|(k, v)| [k.to_string(), v])
            .collect()
    }
}

/// The part's report: our rows, and the reference's JSON (or why there is none). `script` is the PyTorch script
/// and the interpreter to run it with (`--reference`). Nothing on the CPU, and a message instead of an error where
/// the GPU is missing: the other parts' figures still come out.
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if !device.is_cuda() {
        println!("\ncnn: GPU-only, skipped on the CPU (run with --gpu)");
        return Ok(json!({ "skipped": "GPU-only part; the run is on the CPU" }));
    }
    if let Err(e) = device.verify() {
        println!("\ncnn: skipped: {e}");
        return Ok(json!({ "skipped": e.to_string() }));
    }
    let w = Workload::new(quick);
    println!(
        "\ncnn benchmark on {device}: 3 convs (64, 128, 128) + pools + linear, Adam, batch {} of 3x{}x{}",
        w.batch, w.side, w.side
    );
    let ours: Vec<Value> = PRECISIONS
        .into_iter()
        .map(|p| {
            measure(device, p, &w).unwrap_or_else(|e| {
                println!("cohort {p}: failed: {e:#}");
                json!({ "precision": p.name(), "error": format!("{e:#}") })
            })
        })
        .collect();
    let theirs = match script {
        Some((python, path)) => reference(python, path, &w).unwrap_or_else(|e| {
            println!("warning: the PyTorch side did not run: {e:#}");
            json!({ "error": format!("{e:#}") })
        }),
        None => Value::Null,
    };
    print!("\n{}", table(&ours, &theirs));
    Ok(json!({
        "batch": w.batch, "side": w.side, "warmup": w.warmup, "windows": w.windows,
        "window_s": w.window.as_secs_f64(), "cohort": ours, "pytorch": theirs,
    }))
}

/// One policy's row: a fresh model on the one fixed batch, its steps/s (the median window's), images/s, each
/// window's rate, and its tenant's peak over the timed steps (none on the CPU, which has no allocator).
fn measure(device: Device, precision: Precision, w: &Workload) -> Result<Value> {
    let spec = ModelSpec::from_toml(CNN)?;
    let tenant = cohort::tenant(device, &format!("cnn-{precision}"))?;
    let (x, y) = memory::with_tenant(tenant, || -> Result<_> {
        let x = Tensor::rand_uniform(
            &[w.batch, 3, w.side, w.side],
            0.0,
            1.0,
            DType::F32,
            0,
            &device,
        )?;
        let labels = (0..w.batch).map(|i| ((i * 7919) % 10) as i32).collect();
        Ok((x, Tensor::from_vec(labels, &[w.batch], &device)?))
    })?;
    let mut t = Trainee::from_spec(&spec, &[3, w.side, w.side], 1, 0, device, tenant)?;
    let _policy = precision.enter();
    for _ in 0..w.warmup {
        t.step(&x, &y)?;
    }
    device.synchronize()?;
    let alloc = memory::allocator(&device).ok();
    if let Some(a) = &alloc {
        a.reset_tenant_peak(tenant);
    }
    let windows = (0..w.windows)
        .map(|_| cohort::rate(device, 0, w.window, |_| t.step(&x, &y)))
        .collect::<Result<Vec<f64>>>()?;
    let steps_per_s = median(windows.clone()).context("no finite window rate")?;
    let peak = alloc
        .and_then(|a| a.tenant_stats(tenant))
        .map(|s| s.peak_in_use);
    println!(
        "cohort {precision}: {steps_per_s:8.1} steps/s {:9.0} images/s{}",
        steps_per_s * w.batch as f64,
        peak.map(|p| format!("  peak {:.1} MiB", mib(p as f64)))
            .unwrap_or_default()
    );
    Ok(json!({
        "precision": precision.name(), "steps_per_s": steps_per_s,
        "images_per_s": steps_per_s * w.batch as f64, "windows": windows, "peak_bytes": peak,
    }))
}

/// Runs the PyTorch script with the same workload; its progress goes to the terminal as it comes, its stdout is
/// one JSON object.
fn reference(python: &str, script: &Path, w: &Workload) -> Result<Value> {
    let out = Command::new(python)
        .arg(script)
        .args(w.script_args())
        .env("PYTHONUNBUFFERED", "1")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {python} {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} exited with {} (its messages are above; it needs torch with CUDA)",
            script.display(),
            out.status
        );
    }
    parse_reference(&String::from_utf8_lossy(&out.stdout))
}

/// The script's JSON object: its last stdout line that parses as one with a `rows` list.
fn parse_reference(stdout: &str) -> Result<Value> {
    stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v["rows"].is_array())
        .context("the PyTorch script printed no JSON object with `rows`")
}

fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

/// The comparison, one line per policy: speed ratios are cohort's steps/s over PyTorch's (above 1: cohort is
/// faster), the memory ratio cohort's peak over PyTorch's eager one (below 1: cohort holds less). Failed rows say
/// why under the table.
fn table(ours: &[Value], theirs: &Value) -> String {
    let row_of = |p: &Value, form: &str| {
        theirs["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["precision"] == *p && r["form"] == form)
    };
    let cell = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    let mut s = format!(
        "{:<9} {:>14} {:>13} {:>7} {:>18} {:>7} {:>15} {:>16} {:>7}\n",
        "precision",
        "cohort steps/s",
        "PyTorch eager",
        "ratio",
        "PyTorch CUDA graph",
        "ratio",
        "cohort peak MiB",
        "PyTorch peak MiB",
        "ratio"
    );
    for r in ours {
        let p = &r["precision"];
        let us = r["steps_per_s"].as_f64();
        let (eager, graph) = (row_of(p, "eager"), row_of(p, "graph"));
        let rate = |row: Option<&Value>| row.and_then(|x| x["steps_per_s"].as_f64());
        let our_peak = r["peak_bytes"].as_f64().map(mib);
        let their_peak = eager.and_then(|x| x["peak_bytes"].as_f64()).map(mib);
        s += &format!(
            "{:<9} {:>14} {:>13} {:>7} {:>18} {:>7} {:>15} {:>16} {:>7}\n",
            p.as_str().unwrap_or(""),
            cell(us, 1),
            cell(rate(eager), 1),
            ratio(us, rate(eager)),
            cell(rate(graph), 1),
            ratio(us, rate(graph)),
            cell(our_peak, 1),
            cell(their_peak, 1),
            ratio(our_peak, their_peak),
        );
    }
    let theirs_failed = theirs["rows"].as_array().into_iter().flatten();
    for (side, r) in ours
        .iter()
        .map(|r| ("cohort", r))
        .chain(theirs_failed.map(|r| ("PyTorch", r)))
    {
        if let Some(e) = r["error"].as_str() {
            let form = r["form"]
                .as_str()
                .map(|f| format!(" {f}"))
                .unwrap_or_default();
            s += &format!(
                "{side} {}{form}: failed: {e}\n",
                r["precision"].as_str().unwrap_or("")
            );
        }
    }
    if let Some(e) = theirs["error"].as_str() {
        s += &format!("PyTorch: did not run: {e}\n");
    }
    s += "ratios are cohort's over PyTorch's: speed above 1x, cohort is faster; memory below 1x, cohort holds less\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_joins_the_reference_by_precision_and_form() {
        let ours = [
            json!({ "precision": "fp32", "steps_per_s": 200.0, "peak_bytes": 100u64 << 20 }),
            json!({ "precision": "bf16", "error": "no bf16 kernel" }),
        ];
        let stdout = "torch 2.5\n{\"torch\": \"2.5\", \"rows\": [\
            {\"precision\": \"fp32\", \"form\": \"eager\", \"steps_per_s\": 100.0, \"peak_bytes\": 209715200},\
            {\"precision\": \"fp32\", \"form\": \"graph\", \"steps_per_s\": 400.0, \"peak_bytes\": 104857600},\
            {\"precision\": \"bf16\", \"form\": \"graph\", \"error\": \"capture failed\"}]}\n";
        let theirs = parse_reference(stdout).unwrap();
        let t = table(&ours, &theirs);
        let fp32 = t.lines().find(|l| l.starts_with("fp32")).unwrap();
        let cells: Vec<&str> = fp32.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "fp32", "200.0", "100.0", "2.00x", "400.0", "0.50x", "100.0", "200.0", "0.50x"
            ]
        );
        let bf16 = t.lines().find(|l| l.starts_with("bf16")).unwrap();
        assert_eq!(bf16.split_whitespace().filter(|c| *c == "-").count(), 8);
        assert!(t.contains("cohort bf16: failed: no bf16 kernel"), "{t}");
        assert!(
            t.contains("PyTorch bf16 graph: failed: capture failed"),
            "{t}"
        );
        let missing = table(&ours, &json!({ "error": "no torch" }));
        assert!(
            missing.contains("PyTorch: did not run: no torch"),
            "{missing}"
        );
        assert!(parse_reference("Traceback\nModuleNotFoundError: torch\n").is_err());
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
            warmup: 1,
            windows: 2,
            window: Duration::ZERO,
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
