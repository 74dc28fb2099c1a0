//! Tensors: the training batch, host arrays to tensors, and device prefetch (the next batches are copied to the
//! target device on a background thread while the current one computes).
//!
//! The copy goes through a [`DeviceTransfer`]: [`PinnedTransfer`] (the default on a GPU: pinned staging buffers,
//! the copy stream, an event per element) or [`TensorCopy`] (plain `Tensor::to_device`).

use std::sync::{Arc, Mutex, PoisonError};

use cohort_tensor::cuda::{CopyReady, Uploader};
use cohort_tensor::{DType, Device, Tensor};

use crate::array::{Array, ArrayData, Slices, Stack};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::mnist::{Mnist, MnistConfig};

/// One batch for training: `inputs` (`f32`, e.g. `[B, 784]` or `[B, 1, 28, 28]`) and `labels` (`i32`, `[B]`).
#[derive(Clone, Debug)]
pub struct TrainBatch {
    /// The model's input.
    pub inputs: Tensor,
    /// Class labels, `i32`.
    pub labels: Tensor,
}

impl TrainBatch {
    /// A batch from host arrays, the labels converted to `i32`.
    ///
    /// # Errors
    /// When a tensor cannot be created on `device` (no such device, out of memory).
    pub fn from_arrays(inputs: Array, labels: Array, device: &Device) -> Result<TrainBatch> {
        let labels = match labels.into_data() {
            ArrayData::I32(v) => {
                let n = v.len();
                Tensor::from_vec(v, &[n], device)?
            }
            ArrayData::U8(v) => {
                let n = v.len();
                Tensor::from_vec(
                    v.into_iter().map(i32::from).collect::<Vec<i32>>(),
                    &[n],
                    device,
                )?
            }
            other => {
                return Err(Error::Shape {
                    op: "TrainBatch::from_arrays",
                    reason: format!("labels must be integers, found {}", other.dtype_name()),
                });
            }
        };
        Ok(TrainBatch {
            inputs: inputs.to_tensor(device)?,
            labels,
        })
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.shape().first().copied().unwrap_or(0)
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the batch lives on.
    pub fn device(&self) -> Device {
        self.inputs.device()
    }
}

impl Array {
    /// This array as a tensor on `device` (same dtype and shape).
    ///
    /// # Errors
    /// When the tensor cannot be created on `device`.
    pub fn to_tensor(self, device: &Device) -> Result<Tensor> {
        let shape = self.shape().to_vec();
        Ok(match self.into_data() {
            ArrayData::F32(v) => Tensor::from_vec(v, &shape, device)?,
            ArrayData::F64(v) => Tensor::from_vec(v, &shape, device)?,
            ArrayData::I32(v) => Tensor::from_vec(v, &shape, device)?,
            ArrayData::U8(v) => Tensor::from_vec(v, &shape, device)?,
        })
    }

    /// A tensor's elements as a host array.
    ///
    /// # Errors
    /// For dtypes without a host array (`f16`, `bf16`: convert first) or a failed copy from the device.
    pub fn from_tensor(t: &Tensor) -> Result<Array> {
        let shape = t.shape().to_vec();
        match t.dtype() {
            DType::F32 => Array::from_f32(t.to_vec::<f32>()?, &shape),
            DType::F64 => Array::from_f64(t.to_vec::<f64>()?, &shape),
            DType::I32 => Array::from_i32(t.to_vec::<i32>()?, &shape),
            DType::U8 => Array::from_u8(t.to_vec::<u8>()?, &shape),
            other => Err(Error::Shape {
                op: "Array::from_tensor",
                reason: format!("no host array of dtype {other}; convert with to_dtype(F32) first"),
            }),
        }
    }
}

impl Stack for Tensor {
    type Batched = Tensor;
    fn stack(items: Vec<Tensor>) -> Result<Tensor> {
        let refs: Vec<&Tensor> = items.iter().collect();
        Ok(Tensor::stack(&refs, 0)?)
    }
}

impl Slices for Tensor {
    type Item = Tensor;
    fn len(&self) -> usize {
        self.shape().first().copied().unwrap_or(0)
    }
    fn slice(&self, i: usize) -> Result<Tensor> {
        let rest = self.shape().get(1..).unwrap_or(&[]).to_vec();
        Ok(self.narrow(0, i, 1)?.reshape(&rest)?)
    }
}

/// Things that can be moved to a device: tensors, batches, tuples of them.
pub trait ToDevice: Sized + Send + 'static {
    /// A copy on `device` (the same value when it already lives there).
    ///
    /// # Errors
    /// When the copy fails (no such device, out of memory).
    fn to_device(&self, device: &Device) -> Result<Self>;

    /// A copy on the uploader's GPU through its pinned staging buffers and copy stream; the
    /// events say when the copies are done (see [`Staged`]).
    ///
    /// # Errors
    /// When the copy fails (another GPU, f64, out of memory).
    fn upload(&self, uploader: &mut Uploader) -> Result<(Self, Vec<CopyReady>)>;
}

impl ToDevice for Tensor {
    fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self.clone());
        }
        Ok(Tensor::to_device(self, device)?)
    }
    fn upload(&self, uploader: &mut Uploader) -> Result<(Tensor, Vec<CopyReady>)> {
        let (mut out, ready) = uploader.upload(&[self])?;
        let t = out.pop().ok_or_else(|| lost("Tensor"))?;
        Ok((t, vec![ready]))
    }
}

fn lost(what: &str) -> Error {
    Error::Shape {
        op: "upload",
        reason: format!("the uploader returned fewer tensors than a {what} has"),
    }
}

impl ToDevice for TrainBatch {
    fn to_device(&self, device: &Device) -> Result<TrainBatch> {
        Ok(TrainBatch {
            inputs: ToDevice::to_device(&self.inputs, device)?,
            labels: ToDevice::to_device(&self.labels, device)?,
        })
    }
    fn upload(&self, uploader: &mut Uploader) -> Result<(TrainBatch, Vec<CopyReady>)> {
        // one staging buffer and one event for both tensors
        let (out, ready) = uploader.upload(&[&self.inputs, &self.labels])?;
        let mut it = out.into_iter();
        let (Some(inputs), Some(labels)) = (it.next(), it.next()) else {
            return Err(lost("TrainBatch"));
        };
        Ok((TrainBatch { inputs, labels }, vec![ready]))
    }
}

impl<A: ToDevice, B: ToDevice> ToDevice for (A, B) {
    fn to_device(&self, device: &Device) -> Result<(A, B)> {
        Ok((self.0.to_device(device)?, self.1.to_device(device)?))
    }
    fn upload(&self, uploader: &mut Uploader) -> Result<((A, B), Vec<CopyReady>)> {
        let (a, mut ra) = self.0.upload(uploader)?;
        let (b, rb) = self.1.upload(uploader)?;
        ra.extend(rb);
        Ok(((a, b), ra))
    }
}

/// An element whose copy to the device may still be in flight on the copy stream. [`Staged::finish`]
/// (called on the consumer's thread when the element is taken) makes the compute stream wait for
/// the copy, so the element can be used there. Dropped unfinished, it still orders the compute
/// stream after the copy, so the device memory it frees cannot be reused under a running copy.
#[derive(Debug)]
pub struct Staged<T> {
    item: Option<T>,
    ready: Vec<CopyReady>,
}

impl<T> Staged<T> {
    /// An element that is usable as is (copied synchronously, or not copied at all).
    pub fn done(item: T) -> Staged<T> {
        Staged {
            item: Some(item),
            ready: Vec::new(),
        }
    }

    /// An element whose copies end with `ready`.
    pub fn in_flight(item: T, ready: Vec<CopyReady>) -> Staged<T> {
        Staged {
            item: Some(item),
            ready,
        }
    }

    /// Orders the compute stream after the element's copies and hands the element out.
    ///
    /// # Errors
    /// When the driver rejects the wait.
    pub fn finish(mut self) -> Result<T> {
        for r in self.ready.drain(..) {
            r.wait_on_compute()?;
        }
        self.item.take().ok_or_else(|| Error::Shape {
            op: "Staged::finish",
            reason: "the element was already taken".into(),
        })
    }
}

impl<T> Drop for Staged<T> {
    fn drop(&mut self) {
        for r in self.ready.drain(..) {
            // best effort: a failed wait means the context is broken, and nothing runs anyway
            let _ = r.wait_on_compute();
        }
    }
}

/// How elements are moved to a device by [`Dataset::prefetch_to_device_with`]. It runs on the
/// prefetch thread; the [`Staged`] result is finished on the consumer's thread.
pub trait DeviceTransfer<T>: Send + Sync {
    /// Move `item` to `device` (or start moving it: see [`Staged`]).
    ///
    /// # Errors
    /// When the copy fails.
    fn transfer(&self, item: T, device: &Device) -> Result<Staged<T>>;
}

/// The plain transfer: `Tensor::to_device` of every tensor (a synchronous copy from pageable
/// memory, on the compute stream).
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorCopy;

impl<T: ToDevice> DeviceTransfer<T> for TensorCopy {
    fn transfer(&self, item: T, device: &Device) -> Result<Staged<T>> {
        Ok(Staged::done(item.to_device(device)?))
    }
}

/// The GPU transfer: host bytes go into a ring of pinned (page-locked) staging buffers and from
/// there to the device on the GPU's copy stream, asynchronously; the compute stream waits on the
/// copy's event only when the consumer takes the element, so copies overlap the current step's
/// kernels. On the CPU it is the plain copy.
#[derive(Debug)]
pub struct PinnedTransfer {
    slots: usize,
    uploader: Mutex<Option<Uploader>>,
}

impl PinnedTransfer {
    /// A transfer with `slots` pinned staging buffers (at least 1); each grows to the largest
    /// element seen.
    pub fn new(slots: usize) -> PinnedTransfer {
        PinnedTransfer {
            slots: slots.max(1),
            uploader: Mutex::new(None),
        }
    }
}

impl<T: ToDevice> DeviceTransfer<T> for PinnedTransfer {
    fn transfer(&self, item: T, device: &Device) -> Result<Staged<T>> {
        if !device.is_cuda() {
            return Ok(Staged::done(item.to_device(device)?));
        }
        let mut guard = self.uploader.lock().unwrap_or_else(PoisonError::into_inner);
        if guard.as_ref().is_none_or(|u| u.device() != *device) {
            *guard = Some(Uploader::new(device, self.slots)?);
        }
        let Some(up) = guard.as_mut() else {
            return Ok(Staged::done(item.to_device(device)?));
        };
        let (moved, ready) = item.upload(up)?;
        Ok(Staged::in_flight(moved, ready))
    }
}

impl<T: ToDevice> Dataset<T> {
    /// Keep the next `n` elements ready on `device`: a background thread copies them while the
    /// current one computes — on a GPU with [`PinnedTransfer`] (pinned staging buffers, the copy
    /// stream, an event the compute stream waits on when the element is taken). The device is not
    /// part of the fingerprint: a position saved on one device resumes on another.
    pub fn prefetch_to_device(&self, device: Device, n: usize) -> Dataset<T> {
        // slots: the n elements waiting, one being staged, one being finished
        self.prefetch_to_device_with(Arc::new(PinnedTransfer::new(n + 2)), device, n)
    }

    /// [`prefetch_to_device`](Self::prefetch_to_device) with another transfer (e.g. [`TensorCopy`]).
    pub fn prefetch_to_device_with(
        &self,
        transfer: Arc<dyn DeviceTransfer<T>>,
        device: Device,
        n: usize,
    ) -> Dataset<T> {
        self.map_named("to_device", 1, move |x| transfer.transfer(x, &device))
            .prefetch(n)
            .map_named("device_ready", 1, Staged::finish)
    }
}

impl Dataset<(Array, Array)> {
    /// Batches of host `(inputs, labels)` (from `batch`/`padded_batch` of any source: CSV, text, synthetic) as
    /// [`TrainBatch`]es on `device`, made `prefetch` deep on a background thread (0: on the consumer's thread).
    pub fn to_train_batches(&self, device: Device, prefetch: usize) -> Dataset<TrainBatch> {
        let on_cpu = self.map_named("train_batch", 1, |(x, y)| {
            TrainBatch::from_arrays(x, y, &Device::Cpu)
        });
        if device.is_cuda() {
            on_cpu.prefetch_to_device(device, prefetch.max(1))
        } else if prefetch > 0 {
            on_cpu.prefetch(prefetch)
        } else {
            on_cpu
        }
    }
}

impl Mnist {
    /// The training batches of this split as tensors on `device`, per `config`: shuffled (seeded, new order each
    /// epoch), batched, decoded and normalised on `config.workers` threads, and prefetched `config.prefetch` deep
    /// on a background thread — onto the GPU for a CUDA device.
    pub fn train_batches(
        self: &Arc<Self>,
        config: &MnistConfig,
        device: Device,
    ) -> Dataset<TrainBatch> {
        let host = self.batches(&MnistConfig {
            prefetch: 0,
            ..config.clone()
        });
        host.to_train_batches(device, config.prefetch)
    }

    /// The whole split as two tensors on `device`: images `f32 [n, 784]` in `[0, 1]`, labels `i32 [n]`.
    ///
    /// # Errors
    /// When the tensors cannot be created on `device`.
    pub fn to_tensors(&self, device: &Device) -> Result<(Tensor, Tensor)> {
        let x = Tensor::from_vec(self.images_f32(), &[self.len, self.image_size()], device)?;
        let y = Tensor::from_vec(self.labels_i32(), &[self.len], device)?;
        Ok((x, y))
    }
}
