//! The device's cuBLAS handle (with its own workspace) and its cuBLASLt state.

use cudarc::cublas::{result as blas_result, sys as blas_sys};

use std::ffi::c_void;

use super::{DeviceBuffer, Gpu, ON_SIDE, cuda_err, lock};
use crate::cuda::GemmTuning;
use crate::matmul::lt::Lt;
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

    /// The f32 product geometries tuned since the last call: each one's candidates, the
    /// heuristic's pick and the fastest, timed on the device.
    pub fn gemm_tuning(&self) -> Vec<GemmTuning> {
        lock(&self.lt)
            .as_mut()
            .map(Lt::take_report)
            .unwrap_or_default()
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
            set_workspace(own, BLAS_WORKSPACE)?;
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
