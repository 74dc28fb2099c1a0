//! The tuner's decisions as [`GemmChoices`]: exported for a run to save with its checkpoints, and adopted by the
//! process that resumes it, so that it runs every product it met before on the same algorithm without timing
//! anything again.

use cudarc::cublaslt::sys;

use super::{Choice, Desc, Entry, Key, Lt, MAX_WORKSPACE, Picked, thin};
use crate::conv::ConvChoices;
use crate::cuda::Gpu;
use crate::matmul::{GemmChoice, GemmChoices, GemmDecision, GemmDevice};
use crate::{Error, Result};

/// What `gpu`'s choices are valid for.
pub(crate) fn device(gpu: &Gpu) -> GemmDevice {
    // SAFETY: only tries to open the shared library; the version is read only where it opened.
    let version = if unsafe { sys::is_culib_present() } {
        // SAFETY: a plain query of the loaded library.
        unsafe { sys::cublasLtGetVersion() }
    } else {
        0
    };
    GemmDevice {
        name: gpu.name().to_string(),
        compute_capability: gpu.compute_capability(),
        sm_count: gpu.sm_count(),
        cublaslt_version: version as u64,
    }
}

impl Lt {
    /// Entries made, changed or adopted so far.
    pub(crate) fn decisions(&self) -> u64 {
        self.table.made()
    }

    /// Every decision, in a fixed order.
    pub(crate) fn choices(&self, gpu: &Gpu) -> GemmChoices {
        let mut entries: Vec<GemmChoice> = self
            .table
            .iter()
            .map(|(k, e)| GemmChoice {
                geometry: k.g,
                epilogue: k.epilogue,
                align: k.align,
                decision: match e {
                    Entry::Refused => GemmDecision::Refused,
                    Entry::Split(column) => GemmDecision::Split { column: *column },
                    Entry::Thin => GemmDecision::Thin,
                    Entry::Run(c) => GemmDecision::Algorithm {
                        algo: c.algo.data,
                        workspace: c.workspace,
                    },
                },
            })
            .collect();
        entries.sort_by_key(|e| (e.geometry, e.epilogue, e.align));
        GemmChoices {
            device: device(gpu),
            entries,
            convolutions: ConvChoices::default(),
        }
    }

    /// Takes `choices` for the geometries this state has not decided on yet (those it has keep their entry: work
    /// may be queued or captured on them), never to be timed; returns how many it took. An entry this cuBLASLt
    /// rejects is left out, and its geometry is chosen afresh when met.
    ///
    /// # Errors
    /// [`Error::ForeignGemmChoices`] when they were made on another device or cuBLASLt: none is taken.
    pub(crate) fn adopt(&mut self, gpu: &Gpu, choices: &GemmChoices) -> Result<usize> {
        let here = device(gpu);
        if choices.device != here {
            return Err(Error::ForeignGemmChoices {
                made_on: choices.device.to_string(),
                this: here.to_string(),
            });
        }
        let saved: Vec<_> = choices
            .entries
            .iter()
            .map(|c| {
                let key = Key {
                    g: c.geometry,
                    epilogue: c.epilogue,
                    align: c.align,
                };
                let entry = self.entry(&key, &c.decision).ok_or_else(|| {
                    format!("{:?} with {:?} ({:?})", c.geometry, c.epilogue, c.decision)
                });
                (key, entry)
            })
            .collect();
        Ok(self.table.adopt("gemm", saved))
    }

    /// The entry `decision` makes for `key`, where it can run.
    fn entry(&self, key: &Key, decision: &GemmDecision) -> Option<Entry> {
        match *decision {
            GemmDecision::Refused => Some(Entry::Refused),
            GemmDecision::Thin => thin::eligible(&key.g, &key.epilogue).then_some(Entry::Thin),
            GemmDecision::Split { column } => {
                (column > 0 && column < key.g.n).then_some(Entry::Split(column))
            }
            GemmDecision::Algorithm { algo, workspace } => {
                let desc = Desc::new(&key.g, &key.epilogue).ok()?;
                let algo = sys::cublasLtMatmulAlgo_t { data: algo };
                let need = desc.check(self.handle, &algo)?.workspaceSize;
                (need <= workspace && workspace <= MAX_WORKSPACE).then_some(Entry::Run(Choice {
                    desc,
                    algo,
                    workspace,
                    picked: Picked::Adopted,
                }))
            }
        }
    }
}
