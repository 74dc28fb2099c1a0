//! A model of one's own in a cohort: a hand-written gated MLP (a Rust `Module`) trains beside an MLP written in the
//! config, in one process, each with its own optimizer, memory budget, checkpoints and logs.
//!
//! ```text
//! cargo run --release --example own_model [-- STEPS]
//! ```

use cohort_autograd::nn::{Features, Linear, Module};
use cohort_autograd::{BuildOptions, Model, Param, Result, Tape};
use cohort_tensor::{DType, Device};
use cohort_trainer::cohort::{RunOptions, train};
use cohort_trainer::config::Config;
use cohort_trainer::models::Models;

/// `out(tanh(hidden(x)) * sigmoid(gate(x)))`, for `M` members at once like every layer of `cohort_autograd::nn`.
#[derive(Debug)]
struct GatedMlp {
    hidden: Linear,
    gate: Linear,
    out: Linear,
}

impl GatedMlp {
    fn new(
        inp: usize,
        width: usize,
        classes: usize,
        seeds: &[u64],
        dtype: DType,
        dev: &Device,
    ) -> Result<Self> {
        // Each layer its own seeds, so that member m starts the same whatever the number of members.
        let salted = |salt: u64| {
            seeds
                .iter()
                .map(|s| s.wrapping_mul(31).wrapping_add(salt))
                .collect::<Vec<_>>()
        };
        Ok(GatedMlp {
            hidden: Linear::new(inp, width, true, 1.0, &salted(1), dtype, dev)?,
            gate: Linear::new(inp, width, true, 1.0, &salted(2), dtype, dev)?,
            out: Linear::new(width, classes, true, 1.0, &salted(3), dtype, dev)?,
        })
    }
}

impl Module for GatedMlp {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let h = self.hidden.forward(tape, x.clone())?.var.tanh()?;
        let g = self.gate.forward(tape, x)?.var.sigmoid()?;
        self.out.forward(tape, Features::members(h.mul(&g)?))
    }

    fn params(&self) -> Vec<(String, Param)> {
        let mut v = Vec::new();
        for (layer, name) in [
            (&self.hidden, "hidden"),
            (&self.gate, "gate"),
            (&self.out, "out"),
        ] {
            v.extend(
                layer
                    .params()
                    .into_iter()
                    .map(|(n, p)| (format!("{name}.{n}"), p)),
            );
        }
        v
    }

    fn kind(&self) -> &'static str {
        "gated_mlp"
    }
}

/// The data, one config member, and the custom member that names the registered model.
const CONFIG: &str = r#"
[run]
name = "own-model"
epochs = 1

[data.mnist]
source = { idx = "data/mnist" }

[[member]]
name = "mlp"
model = { layers = [{ linear = 64, act = "relu" }, { linear = 10 }] }
optimizer = { adam = { lr = 1e-3 } }

[[member]]
name = "gated"
model = { custom = "gated-mlp" }
optimizer = { adamw = { lr = 2e-3 } }
memory = { limit = "256MiB" }
"#;

fn main() -> anyhow::Result<()> {
    let mut config = Config::parse(CONFIG, "examples/own_model.rs")?;
    if let Some(steps) = std::env::args().nth(1) {
        config = config.with_run_override("steps", toml::Value::Integer(steps.parse()?))?;
    }
    let models = Models::new().with("gated-mlp", |data: &[usize], opts: &BuildOptions| {
        let inp = data.iter().product();
        let net = GatedMlp::new(inp, 64, 10, &opts.seeds, opts.dtype, &opts.device)?;
        Ok(Model::new(
            net,
            &[inp],
            &[10],
            opts.seeds.len(),
            opts.dtype,
            opts.device,
        ))
    });
    let outcome = train(
        config,
        RunOptions {
            progress: true,
            models,
            ..RunOptions::default()
        },
    )?;
    for m in outcome.summary.iter().flat_map(|s| &s.members) {
        println!(
            "{:8} steps {:5}  final loss {:.4}  test accuracy {:.3}",
            m.name,
            m.steps,
            m.final_loss,
            m.test_accuracy.unwrap_or(f64::NAN)
        );
    }
    println!("run directory: {}", outcome.run_dir.display());
    Ok(())
}
