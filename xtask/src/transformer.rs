//! The `transformer` part of `cargo xtask bench`: 4-layer causal Transformer language models as a grid of attention
//! heads × width (heads {2, 4} × width {128, 256}, the largest the brief's width 256 with 4 heads), trained in one
//! process on one GPU: each member alone, and the grid of four in cohort's loop (their shapes differ, so they do
//! not fuse), eagerly and replayed as CUDA graphs, beside PyTorch training the same models the same ways
//! (`bench/torch_transformer.py`, eagerly and with the whole step, or the whole grid's loop, as one CUDA graph),
//! in fp32, tf32 and bf16.
//!
//! The model, defined once on each side (here as a cohort model spec, there as `nn.Module`s): token ids `[32,
//! 128]` of a 256-symbol vocabulary; an embedding of width D; learned positions; 4 pre-norm blocks (layer norm,
//! causal multi-head self-attention with one fused query/key/value projection and an output projection, both with
//! biases; layer norm, linear D→4D, GELU (tanh), linear 4D→D; each added to its input), a final layer norm and a
//! linear D→256 scoring the next token at every position; cross-entropy over all 32 × 128 positions; Adam 1e-3. No
//! dropout. One fixed batch lives on the device. Rates are model-steps/s (a grid step is four of them), timing as
//! the [`workload`] module says; the peak per member is the tenants' over the members, PyTorch's
//! `max_memory_allocated()` over them. GPU-only.

use std::path::Path;

use anyhow::Result;
use cohort_autograd::ModelSpec;
use cohort_tensor::{Device, Precision, Tensor, memory};
use serde_json::{Value, json};

use crate::cnn::PRECISIONS;
use crate::cohort::{self, Trainee};
use crate::workload::{self, Job, Table, Timing};

/// A member of the grid: attention heads and width.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Member {
    heads: usize,
    width: usize,
}

impl Member {
    /// `h4-d256`, as PyTorch's script names it too.
    fn name(self) -> String {
        format!("h{}-d{}", self.heads, self.width)
    }
}

/// Shapes and timing, passed as they are to the PyTorch script so both sides run the same.
struct Workload {
    batch: usize,
    seq: usize,
    vocab: usize,
    layers: usize,
    grid: Vec<Member>,
    timing: Timing,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        let grid = [128, 256]
            .into_iter()
            .flat_map(|width| [2, 4].map(|heads| Member { heads, width }))
            .collect();
        Workload {
            batch: 32,
            seq: 128,
            vocab: 256,
            layers: 4,
            grid,
            timing: Timing::new(quick),
        }
    }

    /// The spec of one member (PyTorch's is `LM` in `bench/torch_transformer.py`).
    fn spec(&self, m: Member) -> String {
        let block = format!("{{ transformer = {}, causal = true }}, ", m.heads);
        format!(
            "layers = [{{ embedding = {}, vocab = {} }}, {{ positional = {} }}, {}{{ layernorm = true }}, \
             {{ linear = {} }}]",
            m.width,
            self.vocab,
            self.seq,
            block.repeat(self.layers),
            self.vocab
        )
    }

    /// The widest member, with the most heads of that width (h4-d256).
    fn widest(&self) -> Member {
        *self
            .grid
            .iter()
            .max_by_key(|m| (m.width, m.heads))
            .expect("the grid has members")
    }

    /// The fixed batch: token ids spread over the vocabulary, the labels another such sequence (the rate does not
    /// depend on them).
    fn batch_on(&self, device: Device) -> Result<(Tensor, Tensor)> {
        let tokens = self.batch * self.seq;
        let ids: Vec<i32> = (0..tokens)
            .map(|i| ((i * 7919 + 13) % self.vocab) as i32)
            .collect();
        let x = Tensor::from_vec(ids, &[self.batch, self.seq], &device)?;
        let y = cohort::labels(tokens, self.vocab, device)?.reshape(&[self.batch, self.seq])?;
        Ok((x, y))
    }

    fn script_args(&self) -> Vec<String> {
        let list = |f: fn(&Member) -> usize| {
            let mut v: Vec<usize> = self.grid.iter().map(f).collect();
            v.sort_unstable();
            v.dedup();
            v.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        };
        let mut args = workload::flags(&[
            ("--batch", self.batch.to_string()),
            ("--seq", self.seq.to_string()),
            ("--vocab", self.vocab.to_string()),
            ("--layers", self.layers.to_string()),
            ("--heads", list(|m| m.heads)),
            ("--widths", list(|m| m.width)),
        ]);
        args.extend(self.timing.script_args());
        args
    }
}

/// The grid's widest member, with the most heads of that width (h4-d256), its input shape and the part's batch, for
/// `xtask profile`.
pub(crate) fn widest_model(device: Device) -> Result<(ModelSpec, Vec<usize>, Tensor, Tensor)> {
    let w = Workload::new(true);
    let m = w.widest();
    let (x, y) = w.batch_on(device)?;
    Ok((ModelSpec::from_toml(&w.spec(m))?, vec![w.seq], x, y))
}

/// The part's report: our rows, and the reference's JSON (or why there is none); `script` as [`crate::cnn::run`]'s.
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if let Some(skipped) = workload::gpu_only("transformer", device) {
        return Ok(skipped);
    }
    let w = Workload::new(quick);
    let names: Vec<String> = w.grid.iter().map(|m| m.name()).collect();
    println!(
        "\ntransformer benchmark on {device}: {}-layer causal LM, sequence {}, vocabulary {}, batch {}, Adam; grid {}",
        w.layers,
        w.seq,
        w.vocab,
        w.batch,
        names.join(" ")
    );
    let mut ours = Vec::new();
    for p in PRECISIONS {
        let groups = w.grid.iter().map(|m| (m.name(), vec![*m]));
        for (model, members) in groups.chain([("grid".to_string(), w.grid.clone())]) {
            for form in ["eager", "graph"] {
                ours.push(measure(device, p, &model, &members, form, &w).unwrap_or_else(|e| {
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
        "batch": w.batch, "seq": w.seq, "vocab": w.vocab, "layers": w.layers, "grid": names,
        "warmup": t.warmup, "windows": t.windows, "window_s": t.window.as_secs_f64(),
        "cohort": ours, "pytorch": theirs,
    }))
}

/// One row: `members` (one alone, or the grid in cohort's loop) in `precision`, `eager` or `graph`, on one fixed
/// batch, in model-steps/s and tokens/s, with the peak per member where the step is eager.
fn measure(
    device: Device,
    precision: Precision,
    model: &str,
    members: &[Member],
    form: &str,
    w: &Workload,
) -> Result<Value> {
    let specs = members
        .iter()
        .map(|m| Ok(ModelSpec::from_toml(&w.spec(*m))?))
        .collect::<Result<Vec<_>>>()?;
    let tag = format!("transformer-{precision}-{model}-{form}");
    let data = cohort::tenant(device, &format!("{tag}-data"))?;
    let tokens = w.batch * w.seq;
    let (x, y) = memory::with_tenant(data, || w.batch_on(device))?;
    let jobs: Vec<Job> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Job {
            build: Box::new(move |tenant| {
                Trainee::from_spec(spec, &[w.seq], 1, i as u64, device, tenant)
            }),
            x: &x,
            y: &y,
            members: 1,
        })
        .collect();
    let _policy = precision.enter();
    let label = format!("{precision} {model:<8} {form:<5}");
    let figures = workload::train_together(device, &w.timing, form, &tag, data, &jobs, &label)?;
    let model_steps = figures["model_steps_per_s"].as_f64().unwrap_or(f64::NAN);
    Ok(workload::row(
        json!({
            "precision": precision.name(), "model": model, "form": form, "members": members.len(),
            "tokens_per_s": model_steps * tokens as f64,
        }),
        figures,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_gets_the_same_workload() {
        let w = Workload::new(true);
        let names: Vec<String> = w.grid.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["h2-d128", "h4-d128", "h2-d256", "h4-d256"]);
        assert_eq!(
            w.script_args().join(" "),
            "--batch 32 --seq 128 --vocab 256 --layers 4 --heads 2,4 --widths 128,256 --warmup 5 --windows 3 \
             --window-s 0.25"
        );
    }

    #[test]
    fn the_profiled_member_is_h4_d256_on_the_parts_batch() {
        let (spec, input, x, y) = widest_model(Device::Cpu).unwrap();
        assert_eq!(Workload::new(true).widest().name(), "h4-d256");
        assert_eq!(input, [128]);
        assert_eq!(
            spec.shapes(&input).unwrap().last().unwrap().dims(),
            [128, 256]
        );
        assert_eq!((x.shape(), y.shape()), (&[32, 128][..], &[32, 128][..]));
    }

    #[test]
    fn spec_is_a_four_block_causal_lm() {
        let w = Workload::new(true);
        let spec = ModelSpec::from_toml(&w.spec(Member {
            heads: 4,
            width: 256,
        }))
        .unwrap();
        assert_eq!(spec.layers.len(), 2 + 4 + 2);
        assert_eq!(
            spec.shapes(&[128]).unwrap().last().unwrap().dims(),
            [128, 256]
        );
        // embedding + positions, 4 blocks of (4 D^2 + 4 D) + (8 D^2 + 5 D) + 4 D, final norm, head
        let d = 256;
        let block = 12 * d * d + 13 * d;
        let expected = 256 * d + 128 * d + 4 * block + 2 * d + d * 256 + 256;
        assert_eq!(spec.param_count(&[128]).unwrap(), expected);
    }

    /// The cohort side on the CPU, shrunk: a member alone and a grid of two step, eagerly (graphs need CUDA).
    #[test]
    fn cohort_side_steps_on_the_cpu() {
        let w = Workload {
            batch: 2,
            seq: 8,
            vocab: 16,
            layers: 2,
            grid: vec![
                Member { heads: 2, width: 8 },
                Member {
                    heads: 1,
                    width: 16,
                },
            ],
            timing: Timing {
                warmup: 1,
                windows: 2,
                window: std::time::Duration::ZERO,
            },
        };
        for members in [&w.grid[..1], &w.grid[..]] {
            let row = measure(Device::Cpu, Precision::Fp32, "m", members, "eager", &w).unwrap();
            assert_eq!(row["members"], members.len());
            assert!(row["model_steps_per_s"].as_f64().unwrap() > 0.0);
            assert!(row["peak_bytes_per_member"].is_null());
        }
        assert!(measure(Device::Cpu, Precision::Fp32, "m", &w.grid, "graph", &w).is_err());
    }
}
