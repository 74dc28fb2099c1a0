//! `cargo xtask bench`: our figures beside the reference frameworks', from one call.
//!
//! Three parts: the allocator's trace replays (against PyTorch's published overheads on the same traces), the
//! criterion benchmarks of every crate (medians and throughputs read back from criterion's JSON), and, with
//! `--reference`, the PyTorch (GPU) or JAX (CPU) cohort script run in the same call, and on the CPU the data
//! sources' benchmarks beside PyTorch's DataLoader and pandas (`input_reference`). On a GPU also realistic
//! workloads in each precision policy beside PyTorch's in the same one: an image CNN (`cnn`), the CNN co-trained
//! with a text classifier (`cotrain`), a small ResNet of N members, loop and fused, beside PyTorch's loop and
//! `torch.func` vmap (`resnet`), and a grid of Transformer language models (`transformer`). Results go to
//! `target/bench/bench.json` and one table on stdout.

use crate::bundle::workspace_root;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cohort_tensor::Device;

#[derive(clap::Args)]
pub struct Args {
    /// A reduced set that finishes within a few minutes on a 2-core CPU.
    #[arg(long)]
    quick: bool,
    /// Also run the reference framework's cohort script (PyTorch on a GPU, JAX on the CPU).
    #[arg(long)]
    reference: bool,
    /// Use the binaries of a `cargo xtask gpu-bundle` folder instead of cargo (for machines without a toolchain).
    #[arg(long)]
    bundle: Option<PathBuf>,
    /// Run on the GPU (criterion benches built with CUDA, PyTorch as reference) rather than the CPU.
    #[arg(long)]
    gpu: bool,
    /// Python interpreter for the reference scripts.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Rounds of the cohort benchmark (and of the reference script, one after each of ours): every figure is the
    /// median over them, so that a slow spell of a shared machine does not land on one side only.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Parts to leave out: any of `replay`, `criterion`, `cohort`, `cnn` (an image CNN per precision beside
    /// PyTorch's), `resnet` (a small ResNet, N = 1, 4, 16 members, loop and fused, beside PyTorch's loop and
    /// `torch.func` vmap), `transformer` (a grid of Transformer language models, heads x width, beside PyTorch's
    /// loop), `cotrain` (the CNN co-trained with an embedding-bag text classifier, beside PyTorch's alternating
    /// loop), `attention` (the fused attention kernel beside PyTorch's `scaled_dot_product_attention`), `input`,
    /// `peak`. `cnn`, `cotrain`, `resnet`, `transformer` and `attention` are GPU-only: they run only with `--gpu`.
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Only criterion benchmarks whose name contains this.
    #[arg(long)]
    filter: Option<String>,
}

/// PyTorch's best peak-reserved overhead on each shared trace (../shared/traces/README.md), the bar to beat.
const PYTORCH_BEST_OVERHEAD: [(&str, f64); 3] = [
    ("transformer-lm", 0.081),
    ("transformer-varlen", 0.075),
    ("mlp-grid8", 0.034),
];

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    let out = if args.bundle.is_some() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    fs::create_dir_all(&out)?;
    let mut report = json!({ "quick": args.quick, "gpu": args.gpu });

    let run_part = |part: &str| !args.skip.iter().any(|s| s == part);
    if run_part("replay") {
        report["replay"] = replay(args, &root)?;
    }
    if run_part("criterion") {
        report["criterion"] = criterion(args, &root, &out)?;
        // The data sources beside PyTorch's DataLoader and pandas, on the files their benchmarks just read.
        if args.reference && args.bundle.is_none() && !args.gpu {
            let rows = report["criterion"].as_array().cloned().unwrap_or_default();
            report["input_reference"] =
                crate::input_reference::compare(&args.python, &root, &rows)?;
        }
    }
    if run_part("peak") && !args.gpu {
        report["peak"] = crate::peak::report()?;
    }
    if run_part("cohort") {
        cohort(args, &root, &out, &mut report)?;
    }
    // The workloads beside PyTorch in the same precision, each with its script from `bench/` (GPU-only).
    type Part = fn(Device, bool, Option<(&str, &Path)>) -> Result<Value>;
    let workloads: [(&str, &str, Part); 5] = [
        ("cnn", "torch_cnn.py", crate::cnn::run),
        ("resnet", "torch_resnet.py", crate::resnet::run),
        (
            "transformer",
            "torch_transformer.py",
            crate::transformer::run,
        ),
        ("cotrain", "torch_cotrain.py", crate::cotrain::run),
        ("attention", "torch_attention.py", crate::attention::run),
    ];
    for (part, script, run) in workloads {
        if !run_part(part) {
            continue;
        }
        let script = args.reference.then(|| match &args.bundle {
            Some(b) => b.join("reference").join(script),
            None => root.join("bench").join(script),
        });
        let script = script.as_deref().map(|s| (args.python.as_str(), s));
        report[part] = run(device(args), args.quick, script)?;
        // each part's figures on disk as soon as they exist: a run cut short by a time limit keeps them
        fs::write(
            out.join("bench.json"),
            serde_json::to_string_pretty(&report)?,
        )?;
    }
    if run_part("input") {
        report["input_bound"] = crate::input_bound::run(device(args), args.quick)?;
    }
    let path = out.join("bench.json");
    fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("\nresults: {}", path.display());
    Ok(())
}

fn device(args: &Args) -> Device {
    if args.gpu {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}

/// The cohort benchmark on the chosen device, beside the reference script's figures from this same call: rounds of
/// ours and theirs in turn, each figure the median of its rounds.
fn cohort(args: &Args, root: &Path, out: &Path, report: &mut Value) -> Result<()> {
    let device = device(args);
    let (ns, budget): (&[usize], _) = if args.quick {
        (&[1, 4, 16], Duration::from_millis(500))
    } else {
        (&[1, 2, 4, 8, 16, 32, 64, 128], Duration::from_secs(2))
    };
    println!("\ncohort benchmark on {device}: MLP 784-128-10, Adam, batch 256");
    if !args.gpu {
        println!("{}", cpu_description());
    }
    let rounds = args.rounds.max(1);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        println!("round {round} of {rounds}");
        ours.push(crate::cohort::run(device, ns, budget)?);
        if args.reference {
            theirs.push(reference(args, root, out)?);
        }
    }
    let ours = median_rows(&ours);
    let theirs = median_reference(&theirs);
    comparison_table(&ours, &theirs, args.gpu);
    report["cohort"] = Value::Array(ours);
    report["reference"] = theirs;
    Ok(())
}

/// The CPU's model, threads and vector extensions, and the ones the kernels use: the figures depend on all four.
fn cpu_description() -> String {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let has: Vec<&str> = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    format!(
        "CPU: {} ({} threads; {}); kernels use {}",
        field("model name").unwrap_or_else(|| "unknown".into()),
        rayon::current_num_threads(),
        if has.is_empty() {
            "no AVX2".to_string()
        } else {
            has.join(" ")
        },
        cohort_kernels::simd::Isa::current(),
    )
}

/// One row per schedule and N, its rate the median of the rounds' (the other fields from the first round).
fn median_rows(rounds: &[Vec<Value>]) -> Vec<Value> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|row| {
            let rates: Vec<f64> = rounds
                .iter()
                .flat_map(|r| {
                    r.iter()
                        .filter(|o| o["schedule"] == row["schedule"] && o["n"] == row["n"])
                })
                .filter_map(|o| o["model_steps_per_s"].as_f64())
                .collect();
            let mut row = row.clone();
            if let Some(m) = median(rates.clone()) {
                row["model_steps_per_s"] = json!(m);
                row["rounds"] = json!(rates);
            }
            row
        })
        .collect()
}

/// The reference's rates and peaks, each key's the median of the rounds'.
fn median_reference(rounds: &[Value]) -> Value {
    let merge = |field: &str| {
        let mut keys: Vec<String> = rounds
            .iter()
            .filter_map(|r| r[field].as_object())
            .flat_map(|m| m.keys().cloned())
            .collect();
        keys.sort();
        keys.dedup();
        let map: serde_json::Map<String, Value> = keys
            .into_iter()
            .filter_map(|k| {
                let values = rounds
                    .iter()
                    .filter_map(|r| r[field][&k].as_f64())
                    .collect();
                median(values).map(|m| (k, json!(m)))
            })
            .collect();
        Value::Object(map)
    };
    json!({ "rates": merge("rates"), "peak_mib": merge("peak_mib") })
}

pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn traces_dir(args: &Args, root: &Path) -> PathBuf {
    match &args.bundle {
        Some(b) => b.join("traces"),
        None => root.join("../shared/traces"),
    }
}

/// Replays every trace with the replay binary's defaults; prints overhead against PyTorch's best.
fn replay(args: &Args, root: &Path) -> Result<Value> {
    let mut rows = Vec::new();
    println!(
        "{:<22} {:>10} {:>12} {:>14} {:>9} {:>10}",
        "trace", "events", "our overhead", "PyTorch best", "ratio", "ns/op"
    );
    for (name, theirs) in PYTORCH_BEST_OVERHEAD {
        let trace = traces_dir(args, root).join(format!("{name}.csv.gz"));
        let mut cmd = match &args.bundle {
            Some(b) => Command::new(b.join("bin/replay")),
            None => {
                let mut c = Command::new("cargo");
                c.args([
                    "run",
                    "--quiet",
                    "--release",
                    "-p",
                    "cohort-alloc",
                    "--bin",
                    "replay",
                    "--",
                ]);
                c.current_dir(root);
                c
            }
        };
        let output = cmd
            .arg(&trace)
            .output()
            .context("running the replay binary")?;
        if !output.status.success() {
            bail!(
                "replay of {} failed: {}",
                trace.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let line = String::from_utf8_lossy(&output.stdout);
        let ours: Value =
            serde_json::from_str(line.trim()).context("parsing the replay binary's JSON line")?;
        let overhead = ours["overhead"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<22} {:>10} {:>11.2}% {:>13.1}% {:>8.2}x {:>10.0}",
            name,
            ours["events"],
            overhead * 100.0,
            theirs * 100.0,
            theirs / overhead.max(1e-9),
            ours["ns_per_op"].as_f64().unwrap_or(f64::NAN)
        );
        rows.push(json!({ "trace": name, "ours": ours, "pytorch_best_overhead": theirs }));
    }
    Ok(Value::Array(rows))
}

/// Runs the criterion benchmarks (through cargo, or the bundle's bench binaries) and reads back their estimates.
fn criterion(args: &Args, root: &Path, out: &Path) -> Result<Value> {
    let home = out.join("criterion").canonicalize().or_else(|_| {
        fs::create_dir_all(out.join("criterion"))?;
        out.join("criterion").canonicalize()
    })?;
    let mut flags: Vec<String> = vec!["--bench".into()];
    if args.quick {
        flags.extend(
            [
                "--warm-up-time",
                "0.5",
                "--measurement-time",
                "1.5",
                "--sample-size",
                "10",
            ]
            .map(String::from),
        );
    }
    if let Some(f) = &args.filter {
        flags.push(f.clone());
    }
    match &args.bundle {
        Some(bundle) => {
            let manifest: Value =
                serde_json::from_str(&fs::read_to_string(bundle.join("MANIFEST.json"))?)?;
            for b in manifest["benches"].as_array().into_iter().flatten() {
                let dir = root_of_bundle(bundle)?.join(b["package_dir"].as_str().unwrap_or(""));
                let exe = bundle
                    .canonicalize()?
                    .join(b["file"].as_str().unwrap_or(""));
                let status = Command::new(&exe)
                    .args(&flags)
                    .current_dir(&dir)
                    .env("CRITERION_HOME", &home)
                    .status()?;
                if !status.success() {
                    eprintln!("warning: {} exited with {status}", exe.display());
                }
            }
        }
        None => {
            let mut cmd = Command::new("cargo");
            // Only the bench targets: libtest's harness of a lib or bin would refuse criterion's flags.
            cmd.args(["bench", "--workspace", "--bench", "*"])
                .current_dir(root)
                .env("CRITERION_HOME", &home);
            if !cfg!(feature = "avx512") {
                // the criterion benches measure the same kernels as this build's cohort benchmark
                cmd.arg("--no-default-features");
            }
            if args.gpu {
                cmd.args([
                    "--features",
                    "cohort-kernels/cuda,cohort-tensor/cuda,cohort-alloc/cuda",
                ]);
            }
            let status = cmd
                .arg("--")
                .args(&flags[1..])
                .status()
                .context("running cargo bench")?;
            if !status.success() {
                bail!("cargo bench failed");
            }
        }
    }
    let mut rows = Vec::new();
    collect_estimates(&home, &mut rows)?;
    rows.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    println!(
        "\n{:<58} {:>14} {:>18}",
        "benchmark", "median", "throughput"
    );
    for r in &rows {
        println!(
            "{:<58} {:>14} {:>18}",
            r["id"].as_str().unwrap_or(""),
            format_ns(r["median_ns"].as_f64().unwrap_or(f64::NAN)),
            r["throughput"].as_str().unwrap_or("")
        );
    }
    Ok(Value::Array(rows))
}

/// The repository root on a GPU machine: the bundle folder sits in it.
fn root_of_bundle(bundle: &Path) -> Result<PathBuf> {
    Ok(bundle
        .canonicalize()?
        .parent()
        .context("bundle folder has a parent")?
        .to_path_buf())
}

fn collect_estimates(dir: &Path, rows: &mut Vec<Value>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "new") {
                let est: Value =
                    serde_json::from_str(&fs::read_to_string(path.join("estimates.json"))?)?;
                let bench: Value =
                    serde_json::from_str(&fs::read_to_string(path.join("benchmark.json"))?)?;
                let median = est["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
                rows.push(json!({
                    "id": bench["full_id"],
                    "median_ns": median,
                    "elements": bench["throughput"]["Elements"],
                    "bytes": bench["throughput"]["Bytes"],
                    "throughput": throughput(&bench["throughput"], median),
                }));
            } else {
                collect_estimates(&path, rows)?;
            }
        }
    }
    Ok(())
}

fn throughput(t: &Value, median_ns: f64) -> String {
    let per_s = |n: f64| n / (median_ns * 1e-9);
    if let Some(n) = t["Elements"].as_f64() {
        format!("{:.3e} elem/s", per_s(n))
    } else if let Some(n) = t["Bytes"].as_f64() {
        format!("{:.2} GB/s", per_s(n) / 1e9)
    } else {
        String::new()
    }
}

fn format_ns(ns: f64) -> String {
    match ns {
        n if n < 1e3 => format!("{n:.1} ns"),
        n if n < 1e6 => format!("{:.2} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.2} s", n / 1e9),
    }
}

/// Bytes the PyTorch script keeps resident for its data (60,000 x 784 f32 inputs and i64 labels), which its peak
/// counts and ours (per member) does not.
const REFERENCE_DATA_BYTES: f64 = 60_000.0 * (784.0 * 4.0 + 8.0);

/// One line per schedule and N: our model-steps/s, the reference's, and the ratio; peak memory per member beside
/// the reference's (its peak less its resident data, over N) where both exist. A graph schedule compares with the
/// reference's eager schedule of the same family (`loop-graph` with `loop`).
fn comparison_table(ours: &[Value], theirs: &Value, gpu: bool) {
    let name = if gpu { "PyTorch" } else { "JAX" };
    println!(
        "\n{:<11} {:>4} {:>14} {:>14} {:>8} {:>16} {:>16}",
        "sched", "N", "cohort", name, "ratio", "peak/member", "theirs/member"
    );
    for r in ours {
        let family = r["schedule"].as_str().unwrap_or("").split('-').next();
        let key = format!("{}-{}", family.unwrap_or(""), r["n"]);
        let us = r["model_steps_per_s"].as_f64().unwrap_or(f64::NAN);
        let them = theirs["rates"][&key].as_f64();
        let mib = |b: f64| format!("{:.2} MiB", b / (1u64 << 20) as f64);
        let their_peak = theirs["peak_mib"][&key].as_f64().map(|p| {
            let n = r["n"].as_f64().unwrap_or(1.0);
            mib(((p * (1u64 << 20) as f64) - REFERENCE_DATA_BYTES).max(0.0) / n)
        });
        println!(
            "{:<11} {:>4} {:>14.0} {:>14} {:>8} {:>16} {:>16}",
            r["schedule"].as_str().unwrap_or(""),
            r["n"].as_u64().unwrap_or(0),
            us,
            them.map(|t| format!("{t:.0}"))
                .unwrap_or_else(|| "-".into()),
            them.map(|t| format!("{:.2}x", us / t))
                .unwrap_or_else(|| "-".into()),
            r["peak_bytes_per_member"]
                .as_f64()
                .map(mib)
                .unwrap_or_else(|| "-".into()),
            their_peak.unwrap_or_else(|| "-".into()),
        );
    }
    // A schedule that failed (a capture refused, replays that diverged) says why under the table.
    for r in ours {
        if let Some(e) = r["error"].as_str() {
            println!(
                "{} n={}: failed: {e}",
                r["schedule"].as_str().unwrap_or(""),
                r["n"]
            );
        }
    }
}

/// Runs the reference script of the device (PyTorch cohort on a GPU, JAX on the CPU) and returns its figures
/// keyed `loop-N` / `fused-N` in model-steps/s.
fn reference(args: &Args, root: &Path, out: &Path) -> Result<Value> {
    let dir = match &args.bundle {
        Some(b) => b.join("reference"),
        None => root.join("../shared/bench"),
    };
    let script = dir.join(if args.gpu {
        "torch_mlp_cohort.py"
    } else {
        "jax_cpu_mlp_cohort.py"
    });
    let json_out = out.join("reference.json");
    let mut cmd = Command::new(&args.python);
    cmd.arg(&script).arg(&json_out).env("PYTHONUNBUFFERED", "1");
    if !args.gpu {
        // A JAX built with CUDA would run the CPU reference on the GPU.
        cmd.env("JAX_PLATFORMS", "cpu");
    }
    if !args.gpu && cohort_kernels::simd::Isa::current() != cohort_kernels::simd::Isa::Avx512 {
        // The same vector width on both sides: XLA's code generator and oneDNN capped at AVX2, as ours are.
        cmd.env("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
            .env("ONEDNN_MAX_CPU_ISA", "AVX2");
    }
    let output = cmd
        .output()
        .with_context(|| format!("running {} {}", args.python, script.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    print!("\n{text}");
    if !output.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(parse_reference(&text))
}

/// Both scripts print lines like `mlp fused n= 16:  11736 model-steps/s  peak_alloc=190 MiB` or
/// `jax-cpu vmap n=  4:  512.0 model-steps/s`; gives `{rates: {fused-16: ..}, peak_mib: {fused-16: ..}}`.
fn parse_reference(text: &str) -> Value {
    let mut map = serde_json::Map::new();
    let mut peaks = serde_json::Map::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(pos) = words.iter().position(|w| w.starts_with("n=")) else {
            continue;
        };
        let mode = match words.get(pos.wrapping_sub(1)) {
            Some(&"vmap") | Some(&"fused") => "fused",
            Some(&"loop") => "loop",
            _ => continue,
        };
        let rest: Vec<&str> = words[pos..]
            .iter()
            .flat_map(|w| w.split(['=', ':']))
            .filter(|w| !w.is_empty())
            .collect();
        let n = rest.get(1).and_then(|n| n.parse::<u32>().ok());
        let rate = rest.get(2).and_then(|r| r.parse::<f64>().ok());
        if let (Some(n), Some(rate)) = (n, rate) {
            map.insert(format!("{mode}-{n}"), json!(rate));
            let peak = words
                .iter()
                .find_map(|w| w.strip_prefix("peak_alloc="))
                .and_then(|p| p.parse::<f64>().ok());
            if let Some(p) = peak {
                peaks.insert(format!("{mode}-{n}"), json!(p));
            }
        }
    }
    json!({ "rates": map, "peak_mib": peaks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_merge_to_their_medians() {
        let row = |rate: f64| json!({ "schedule": "fused", "n": 4, "model_steps_per_s": rate });
        let merged = median_rows(&[vec![row(300.0)], vec![row(100.0)], vec![row(200.0)]]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0]["model_steps_per_s"], json!(200.0));
        assert_eq!(merged[0]["rounds"], json!([300.0, 100.0, 200.0]));
        let theirs = median_reference(&[
            json!({ "rates": { "loop-1": 10.0, "fused-4": 40.0 }, "peak_mib": {} }),
            json!({ "rates": { "loop-1": 30.0 }, "peak_mib": {} }),
        ]);
        assert_eq!(theirs["rates"]["loop-1"], json!(20.0));
        assert_eq!(theirs["rates"]["fused-4"], json!(40.0));
        assert_eq!(median(vec![f64::NAN]), None);
    }

    #[test]
    fn parses_both_reference_formats() {
        let text = "mlp loop  n=  4:        593 model-steps/s  peak_alloc=12 MiB  loss=2.1\n\
                    jax-cpu vmap n= 16:    612.5 model-steps/s\nnoise line\n";
        let v = parse_reference(text);
        assert_eq!(v["rates"]["loop-4"], json!(593.0));
        assert_eq!(v["rates"]["fused-16"], json!(612.5));
        assert_eq!(v["rates"].as_object().map(|m| m.len()), Some(2));
        assert_eq!(v["peak_mib"]["loop-4"], json!(12.0));
        assert!(v["peak_mib"].get("fused-16").is_none());
    }
}
