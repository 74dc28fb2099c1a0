//! `cargo xtask gpu-bundle`: everything a GPU machine without a Rust toolchain needs, in one folder.
//!
//! Layout: `bin/` (cohort, replay, xtask), `tests/` and `benches/` (one executable per test or bench target),
//! `reference/` (the PyTorch and JAX scripts of ../shared/bench, and the workloads' `bench/torch_*.py` with
//! their shared `torch_timing.py`), `traces/`, and
//! `MANIFEST.json`, which names each executable with the package folder it must run in (cargo runs tests and
//! benches in their package's root, so relative paths hold).

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(clap::Args)]
pub struct Args {
    /// Folder to fill (emptied first).
    #[arg(long, default_value = "gpu-bundle")]
    out: PathBuf,
    /// Skip test binaries.
    #[arg(long)]
    no_tests: bool,
    /// Skip bench binaries.
    #[arg(long)]
    no_benches: bool,
    /// Also pack the folder as `<out>.tar.xz` (what travels to a GPU machine is limited in size: 306 MiB of stripped
    /// binaries packed to 21 MiB, where xz's default window made 57).
    #[arg(long)]
    archive: bool,
    /// Architectures whose common kernel modules are built into the binaries (`COHORT_CUDA_ARCH`, see
    /// kernels/build.rs): the lent H100s and H200s are sm_90. Needs NVRTC on the library path (`pip install
    /// nvidia-cuda-nvrtc` gives one without a GPU); without it none are, and they compile on first use.
    #[arg(long, default_value = "sm_90")]
    cuda_arch: String,
}

/// The workspace root: xtask lives one folder below it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// `pkg/cuda` for every workspace package that has a `cuda` feature, so the bundle is built with CUDA.
fn cuda_features(root: &Path) -> Result<String> {
    let out = Command::new("cargo")
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    let meta: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let features: Vec<String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["features"].get("cuda").is_some())
        .map(|p| format!("{}/cuda", p["name"].as_str().unwrap_or_default()))
        .collect();
    Ok(features.join(","))
}

/// Scripts of `bench/` that `xtask bench --bundle` runs from the bundle's `reference/`.
const REPO_REFERENCE_SCRIPTS: [&str; 6] = [
    "torch_timing.py",
    "torch_attention.py",
    "torch_cnn.py",
    "torch_cotrain.py",
    "torch_resnet.py",
    "torch_transformer.py",
];

/// One executable cargo built, with the package folder it runs in.
struct Artifact {
    name: String,
    /// `lib`, `bin`, `test` or `bench`: a package's unit tests of its `cohort` binary and its `tests/cohort.rs`
    /// share a name.
    kind: String,
    path: PathBuf,
    package_dir: PathBuf,
}

/// Runs a cargo build command with JSON messages and returns the executables it produced that `keep` accepts.
fn cargo_executables(
    root: &Path,
    args: &[String],
    cuda_arch: &str,
    keep: impl Fn(&Value) -> bool,
) -> Result<Vec<Artifact>> {
    let out = Command::new("cargo")
        .args(args)
        .env("COHORT_CUDA_ARCH", cuda_arch)
        .args(["--message-format", "json-render-diagnostics"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    let mut found = Vec::new();
    for line in out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let msg: Value = serde_json::from_slice(line)?;
        if msg["reason"] != "compiler-artifact" || !keep(&msg) {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
        let package_dir = manifest
            .parent()
            .unwrap_or(root)
            .strip_prefix(root)
            .unwrap_or(Path::new(""))
            .to_path_buf();
        found.push(Artifact {
            name: msg["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            kind: msg["target"]["kind"][0]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            path: PathBuf::from(exe),
            package_dir,
        });
    }
    Ok(found)
}

fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    let status = Command::new("strip")
        .arg(to)
        .status()
        .context("running strip")?;
    if !status.success() {
        bail!("strip failed on {}", to.display());
    }
    Ok(())
}

fn kind_is(msg: &Value, kind: &str) -> bool {
    msg["target"]["kind"]
        .as_array()
        .is_some_and(|k| k.iter().any(|x| x == kind))
}

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    let out = root.join(&args.out);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("emptying {}", out.display()))?;
    }
    for dir in ["bin", "tests", "benches", "reference", "traces"] {
        fs::create_dir_all(out.join(dir))?;
    }
    let features = cuda_features(&root)?;
    let cargo_args = |base: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        if !features.is_empty() {
            v.extend(["--features".to_string(), features.clone()]);
        }
        v
    };
    let mut manifest = json!({
        "features": features, "cuda_arch": args.cuda_arch, "bins": [], "tests": [], "benches": []
    });

    let build = cargo_args(&["build", "--release", "--workspace", "--bins"]);
    for a in cargo_executables(&root, &build, &args.cuda_arch, |m| kind_is(m, "bin"))? {
        copy_stripped(&a.path, &out.join("bin").join(&a.name))?;
        manifest["bins"]
            .as_array_mut()
            .expect("array")
            .push(json!({ "name": a.name }));
    }
    let groups: [(&str, bool, Vec<String>); 2] = [
        (
            "tests",
            args.no_tests,
            cargo_args(&["test", "--release", "--workspace", "--no-run"]),
        ),
        (
            "benches",
            args.no_benches,
            cargo_args(&["bench", "--workspace", "--no-run"]),
        ),
    ];
    for (dir, skip, cmd) in groups {
        if skip {
            continue;
        }
        let keep = |m: &Value| {
            if dir == "benches" {
                kind_is(m, "bench")
            } else {
                m["profile"]["test"] == true
            }
        };
        for a in cargo_executables(&root, &cmd, &args.cuda_arch, keep)? {
            let file =
                format!("{}-{}-{}", a.package_dir.display(), a.kind, a.name).replace('/', "_");
            copy_stripped(&a.path, &out.join(dir).join(&file))?;
            manifest[dir].as_array_mut().expect("array").push(json!({
                "name": a.name, "file": format!("{dir}/{file}"), "package_dir": a.package_dir,
            }));
        }
    }
    let shared = root.join("../shared");
    for (from, to) in [("bench", "reference"), ("traces", "traces")] {
        for entry in
            fs::read_dir(shared.join(from)).with_context(|| format!("reading ../shared/{from}"))?
        {
            let path = entry?.path();
            if let Some(name) = path.file_name() {
                fs::copy(&path, out.join(to).join(name))?;
            }
        }
    }
    // The reference scripts kept in this repository rather than in ../shared.
    for name in REPO_REFERENCE_SCRIPTS {
        fs::copy(
            root.join("bench").join(name),
            out.join("reference").join(name),
        )
        .with_context(|| format!("copying bench/{name}"))?;
    }
    fs::write(
        out.join("MANIFEST.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    fs::write(out.join("run-tests.sh"), RUN_TESTS)?;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!(
        "gpu-bundle: {} ({:.1} MiB)",
        out.display(),
        mib(walk_size(&out)?)
    );
    if args.archive {
        let name = out.file_name().context("bundle folder has a name")?;
        let archive = out.with_file_name(format!("{}.tar.xz", name.to_string_lossy()));
        let status = Command::new("tar")
            .arg("-cJf")
            .arg(&archive)
            .arg(name)
            .current_dir(out.parent().context("bundle folder has a parent")?)
            // one stream with a 64 MiB window: the test binaries share most of their code, which smaller windows
            // (and the blocks of a multi-threaded xz) do not see across binaries
            .env("XZ_OPT", "-9 -T1")
            .status()
            .context("running tar")?;
        if !status.success() {
            bail!("tar failed on {}", out.display());
        }
        println!(
            "archive: {} ({:.1} MiB)",
            archive.display(),
            mib(fs::metadata(&archive)?.len())
        );
    }
    Ok(())
}

fn walk_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            walk_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Runs every carried test binary in its package folder with the GPU tests included; logs go to `$1` (default .).
const RUN_TESTS: &str = r#"#!/usr/bin/env bash
# Usage: gpu-bundle/run-tests.sh [LOG_DIR] [FILTER]; run from the repository root.
set -u
root=$(pwd); bundle=$(cd "$(dirname "$0")" && pwd); logs=${1:-.}; filter=${2:-}
mkdir -p "$logs"; fail=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
while IFS=$'\t' read -r file dir; do
  name=$(basename "$file")
  (cd "$root/$dir" && CARGO_MANIFEST_DIR="$root/$dir" CARGO_BIN_EXE_cohort="$bundle/bin/cohort" "$bundle/$file" --include-ignored $filter) >"$logs/$name.log" 2>&1
  rc=$?; echo "$name: rc=$rc $(grep -E '^test result' "$logs/$name.log" | tail -1)"; [ $rc -eq 0 ] || fail=1
done < <(python3 -c 'import json,sys; [print(t["file"]+"\t"+t["package_dir"]) for t in json.load(open(sys.argv[1]))["tests"]]' "$bundle/MANIFEST.json")
exit $fail
"#;
