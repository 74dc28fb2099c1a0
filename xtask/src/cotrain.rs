//! The `cotrain` part of `cargo xtask bench`: the `cnn` part's image CNN co-trained in one process on one GPU with
//! a text classifier, each alone and the two as a pair, beside PyTorch training the same (`bench/torch_cotrain.py`)
//! with its pair in the alternating loop (a step of one, then of the other), eagerly and as one CUDA graph, in
//! fp32, tf32 and bf16.
//!
//! The models, defined once on each side: the CNN of [`crate::cnn`] on a batch of 128 images 3x64x64; the text
//! classifier, token ids `[128, 200]` (documents of 200 tokens) of a 30,000-token vocabulary, a 30,000 x 256
//! embedding bag (each document the mean of its tokens' vectors; PyTorch's `nn.EmbeddingBag(mode="mean")`), a
//! linear 256→10; both cross-entropy, Adam 1e-3; each on one fixed batch resident on the device. cohort's pair
//! steps the two in turn when eager; as graphs it replays both on concurrent streams, as it does for any members.
//! Rates are model-steps/s (a pair step is two); the peak per member is the tenants' over the models, PyTorch's
//! `max_memory_allocated()` over them. GPU-only.

use std::path::Path;

use anyhow::{Context, Result};
use cohort_alloc::TenantId;
use cohort_autograd::ModelSpec;
use cohort_tensor::{Device, Precision, Tensor, memory};
use serde_json::{Value, json};

use crate::cnn::{CNN, PRECISIONS};
use crate::cohort::{self, Trainee};
use crate::workload::{self, Job, Table, Timing};

/// Shapes and timing, passed as they are to the PyTorch script so both sides run the same.
struct Workload {
    batch: usize,
    /// Images are `side` x `side`.
    side: usize,
    /// Tokens per document.
    doc: usize,
    vocab: usize,
    dim: usize,
    timing: Timing,
}

/// One of the two models: its spec, its per-example input shape and its fixed batch.
struct Model {
    name: &'static str,
    spec: ModelSpec,
    input: Vec<usize>,
    x: Tensor,
    y: Tensor,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        Workload {
            batch: 128,
            side: 64,
            doc: 200,
            vocab: 30_000,
            dim: 256,
            timing: Timing::new(quick),
        }
    }

    /// The text classifier (PyTorch's is `text()` in `bench/torch_cotrain.py`).
    fn text_spec(&self) -> String {
        format!(
            "layers = [{{ embedding_bag = {}, vocab = {} }}, {{ linear = {} }}]",
            self.dim,
            self.vocab,
            cohort::CLASSES
        )
    }

    /// The two models with their batches, made under `tenant`.
    fn models(&self, device: Device, tenant: TenantId) -> Result<Vec<Model>> {
        memory::with_tenant(tenant, || {
            let (images, classes) = cohort::images(self.batch, self.side, device)?;
            let ids: Vec<i32> = (0..self.batch * self.doc)
                .map(|i| ((i * 7919 + 13) % self.vocab) as i32)
                .collect();
            let docs = Tensor::from_vec(ids, &[self.batch, self.doc], &device)?;
            Ok(vec![
                Model {
                    name: "cnn",
                    spec: ModelSpec::from_toml(CNN)?,
                    input: vec![3, self.side, self.side],
                    x: images,
                    y: classes,
                },
                Model {
                    name: "text",
                    spec: ModelSpec::from_toml(&self.text_spec())?,
                    input: vec![self.doc],
                    x: docs,
                    y: cohort::labels(self.batch, cohort::CLASSES, device)?,
                },
            ])
        })
    }

    fn script_args(&self) -> Vec<String> {
        let mut args = workload::flags(&[
            ("--batch", self.batch.to_string()),
            ("--side", self.side.to_string()),
            ("--doc", self.doc.to_string()),
            ("--vocab", self.vocab.to_string()),
            ("--dim", self.dim.to_string()),
        ]);
        args.extend(self.timing.script_args());
        args
    }
}

/// The text classifier and its batch as the part trains them: its spec, its per-example input shape, the token ids and
/// the labels (for `cargo xtask profile`).
pub(crate) fn text_model(device: Device) -> Result<(ModelSpec, Vec<usize>, Tensor, Tensor)> {
    let text = Workload::new(true)
        .models(device, TenantId::DEFAULT)?
        .into_iter()
        .find(|m| m.name == "text")
        .context("the part has a text model")?;
    Ok((text.spec, text.input, text.x, text.y))
}

/// The part's report: our rows, and the reference's JSON (or why there is none); `script` as [`crate::cnn::run`]'s.
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if let Some(skipped) = workload::gpu_only("cotrain", device) {
        return Ok(skipped);
    }
    let w = Workload::new(quick);
    println!(
        "\ncotrain benchmark on {device}: the cnn part's CNN (batch {} of 3x{}x{}) and a text classifier \
         ({} x {} embedding bag over {}-token documents, batch {}, linear), each alone and as a pair",
        w.batch, w.side, w.side, w.vocab, w.dim, w.doc, w.batch
    );
    let mut ours = Vec::new();
    for p in PRECISIONS {
        for model in ["cnn", "text", "pair"] {
            for form in ["eager", "graph"] {
                ours.push(measure(device, p, model, form, &w).unwrap_or_else(|e| {
                    println!("cohort {p} {model} {form}: failed: {e:#}");
                    json!({ "precision": p.name(), "model": model, "form": form, "error": format!("{e:#}") })
                }));
            }
        }
    }
    let theirs = workload::reference_or_error(script, &w.script_args());
    print!("\n{}", Table::by_model().render(&ours, &theirs));
    let t = &w.timing;
    Ok(json!({
        "batch": w.batch, "side": w.side, "doc": w.doc, "vocab": w.vocab, "dim": w.dim,
        "warmup": t.warmup, "windows": t.windows, "window_s": t.window.as_secs_f64(),
        "cohort": ours, "pytorch": theirs,
    }))
}

/// One row: `model` (`cnn`, `text`, or `pair`: both) in `precision`, `eager` (the models stepped in turn) or
/// `graph` (their captured steps replayed together), with the peak per member where the step is eager.
fn measure(
    device: Device,
    precision: Precision,
    model: &str,
    form: &str,
    w: &Workload,
) -> Result<Value> {
    let tag = format!("cotrain-{precision}-{model}-{form}");
    let data = cohort::tenant(device, &format!("{tag}-data"))?;
    let models: Vec<Model> = w
        .models(device, data)?
        .into_iter()
        .filter(|m| model == "pair" || m.name == model)
        .collect();
    anyhow::ensure!(!models.is_empty(), "no model {model}: cnn, text or pair");
    let jobs: Vec<Job> = models
        .iter()
        .map(|m| Job {
            build: Box::new(move |tenant| {
                Trainee::from_spec(&m.spec, &m.input, 1, 0, device, tenant)
            }),
            x: &m.x,
            y: &m.y,
            members: 1,
        })
        .collect();
    let _policy = precision.enter();
    let label = format!("{precision} {model:<4} {form:<5}");
    let figures = workload::train_together(device, &w.timing, form, &tag, data, &jobs, &label)?;
    Ok(workload::row(
        json!({ "precision": precision.name(), "model": model, "form": form, "members": jobs.len() }),
        figures,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_gets_the_same_workload() {
        let w = Workload::new(true);
        assert_eq!(
            w.script_args().join(" "),
            "--batch 128 --side 64 --doc 200 --vocab 30000 --dim 256 --warmup 5 --windows 3 --window-s 0.25"
        );
        let spec = ModelSpec::from_toml(&w.text_spec()).unwrap();
        assert_eq!(
            spec.param_count(&[200]).unwrap(),
            30_000 * 256 + 256 * 10 + 10
        );
    }

    /// The cohort side on the CPU, shrunk: each model alone and the pair step eagerly (graphs need CUDA).
    #[test]
    fn cohort_side_steps_on_the_cpu() {
        let w = Workload {
            batch: 2,
            side: 8,
            doc: 5,
            vocab: 50,
            dim: 4,
            timing: Timing {
                warmup: 1,
                windows: 2,
                window: std::time::Duration::ZERO,
            },
        };
        for (model, n) in [("cnn", 1), ("text", 1), ("pair", 2)] {
            let row = measure(Device::Cpu, Precision::Fp32, model, "eager", &w).unwrap();
            assert_eq!(row["members"], n);
            assert!(row["model_steps_per_s"].as_f64().unwrap() > 0.0);
        }
        assert!(measure(Device::Cpu, Precision::Fp32, "pair", "graph", &w).is_err());
        assert!(measure(Device::Cpu, Precision::Fp32, "rnn", "eager", &w).is_err());
    }
}
