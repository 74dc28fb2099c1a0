//! What the parts that train a workload beside PyTorch share (`cnn`, `resnet`, `transformer`): the timing both
//! sides follow, the run of the PyTorch script and the reading of its JSON, and the comparison table.
//!
//! Timing: `warmup` steps untimed (cuDNN's algorithm choices are made in them), then `windows` windows of
//! [`cohort::rate`]'s form (at least `window` and 3 steps, the device synchronized every 16 steps and at the end),
//! the median window's rate the figure. The scripts take the same three numbers (`--warmup --windows
//! --window-s`) and time the same way (`bench/torch_timing.py`). The peak is the most held at one moment over the
//! timed steps: for cohort by the tenants that hold the models, their Adam state and the batch
//! ([`ConcurrentPeak`]); for PyTorch `torch.cuda.max_memory_allocated()`, which holds the same.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use cohort_alloc::TenantId;
use cohort_tensor::{Device, Tensor};
use serde_json::{Value, json};

use crate::bench::median;
use crate::cohort::{self, Captured, ConcurrentPeak, Drift, Trainee};

/// Warm-up and windows, passed as they are to the PyTorch script so both sides time alike.
pub(crate) struct Timing {
    pub(crate) warmup: usize,
    pub(crate) windows: usize,
    pub(crate) window: Duration,
}

/// A measured step: each window's rate (calls per second), their median, and the most the tenants held together.
pub(crate) struct Measured {
    pub(crate) windows: Vec<f64>,
    pub(crate) rate: f64,
    pub(crate) peak: Option<u64>,
}

impl Timing {
    pub(crate) fn new(quick: bool) -> Timing {
        Timing {
            warmup: if quick { 5 } else { 10 },
            windows: if quick { 3 } else { 5 },
            window: Duration::from_millis(if quick { 250 } else { 1000 }),
        }
    }

    pub(crate) fn script_args(&self) -> Vec<String> {
        flags(&[
            ("--warmup", self.warmup.to_string()),
            ("--windows", self.windows.to_string()),
            ("--window-s", self.window.as_secs_f64().to_string()),
        ])
    }

    /// Times `step`: the warm-up untimed, then the windows; the peak is what `tenants` held together at most over
    /// the windows ([`ConcurrentPeak`], started after the warm-up; none on the CPU, which has no allocator, or
    /// without tenants).
    pub(crate) fn measure(
        &self,
        device: Device,
        tenants: &[TenantId],
        mut step: impl FnMut() -> Result<()>,
    ) -> Result<Measured> {
        for _ in 0..self.warmup {
            step()?;
        }
        device.synchronize()?;
        let peak = ConcurrentPeak::start(device, tenants);
        let windows = (0..self.windows)
            .map(|_| cohort::rate(device, 0, self.window, |_| step()))
            .collect::<Result<Vec<f64>>>()?;
        let rate = median(windows.clone()).context("no finite window rate")?;
        Ok(Measured {
            windows,
            rate,
            peak: peak.map(|p| p.bytes()),
        })
    }
}

/// One model (or fused group) of a measurement: how to build it with its memory charged to a tenant, and the
/// batch it trains on.
pub(crate) struct Job<'a> {
    pub(crate) build: Box<dyn Fn(TenantId) -> Result<Trainee> + 'a>,
    pub(crate) x: &'a Tensor,
    pub(crate) y: &'a Tensor,
    /// Its members: model-steps per step.
    pub(crate) members: usize,
}

/// Trains `jobs` together, each a step per call, timed by `timing`: `eager`, the jobs stepped in turn, each in a
/// tenant of its own (named from `tag`), the peak what they and `data` (the tenant holding the batches) held together;
/// `graph`, each job's step captured ([`Captured`], on static inputs of its own) and all replayed together on
/// concurrent streams, without a peak (a graph's memory is the capture's, outside the tenants). Prints `label` with
/// the figures and returns them: `model_steps_per_s`, `steps_per_s`, `windows`, `peak_bytes_per_member`.
pub(crate) fn train_together(
    device: Device,
    timing: &Timing,
    form: &str,
    tag: &str,
    data: TenantId,
    jobs: &[Job<'_>],
    label: &str,
) -> Result<Value> {
    let members: usize = jobs.iter().map(|j| j.members).sum();
    let mut drift = None;
    let m = match form {
        "graph" => {
            let groups = jobs
                .iter()
                .map(|j| {
                    let check = vec![(j.x.clone(), j.y.clone()); 4];
                    let build = || (j.build)(TenantId::DEFAULT);
                    Captured::new(vec![build()?], [build()?, build()?], j.x, j.y, &check)
                })
                .collect::<Result<Vec<_>>>()?;
            let groups: Vec<&Captured> = groups.iter().collect();
            drift = groups.iter().map(|g| g.drift).reduce(Drift::worst);
            timing.measure(device, &[], || Captured::replay_together(&groups))?
        }
        "eager" => {
            let mut tenants = vec![data];
            let mut trainees = Vec::new();
            for (i, j) in jobs.iter().enumerate() {
                let tenant = cohort::tenant(device, &format!("{tag}-{i}"))?;
                tenants.push(tenant);
                trainees.push((j.build)(tenant)?);
            }
            timing.measure(device, &tenants, || {
                trainees
                    .iter_mut()
                    .zip(jobs)
                    .try_for_each(|(t, j)| t.step(j.x, j.y))
            })?
        }
        other => bail!("no form {other}: eager or graph"),
    };
    let model_steps = m.rate * members as f64;
    let per_member = m.peak.map(|p| p as f64 / members.max(1) as f64);
    println!(
        "cohort {label}: {model_steps:9.1} model-steps/s{}{}",
        per_member
            .map(|p| format!("  peak/member {:.1} MiB", mib(p)))
            .unwrap_or_default(),
        drift
            .map(|d| format!("  replay drift {:.1e} (eager {:.1e})", d.replay, d.eager))
            .unwrap_or_default()
    );
    Ok(json!({
        "model_steps_per_s": model_steps, "steps_per_s": m.rate, "windows": m.windows,
        "peak_bytes_per_member": per_member,
        "replay_drift": drift.map(|d| d.replay), "eager_drift": drift.map(|d| d.eager),
    }))
}

/// `keys` (an object) with `figures`' fields added.
pub(crate) fn row(keys: Value, figures: Value) -> Value {
    let mut row = keys;
    if let (Some(r), Value::Object(f)) = (row.as_object_mut(), figures) {
        r.extend(f);
    }
    row
}

/// `[("--batch", "128")]` as `["--batch", "128"]`.
pub(crate) fn flags(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.clone()])
        .collect()
}

/// `None` where the part can run (a GPU the driver sees); otherwise the part's report, after saying why it skips.
pub(crate) fn gpu_only(part: &str, device: Device) -> Option<Value> {
    if !device.is_cuda() {
        println!("\n{part}: GPU-only, skipped on the CPU (run with --gpu)");
        return Some(json!({ "skipped": "GPU-only part; the run is on the CPU" }));
    }
    if let Err(e) = device.verify() {
        println!("\n{part}: skipped: {e}");
        return Some(json!({ "skipped": e.to_string() }));
    }
    None
}

/// The PyTorch script's JSON (`script`: the interpreter and the script, `None` without `--reference`), or why
/// there is none: a script that fails leaves our figures standing.
pub(crate) fn reference_or_error(script: Option<(&str, &Path)>, args: &[String]) -> Value {
    match script {
        Some((python, path)) => reference(python, path, args).unwrap_or_else(|e| {
            println!("warning: the PyTorch side did not run: {e:#}");
            json!({ "error": format!("{e:#}") })
        }),
        None => Value::Null,
    }
}

/// Runs a PyTorch script with `args`; its progress goes to the terminal as it comes, its stdout is one JSON object.
fn reference(python: &str, script: &Path, args: &[String]) -> Result<Value> {
    let out = Command::new(python)
        .arg(script)
        .args(args)
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
pub(crate) fn parse_reference(stdout: &str) -> Result<Value> {
    stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v["rows"].is_array())
        .context("the PyTorch script printed no JSON object with `rows`")
}

pub(crate) fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

/// A row's identifying field as text: strings as they are, numbers as written.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// How a part's rows meet PyTorch's: one line per row of ours, its rate beside each PyTorch form's with the ratio,
/// and its peak beside one form's.
pub(crate) struct Table<'a> {
    /// Fields that name a row on both sides (`precision`, `n`); the first columns.
    pub(crate) join: &'a [&'a str],
    /// Fields of our rows shown after them (`schedule`).
    pub(crate) shown: &'a [&'a str],
    /// The rate's field on both sides, and its column's header.
    pub(crate) rate: &'a str,
    pub(crate) rate_header: &'a str,
    /// PyTorch's forms (their rows' `form`) compared with, and their columns' headers.
    pub(crate) forms: &'a [(&'a str, &'a str)],
    /// The peak's field (bytes) on both sides.
    pub(crate) peak: &'a str,
    /// The PyTorch form whose peak stands beside one of our rows.
    pub(crate) peak_form: fn(&Value) -> &'static str,
}

impl Table<'static> {
    /// Rows named by precision and model, shown with their form (eager or graph), beside PyTorch's eager and
    /// CUDA-graph forms of the same; the peak beside PyTorch's eager one.
    pub(crate) fn by_model() -> Table<'static> {
        Table {
            join: &["precision", "model"],
            shown: &["form"],
            rate: "model_steps_per_s",
            rate_header: "cohort model-steps/s",
            forms: &[("eager", "PyTorch eager"), ("graph", "PyTorch CUDA graph")],
            peak: "peak_bytes_per_member",
            peak_form: |_| "eager",
        }
    }
}

impl Table<'_> {
    /// Speed ratios are ours over PyTorch's (above 1: cohort is faster), the memory ratio our peak over PyTorch's
    /// (below 1: cohort holds less). Failed rows, and a script that did not run, say why under the table, and
    /// PyTorch's notes on a form follow.
    pub(crate) fn render(&self, ours: &[Value], theirs: &Value) -> String {
        let their_rows: Vec<&Value> = theirs["rows"].as_array().into_iter().flatten().collect();
        let find = |r: &Value, form: &str| {
            their_rows
                .iter()
                .copied()
                .find(|t| t["form"] == form && self.join.iter().all(|k| t[*k] == r[*k]))
        };
        let cell = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let mut headers: Vec<String> = self
            .join
            .iter()
            .chain(self.shown)
            .map(|s| s.to_string())
            .collect();
        let labels = headers.len();
        headers.push(self.rate_header.into());
        for (_, h) in self.forms {
            headers.extend([h.to_string(), "ratio".into()]);
        }
        headers.extend([
            "cohort peak MiB".into(),
            "PyTorch peak MiB".into(),
            "ratio".into(),
        ]);
        let mut lines = vec![headers.clone()];
        for r in ours {
            let mut line: Vec<String> = self
                .join
                .iter()
                .chain(self.shown)
                .map(|k| text(&r[*k]))
                .collect();
            let us = r[self.rate].as_f64();
            line.push(cell(us));
            for (form, _) in self.forms {
                let them = find(r, form).and_then(|t| t[self.rate].as_f64());
                line.extend([cell(them), ratio(us, them)]);
            }
            let our_peak = r[self.peak].as_f64().map(mib);
            let their_peak = find(r, (self.peak_form)(r))
                .and_then(|t| t[self.peak].as_f64())
                .map(mib);
            line.extend([
                cell(our_peak),
                cell(their_peak),
                ratio(our_peak, their_peak),
            ]);
            lines.push(line);
        }
        let widths: Vec<usize> = (0..headers.len())
            .map(|i| {
                lines
                    .iter()
                    .map(|l| l[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut s = String::new();
        for line in &lines {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| match i < labels {
                    true => format!("{c:<w$}"),
                    false => format!("{c:>w$}"),
                })
                .collect();
            s += cells.join(" ").trim_end();
            s.push('\n');
        }
        let label = |r: &Value, keys: &mut dyn Iterator<Item = &&str>| {
            keys.map(|k| text(&r[*k]))
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        };
        for r in ours {
            if let Some(e) = r["error"].as_str() {
                let name = label(r, &mut self.join.iter().chain(self.shown));
                s += &format!("cohort {name}: failed: {e}\n");
            }
        }
        for r in &their_rows {
            let name = label(r, &mut self.join.iter().chain(&["form"]));
            if let Some(e) = r["error"].as_str() {
                s += &format!("PyTorch {name}: failed: {e}\n");
            }
            // a form that had to change to run (the vmap ResNet's batch norm in fp32) says how
            if let Some(note) = r["note"].as_str() {
                s += &format!("PyTorch {name}: {note}\n");
            }
        }
        if let Some(e) = theirs["error"].as_str() {
            s += &format!("PyTorch: did not run: {e}\n");
        }
        s += "ratios are cohort's over PyTorch's: speed above 1x, cohort is faster; memory below 1x, cohort holds less\n";
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_meet_by_their_join_fields() {
        let table = Table {
            join: &["precision", "n"],
            shown: &["schedule"],
            rate: "model_steps_per_s",
            rate_header: "model-steps/s",
            forms: &[("loop", "PyTorch loop"), ("vmap", "vmap")],
            peak: "peak_bytes_per_member",
            peak_form: |r| match r["schedule"].as_str() {
                Some(s) if s.starts_with("fused") => "vmap",
                _ => "loop",
            },
        };
        let ours = [
            json!({ "precision": "fp32", "n": 4, "schedule": "loop", "model_steps_per_s": 100.0,
                    "peak_bytes_per_member": 1u64 << 20 }),
            json!({ "precision": "fp32", "n": 4, "schedule": "fused", "model_steps_per_s": 600.0,
                    "peak_bytes_per_member": 1u64 << 20 }),
            json!({ "precision": "fp32", "n": 16, "schedule": "fused", "error": "out of memory" }),
        ];
        let theirs = json!({ "rows": [
            { "precision": "fp32", "n": 4, "form": "loop", "model_steps_per_s": 50.0,
              "peak_bytes_per_member": 4u64 << 20 },
            { "precision": "fp32", "n": 4, "form": "vmap", "model_steps_per_s": 300.0,
              "peak_bytes_per_member": 2u64 << 20 },
            { "precision": "fp32", "n": 1, "form": "vmap", "model_steps_per_s": 1.0 },
            { "precision": "bf16", "n": 4, "form": "loop", "error": "autocast refused" },
            { "precision": "bf16", "n": 4, "form": "vmap", "note": "batch norm in fp32" },
        ]});
        let t = table.render(&ours, &theirs);
        let cells = |first: &[&str]| -> Vec<String> {
            t.lines()
                .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
                .find(|c| c.starts_with(&first.iter().map(|s| s.to_string()).collect::<Vec<_>>()))
                .unwrap_or_else(|| panic!("no line {first:?} in\n{t}"))
        };
        assert_eq!(
            cells(&["fp32", "4", "loop"]),
            [
                "fp32", "4", "loop", "100.0", "50.0", "2.00x", "300.0", "0.33x", "1.0", "4.0",
                "0.25x"
            ]
        );
        assert_eq!(
            cells(&["fp32", "4", "fused"]),
            [
                "fp32", "4", "fused", "600.0", "50.0", "12.00x", "300.0", "2.00x", "1.0", "2.0",
                "0.50x"
            ]
        );
        assert_eq!(
            cells(&["fp32", "16"])
                .iter()
                .filter(|c| c.as_str() == "-")
                .count(),
            8
        );
        assert!(
            t.contains("cohort fp32 16 fused: failed: out of memory"),
            "{t}"
        );
        assert!(
            t.contains("PyTorch bf16 4 loop: failed: autocast refused"),
            "{t}"
        );
        assert!(t.contains("PyTorch bf16 4 vmap: batch norm in fp32"), "{t}");
        assert!(!t.contains("did not run"));
        let missing = table.render(&ours, &json!({ "error": "no torch" }));
        assert!(
            missing.contains("PyTorch: did not run: no torch"),
            "{missing}"
        );
    }

    #[test]
    fn the_reference_is_its_last_json_line_with_rows() {
        let v = parse_reference("torch 2.5\n{\"rows\": [1]}\n{\"other\": 2}\nnoise\n").unwrap();
        assert_eq!(v["rows"], json!([1]));
        assert!(parse_reference("Traceback\nModuleNotFoundError: torch\n").is_err());
        assert_eq!(
            Timing::new(true).script_args().join(" "),
            "--warmup 5 --windows 3 --window-s 0.25"
        );
    }
}
