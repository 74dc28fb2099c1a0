//! `replay FILE.csv[.gz] [--policy stitched|growth|preallocate] [--limit BYTES] [--passes N] [--steps N]
//! [--idle-page-slack PAGES] [--stream-lag OPS] [--capacity BYTES]`: replays an allocation trace on a simulated
//! device and prints one line of JSON (with `synchronising_moves`: pages moved only after waiting for the device).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cohort_alloc::parse_bytes;
use cohort_alloc::replay::{ReplayOptions, read_trace, replay};

const USAGE: &str = "usage: replay FILE.csv[.gz] [--policy stitched|growth|preallocate] [--limit BYTES] \
                     [--passes N] [--steps N] [--idle-page-slack PAGES] [--stream-lag OPS] [--placement-candidates N] [--large-block BYTES] [--capacity BYTES]";

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut file: Option<PathBuf> = None;
    let mut opts = ReplayOptions::default();
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--policy" => opts.policy = value("--policy")?.parse()?,
            "--limit" => {
                let v = value("--limit")?;
                opts.limit = Some(
                    parse_bytes(&v)
                        .with_context(|| format!("--limit {v:?}: expected bytes such as 2GiB"))?,
                );
            }
            "--capacity" => {
                let v = value("--capacity")?;
                opts.capacity =
                    parse_bytes(&v).with_context(|| format!("--capacity {v:?}: expected bytes"))?;
            }
            "--passes" => {
                opts.passes = value("--passes")?
                    .parse()
                    .context("--passes: expected a count")?
            }
            "--steps" => {
                opts.steps = Some(
                    value("--steps")?
                        .parse()
                        .context("--steps: expected a count")?,
                )
            }
            "--idle-page-slack" => {
                opts.idle_page_slack = value("--idle-page-slack")?
                    .parse()
                    .context("--idle-page-slack: expected a number of pages")?;
            }
            "--stream-lag" => {
                opts.stream_lag = value("--stream-lag")?
                    .parse()
                    .context("--stream-lag: expected a number of trace operations")?;
            }
            "--large-block" => {
                let v = value("--large-block")?;
                opts.large_block = parse_bytes(&v)
                    .with_context(|| format!("--large-block {v:?}: expected bytes"))?;
            }
            "--placement-candidates" => {
                opts.placement_candidates = value("--placement-candidates")?
                    .parse()
                    .context("--placement-candidates: expected a count")?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if a.starts_with('-') => bail!("unknown option {a:?}\n{USAGE}"),
            _ if file.is_none() => file = Some(PathBuf::from(a)),
            _ => bail!("more than one trace file given\n{USAGE}"),
        }
    }
    let Some(file) = file else {
        bail!("no trace file given\n{USAGE}")
    };
    let trace = read_trace(&file)?;
    let report = replay(&trace, &opts)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
