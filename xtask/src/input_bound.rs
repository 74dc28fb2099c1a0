//! The input-bound check: a CPU-side pipeline feeding 4 members, the GPU's idle fraction with and without device
//! prefetch.

use anyhow::Result;
use cohort_tensor::Device;
use serde_json::{Value, json};

/// Measures the GPU's idle fraction while a CPU pipeline feeds four members (see the module docs).
pub fn run(device: Device, quick: bool) -> Result<Value> {
    Ok(json!({ "device": device.to_string(), "quick": quick, "measured": false }))
}
