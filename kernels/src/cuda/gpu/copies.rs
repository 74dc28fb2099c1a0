//! Copies between host and device, on the compute stream or the copy stream, and page-locked host memory.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaContext, CudaEvent, result as drv, sys};

use super::{Gpu, cuda_err, lock};
use crate::{Error, Result};

/// Page-locked host memory (`cuMemHostAlloc`): the copy engine reads it directly, so a copy from
/// it runs asynchronously and overlaps kernels. Freed with `cuMemFreeHost` when dropped.
pub struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes through &self/&mut self.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for PinnedBuffer {}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.bytes)
    }
}

impl PinnedBuffer {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr holds `bytes` bytes owned by self (a null ptr only for 0 bytes is never made).
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The bytes, writable. A copy still reading them must have finished (see [`CopyEvent`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

/// Page-locked host bytes live in the process.
static PINNED: AtomicU64 = AtomicU64::new(0);

/// Page-locked host memory the process holds now (staging for copies; host memory, not the device's).
pub fn pinned_host_bytes() -> u64 {
    PINNED.load(Ordering::Relaxed)
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        PINNED.fetch_sub(self.bytes as u64, Ordering::Relaxed);
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: ptr came from cuMemHostAlloc and is freed once.
            let _ = unsafe { drv::free_host(self.ptr.cast()) };
        }
    }
}

/// Device bytes on their way to the host ([`Gpu::dtoh_later`]).
pub struct HostCopy {
    buf: Option<PinnedBuffer>,
    bytes: usize,
    event: CudaEvent,
    gpu: Arc<Gpu>,
}

impl fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostCopy({} bytes, done: {})",
            self.bytes,
            self.is_done()
        )
    }
}

impl HostCopy {
    /// Whether the bytes have arrived (without waiting).
    pub fn is_done(&self) -> bool {
        self.event.is_complete()
    }

    /// The bytes, once the copy (and the work queued before it) is done.
    ///
    /// # Errors
    /// A queued kernel or the copy failed.
    pub fn wait(&self) -> Result<&[u8]> {
        self.event
            .synchronize()
            .map_err(|e| cuda_err("waiting for a copy to the host", e))?;
        Ok(self
            .buf
            .as_ref()
            .map_or(&[][..], |b| &b.as_slice()[..self.bytes]))
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // A copy still running writes the buffer: only a finished one goes back for reuse.
        if let Some(buf) = self.buf.take()
            && self.event.synchronize().is_ok()
        {
            lock(&self.gpu.host_copy_buffers).push(buf);
        }
    }
}

/// The end of copies queued on the copy stream: the compute stream waits on it before using
/// their data ([`CopyEvent::wait_on_compute`]); the host waits on it before reusing their pinned
/// source ([`CopyEvent::synchronize`]).
#[derive(Debug)]
pub struct CopyEvent {
    event: CudaEvent,
    gpu: Arc<Gpu>,
}

impl CopyEvent {
    /// Makes the device's compute stream wait for the copies (without blocking the host): work
    /// queued on it from now on sees their data.
    ///
    /// # Errors
    /// The driver rejects the wait.
    pub fn wait_on_compute(&self) -> Result<()> {
        let _turn = self.gpu.turn();
        self.gpu.bind()?;
        self.gpu
            .compute
            .wait(&self.event)
            .map_err(|e| cuda_err("ordering the compute stream after a copy", e))
    }

    /// Blocks the host until the copies are done.
    ///
    /// # Errors
    /// A copy failed.
    pub fn synchronize(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(|e| cuda_err("waiting for a copy", e))
    }

    /// Whether the copies are done (without waiting).
    pub fn is_done(&self) -> bool {
        self.event.is_complete()
    }
}

impl Gpu {
    /// Copies host bytes to device address `dst`, ordered on the compute stream.
    ///
    /// # Safety
    /// `dst` must address at least `src.len()` bytes of this device's memory.
    ///
    /// # Errors
    /// The driver rejects the copy.
    pub unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        if self.is_capturing() {
            // A graph replays the copy long after `src` is gone: copy from pinned bytes it keeps.
            let mut keep = self.alloc_pinned(src.len())?;
            keep.as_mut_slice().copy_from_slice(src);
            // SAFETY: caller guarantees dst; `keep` lives as long as the graph (keep_for_graph).
            unsafe { drv::memcpy_htod_async(dst, keep.as_slice(), self.compute.cu_stream()) }
                .map_err(|e| cuda_err("copying host to device", e))?;
            self.keep_for_graph(keep);
            return Ok(());
        }
        // SAFETY: caller guarantees dst; a pageable source is staged before the call returns,
        // so `src` may be dropped right after.
        unsafe { drv::memcpy_htod_async(dst, src, self.compute.cu_stream()) }
            .map_err(|e| cuda_err("copying host to device", e))
    }

    /// Copies host bytes to `dst` on the copy stream: it starts after the compute stream's work
    /// queued so far (the block may have just been freed by it) and the compute stream's later
    /// work waits for it.
    ///
    /// # Safety
    /// As [`Gpu::htod`].
    ///
    /// # Errors
    /// The driver rejects the copy or an event.
    pub unsafe fn htod_prefetch(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        self.copy_after_compute()?;
        // SAFETY: caller guarantees dst; see `htod` for the source.
        unsafe { drv::memcpy_htod_async(dst, src, self.copy.cu_stream()) }
            .map_err(|e| cuda_err("copying host to device", e))?;
        let after = self
            .copy
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        self.compute
            .wait(&after)
            .map_err(|e| cuda_err("ordering the compute stream", e))
    }

    /// Orders the copy stream after the compute stream's work queued so far: the block a copy
    /// writes may just have been freed there.
    fn copy_after_compute(&self) -> Result<()> {
        let before = self
            .compute
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        self.copy
            .wait(&before)
            .map_err(|e| cuda_err("ordering the copy stream", e))
    }

    /// Copies device bytes at `src` to the host, waiting for all queued work first.
    ///
    /// # Safety
    /// `src` must address at least `dst.len()` bytes of this device's memory.
    ///
    /// # Errors
    /// A queued kernel failed or flagged a bad index, or the copy failed.
    pub unsafe fn dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.refuse_in_capture("reading a tensor back to the host")?;
        let _turn = self.turn();
        self.bind()?;
        if !dst.is_empty() {
            // SAFETY: caller guarantees src.
            unsafe { drv::memcpy_dtoh_async(dst, src, self.compute.cu_stream()) }
                .map_err(|e| cuda_err("copying device to host", e))?;
        }
        self.compute
            .synchronize()
            .map_err(|e| cuda_err("waiting for the compute stream", e))?;
        self.check_flag()
    }

    /// Queues a copy of `bytes` bytes at `src` to the host behind the compute stream's work so far,
    /// without waiting for it: the host goes on queueing work and reads the bytes once the copy is
    /// done ([`HostCopy::wait`]). An index error flagged meanwhile is reported by the next
    /// [`Gpu::dtoh`] or [`Gpu::synchronize`].
    ///
    /// # Safety
    /// `src` must address at least `bytes` bytes of this device's memory, not freed before the
    /// copy runs (the caching allocator keeps stream order, so freeing a tensor after this is fine).
    ///
    /// # Errors
    /// During a capture; the driver rejects the copy or its event; no pinned memory.
    pub unsafe fn dtoh_later(self: &Arc<Self>, src: u64, bytes: usize) -> Result<HostCopy> {
        self.refuse_in_capture("reading a tensor back to the host")?;
        let _turn = self.turn();
        self.bind()?;
        let reused = {
            let mut free = lock(&self.host_copy_buffers);
            free.iter()
                .position(|b| b.bytes >= bytes)
                .map(|i| free.swap_remove(i))
        };
        let mut buf = match reused {
            Some(b) => b,
            None => self.alloc_pinned(bytes.max(64))?,
        };
        if bytes > 0 {
            // SAFETY: caller guarantees src; the pinned buffer outlives the copy (HostCopy keeps
            // it until the copy's event is done).
            unsafe {
                drv::memcpy_dtoh_async(
                    &mut buf.as_mut_slice()[..bytes],
                    src,
                    self.compute.cu_stream(),
                )
            }
            .map_err(|e| cuda_err("copying device to host", e))?;
        }
        let event = self
            .compute
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        Ok(HostCopy {
            buf: Some(buf),
            bytes,
            event,
            gpu: self.clone(),
        })
    }

    /// Copies `bytes` bytes from `src` to `dst` on the device.
    ///
    /// # Safety
    /// Both addresses must hold `bytes` bytes of this device's memory.
    ///
    /// # Errors
    /// The driver rejects the copy.
    pub unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        // SAFETY: caller guarantees both ranges.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.stream().cu_stream()) }
            .map_err(|e| cuda_err("copying device to device", e))
    }

    /// Fills `count` elements of `elem_bytes` (1, 2, 4) bytes at `dst` with the bit pattern `bits`.
    ///
    /// # Safety
    /// `dst` must hold `count * elem_bytes` bytes and be aligned to `elem_bytes`.
    ///
    /// # Errors
    /// Another element size, or the driver rejects the fill.
    pub unsafe fn fill(&self, dst: u64, bits: u32, elem_bytes: usize, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let _turn = self.turn();
        self.bind()?;
        let s = self.stream().cu_stream();
        // SAFETY: caller guarantees the range and alignment.
        let r = unsafe {
            match elem_bytes {
                1 => sys::cuMemsetD8Async(dst, bits as u8, count, s),
                2 => sys::cuMemsetD16Async(dst, bits as u16, count, s),
                4 => sys::cuMemsetD32Async(dst, bits, count, s),
                8 if bits == 0 => sys::cuMemsetD32Async(dst, 0, count * 2, s),
                _ => {
                    return Err(Error::Cuda(format!(
                        "fill: elements of {elem_bytes} bytes are not supported (1, 2 or 4)"
                    )));
                }
            }
        };
        r.result().map_err(|e| cuda_err("cuMemset", e))
    }

    /// Zeroes `bytes` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must hold `bytes` bytes.
    ///
    /// # Errors
    /// The driver rejects the fill.
    pub unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.fill(dst, 0, 1, bytes) }
    }

    /// Allocates `bytes` (at least 1) of page-locked host memory.
    ///
    /// # Errors
    /// The driver cannot pin that much memory.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        self.bind()?;
        // SAFETY: plain allocation in the bound context; flags 0 = cacheable, this context only.
        let ptr = unsafe { drv::malloc_host(bytes.max(1), 0) }
            .map_err(|e| cuda_err(&format!("cuMemHostAlloc of {bytes} bytes"), e))?;
        PINNED.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            bytes,
            ctx: self.ctx.clone(),
        })
    }

    /// Copies pinned host bytes to the device on the copy stream. `parts` are (destination,
    /// offset into `src`, bytes). The copies start after the compute stream's work queued so far
    /// (the destinations may be blocks it has just freed); nothing on the compute stream waits
    /// for them until the returned event's [`CopyEvent::wait_on_compute`], so they overlap the
    /// kernels queued meanwhile. `src` must not be rewritten before the event is done.
    ///
    /// # Safety
    /// Each destination must address its `bytes` of this device's memory.
    ///
    /// # Errors
    /// A part outside `src`, or the driver rejects a copy or an event.
    pub unsafe fn upload_pinned(
        self: &Arc<Self>,
        src: &PinnedBuffer,
        parts: &[(u64, usize, usize)],
    ) -> Result<CopyEvent> {
        self.refuse_in_capture("a copy-stream upload")?;
        let _turn = self.turn();
        self.bind()?;
        self.copy_after_compute()?;
        for &(dst, offset, bytes) in parts {
            let Some(bytes_src) = src.as_slice().get(offset..offset + bytes) else {
                return Err(Error::Cuda(format!(
                    "upload: bytes {offset}..{} are outside the {}-byte staging buffer",
                    offset + bytes,
                    src.bytes
                )));
            };
            if bytes == 0 {
                continue;
            }
            // SAFETY: caller guarantees dst; the source is pinned and outlives the copy (caller
            // waits on the event before rewriting it).
            unsafe { drv::memcpy_htod_async(dst, bytes_src, self.copy.cu_stream()) }
                .map_err(|e| cuda_err("copying host to device", e))?;
        }
        let event = self
            .copy
            .record_event(None)
            .map_err(|e| cuda_err("recording an event", e))?;
        Ok(CopyEvent {
            event,
            gpu: self.clone(),
        })
    }
}

/// Round trips of f32 data for the kernels' GPU tests.
#[cfg(test)]
impl Gpu {
    /// `v` in a new device buffer (at least one element's worth).
    pub(crate) fn upload_f32(&self, v: &[f32]) -> super::DeviceBuffer {
        let buf = self.alloc(v.len().max(1) * 4).unwrap();
        // SAFETY: the buffer holds at least these bytes.
        unsafe { self.htod(buf.ptr(), bytemuck::cast_slice(v)).unwrap() };
        buf
    }

    /// The first `n` f32 of `buf`.
    pub(crate) fn download_f32(&self, buf: &super::DeviceBuffer, n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        // SAFETY: callers size the buffer for n f32.
        unsafe {
            self.dtoh(buf.ptr(), bytemuck::cast_slice_mut(&mut v))
                .unwrap()
        };
        v
    }
}
