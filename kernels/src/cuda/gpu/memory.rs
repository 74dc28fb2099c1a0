//! Device memory the runtime owns: [`DeviceBuffer`]s from the driver or from an installed [`DeviceArena`], and the
//! scratch area each stream's ops share.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, result as drv};

use super::{Gpu, ON_SIDE, cuda_err, lock};
use crate::{Error, Result};

/// Where a device's own buffers (scratch areas, library workspaces, error flags) come from once installed with
/// [`Gpu::set_arena`]: the tensor crate's caching allocator, so that a process-wide memory limit covers them and
/// they count in its report. Without one they are `cuMemAlloc`ed.
pub trait DeviceArena: Send + Sync {
    /// At least `bytes` of device memory in the device's context, 256-byte aligned. `may_sync` is false while a
    /// CUDA graph is being captured: the arena may then not synchronize the device (no page moves, no trim).
    ///
    /// # Errors
    /// Out of memory (the allocator's own error, kept as the source of [`Error::DeviceMemory`]).
    fn alloc(
        &self,
        bytes: usize,
        may_sync: bool,
    ) -> std::result::Result<u64, Box<dyn std::error::Error + Send + Sync>>;
    /// Gives back what [`alloc`](DeviceArena::alloc) returned; the device has finished with it.
    fn free(&self, ptr: u64);
}

/// Who frees a [`DeviceBuffer`].
enum Owner {
    Driver,
    Arena(Arc<dyn DeviceArena>),
}

/// A device allocation owned by one value: scratch space, workspaces, tests, benches; from the device's arena
/// where one is installed, else from `cuMemAlloc`.
///
/// Tensors do not use it: their storage comes from the caching allocator.
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
    owner: Owner,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl DeviceBuffer {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        match &self.owner {
            // SAFETY: ptr came from cuMemAlloc in this context and is freed once; cuMemFree
            // waits for work still using it.
            Owner::Driver => drop(unsafe { drv::free_sync(self.ptr) }),
            // As cuMemFree does, wait for work still using it (on any stream: a graph's scratch may be read by
            // a replay on a side lane) before the arena hands it to someone else. A broken context keeps it.
            Owner::Arena(arena) => {
                if self.ctx.synchronize().is_ok() {
                    arena.free(self.ptr);
                }
            }
        }
    }
}

/// The size of a new scratch area for a need of `bytes`: a power of two, 64 KiB at least, so that growing needs
/// make few areas.
pub(super) fn scratch_bytes(bytes: usize) -> usize {
    bytes.next_power_of_two().max(1 << 16)
}

impl Gpu {
    /// Allocates `bytes` (at least 1) of device memory owned by the returned buffer, from the device's arena where
    /// one is installed.
    ///
    /// # Errors
    /// The device (or the arena: [`Error::DeviceMemory`]) is out of memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        let (ptr, owner) = match self.arena.get() {
            Some(arena) => {
                let ptr = arena
                    .alloc(bytes.max(1), !self.is_capturing())
                    .map_err(|source| Error::DeviceMemory {
                        what: format!("{bytes} bytes of runtime scratch or workspace"),
                        source,
                    })?;
                (ptr, Owner::Arena(arena.clone()))
            }
            None => {
                // SAFETY: plain allocation in the bound context.
                let ptr = unsafe { drv::malloc_sync(bytes.max(1)) }
                    .map_err(|e| cuda_err(&format!("cuMemAlloc of {bytes} bytes"), e))?;
                (ptr, Owner::Driver)
            }
        };
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
            owner,
        })
    }

    /// Makes [`Gpu::alloc`] (every scratch area, library workspace and flag the runtime makes from now on) take
    /// memory from `arena`; buffers made before keep theirs. `false` when an arena was installed already.
    pub fn set_arena(&self, arena: Arc<dyn DeviceArena>) -> bool {
        self.arena.set(arena).is_ok()
    }

    /// Runs `f` with a device scratch area of at least `bytes`, owned by this device and reused
    /// by every op of the stream the work goes to (safe because all of them are ordered on it).
    /// During a capture the area is the graph's own.
    pub(crate) fn with_scratch<R>(
        &self,
        bytes: usize,
        f: impl FnOnce(u64) -> Result<R>,
    ) -> Result<R> {
        // Growing the area synchronizes the stream, which another thread's capture must not see.
        let _turn = self.turn();
        let side = ON_SIDE.get();
        if self.is_capturing() {
            return f(self.graph_scratch(side, bytes)?);
        }
        let (area, stream) = if side {
            (&self.side_scratch, &self.side)
        } else {
            (&self.scratch, &self.compute)
        };
        let mut guard = lock(area);
        let big_enough = guard.as_ref().is_some_and(|b| b.bytes >= bytes);
        if !big_enough {
            // Work still queued may read the old area: let it finish before the area is freed.
            if guard.is_some() {
                stream
                    .synchronize()
                    .map_err(|e| cuda_err("synchronizing before growing the scratch area", e))?;
            }
            guard.take();
            *guard = Some(self.alloc(scratch_bytes(bytes))?);
        }
        let ptr = guard.as_ref().map(|b| b.ptr).unwrap_or_default();
        f(ptr)
    }
}
