//! The `attention` part of `cargo xtask bench`: the fused self-attention kernel alone, forward and backward, beside
//! PyTorch's `scaled_dot_product_attention` on the same packed projection (`bench/torch_attention.py`: its fused
//! kernel, and its unfused math backend), in fp32, tf32 (ours on tensor cores in TF32, PyTorch's with its TF32 flags
//! on) and bf16 (autocast, where PyTorch's SDPA runs its flash kernels and ours its tensor-core ones), at sequence lengths 128 to 2,048 with the same number of tokens
//! (16,384), 4 causal heads of width 64. A call is one forward and one backward with a fixed output gradient; the
//! figure is calls per second, timed as the [`workload`] module says; the peak is the tenant's over the timed calls,
//! the inputs included, as PyTorch's `max_memory_allocated()` is. GPU-only.

use std::path::Path;

use anyhow::Result;
use cohort_tensor::{AttentionMask, DType, Device, Precision, Tensor, memory};
use serde_json::{Value, json};

use crate::cohort;
use crate::workload::{self, Table, Timing};

/// The precisions measured: attention's products in fp32 (3xTF32), TF32 or bf16, all on tensor cores.
const PRECISIONS: [Precision; 3] = [Precision::Fp32, Precision::Tf32, Precision::Bf16];

/// Shapes and timing, passed as they are to the PyTorch script.
struct Workload {
    tokens: usize,
    lens: Vec<usize>,
    heads: usize,
    head_dim: usize,
    timing: Timing,
}

impl Workload {
    fn new(quick: bool) -> Workload {
        Workload {
            tokens: 16384,
            lens: vec![128, 512, 2048],
            heads: 4,
            head_dim: 64,
            timing: Timing::new(quick),
        }
    }

    fn script_args(&self) -> Vec<String> {
        let lens: Vec<String> = self.lens.iter().map(usize::to_string).collect();
        let precisions: Vec<&str> = PRECISIONS.iter().map(|p| p.name()).collect();
        let mut args = workload::flags(&[
            ("--precisions", precisions.join(",")),
            ("--tokens", self.tokens.to_string()),
            ("--lens", lens.join(",")),
            ("--heads", self.heads.to_string()),
            ("--head-dim", self.head_dim.to_string()),
        ]);
        args.extend(self.timing.script_args());
        args
    }
}

/// The part's report: our rows, and the reference's JSON (or why there is none).
pub fn run(device: Device, quick: bool, script: Option<(&str, &Path)>) -> Result<Value> {
    if let Some(skipped) = workload::gpu_only("attention", device) {
        return Ok(skipped);
    }
    let w = Workload::new(quick);
    println!(
        "\nattention benchmark on {device}: causal, {} heads of width {}, {} tokens per call, forward + backward",
        w.heads, w.head_dim, w.tokens
    );
    let mut ours = Vec::new();
    for p in PRECISIONS {
        for &len in &w.lens {
            ours.push(measure(device, p, len, &w).unwrap_or_else(|e| {
                println!("cohort attention {p} L={len}: failed: {e:#}");
                json!({ "precision": p.name(), "len": len, "error": format!("{e:#}") })
            }));
        }
    }
    let theirs = workload::reference_or_error(script, &w.script_args());
    let table = Table {
        join: &["precision", "len"],
        shown: &["seqs"],
        rate: "calls_per_s",
        rate_header: "cohort calls/s",
        forms: &[("sdpa", "PyTorch SDPA"), ("math", "PyTorch math")],
        peak: "peak_bytes",
        peak_form: |_| "sdpa",
    };
    print!("\n{}", table.render(&ours, &theirs));
    Ok(json!({
        "tokens": w.tokens, "heads": w.heads, "head_dim": w.head_dim, "cohort": ours, "pytorch": theirs,
    }))
}

/// One length in one precision: `tokens / len` sequences, a forward and a backward call per step.
fn measure(device: Device, precision: Precision, len: usize, w: &Workload) -> Result<Value> {
    let seqs = (w.tokens / len).max(1);
    let width = w.heads * w.head_dim;
    let tenant = cohort::tenant(device, &format!("attention-{precision}-{len}"))?;
    let (qkv, dout) = memory::with_tenant(tenant, || -> Result<_> {
        Ok((
            Tensor::rand_normal(&[seqs, len, 3 * width], 0.0, 1.0, DType::F32, 1, &device)?,
            Tensor::rand_normal(&[seqs, len, width], 0.0, 1.0, DType::F32, 2, &device)?,
        ))
    })?;
    let mask = AttentionMask {
        causal: true,
        keys: None,
    };
    let _policy = precision.enter();
    let m = memory::with_tenant(tenant, || {
        w.timing.measure(device, &[tenant], || {
            let (out, lse) = qkv.attention(w.heads, mask)?;
            qkv.attention_backward(w.heads, mask, (&out, &lse), &dout)?;
            Ok(())
        })
    })?;
    println!(
        "cohort attention {precision} L={len:<5} {:9.1} calls/s{}",
        m.rate,
        m.peak
            .map(|p| format!("  peak {:.1} MiB", workload::mib(p as f64)))
            .unwrap_or_default()
    );
    Ok(json!({
        "precision": precision.name(), "len": len, "seqs": seqs, "calls_per_s": m.rate, "windows": m.windows,
        "peak_bytes": m.peak,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_gets_the_same_workload() {
        assert_eq!(
            Workload::new(true).script_args().join(" "),
            "--precisions fp32,tf32,bf16 --tokens 16384 --lens 128,512,2048 --heads 4 --head-dim 64 --warmup 5 \
             --windows 3 --window-s 0.25"
        );
    }

    /// The cohort side on the CPU, shrunk.
    #[test]
    fn cohort_side_runs_on_the_cpu() {
        let w = Workload {
            tokens: 64,
            lens: vec![16],
            heads: 2,
            head_dim: 4,
            timing: Timing {
                warmup: 1,
                windows: 1,
                window: std::time::Duration::ZERO,
            },
        };
        let row = measure(Device::Cpu, Precision::Bf16, 16, &w).unwrap();
        assert_eq!(row["seqs"], 4);
        assert!(row["calls_per_s"].as_f64().unwrap() > 0.0);
    }
}
