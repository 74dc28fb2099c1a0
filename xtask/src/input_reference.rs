//! The data sources' benchmarks beside what a user would otherwise run, from the same `cargo xtask bench
//! --reference` call: the image-folder epoch (`data/benches/images.rs`) against PyTorch's `DataLoader` with
//! torchvision transforms and the same number of workers (`bench/torch_images.py`), and the CSV read
//! (`data/benches/csv.rs`) against pandas (`bench/pandas_csv.py`), on the very files the benchmarks wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use serde_json::{Value, json};

/// A benchmark's file or folder: the environment's, else the benchmark's default in the temporary directory.
fn input(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| std::env::temp_dir().join(default), PathBuf::from)
}

/// Runs `script` on `arg`; its stdout, or `None` (with a warning) where the interpreter lacks its packages.
fn script(python: &str, script: &Path, arg: &Path) -> Option<String> {
    let out = Command::new(python).arg(script).arg(arg).output().ok()?;
    if !out.status.success() {
        eprintln!(
            "warning: {} did not run ({}); install its packages (see its docstring) or pass --python",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("\n{text}");
    Some(text)
}

/// Per second of a criterion row: its elements (or bytes) over its median.
fn rate(rows: &[Value], id: &str, key: &str) -> Option<f64> {
    let r = rows.iter().find(|r| r["id"] == id)?;
    Some(r[key].as_f64()? / (r["median_ns"].as_f64()? * 1e-9))
}

/// Our images/s and MB/s beside the references', with the ratios; `rows` are the criterion results.
pub fn compare(python: &str, root: &Path, rows: &[Value]) -> Result<Value> {
    let mut out = Vec::new();
    let images = input("COHORT_BENCH_IMAGES", "cohort-bench-images");
    if let Some(text) = script(python, &root.join("bench/torch_images.py"), &images) {
        // `crop_flip        1         1469             1660`: work, workers, images/s, images per CPU second
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let (Some(work), Some(workers), Some(theirs)) = (
                w.first(),
                w.get(1).and_then(|v| v.parse::<usize>().ok()),
                w.get(2).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            let ours = rate(
                rows,
                &format!("image_folder_epoch/cpu_{work}_{workers}worker"),
                "elements",
            );
            out.push(json!({
                "bench": format!("images {work}, {workers} worker{}", if workers > 1 { "s" } else { "" }),
                "unit": "images/s", "ours": ours, "theirs": theirs, "reference": "PyTorch DataLoader + torchvision",
            }));
        }
    }
    let table = input("COHORT_BENCH_CSV", "cohort-bench.csv");
    if let Some(text) = script(python, &root.join("bench/pandas_csv.py"), &table) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // `pandas_c: 0.356 s  163.1 MB/s  rows 500000`
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let (Some(engine), Some(seconds)) = (
                w.first()
                    .and_then(|e| e.strip_prefix("pandas_")?.strip_suffix(':')),
                w.get(1).and_then(|v| v.parse::<f64>().ok()),
            ) else {
                continue;
            };
            // pandas' C parser is one thread; pyarrow's uses every core.
            let threads = if engine == "c" { 1 } else { cores };
            let bytes = std::fs::metadata(&table).map_or(0, |m| m.len()) as f64;
            let ours =
                rate(rows, &format!("csv_read/cpu_{threads}thread"), "bytes").map(|b| b / 1e6);
            out.push(json!({
                "bench": format!("csv, {threads} thread{}", if threads > 1 { "s" } else { "" }),
                "unit": "MB/s", "ours": ours, "theirs": bytes / 1e6 / seconds,
                "reference": format!("pandas.read_csv(engine=\"{engine}\")"),
            }));
        }
    }
    println!(
        "\n{:<28} {:>10} {:>12} {:>12} {:>8}  reference",
        "input", "unit", "cohort", "theirs", "ratio"
    );
    for r in &out {
        let (ours, theirs) = (r["ours"].as_f64(), r["theirs"].as_f64().unwrap_or(f64::NAN));
        println!(
            "{:<28} {:>10} {:>12} {:>12.0} {:>8}  {}",
            r["bench"].as_str().unwrap_or(""),
            r["unit"].as_str().unwrap_or(""),
            ours.map_or("-".into(), |o| format!("{o:.0}")),
            theirs,
            ours.map_or("-".into(), |o| format!("{:.2}x", o / theirs)),
            r["reference"].as_str().unwrap_or("")
        );
    }
    Ok(Value::Array(out))
}
