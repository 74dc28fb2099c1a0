//! Host-to-device uploads through pinned staging buffers on the device's copy stream, for input
//! pipelines: the copy overlaps the kernels of the current step, and the compute stream waits on
//! the copy's event only when the batch is taken into use.

use cohort_kernels::cuda::{CopyEvent, PinnedBuffer};

use super::*;
use crate::Tensor;
use crate::storage::Storage;

/// The copies of one [`Uploader::upload`]: make the compute stream wait on them
/// ([`CopyReady::wait_on_compute`]) before any op uses the uploaded tensors.
#[derive(Clone, Debug)]
pub struct CopyReady(Arc<CopyEvent>);

impl CopyReady {
    /// Orders the device's compute stream after the copies (the host does not block).
    ///
    /// # Errors
    /// The driver rejects the wait.
    pub fn wait_on_compute(&self) -> Result<()> {
        Ok(self.0.wait_on_compute()?)
    }

    /// Whether the copies have finished.
    pub fn is_done(&self) -> bool {
        self.0.is_done()
    }
}

struct Slot {
    buf: Option<PinnedBuffer>,
    done: Option<Arc<CopyEvent>>,
}

/// Uploads host tensors to one device through a ring of pinned staging buffers (one per upload
/// in flight; a slot is reused once its previous copy is done).
pub struct Uploader {
    gpu: Arc<Gpu>,
    ordinal: usize,
    slots: Vec<Slot>,
    next: usize,
}

impl fmt::Debug for Uploader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Uploader(cuda:{}, {} slots)",
            self.ordinal,
            self.slots.len()
        )
    }
}

impl Uploader {
    /// An uploader to `device` with `slots` staging buffers (at least 1; they grow to the
    /// largest upload seen).
    ///
    /// # Errors
    /// A CPU device, or no such GPU.
    pub fn new(device: &Device, slots: usize) -> Result<Uploader> {
        let Device::Cuda(ordinal) = *device else {
            return Err(Error::Unsupported {
                op: "Uploader::new",
                device: *device,
            });
        };
        Ok(Uploader {
            gpu: gpu(ordinal)?,
            ordinal,
            slots: (0..slots.max(1))
                .map(|_| Slot {
                    buf: None,
                    done: None,
                })
                .collect(),
            next: 0,
        })
    }

    /// The device uploads go to.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// Copies `tensors` to the device: host bytes into the next pinned slot, then one async copy
    /// per tensor on the copy stream. Tensors already on this device are passed through. The
    /// result must not be used on the device before [`CopyReady::wait_on_compute`].
    ///
    /// # Errors
    /// A tensor on another GPU, an f64 tensor, out of pinned or device memory, or a driver error.
    pub fn upload(&mut self, tensors: &[&Tensor]) -> Result<(Vec<Tensor>, CopyReady)> {
        let slot_index = self.next;
        self.next = (self.next + 1) % self.slots.len();
        let slot = &mut self.slots[slot_index];
        // The slot's previous copy still reads its buffer until it is done.
        if let Some(done) = slot.done.take() {
            done.synchronize()?;
        }
        let guards: Vec<_> = tensors.iter().map(|t| t.read()).collect();
        let mut total = 0usize;
        for g in &guards {
            match &**g {
                Storage::Cpu(c) => {
                    ty("to_device", c.dtype())?;
                    total += c.as_bytes().len().next_multiple_of(64);
                }
                Storage::Cuda(c) if c.ordinal == self.ordinal => {}
                Storage::Cuda(c) => {
                    return Err(Error::DeviceMismatch {
                        op: "upload",
                        lhs: Device::Cuda(c.ordinal),
                        rhs: Device::Cuda(self.ordinal),
                    });
                }
            }
        }
        if slot.buf.as_ref().is_none_or(|b| b.bytes() < total) {
            slot.buf = None;
            slot.buf = Some(self.gpu.alloc_pinned(total.next_multiple_of(1 << 20))?);
        }
        let Some(buf) = slot.buf.as_mut() else {
            return Err(Error::InvalidArgument {
                op: "upload",
                reason: "no staging buffer".into(),
            });
        };
        let ctx = Ctx::of(self.ordinal)?;
        let mut out = Vec::with_capacity(tensors.len());
        let mut parts = Vec::with_capacity(tensors.len());
        let mut offset = 0usize;
        for (t, g) in tensors.iter().zip(&guards) {
            match &**g {
                Storage::Cpu(c) => {
                    let bytes = c.as_bytes();
                    buf.as_mut_slice()[offset..offset + bytes.len()].copy_from_slice(bytes);
                    let dst = ctx.storage(c.len(), c.dtype())?;
                    parts.push((dst.device_ptr(), offset, bytes.len()));
                    offset += bytes.len().next_multiple_of(64);
                    out.push(Tensor::from_storage(Storage::Cuda(dst), t.shape().to_vec()));
                }
                Storage::Cuda(_) => out.push((*t).clone()),
            }
        }
        drop(guards);
        // SAFETY: each destination is a fresh storage of exactly its part's bytes.
        let done = Arc::new(unsafe { self.gpu.upload_pinned(buf, &parts)? });
        slot.done = Some(done.clone());
        Ok((out, CopyReady(done)))
    }
}
