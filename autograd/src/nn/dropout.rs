use std::sync::atomic::{AtomicU64, Ordering};

use cohort_tensor::Tensor;
use serde::Serialize;

use super::{Features, Module, mix};
use crate::spec::{Fields, SpecResult};
use crate::{Error, Param, Result, Tape, Var};

/// Zeroes each value with probability `p` while training (scaling the rest by `1 / (1 - p)`); identity in eval
/// mode. Seeded: the n-th training call of a layer draws the same mask in every run.
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    seed: u64,
    calls: AtomicU64,
}

impl Dropout {
    /// Dropout with rate `p` in `[0, 1)`.
    ///
    /// # Errors
    /// When `p` is outside `[0, 1)`.
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Shape {
                op: "dropout",
                reason: format!("rate {p} outside [0, 1)"),
            });
        }
        Ok(Dropout {
            p,
            seed,
            calls: AtomicU64::new(0),
        })
    }

    /// How many masks were drawn (part of a checkpoint's RNG state).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Continues the mask sequence from `calls` (when resuming).
    pub fn set_calls(&self, calls: u64) {
        self.calls.store(calls, Ordering::Relaxed);
    }
}

impl Module for Dropout {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        if !tape.is_training() || self.p == 0.0 {
            return Ok(x);
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let v = x.var.value();
        let u = Tensor::rand_uniform(
            v.shape(),
            0.0,
            1.0,
            v.dtype(),
            mix(self.seed, n),
            &v.device(),
        )?;
        let keep = u.gt_scalar(self.p)?.mul_scalar(1.0 / (1.0 - self.p))?;
        Ok(x.keep_mask(x.var.mul(&Var::constant(keep))?, x.layout))
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn set_masks_drawn(&self, n: u64) {
        self.set_calls(n);
    }

    fn kind(&self) -> &'static str {
        "dropout"
    }
}

/// `{ dropout = P }`: zero each value with probability `P` while training.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DropoutSpec {
    /// The rate, in `[0, 1)`.
    pub p: f64,
}

impl DropoutSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<DropoutSpec> {
        let p = f.f64("dropout")?.unwrap_or(0.0);
        if !(0.0..1.0).contains(&p) {
            return Err(f.error("dropout", format!("expected a rate in [0, 1), found {p}")));
        }
        Ok(DropoutSpec { p })
    }
}
