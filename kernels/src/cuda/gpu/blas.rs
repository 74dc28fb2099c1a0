//! The device's cuBLAS handle (with its own workspace) and its cuBLASLt state.

use cudarc::cublas::{result as blas_result, sys as blas_sys};

use std::ffi::c_void;

use super::{DeviceBuffer, Gpu, ON_SIDE, cuda_err, lock};
use crate::conv::ConvChoices;
use crate::cuda::GemmTuning;
use crate::matmul::GemmChoices;
use crate::matmul::lt::{self, Lt};
use crate::{Error, Result};

/// A cuBLAS handle with its own workspace (as PyTorch gives each handle: without one, cuBLAS
/// manages a workspace itself on every call).
pub(super) struct Blas(blas_sys::cublasHandle_t, DeviceBuffer);

/// Bytes of the cuBLAS workspace (PyTorch's default on Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;
/// Bytes of the cuBLAS workspace of work on the side stream or in a graph (a scratch area each).
const SIDE_BLAS_WORKSPACE: usize = 4 << 20;

// SAFETY: the handle is only used under the Gpu's mutex, one thread at a time.
unsafe impl Send for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by cublasCreate and is destroyed once.
        let _ = unsafe { blas_result::destroy_handle(self.0) };
    }
}

impl Gpu {
    /// Runs `f` with the device's cuBLASLt state (created on first use).
    pub(crate) fn with_lt<R>(&self, f: impl FnOnce(&mut Lt) -> Result<R>) -> Result<R> {
        let _turn = self.turn();
        self.bind()?;
        let mut guard = lock(&self.lt);
        let lt = match &mut *guard {
            Some(lt) => lt,
            empty => empty.insert(Lt::new()?),
        };
        f(lt)
    }

    /// The f32 product geometries, and the convolutions' passes (labelled `cudnn ...`), tuned since the last call:
    /// each one's candidates, the heuristic's pick and the fastest, timed on the device.
    pub fn gemm_tuning(&self) -> Vec<GemmTuning> {
        let mut report = lock(&self.lt)
            .as_mut()
            .map(Lt::take_report)
            .unwrap_or_default();
        report.extend(self.take_conv_report());
        report
    }

    /// Every f32 product geometry decided on so far and how it runs (the algorithms tuning picked), and every
    /// convolution's cuDNN algorithm ([`GemmChoices::convolutions`]), to save with a run: adopted by the process
    /// that resumes it ([`Gpu::adopt_gemm_choices`]), they make it run each product and convolution as before,
    /// where timing afresh could pick another algorithm, with other rounding.
    pub fn gemm_choices(&self) -> GemmChoices {
        let mut choices = match &*lock(&self.lt) {
            Some(lt) => lt.choices(self),
            None => GemmChoices {
                device: lt::device(self),
                entries: Vec::new(),
                convolutions: ConvChoices::default(),
            },
        };
        choices.convolutions = self.conv_choices();
        choices
    }

    /// Takes saved [`GemmChoices`] for every geometry not decided on yet, never to time them; returns how many
    /// product entries it took. The convolutions' choices they carry are adopted too, where cuDNN is in use and
    /// of the version that made them (the log says how many, or why none): a convolution that cannot be adopted
    /// is chosen afresh, and costs the products nothing. Adopt before the first product: geometries decided on
    /// already keep their entry.
    ///
    /// # Errors
    /// [`Error::ForeignGemmChoices`] when they were made on another device or cuBLASLt version (nothing is
    /// adopted, the convolutions neither; all are chosen afresh); cuBLASLt missing.
    pub fn adopt_gemm_choices(&self, choices: &GemmChoices) -> Result<usize> {
        let products = self.with_lt(|lt| lt.adopt(self, choices))?;
        self.adopt_conv_choices(&choices.convolutions);
        Ok(products)
    }

    /// A count that grows whenever a geometry (of a product or a convolution) is decided on, re-decided or
    /// adopted: [`Gpu::gemm_choices`] can only differ from what it returned when this count differs too, so a run
    /// writes them only then.
    pub fn gemm_choice_count(&self) -> u64 {
        lock(&self.lt).as_ref().map_or(0, Lt::decisions) + self.conv_decisions()
    }

    /// Runs `f` with the device's cuBLAS handle (created on first use), bound to the stream this
    /// thread's work goes to and to a workspace no other stream or graph uses meanwhile.
    pub(crate) fn with_blas<R>(
        &self,
        f: impl FnOnce(blas_sys::cublasHandle_t) -> Result<R>,
    ) -> Result<R> {
        let _turn = self.turn();
        self.bind()?;
        let mut guard = lock(&self.blas);
        let blas = match &mut *guard {
            Some(b) => b,
            empty => {
                // SAFETY: only tries to open the shared library.
                if !unsafe { blas_sys::is_culib_present() } {
                    return Err(Error::Cuda(
                        "cuBLAS (libcublas.so.13) was not found: install the CUDA 13 toolkit's \
                         cuBLAS or put its lib folder on LD_LIBRARY_PATH"
                            .to_string(),
                    ));
                }
                let workspace = self.alloc(BLAS_WORKSPACE)?;
                let handle =
                    blas_result::create_handle().map_err(|e| cuda_err("cublasCreate", e))?;
                empty.insert(Blas(handle, workspace))
            }
        };
        let (handle, own) = (blas.0, blas.1.ptr());
        // SAFETY: the handle is live; every stream of this Gpu outlives it.
        unsafe { blas_result::set_stream(handle, self.stream().cu_stream() as _) }
            .map_err(|e| cuda_err("cublasSetStream", e))?;
        let set_workspace = |ws: u64, bytes: usize| {
            // SAFETY: the handle is live; `ws` holds `bytes` bytes for the work queued next.
            unsafe { blas_sys::cublasSetWorkspace_v2(handle, ws as *mut c_void, bytes) }
                .result()
                .map_err(|e| cuda_err("cublasSetWorkspace", e))
        };
        if !ON_SIDE.get() && !self.is_capturing() {
            // cuBLAS may pick its kernel by the workspace it has: deterministic mode gives it the same size as
            // on the side stream and in graphs, so that a product runs alike wherever it runs.
            let bytes = if crate::deterministic() {
                SIDE_BLAS_WORKSPACE
            } else {
                BLAS_WORKSPACE
            };
            set_workspace(own, bytes)?;
            return f(handle);
        }
        // The side stream's work, and a graph's (whose replays may run beside other graphs'),
        // must not share the compute stream's workspace: they take their own scratch area.
        self.with_scratch(SIDE_BLAS_WORKSPACE, |ws| {
            set_workspace(ws, SIDE_BLAS_WORKSPACE)?;
            f(handle)
        })
    }
}
