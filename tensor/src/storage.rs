//! Tensor storage: a host buffer of one dtype, or a CUDA block.

use half::{bf16, f16};

use crate::cuda::CudaStorage;
use crate::{DType, Device};

/// The elements of a tensor on one device.
#[derive(Debug)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// A block of a CUDA device's allocator.
    Cuda(CudaStorage),
}

impl Storage {
    /// The device the storage lives on.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }
}

/// A backend's storage as it sits in a [`Storage`]: lets an op body written once for both backends
/// take a further operand of its own backend.
pub(crate) trait OfBackend {
    /// The storage behind `s`, or `None` when it is of the other backend.
    fn of(s: &Storage) -> Option<&Self>;
}

impl OfBackend for CpuStorage {
    fn of(s: &Storage) -> Option<&Self> {
        match s {
            Storage::Cpu(c) => Some(c),
            Storage::Cuda(_) => None,
        }
    }
}

impl OfBackend for CudaStorage {
    fn of(s: &Storage) -> Option<&Self> {
        match s {
            Storage::Cuda(c) => Some(c),
            Storage::Cpu(_) => None,
        }
    }
}

/// The storages as CPU ones, or `None` when any is on a GPU.
pub(crate) fn on_cpu<'a>(s: &[&'a Storage]) -> Option<Vec<&'a CpuStorage>> {
    s.iter().map(|&s| CpuStorage::of(s)).collect()
}

/// The storages as CUDA ones, or `None` when any is on the CPU.
pub(crate) fn on_cuda<'a>(s: &[&'a Storage]) -> Option<Vec<&'a CudaStorage>> {
    s.iter().map(|&s| CudaStorage::of(s)).collect()
}

/// A host buffer of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i32 elements.
    I32(Vec<i32>),
    /// u8 elements.
    U8(Vec<u8>),
}

impl CpuStorage {
    /// The buffer's dtype.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::I32(v) => v.len(),
            CpuStorage::U8(v) => v.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw bytes of the buffer (host byte order).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice(v),
            CpuStorage::F64(v) => bytemuck::cast_slice(v),
            CpuStorage::F16(v) => bytemuck::cast_slice(v),
            CpuStorage::BF16(v) => bytemuck::cast_slice(v),
            CpuStorage::I32(v) => bytemuck::cast_slice(v),
            CpuStorage::U8(v) => v,
        }
    }
}
