//! The input-bound check: a CPU-side MNIST pipeline (decode, normalise, shuffle, batch 256) feeds 4 members (MLP
//! 784-128-10, Adam 1e-3) in lockstep through `share(4)`, once with the pipeline on the training thread and once
//! with device prefetch (a background thread; on a GPU, pinned staging buffers and the copy stream).
//!
//! Reported per run: steps per second (one step = every member trains on the batch), the fraction of wall time
//! the training thread waits for input, and on a GPU the idle fraction of the compute stream between steps: a
//! timing event is recorded on it after the batch is taken and after the last member's step was queued; a gap
//! between one step's end and the next step's start on the GPU is time the stream had no work queued, waiting for
//! input. Idle fraction = sum of gaps / GPU time from the first step's start to the last step's end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cohort_alloc::TenantId;
use cohort_data::{Dataset, Layout, Mnist, MnistConfig, Split, TrainBatch, bundled_mnist_dir};
use cohort_tensor::Device;
use cohort_tensor::cuda::{StreamMark, mark};
use serde_json::{Value, json};

use crate::cohort::Trainee;

const MEMBERS: usize = 4;
const BATCH: usize = 256;
const WARMUP: usize = 5;

/// The batches for the members: the host pipeline, with or without device prefetch.
fn pipeline(mnist: &Arc<Mnist>, device: Device, prefetch: bool) -> Dataset<TrainBatch> {
    let config = MnistConfig {
        batch_size: BATCH,
        seed: 0,
        shuffle: true,
        drop_remainder: true,
        layout: Layout::Flat,
        workers: 1,
        prefetch: 0,
    };
    let host = mnist.batches(&config).repeat(None);
    if prefetch {
        host.to_train_batches(device, 2)
    } else {
        // decoded, batched and copied on the training thread, when a member asks for the batch
        host.map(move |(x, y)| TrainBatch::from_arrays(x, y, &device))
    }
}

/// One run of `steps` lockstep steps after a warm-up.
fn measure(mnist: &Arc<Mnist>, device: Device, prefetch: bool, steps: usize) -> Result<Value> {
    let ds = pipeline(mnist, device, prefetch);
    let mut consumers = ds.share(MEMBERS)?;
    let mut members: Vec<Trainee> = (0..MEMBERS)
        .map(|i| Trainee::new(1, i as u64, device, TenantId::DEFAULT))
        .collect::<Result<_>>()?;
    let cuda = match device {
        Device::Cuda(n) => Some(n),
        Device::Cpu => None,
    };
    let mut marks: Vec<(StreamMark, StreamMark)> = Vec::with_capacity(steps);
    let mut wait = Duration::ZERO;
    let mut start = Instant::now();
    for s in 0..WARMUP + steps {
        if s == WARMUP {
            device.synchronize()?;
            start = Instant::now();
            wait = Duration::ZERO;
        }
        let asked = Instant::now();
        let batches = consumers
            .iter_mut()
            .map(|c| Ok(c.next().context("the repeated pipeline ended")??))
            .collect::<Result<Vec<Arc<TrainBatch>>>>()?;
        wait += asked.elapsed();
        let begin = cuda.map(mark).transpose()?;
        for (m, b) in members.iter_mut().zip(&batches) {
            m.step(&b.inputs, &b.labels)?;
        }
        if let (Some(n), Some(begin)) = (cuda, begin)
            && s >= WARMUP
        {
            marks.push((begin, mark(n)?));
        }
    }
    device.synchronize()?;
    let wall = start.elapsed().as_secs_f64();
    let gpu_idle = gpu_idle_fraction(&marks)?;
    Ok(json!({
        "prefetch": prefetch,
        "steps": steps,
        "steps_per_s": steps as f64 / wall,
        "model_steps_per_s": (steps * MEMBERS) as f64 / wall,
        "input_wait_fraction": wait.as_secs_f64() / wall,
        "gpu_idle_fraction": gpu_idle,
    }))
}

/// Sum of the gaps between one step's end and the next one's start on the compute stream, over the GPU time
/// from the first start to the last end; `None` without marks (the CPU).
fn gpu_idle_fraction(marks: &[(StreamMark, StreamMark)]) -> Result<Option<f64>> {
    let (Some(first), Some(last)) = (marks.first(), marks.last()) else {
        return Ok(None);
    };
    let span = first.0.elapsed_ms(&last.1)?;
    let mut idle = 0.0;
    for pair in marks.windows(2) {
        idle += pair[0].1.elapsed_ms(&pair[1].0)?.max(0.0);
    }
    Ok(Some(if span > 0.0 { idle / span } else { 0.0 }))
}

/// Measures the GPU's idle fraction (CPU: the input wait) while a CPU pipeline feeds four members, without and
/// with device prefetch; prints a short table and returns the figures.
pub fn run(device: Device, quick: bool) -> Result<Value> {
    let mnist =
        Arc::new(Mnist::load(bundled_mnist_dir(), Split::Train).context(
            "the input-bound check needs the MNIST digits (data/mnist or COHORT_DATA_DIR)",
        )?);
    let steps = if quick { 200 } else { 1000 };
    println!(
        "\ninput-bound check on {device}: MNIST pipeline (decode, normalise, shuffle, batch {BATCH}) -> {MEMBERS} MLP members, share({MEMBERS}), {steps} steps"
    );
    println!(
        "{:<18} {:>10} {:>14} {:>16} {:>14}",
        "feed", "steps/s", "model-steps/s", "input wait", "GPU idle"
    );
    let mut rows = Vec::new();
    for prefetch in [false, true] {
        let row = measure(&mnist, device, prefetch, steps)?;
        let pct = |k: &str| {
            row[k]
                .as_f64()
                .map_or_else(|| "-".to_string(), |f| format!("{:.1} %", 100.0 * f))
        };
        println!(
            "{:<18} {:>10.1} {:>14.0} {:>16} {:>14}",
            if prefetch {
                "device prefetch"
            } else {
                "inline (no prefetch)"
            },
            row["steps_per_s"].as_f64().unwrap_or(0.0),
            row["model_steps_per_s"].as_f64().unwrap_or(0.0),
            pct("input_wait_fraction"),
            pct("gpu_idle_fraction"),
        );
        rows.push(row);
    }
    Ok(json!({
        "device": device.to_string(),
        "members": MEMBERS,
        "batch": BATCH,
        "quick": quick,
        "runs": rows,
    }))
}
