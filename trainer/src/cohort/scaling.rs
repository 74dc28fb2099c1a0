//! An f16 unit's dynamic loss scaling as the trainer keeps it: the scaler on the unit's device, every step of it
//! queued there (so that the unit's steps replay as CUDA graphs), and the scale as the host last read it back, a
//! step's read arriving with its losses, from which skipped updates are counted and the scale is told.

use cohort_optim::{LossScale, LossScaler};
use cohort_tensor::Device;

use crate::error::Result;

/// The loss scaler of an f16 unit and its scale as last read back.
#[derive(Debug)]
pub(super) struct Scaling {
    pub(super) scaler: LossScaler,
    /// The scale after the newest step read back.
    pub(super) seen: LossScale,
}

impl Scaling {
    /// Scaling on `dev` going on from `start`.
    pub(super) fn new(start: LossScale, dev: &Device) -> Result<Scaling> {
        Ok(Scaling {
            scaler: LossScaler::new(start, dev)?,
            seen: start,
        })
    }

    /// Takes the state read back after a step ([`LossScaler::read_later`]); returns the updates skipped since the
    /// one read before.
    pub(super) fn took(&mut self, state: &[f32]) -> Result<u64> {
        let now = LossScale::from_state(state)?;
        let skipped = now.skipped.saturating_sub(self.seen.skipped);
        self.seen = now;
        Ok(skipped)
    }

    /// The scale now, its steps finished: for a checkpoint or a split, which must not lag the steps taken.
    pub(super) fn now(&self) -> Result<LossScale> {
        Ok(self.scaler.read()?)
    }
}
