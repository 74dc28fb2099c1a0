//! `tuning.json`: the choices a GPU run made by timing (today cuBLASLt's algorithm for each product geometry), kept
//! in the run directory so that a resumed run makes the ones the interrupted run made instead of timing afresh,
//! where noise may pick another algorithm and so other rounding. It is written before every checkpoint, so every
//! checkpoint on disk has the choices its steps ran on, and at each memory tick when new choices were made.
//! With `[run] deterministic = true` nothing is chosen by timing and the file only records the heuristics' picks.

use std::path::{Path, PathBuf};

use cohort_tensor::Device;

use crate::error::{Error, Result};

/// The file's name in a run directory.
pub const FILE: &str = "tuning.json";

/// The run's tuning file and how many choices it holds.
#[derive(Debug)]
pub(crate) struct TuningFile {
    path: PathBuf,
    ordinal: Option<usize>,
    saved: u64,
}

impl TuningFile {
    /// The tuning file of the run in `root` on `device` (on the CPU nothing is tuned and nothing written).
    pub(crate) fn new(root: &Path, device: Device) -> TuningFile {
        TuningFile {
            path: root.join(FILE),
            ordinal: match device {
                Device::Cuda(n) => Some(n),
                Device::Cpu => None,
            },
            saved: 0,
        }
    }

    /// On a resume: adopts the choices the file holds, so the products that ran before run the same way again.
    /// Returns what to tell the user: how many were adopted, or why none were (the file names another GPU or
    /// library version, or cannot be read) and that the products are tuned afresh.
    pub(crate) fn adopt(&mut self) -> Option<String> {
        let ordinal = self.ordinal?;
        let text = std::fs::read_to_string(&self.path).ok()?;
        let adopted = serde_json::from_str::<cohort_tensor::GemmChoices>(&text)
            .map_err(|e| format!("it does not parse ({e})"))
            .and_then(|c| {
                cohort_tensor::cuda::adopt_gemm_choices(ordinal, &c).map_err(|e| e.to_string())
            });
        match adopted {
            Ok(n) => {
                self.saved = cohort_tensor::cuda::gemm_choice_count(ordinal).unwrap_or(0);
                Some(format!(
                    "{n} product algorithm choices taken from {}: the resumed steps run as the interrupted ones did",
                    self.path.display()
                ))
            }
            Err(why) => Some(format!(
                "warning: {} not used: {why}; products are tuned afresh, so a resumed run may round differently",
                self.path.display()
            )),
        }
    }

    /// Writes the file when choices were made since it was last written.
    ///
    /// # Errors
    /// The file cannot be written (a full disk, a read-only folder).
    pub(crate) fn save(&mut self) -> Result<()> {
        let Some(ordinal) = self.ordinal else {
            return Ok(());
        };
        let count = cohort_tensor::cuda::gemm_choice_count(ordinal)?;
        if count == self.saved {
            return Ok(());
        }
        let choices = cohort_tensor::cuda::gemm_choices(ordinal)?;
        let text =
            serde_json::to_vec_pretty(&choices).map_err(|e| Error::json("tuning choices", e))?;
        crate::checkpoint::write_atomic(&self.path, &text)?;
        self.saved = count;
        Ok(())
    }
}
