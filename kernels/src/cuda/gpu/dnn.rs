//! The device's cuDNN state: its handle and the algorithm of each convolution, loaded on the first convolution;
//! or, where cuDNN is switched off or cannot be loaded, the one line that says so, and the own kernels.

use std::sync::Once;

use super::{Gpu, lock};
use crate::Result;
use crate::conv::cuda::cudnn_mode;
use crate::conv::cudnn::Dnn;
use crate::conv::{ConvChoices, CudnnMode};
use crate::cuda::GemmTuning;

/// cuDNN on one device.
pub(super) enum DnnSlot {
    /// No convolution has asked for it yet.
    Untried,
    /// It cannot be loaded here (said once).
    Absent,
    Ready(Dnn),
}

impl Gpu {
    /// Runs `f` with the device's cuDNN state, loading cuDNN on first use; `None` where it is switched off
    /// (`COHORT_CUDNN=0`) or cannot be loaded, which one line per process says, and the own kernels run.
    pub(crate) fn with_cudnn<R>(&self, f: impl FnOnce(&mut Dnn) -> Result<R>) -> Result<Option<R>> {
        if cudnn_mode() == CudnnMode::Off {
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    "cuDNN is switched off (COHORT_CUDNN=0): convolutions run on cohort's own kernels"
                )
            });
            return Ok(None);
        }
        let _turn = self.turn();
        self.bind()?;
        let mut slot = lock(&self.dnn);
        if matches!(*slot, DnnSlot::Untried) {
            *slot = match Dnn::load() {
                Ok(dnn) => {
                    tracing::debug!(
                        "cuda:{}: convolutions through cuDNN {}",
                        self.ordinal,
                        dnn.version()
                    );
                    DnnSlot::Ready(dnn)
                }
                Err(why) => {
                    static SAID: Once = Once::new();
                    SAID.call_once(|| {
                        tracing::warn!(
                            "cuDNN is not used ({why}): convolutions run on cohort's own kernels (im2col and \
                             cuBLAS: slower, and they need more memory); install cuDNN 9 (NVIDIA's libcudnn9 \
                             package for your CUDA, or pip's nvidia-cudnn-cu13) so that libcudnn.so.9 is on the \
                             library path (ldconfig or LD_LIBRARY_PATH)"
                        )
                    });
                    DnnSlot::Absent
                }
            };
        }
        match &mut *slot {
            DnnSlot::Ready(dnn) => f(dnn).map(Some),
            _ => Ok(None),
        }
    }

    /// The cuDNN this device's convolutions run through, as `cudnnGetVersion()` gives it (91400 for 9.14.0),
    /// loading it if no convolution has yet; `None` where it is switched off or cannot be loaded (the own kernels
    /// run the convolutions).
    pub fn cudnn_version(&self) -> Option<usize> {
        self.with_cudnn(|dnn| Ok(dnn.version())).ok().flatten()
    }

    /// Every convolution decided on so far and how it runs (empty where cuDNN is not in use).
    pub(super) fn conv_choices(&self) -> ConvChoices {
        match &*lock(&self.dnn) {
            DnnSlot::Ready(dnn) => dnn.choices(),
            _ => ConvChoices::default(),
        }
    }

    /// Takes saved convolution choices for every pass and geometry not decided on yet; what it took, or why
    /// nothing, is logged: product choices were adopted already, and stay adopted whatever happens here.
    pub(super) fn adopt_conv_choices(&self, choices: &ConvChoices) {
        let saved = choices.entries.len();
        if saved == 0 {
            return;
        }
        match self.with_cudnn(|dnn| Ok(dnn.adopt(choices))) {
            Ok(Some(adopted)) => {
                tracing::info!("{adopted} of {saved} saved convolution choices adopted")
            }
            Ok(None) => tracing::warn!(
                "{saved} saved convolution choices not used: cuDNN is not in use here, the own kernels run"
            ),
            Err(e) => tracing::warn!("{saved} saved convolution choices not used: {e}"),
        }
    }

    /// Convolution decisions made, changed or adopted so far.
    pub(super) fn conv_decisions(&self) -> u64 {
        match &*lock(&self.dnn) {
            DnnSlot::Ready(dnn) => dnn.decisions(),
            _ => 0,
        }
    }

    /// The convolutions tuned since the last call.
    pub(super) fn take_conv_report(&self) -> Vec<GemmTuning> {
        match &mut *lock(&self.dnn) {
            DnnSlot::Ready(dnn) => dnn.take_report(),
            _ => Vec::new(),
        }
    }
}
