//! Tensors: the training batch, host arrays to tensors, and device prefetch (the next batches are copied to the
//! target device on a background thread while the current one computes).
//!
//! The copy itself goes through [`DeviceTransfer`], the seam where a pinned-memory / copy-stream implementation
//! plugs in; [`TensorCopy`] is the plain one (`Tensor::to_device`).

use std::sync::Arc;

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
}

impl ToDevice for Tensor {
    fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self.clone());
        }
        Ok(Tensor::to_device(self, device)?)
    }
}

impl ToDevice for TrainBatch {
    fn to_device(&self, device: &Device) -> Result<TrainBatch> {
        Ok(TrainBatch {
            inputs: ToDevice::to_device(&self.inputs, device)?,
            labels: ToDevice::to_device(&self.labels, device)?,
        })
    }
}

impl<A: ToDevice, B: ToDevice> ToDevice for (A, B) {
    fn to_device(&self, device: &Device) -> Result<(A, B)> {
        Ok((self.0.to_device(device)?, self.1.to_device(device)?))
    }
}

/// How batches are moved to a device by [`Dataset::prefetch_to_device_with`]: the seam for a transfer with pinned
/// host memory and a dedicated copy stream. It runs on the prefetch thread.
pub trait DeviceTransfer<T>: Send + Sync {
    /// Move `item` to `device`. An implementation that copies asynchronously must return only when the result may
    /// be used on the device's compute stream (e.g. after recording an event the compute stream waits on).
    ///
    /// # Errors
    /// When the copy fails.
    fn transfer(&self, item: T, device: &Device) -> Result<T>;
}

/// The plain transfer: `Tensor::to_device` of every tensor.
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorCopy;

impl<T: ToDevice> DeviceTransfer<T> for TensorCopy {
    fn transfer(&self, item: T, device: &Device) -> Result<T> {
        item.to_device(device)
    }
}

impl<T: ToDevice> Dataset<T> {
    /// Keep the next `n` elements ready on `device`: a background thread copies them (with [`TensorCopy`]) while
    /// the current one computes. The device is not part of the fingerprint: a position saved on one device
    /// resumes on another.
    pub fn prefetch_to_device(&self, device: Device, n: usize) -> Dataset<T> {
        self.prefetch_to_device_with(Arc::new(TensorCopy), device, n)
    }

    /// [`prefetch_to_device`](Self::prefetch_to_device) with another transfer (pinned memory, copy stream).
    pub fn prefetch_to_device_with(
        &self,
        transfer: Arc<dyn DeviceTransfer<T>>,
        device: Device,
        n: usize,
    ) -> Dataset<T> {
        self.map_named("to_device", 1, move |x| transfer.transfer(x, &device))
            .prefetch(n)
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
