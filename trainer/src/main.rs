//! The `cohort` binary: `cohort train [CONFIG.toml]`, `cohort resume RUN_DIR`, `cohort report RUN_DIR`,
//! `cohort memory`, `cohort replay`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cohort_trainer::cohort::{Cohort, RunOptions, RunOutcome, signal_name};
use cohort_trainer::config::Config;
use cohort_trainer::report::{Summary, bytes};

/// Train several models at once, in one process, on one GPU (or on the CPU where there is none).
///
/// With no command, runs the built-in default job (`cohort train`).
#[derive(Debug, Parser)]
#[command(name = "cohort", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train the members of a TOML config (with no CONFIG: the built-in default job, a small grid of MLPs and one
    /// CNN on the bundled MNIST digits). Documented configs: examples/*.toml.
    Train {
        /// The config file.
        config: Option<PathBuf>,
        /// Run name (the directory under [run].dir); overrides [run].name.
        #[arg(long)]
        name: Option<String>,
        /// Device: auto, cpu, cuda (every visible GPU) or cuda:N; overrides [run].device.
        #[arg(long)]
        device: Option<String>,
        /// Train only the I-th of N shares of the members (a grid's points, a sweep's trials), one cohort per host:
        /// every host given the same config and N trains its share, each member in exactly one; `cohort report`
        /// merges their run directories. Overrides [run].shard.
        #[arg(long, value_name = "I/N")]
        shard: Option<String>,
        /// Epochs per member; overrides [run].epochs and the members' own.
        #[arg(long)]
        epochs: Option<u32>,
        /// Directory runs are created in; overrides [run].dir.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// No progress lines (the summary is still printed).
        #[arg(long, short)]
        quiet: bool,
    },
    /// Continue an interrupted run from its members' latest valid checkpoints, with the config saved in it. The
    /// result is the same as if the run had never stopped.
    Resume {
        /// The run directory (`runs/<run>`).
        run_dir: PathBuf,
        /// No progress lines.
        #[arg(long, short)]
        quiet: bool,
    },
    /// A finished run's report, from its summary.json: for a sweep, its trials best first (hyper-parameters,
    /// status, metric, epochs, the best checkpoint), the counts by how they ended, and report.png (the metric
    /// against each hyper-parameter); for a plain run, its summary table. Given the run directories of a sweep's
    /// shards (`--shard`), one report of all their members.
    Report {
        /// The run directory (`runs/<run>`), or several: the shards of one grid or sweep.
        #[arg(required = true, num_args = 1..)]
        run_dirs: Vec<PathBuf>,
        /// Print the members as JSON instead (name, status, hyper-parameters, metric, best; best first), and
        /// write no plot.
        #[arg(long)]
        json: bool,
    },
    /// Given a run directory, each member's memory: while the run trains, what its process measured within the
    /// last second (live, reserved and peak bytes, limit, reserve, batch; on a GPU the pool, what lies outside it
    /// and the allocator's tenants), otherwise what its records last said. Without one, this process's device and
    /// its allocator.
    Memory {
        /// A run directory whose members' memory to show.
        run_dir: Option<PathBuf>,
        /// The device to show without a run directory: auto, cpu, cuda or cuda:N.
        #[arg(long, default_value = "auto", conflicts_with = "run_dir")]
        device: String,
    },
    /// Replay an allocator trace (CSV `op,id,bytes`: `a` alloc, `f` free, `t` trim; optionally gzip) on a simulated
    /// device. The allocator's property tests write their failing sequences in this form.
    Replay {
        /// The trace file.
        trace: PathBuf,
        /// Allocator policy: stitched, growth or preallocate.
        #[arg(long, default_value = "stitched")]
        policy: String,
        /// A hard limit on the pool, e.g. 12GiB.
        #[arg(long)]
        limit: Option<String>,
        /// Capacity of the simulated device, e.g. 140GiB (default: an H200's).
        #[arg(long)]
        capacity: Option<String>,
        /// Replay the trace this many times on one allocator (steady state).
        #[arg(long, default_value_t = 1)]
        passes: u32,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT and SIGTERM: the first sets the flag to its number, and the run checkpoints every member and stops; a
/// second ends the process at once, with 128 + its number.
fn interrupt_on_signals() -> anyhow::Result<Arc<AtomicUsize>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let signal = Arc::new(AtomicUsize::new(0));
    let once = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // In registration order: exit if one came before, then note this one.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, once.clone())?;
        signal_hook::flag::register(sig, once.clone())?;
        signal_hook::flag::register_usize(sig, signal.clone(), sig as usize)?;
    }
    Ok(signal)
}

/// What a finished or interrupted run prints, and the exit code: 0; 1 when a member failed (each is listed with
/// its reason); 128 + the signal's number when one interrupted the run.
fn conclude(outcome: RunOutcome, t0: Instant) -> ExitCode {
    if let Some(s) = &outcome.summary {
        print_summary(s, t0.elapsed().as_secs_f64());
        let failed = s.failures();
        if !failed.is_empty() {
            eprintln!(
                "error: {} of {} members failed:",
                failed.len(),
                s.members.len()
            );
            for (name, why) in failed {
                eprintln!("  {name}: {why}");
            }
            return ExitCode::FAILURE;
        }
    }
    match outcome.interrupted {
        Some(sig) => {
            eprintln!(
                "\ninterrupted by {}: every member still training was checkpointed where it stood and its logs \
                 written; continue with\n  cohort resume {}",
                signal_name(sig),
                resume_path(&outcome.run_dir).display()
            );
            ExitCode::from((128 + sig) as u8)
        }
        None => ExitCode::SUCCESS,
    }
}

/// The run directory as the user can type it: relative to the working directory where it lies inside it.
fn resume_path(dir: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| dir.to_path_buf())
}

fn print_summary(summary: &Summary, wall: f64) {
    if summary.sweep.is_some() {
        // A sweep's end is its leaderboard, its best trial first, and the plot of its metric by each dimension.
        println!("{}", cohort_trainer::leaderboard::leaderboard(summary));
        let dir = &summary.run_dir;
        println!(
            "{dir}/  (report.png, summary.json, sweep.json, a folder per trial with its checkpoints and logs)  \
             {wall:.1} s\ntensorboard --logdir {dir}  (the HPARAMS tab lists the trials)"
        );
        return;
    }
    println!("{summary}");
    let mut data: Vec<&str> = summary.members.iter().map(|m| m.data.as_str()).collect();
    data.sort_unstable();
    data.dedup();
    for d in data {
        let on = summary.members.iter().filter(|m| m.data == d).count();
        if on > 1
            && let Some(best) = summary.best(d)
        {
            let val = best.val.as_ref().map(|v| v.headline()).unwrap_or_default();
            println!("best on {d} by validation: {} (val {val})", best.name);
        }
    }
    let dir = &summary.run_dir;
    println!(
        "{dir}/  (checkpoints, TensorBoard logs, summary.json, loss.png, memory.png, memory-trace.json)  {wall:.1} s"
    );
    println!("tensorboard --logdir {dir}");
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let command = cli.command.unwrap_or(Command::Train {
        config: None,
        name: None,
        device: None,
        shard: None,
        epochs: None,
        dir: None,
        quiet: false,
    });
    match command {
        Command::Train {
            config,
            name,
            device,
            shard,
            epochs,
            dir,
            quiet,
        } => {
            let t0 = Instant::now();
            let is_default = config.is_none();
            let mut config = match &config {
                Some(p) => Config::from_file(p)?,
                None => Config::default_job()?,
            };
            let overrides = [
                ("name", name.map(toml::Value::String)),
                ("device", device.map(toml::Value::String)),
                ("shard", shard.map(toml::Value::String)),
                (
                    "dir",
                    dir.map(|d| toml::Value::String(d.display().to_string())),
                ),
                ("epochs", epochs.map(|e| toml::Value::Integer(i64::from(e)))),
            ];
            for (key, value) in overrides {
                if let Some(v) = value {
                    config = config.with_run_override(key, v)?;
                }
            }
            let cohort = Cohort::new(
                config,
                RunOptions {
                    progress: !quiet,
                    interrupt: Some(interrupt_on_signals()?),
                    ..RunOptions::default()
                },
            )?;
            eprintln!(
                "cohort {} · device: {}",
                env!("CARGO_PKG_VERSION"),
                describe_device(cohort.device())
            );
            eprintln!(
                "{}{}",
                if is_default { "default job: " } else { "" },
                cohort.describe()
            );
            Ok(conclude(cohort.run()?, t0))
        }
        Command::Resume { run_dir, quiet } => {
            let t0 = Instant::now();
            let cohort = Cohort::resume(
                &run_dir,
                RunOptions {
                    progress: !quiet,
                    interrupt: Some(interrupt_on_signals()?),
                    ..RunOptions::default()
                },
            )?;
            eprintln!(
                "cohort {} · resuming {} · device: {}",
                env!("CARGO_PKG_VERSION"),
                run_dir.display(),
                describe_device(cohort.device())
            );
            Ok(conclude(cohort.run()?, t0))
        }
        Command::Report { run_dirs, json } => match run_dirs.as_slice() {
            [one] => report(one, json),
            shards => report_shards(shards, json),
        }
        .map(|()| ExitCode::SUCCESS),
        Command::Memory { run_dir, device } => match run_dir {
            Some(dir) => run_memory(&dir).map(|()| ExitCode::SUCCESS),
            None => memory(&device).map(|()| ExitCode::SUCCESS),
        },
        Command::Replay {
            trace,
            policy,
            limit,
            capacity,
            passes,
            json,
        } => {
            use cohort_alloc::replay::{ReplayOptions, read_trace, replay};
            let parse = |what: &str, s: &str| {
                cohort_alloc::parse_bytes(s).with_context(|| {
                    format!("--{what} {s:?}: expected a size such as 12GiB, 512MiB or bytes")
                })
            };
            let mut opts = ReplayOptions {
                policy: policy.parse()?,
                passes,
                ..ReplayOptions::default()
            };
            if let Some(l) = limit {
                opts.limit = Some(parse("limit", &l)?);
            }
            if let Some(c) = capacity {
                opts.capacity = parse("capacity", &c)?;
            }
            let t = read_trace(&trace)?;
            let r = replay(&t, &opts)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("trace            {} ({} events)", r.trace, r.events);
                println!("policy           {}", r.policy);
                println!("peak live        {}", bytes(r.peak_live_bytes));
                println!("peak reserved    {}", bytes(r.peak_reserved_bytes));
                println!("source calls     {}", r.source_calls);
                println!("page moves       {}", r.page_moves);
                println!("OOMs             {}", r.ooms);
                println!("ns per op        {:.1}", r.ns_per_op);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn describe_device(d: cohort_tensor::Device) -> String {
    match d {
        cohort_tensor::Device::Cpu => format!(
            "cpu ({} threads, {} host memory)",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            bytes(cohort_trainer::memory::host_total_bytes())
        ),
        cuda => match cohort_trainer::memory::device_report(&cuda) {
            Some(r) => format!(
                "{cuda} ({}) · allocator: {}/{}, {}, limit {}",
                r.device,
                r.backend,
                r.layout,
                if std::env::var("COHORT_MEMORY_GROWTH").is_ok_and(|v| v == "false") {
                    "preallocate"
                } else {
                    "growth"
                },
                bytes(r.limit)
            ),
            None => cuda.to_string(),
        },
    }
}

/// `cohort memory` without a run: this process's device and its allocator.
fn memory(device: &str) -> anyhow::Result<()> {
    let dev = cohort_tensor::Device::parse(device)?;
    println!("device: {}", describe_device(dev));
    if dev.is_cuda() {
        match cohort_trainer::memory::device_report(&dev) {
            Some(r) => println!("{r}"),
            None => println!("(no allocator report)"),
        }
        if let Some(p) = cohort_trainer::memory::process_report(&dev) {
            println!("\n{p}");
        }
    } else {
        println!(
            "allocator: host tensors are plain host memory; members' budgets are charged to a host-accounting \
             allocator while they train"
        );
    }
    Ok(())
}

/// A run's summary.json. A run writes it at its end, so a run directory without one has not finished, which the
/// error tells apart from a directory that is no run at all.
fn read_summary(dir: &Path) -> anyhow::Result<Summary> {
    use cohort_trainer::run_dir::{RunDir, SUMMARY_FILE};
    let path = dir.join(SUMMARY_FILE);
    if !path.is_file() {
        if !dir.is_dir() {
            anyhow::bail!(
                "{}: no such directory (a run directory is runs/<run>)",
                dir.display()
            );
        }
        RunDir::open(dir)?;
        anyhow::bail!(
            "{d} has not finished: it has no {SUMMARY_FILE} yet (a run writes it at its end)\n  \
             if it still trains, wait for its end (`cohort memory {d}` shows it); if it was interrupted, \
             finish it with: cohort resume {d}",
            d = dir.display()
        );
    }
    Ok(Summary::read(&path)?)
}

/// `cohort report RUN`: what a run's summary.json says.
fn report(dir: &Path, json: bool) -> anyhow::Result<()> {
    use cohort_trainer::leaderboard::{entries, leaderboard};
    use cohort_trainer::plot::sweep::{REPORT_PLOT_FILE, write_report_plot};
    use cohort_trainer::run_dir::MEMORY_PLOT_FILE;
    let summary = read_summary(dir)?;
    if json {
        return print_out(&serde_json::to_string_pretty(&entries(&summary))?);
    }
    print_out(&leaderboard(&summary))?;
    let plots: Vec<PathBuf> = if summary.sweep.is_some() {
        let png = dir.join(REPORT_PLOT_FILE);
        write_report_plot(&png, &summary)?;
        vec![png]
    } else {
        ["loss.png", MEMORY_PLOT_FILE]
            .iter()
            .map(|f| dir.join(f))
            .filter(|p| p.is_file())
            .collect()
    };
    if !plots.is_empty() {
        let shown: Vec<String> = plots.iter().map(|p| p.display().to_string()).collect();
        print_out(&format!("plots: {}", shown.join("  ")))?;
    }
    Ok(())
}

/// `cohort report SHARD...`: the shards' summaries merged into one report. Its plot is left out: each shard's
/// report.png stays its own (`cohort report SHARD` writes it).
fn report_shards(dirs: &[PathBuf], json: bool) -> anyhow::Result<()> {
    use cohort_trainer::leaderboard::{entries, leaderboard};
    let mut summaries = Vec::new();
    for d in dirs {
        summaries.push((d.display().to_string(), read_summary(d)?));
    }
    let merged = cohort_trainer::shard::merge(summaries).map_err(anyhow::Error::msg)?;
    if json {
        return print_out(&serde_json::to_string_pretty(&entries(&merged))?);
    }
    print_out(&leaderboard(&merged))?;
    print_out(&format!("merged from {} run directories", dirs.len()))
}

/// Prints `text` and a newline. A reader that went away (`cohort report RUN | head`) ends the printing, not the
/// process with a panic, as `println!` would.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Seconds as a person reads an age: `0.4 s`, `12 s`, `3:07`.
fn age(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 60.0 {
        format!("{seconds:.0} s")
    } else {
        cohort_trainer::progress::clock(seconds)
    }
}

/// `cohort memory RUN`: the snapshot of a run that trains now, or what its records last said. It reads files
/// only: a CUDA context of its own would cost the card memory and show this process, not the run's.
fn run_memory(dir: &Path) -> anyhow::Result<()> {
    use cohort_trainer::memory_now::{self, RunState};
    use cohort_trainer::run_dir::{MEMORY_NOW_FILE, RunDir, SUMMARY_FILE};
    let run = RunDir::open(dir)?;
    let shown = resume_path(run.root());
    match memory_now::run_state(run.root())? {
        RunState::Running {
            pid,
            snapshot: Some(s),
        } => {
            let old = s.age();
            println!(
                "run {} · running (process {pid}) · device {} · measured {} ago, {} into the run",
                shown.display(),
                s.device,
                age(old),
                age(s.time)
            );
            if old > 10.0 {
                println!(
                    "  (the run measures between steps: a long step, evaluation or checkpoint holds the next \
                     measurement back)"
                );
            }
            print!("{s}");
        }
        running => {
            let last = match running {
                RunState::Running { pid, .. } => {
                    println!(
                        "run {} · running (process {pid}), not measured yet (it writes {MEMORY_NOW_FILE} once it \
                         trains) · from its records:",
                        shown.display()
                    );
                    None
                }
                RunState::NotRunning { last } => {
                    let when = last.as_ref().map_or(String::new(), |s| {
                        format!(
                            " (last measured {} ago, by process {})",
                            age(s.age()),
                            s.pid
                        )
                    });
                    println!(
                        "run {} · not running{when} · from its records (<member>/metrics.jsonl):",
                        shown.display()
                    );
                    last
                }
            };
            let config = Config::from_file(&run.config_path())?;
            let summary = Summary::read(&run.root().join(SUMMARY_FILE)).ok();
            let names: Vec<String> = config.members.iter().map(|m| m.name.clone()).collect();
            let rows =
                memory_now::from_records(run.root(), &names, summary.as_ref(), last.as_deref())?;
            print!("{}", memory_now::table(&rows));
        }
    }
    Ok(())
}
