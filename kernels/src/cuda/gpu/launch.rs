//! Kernel launches: a kernel's function from its module (compiled or read from the kernel cache on first use),
//! launch geometry, and the optional per-kernel timing around each launch.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, result as drv, sys};

use super::{Gpu, Launch, cuda_err, lock};
use crate::Result;
use crate::cuda::KernelTime;
use crate::cuda::modules::{self, Origin};
use crate::cuda::profile::Profile;
use crate::cuda::sources::KernelSource;

/// Dynamic shared memory a kernel may take without opting in (48 KiB on every architecture since Volta).
const DEFAULT_SHARED: u32 = 48 << 10;

impl Gpu {
    /// A kernel of `src`, loading (and on first use in the process, compiling) its module.
    pub(crate) fn function(
        &self,
        src: &'static KernelSource,
        name: &'static str,
    ) -> Result<CudaFunction> {
        if let Some(f) = lock(&self.functions).get(name) {
            return Ok(f.clone());
        }
        let module = {
            let cached = lock(&self.modules).get(src.name).cloned();
            match cached {
                Some(m) => m,
                None => {
                    let m = self.load_module(src)?;
                    lock(&self.modules).insert(src.name, m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| cuda_err(&format!("finding kernel {name} in {}.cu", src.name), e))?;
        lock(&self.functions).insert(name, f.clone());
        Ok(f)
    }

    /// Loads `src`'s module; a cached or built-in cubin that the driver refuses is compiled again once.
    fn load_module(&self, src: &'static KernelSource) -> Result<Arc<CudaModule>> {
        let load = |ptx| {
            self.ctx
                .load_module(ptx)
                .map_err(|e| cuda_err(&format!("loading module {}.cu", src.name), e))
        };
        let (ptx, origin) = modules::image(src, self.target)?;
        match load(ptx) {
            Err(e) if origin != Origin::Compiled => {
                // a built-in cubin from a newer NVRTC than this driver takes, or a damaged cache file
                tracing::warn!(
                    "kernel module {}.cu ({origin:?}): {e}; compiling it again",
                    src.name
                );
                load(modules::replacement(src, self.target, origin)?)
            }
            loaded => loaded,
        }
    }

    /// A 1-D grid-stride launch over `n` items with `block` threads per block.
    pub(crate) fn grid(&self, n: usize, block: u32) -> Launch {
        let blocks = n
            .div_ceil(block as usize)
            .clamp(1, self.sm_count as usize * 16) as u32;
        Launch {
            grid: (blocks, 1, 1),
            block: (block, 1, 1),
            shared: 0,
        }
    }

    /// Launches kernel `name` of `src` on the compute stream (the side stream inside [`Gpu::on_side`]), opting it
    /// in to more than [`DEFAULT_SHARED`] bytes of dynamic shared memory where `cfg` asks for them.
    ///
    /// # Safety
    /// `args` must point at values whose types and order match the kernel's parameters, and
    /// every device address among them must be valid for what the kernel reads and writes.
    pub(crate) unsafe fn launch(
        &self,
        src: &'static KernelSource,
        name: &'static str,
        cfg: Launch,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(src, name)?;
        if cfg.shared > DEFAULT_SHARED {
            // more dynamic shared memory than a launch gets unasked: a driver call, no synchronisation
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                cfg.shared as i32,
            )
            .map_err(|e| {
                cuda_err(
                    &format!("giving {name} {} bytes of shared memory", cfg.shared),
                    e,
                )
            })?;
        }
        let _turn = self.turn();
        self.bind()?;
        self.timed(
            || name.to_string(),
            || {
                // SAFETY: forwarded to the caller.
                unsafe {
                    drv::launch_kernel(
                        f.cu_function(),
                        cfg.grid,
                        cfg.block,
                        cfg.shared,
                        self.stream().cu_stream(),
                        args,
                    )
                }
                .map_err(|e| cuda_err(&format!("launching {name}"), e))
            },
        )
    }

    /// Runs `f`, which queues work on the compute stream, timed under `label` when profiling.
    pub(crate) fn timed<R>(
        &self,
        label: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        match &self.profile {
            Some(p) if !self.is_capturing() => p.span(self.stream(), label, f),
            _ => f(),
        }
    }

    /// GPU time per kernel since the last call (waiting for it), the most expensive first; empty
    /// unless the process runs with `COHORT_CUDA_PROFILE=1`.
    ///
    /// # Errors
    /// A timing event failed.
    pub fn kernel_profile(&self) -> Result<Vec<KernelTime>> {
        let _turn = self.turn();
        self.bind()?;
        self.profile.as_ref().map_or(Ok(Vec::new()), Profile::drain)
    }
}
