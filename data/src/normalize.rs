//! Per-channel normalisation: `(x - mean) / std`, with the statistics given or measured on the training split.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::source::Examples;

/// A channel's mean and standard deviation, applied as `(x - mean) / std` (torchvision's `Normalize`).
///
/// A channel is the first dimension of an image's `[C, H, W]`, and each feature of a table's `[F]`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Normalize {
    /// Per channel.
    pub mean: Vec<f32>,
    /// Per channel, each positive.
    pub std: Vec<f32>,
}

/// Channels and values per channel of an example of `shape`.
fn channels(shape: &[usize]) -> (usize, usize) {
    match shape {
        [f] => (*f, 1),
        [c, rest @ ..] => (*c, rest.iter().product()),
        [] => (1, 1),
    }
}

impl Normalize {
    /// Statistics measured on the examples at `indices` (at most `sample` of them, evenly spaced), in parallel. A
    /// channel that never varies gets a standard deviation of 1, so that it passes through centred.
    ///
    /// # Errors
    /// When an example cannot be read, or `indices` is empty.
    pub fn measure(examples: &dyn Examples, indices: &[usize], sample: usize) -> Result<Normalize> {
        if indices.is_empty() {
            return Err(Error::InvalidArgument {
                op: "normalize",
                reason: "no training examples to measure the channels' statistics on".into(),
            });
        }
        let step = indices.len().div_ceil(sample.max(1));
        let picked: Vec<usize> = indices.iter().step_by(step).copied().collect();
        let (c, per) = channels(examples.shape());
        let sums = picked
            .par_iter()
            .map(|&i| -> Result<Vec<f64>> {
                let (x, _) = examples.example(i)?;
                let x = x.as_f32().unwrap_or(&[]);
                let mut s = vec![0.0; 2 * c];
                for (k, v) in x.iter().enumerate() {
                    let ch = (k / per) % c;
                    s[ch] += f64::from(*v);
                    s[c + ch] += f64::from(*v) * f64::from(*v);
                }
                Ok(s)
            })
            .try_reduce(
                || vec![0.0; 2 * c],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                    Ok(a)
                },
            )?;
        let n = (picked.len() * per) as f64;
        let mean: Vec<f64> = sums[..c].iter().map(|s| s / n).collect();
        let std = sums[c..]
            .iter()
            .zip(&mean)
            .map(|(sq, m)| {
                let var = (sq / n - m * m).max(0.0);
                if var > 1e-12 { var.sqrt() as f32 } else { 1.0 }
            })
            .collect();
        Ok(Normalize {
            mean: mean.into_iter().map(|m| m as f32).collect(),
            std,
        })
    }

    /// Checks that these statistics fit examples of `shape`.
    ///
    /// # Errors
    /// When the channel counts differ or a standard deviation is not positive.
    pub fn check(&self, shape: &[usize]) -> Result<()> {
        let (c, _) = channels(shape);
        let reason = if self.mean.len() != c || self.std.len() != c {
            format!(
                "{} means and {} standard deviations for examples of shape {shape:?}, which have {c} channels",
                self.mean.len(),
                self.std.len()
            )
        } else if let Some(s) = self.std.iter().find(|s| !(**s > 0.0 && s.is_finite())) {
            format!("a standard deviation of {s}: each must be positive")
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument {
            op: "normalize",
            reason,
        })
    }

    /// Normalises one example of `shape` in place.
    pub fn apply(&self, x: &mut [f32], shape: &[usize]) {
        let (c, per) = channels(shape);
        for (k, chunk) in x.chunks_mut(per).enumerate() {
            let ch = k % c;
            let (m, inv) = (self.mean[ch], 1.0 / self.std[ch]);
            chunk.iter_mut().for_each(|v| *v = (*v - m) * inv);
        }
    }
}
