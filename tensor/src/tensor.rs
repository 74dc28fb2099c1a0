//! The [`Tensor`] type: creation, access, movement and layout.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cohort_kernels::copy::Copy2d;
use cohort_kernels::reduce::{ReduceOp, ReduceShape};

use crate::backend::{CudaBackend, Elementwise, Layout, Reductions};
use crate::cuda::{self, CudaStorage};
use crate::storage::{CpuStorage, Storage};
use crate::{DType, Device, Element, Error, Result, cpu, random};

/// An n-dimensional array on one device: contiguous, row-major, with shared storage.
///
/// Cloning is cheap and shares the storage; so do [`Tensor::reshape`] and same-device
/// [`Tensor::to_device`]. Every other op returns a new tensor, except the in-place ones
/// (`assign_`, `add_assign_`, ..., the optimizer steps), which write through the shared storage.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<RwLock<Storage>>,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {}, {}]",
            self.shape, self.dtype, self.device
        )
    }
}

/// The product of a shape's dims.
pub(crate) fn elem_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Builds a new tensor of shape `$shape` by running `$body` on `$t`'s storage bound to `$s`: one
/// expression, compiled for the CPU and the CUDA storage alike (both implement
/// [`crate::backend::BackendStorage`]), returning `Result<Tensor>`.
macro_rules! map1 {
    ($t:expr, $shape:expr, |$s:ident| $body:expr) => {{
        let t: &Tensor = $t;
        let out = match &*t.read() {
            Storage::Cpu($s) => Storage::Cpu($body?),
            Storage::Cuda($s) => Storage::Cuda($body?),
        };
        Ok::<Tensor, Error>(Tensor::from_storage(out, $shape))
    }};
}

/// Like [`map1!`] for two operands on the same device; `$op` names the op in a device mismatch.
macro_rules! map2 {
    ($t:expr, $op:expr, $other:expr, $shape:expr, |$a:ident, $b:ident| $body:expr) => {{
        let (t, other): (&Tensor, &Tensor) = ($t, $other);
        t.same_device($op, other)?;
        let out = Tensor::read_all(&[t, other], |st| match (st[0], st[1]) {
            (Storage::Cpu($a), Storage::Cpu($b)) => Ok(Storage::Cpu($body?)),
            (Storage::Cuda($a), Storage::Cuda($b)) => Ok(Storage::Cuda($body?)),
            _ => Err(t.device_mismatch($op, other)),
        })?;
        Ok::<Tensor, Error>(Tensor::from_storage(out, $shape))
    }};
}

/// Runs the in-place `$body` on `$t`'s storage bound to `$d`, reading `$src`'s bound to `$s` (copied
/// first if it shares `$t`'s storage); `Result<()>`.
macro_rules! mutate2 {
    ($t:expr, $op:expr, $src:expr, |$d:ident, $s:ident| $body:expr) => {{
        let (t, src): (&Tensor, &Tensor) = ($t, $src);
        t.same_device($op, src)?;
        let src = if t.same_storage(src) {
            src.copy()?
        } else {
            src.clone()
        };
        let sg = src.read();
        let mut dg = t.write();
        match (&mut *dg, &*sg) {
            (Storage::Cpu($d), Storage::Cpu($s)) => $body,
            (Storage::Cuda($d), Storage::Cuda($s)) => $body,
            _ => Err(t.device_mismatch($op, &src)),
        }
    }};
}

pub(crate) use {map1, map2, mutate2};

impl Tensor {
    pub(crate) fn from_storage(storage: Storage, shape: Vec<usize>) -> Tensor {
        let (dtype, device) = match &storage {
            Storage::Cpu(s) => {
                crate::memory::tune_host_malloc();
                (s.dtype(), Device::Cpu)
            }
            Storage::Cuda(s) => (s.dtype(), Device::Cuda(s.ordinal())),
        };
        Tensor {
            storage: Arc::new(RwLock::new(storage)),
            shape,
            dtype,
            device,
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.storage.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the storage of every tensor in `ts`, read under one guard per distinct storage:
    /// a second read lock on the same storage could deadlock behind a waiting writer.
    pub(crate) fn read_all<R>(ts: &[&Tensor], f: impl FnOnce(&[&Storage]) -> R) -> R {
        let mut guards = Vec::with_capacity(ts.len());
        let mut which = Vec::with_capacity(ts.len());
        for (i, t) in ts.iter().enumerate() {
            match ts[..i].iter().position(|u| u.same_storage(t)) {
                Some(j) => which.push(which[j]),
                None => {
                    which.push(guards.len());
                    guards.push(t.read());
                }
            }
        }
        let views: Vec<&Storage> = which.iter().map(|&k| &*guards[k]).collect();
        f(&views)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.storage.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether two tensors share storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    pub(crate) fn device_mismatch(&self, op: &'static str, other: &Tensor) -> Error {
        Error::DeviceMismatch {
            op,
            lhs: self.device,
            rhs: other.device,
        }
    }

    pub(crate) fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device != other.device {
            return Err(self.device_mismatch(op, other));
        }
        Ok(())
    }

    pub(crate) fn same_dtype(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype,
                rhs: other.dtype,
            });
        }
        Ok(())
    }

    pub(crate) fn same_shape(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.shape != other.shape {
            return Err(self.shape_mismatch(op, other));
        }
        Ok(())
    }

    pub(crate) fn shape_mismatch(&self, op: &'static str, other: &Tensor) -> Error {
        Error::ShapeMismatch {
            op,
            lhs: self.shape.clone(),
            rhs: other.shape.clone(),
        }
    }

    pub(crate) fn check_dim(&self, op: &'static str, dim: usize) -> Result<()> {
        if dim >= self.rank() {
            return Err(Error::DimOutOfRange {
                op,
                dim,
                rank: self.rank(),
                shape: self.shape.clone(),
            });
        }
        Ok(())
    }

    /// `[outer, dim, inner]` around `dim`.
    pub(crate) fn split_at_dim(&self, dim: usize) -> ReduceShape {
        ReduceShape {
            outer: elem_count(&self.shape[..dim]),
            dim: self.shape[dim],
            inner: elem_count(&self.shape[dim + 1..]),
        }
    }

    /// f32 or f64; on CUDA also bf16 and f16, whose kernels exist for the ops a mixed policy keeps activations
    /// in the low type through (the storage names any other).
    pub(crate) fn require_float(&self, op: &'static str) -> Result<()> {
        match self.dtype {
            DType::F32 | DType::F64 => Ok(()),
            DType::BF16 | DType::F16 if self.device.is_cuda() => Ok(()),
            dtype => Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: " (needs f32 or f64: convert with to_dtype)",
            }),
        }
    }

    pub(crate) fn require_i32(&self, op: &'static str) -> Result<()> {
        if self.dtype != DType::I32 {
            return Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype,
                hint: " (indices and labels must be i32)",
            });
        }
        Ok(())
    }

    fn from_cpu(s: CpuStorage, shape: &[usize], dev: &Device) -> Result<Tensor> {
        let storage = match dev {
            Device::Cpu => Storage::Cpu(s),
            Device::Cuda(n) => Storage::Cuda(CudaStorage::from_host(&s, *n)?),
        };
        Ok(Tensor::from_storage(storage, shape.to_vec()))
    }

    // ---------------------------------------------------------------- creation

    /// A tensor of `value` (cast to `dtype`).
    ///
    /// # Errors
    /// When the device is unavailable or out of memory.
    pub fn full(shape: &[usize], value: f64, dtype: DType, dev: &Device) -> Result<Tensor> {
        let n = elem_count(shape);
        let s = match dev {
            Device::Cpu => Storage::Cpu(cpu::full(n, value, dtype)?),
            Device::Cuda(o) => Storage::Cuda(CudaStorage::full(n, value, dtype, *o)?),
        };
        Ok(Tensor::from_storage(s, shape.to_vec()))
    }

    /// A tensor of zeros.
    ///
    /// # Errors
    /// When the device is unavailable or out of memory.
    pub fn zeros(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, dev)
    }

    /// A tensor of ones.
    ///
    /// # Errors
    /// When the device is unavailable or out of memory.
    pub fn ones(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, dev)
    }

    /// A tensor of zeros with this tensor's shape, dtype and device.
    ///
    /// # Errors
    /// When the device is unavailable or out of memory.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(&self.shape, self.dtype, &self.device)
    }

    /// A rank-0 tensor.
    ///
    /// # Errors
    /// When the device is unavailable or out of memory.
    pub fn scalar(value: f64, dtype: DType, dev: &Device) -> Result<Tensor> {
        Tensor::full(&[], value, dtype, dev)
    }

    /// Takes ownership of `data` as a tensor of `shape`.
    ///
    /// # Errors
    /// [`Error::ElementCount`] when `data.len()` is not the product of `shape`; device errors.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], dev: &Device) -> Result<Tensor> {
        let expected = elem_count(shape);
        if data.len() != expected {
            return Err(Error::ElementCount {
                op: "from_vec",
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        Tensor::from_cpu(T::into_storage(data), shape, dev)
    }

    /// Copies `data` into a tensor of `shape`.
    ///
    /// # Errors
    /// [`Error::ElementCount`] when `data.len()` is not the product of `shape`; device errors.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], dev: &Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, dev)
    }

    /// `[0, 1, ..., n-1]`.
    ///
    /// # Errors
    /// Device errors.
    pub fn arange(n: usize, dtype: DType, dev: &Device) -> Result<Tensor> {
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        Tensor::from_cpu(CpuStorage::F64(v).cast(dtype)?, &[n], dev)
    }

    /// Values uniform in `[lo, hi)` from a seeded generator (the same on every device).
    ///
    /// # Errors
    /// Device errors.
    pub fn rand_uniform(
        shape: &[usize],
        lo: f64,
        hi: f64,
        dtype: DType,
        seed: u64,
        dev: &Device,
    ) -> Result<Tensor> {
        let v = random::uniform(elem_count(shape), lo, hi, seed);
        Tensor::from_cpu(CpuStorage::F64(v).cast(dtype)?, shape, dev)
    }

    /// Values from N(mean, std²) from a seeded generator (the same on every device).
    ///
    /// # Errors
    /// Device errors.
    pub fn rand_normal(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        seed: u64,
        dev: &Device,
    ) -> Result<Tensor> {
        let v = random::normal(elem_count(shape), mean, std, seed);
        Tensor::from_cpu(CpuStorage::F64(v).cast(dtype)?, shape, dev)
    }

    // ---------------------------------------------------------------- access

    /// The dims.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        elem_count(&self.shape)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the tensor lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The elements, row-major, copied to the host.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] when `T` is not the tensor's dtype; device errors.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                lhs: self.dtype,
                rhs: T::DTYPE,
            });
        }
        let mismatch = |s: &CpuStorage| Error::DTypeMismatch {
            op: "to_vec",
            lhs: s.dtype(),
            rhs: T::DTYPE,
        };
        match &*self.read() {
            Storage::Cpu(s) => T::slice(s).map(<[T]>::to_vec).ok_or_else(|| mismatch(s)),
            Storage::Cuda(s) => {
                let h = s.to_host()?;
                T::slice(&h).map(<[T]>::to_vec).ok_or_else(|| mismatch(&h))
            }
        }
    }

    /// Starts copying the elements to the host behind the work queued so far and returns at once
    /// (on a GPU; on the CPU they are copied now). [`HostRead::wait`] gives them. A training loop
    /// reads each step's loss this way and keeps the GPU busy instead of waiting for every step.
    ///
    /// # Errors
    /// Device errors (a read-back inside a graph capture is one).
    pub fn read_later(&self) -> Result<HostRead> {
        Ok(HostRead(match &*self.read() {
            Storage::Cpu(s) => Pending::Ready(s.clone()),
            Storage::Cuda(s) => Pending::Cuda(s.to_host_later()?),
        }))
    }

    /// The single element of a one-element tensor (any shape).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when the tensor does not hold exactly one element; dtype errors.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.elem_count() != 1 {
            return Err(Error::InvalidShape {
                op: "to_scalar",
                shape: self.shape.clone(),
                reason: "to_scalar needs exactly one element".into(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// A copy on `dev` (this tensor itself, shared, when already there).
    ///
    /// # Errors
    /// Device errors.
    pub fn to_device(&self, dev: &Device) -> Result<Tensor> {
        if *dev == self.device {
            return Ok(self.clone());
        }
        let host = match &*self.read() {
            Storage::Cpu(s) => s.clone(),
            Storage::Cuda(s) => s.to_host()?,
        };
        Tensor::from_cpu(host, &self.shape, dev)
    }

    /// A copy converted to `dtype` (this tensor itself, shared, when already of it).
    ///
    /// # Errors
    /// Device errors.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        if self.device.is_cuda() && dtype == DType::F64 {
            return Err(Error::UnsupportedDType {
                op: "to_dtype",
                dtype,
                hint: " (f64 is CPU only)",
            });
        }
        map1!(self, self.shape.clone(), |s| s.cast(dtype))
    }

    /// A deep copy with its own storage.
    ///
    /// # Errors
    /// Device errors.
    pub fn copy(&self) -> Result<Tensor> {
        let n = self.elem_count();
        let c = Copy2d::whole(n);
        let dtype = self.dtype;
        let out = match &*self.read() {
            Storage::Cpu(s) => Storage::Cpu(s.clone()),
            Storage::Cuda(s) => {
                let mut d = s.zeros_like(n, dtype)?;
                s.copy2d(&mut d, &c)?;
                Storage::Cuda(d)
            }
        };
        Ok(Tensor::from_storage(out, self.shape.clone()))
    }

    // ---------------------------------------------------------------- layout

    /// The same storage seen with another shape of the same element count.
    ///
    /// # Errors
    /// [`Error::ElementCount`] when the counts differ.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if elem_count(shape) != self.elem_count() {
            return Err(Error::ElementCount {
                op: "reshape",
                shape: shape.to_vec(),
                expected: elem_count(shape),
                got: self.elem_count(),
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// Swaps the last two dims (a new, materialized tensor).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for tensors of rank below 2.
    pub fn transpose(&self) -> Result<Tensor> {
        let r = self.rank();
        if r < 2 {
            return Err(Error::InvalidShape {
                op: "transpose",
                shape: self.shape.clone(),
                reason: "transpose needs rank >= 2 (it swaps the last two dims)".into(),
            });
        }
        let (rows, cols) = (self.shape[r - 2], self.shape[r - 1]);
        let batch = elem_count(&self.shape[..r - 2]);
        let mut shape = self.shape.clone();
        shape.swap(r - 2, r - 1);
        map1!(self, shape, |s| s.transpose(batch, rows, cols))
    }

    /// Elements `start..start + len` along `dim` (a new tensor).
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`], or [`Error::InvalidArgument`] when the range exceeds the dim.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        self.check_dim("narrow", dim)?;
        let size = self.shape[dim];
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::InvalidArgument {
                op: "narrow",
                reason: format!(
                    "range {start}..{} exceeds dim {dim} of size {size} (shape {:?})",
                    start.saturating_add(len),
                    self.shape
                ),
            });
        }
        let ReduceShape { outer, inner, .. } = self.split_at_dim(dim);
        let mut shape = self.shape.clone();
        shape[dim] = len;
        let c = Copy2d {
            rows: outer,
            cols: len * inner,
            src_stride: size * inner,
            dst_stride: len * inner,
            src_offset: start * inner,
            dst_offset: 0,
        };
        let (n, dtype) = (elem_count(&shape), self.dtype);
        map1!(self, shape, |s| {
            let mut d = s.zeros_like(n, dtype)?;
            s.copy2d(&mut d, &c)?;
            Ok::<_, Error>(d)
        })
    }

    /// Writes `src` into elements `start..start + src.shape[dim]` along `dim`, in place.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; a range beyond the dim.
    pub fn narrow_assign_(&self, dim: usize, start: usize, src: &Tensor) -> Result<()> {
        const OP: &str = "narrow_assign_";
        self.check_dim(OP, dim)?;
        self.same_dtype(OP, src)?;
        let len = src.shape.get(dim).copied().unwrap_or(0);
        let mut expect = self.shape.clone();
        expect[dim] = len;
        if src.shape != expect {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: self.shape.clone(),
                rhs: src.shape.clone(),
            });
        }
        let size = self.shape[dim];
        if start.checked_add(len).is_none_or(|e| e > size) {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "range {start}..{} exceeds dim {dim} of size {size}",
                    start.saturating_add(len)
                ),
            });
        }
        let ReduceShape { outer, inner, .. } = self.split_at_dim(dim);
        let c = Copy2d {
            rows: outer,
            cols: len * inner,
            src_stride: len * inner,
            dst_stride: size * inner,
            src_offset: 0,
            dst_offset: start * inner,
        };
        mutate2!(self, OP, src, |d, s| s.copy2d(d, &c))
    }

    /// Concatenates along `dim`; all other dims must agree.
    ///
    /// # Errors
    /// An empty list; shape, dtype or device mismatches.
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        const OP: &str = "cat";
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "needs at least one tensor".into(),
            });
        };
        first.check_dim(OP, dim)?;
        let mut shape = first.shape.clone();
        shape[dim] = 0;
        for t in tensors {
            first.same_dtype(OP, t)?;
            first.same_device(OP, t)?;
            let ok = t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == dim || t.shape[i] == first.shape[i]);
            if !ok {
                return Err(first.shape_mismatch(OP, t));
            }
            shape[dim] += t.shape[dim];
        }
        let out = Tensor::zeros(&shape, first.dtype, &first.device)?;
        let mut start = 0;
        for t in tensors {
            out.narrow_assign_(dim, start, t)?;
            start += t.shape[dim];
        }
        Ok(out)
    }

    /// Stacks equal-shaped tensors along a new dim `dim` (0..=rank).
    ///
    /// # Errors
    /// An empty list; shape, dtype or device mismatches; `dim > rank`.
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        const OP: &str = "stack";
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "needs at least one tensor".into(),
            });
        };
        if dim > first.rank() {
            return Err(Error::DimOutOfRange {
                op: OP,
                dim,
                rank: first.rank() + 1,
                shape: first.shape.clone(),
            });
        }
        let mut views = Vec::with_capacity(tensors.len());
        for t in tensors {
            first.same_shape(OP, t)?;
            let mut s = t.shape.clone();
            s.insert(dim, 1);
            views.push(t.reshape(&s)?);
        }
        let refs: Vec<&Tensor> = views.iter().collect();
        Tensor::cat(&refs, dim)
    }

    /// Materializes a numpy-style broadcast to `shape`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shapes are not broadcast-compatible.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape.as_slice() {
            return Ok(self.clone());
        }
        let ok = self.rank() <= shape.len()
            && self
                .shape
                .iter()
                .rev()
                .zip(shape.iter().rev())
                .all(|(&a, &b)| a == b || a == 1);
        if !ok {
            return Err(Error::ShapeMismatch {
                op: "broadcast_to",
                lhs: self.shape.clone(),
                rhs: shape.to_vec(),
            });
        }
        let src = self.shape.clone();
        map1!(self, shape.to_vec(), |s| s.broadcast(&src, shape))
    }

    /// Sums a broadcast result back to `shape` (the backward of broadcasting).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when this tensor's shape is not a broadcast of `shape`.
    pub fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape.as_slice() {
            return Ok(self.clone());
        }
        let err = || Error::ShapeMismatch {
            op: "sum_to",
            lhs: self.shape.clone(),
            rhs: shape.to_vec(),
        };
        if shape.len() > self.rank() {
            return Err(err());
        }
        let lead = self.rank() - shape.len();
        if (0..shape.len()).any(|i| shape[i] != self.shape[lead + i] && shape[i] != 1) {
            return Err(err());
        }
        // Leading dims collapse into one and are summed in a single pass.
        let mut t = if lead > 0 {
            let rest = &self.shape[lead..];
            let outer = elem_count(&self.shape[..lead]);
            let mut s = vec![outer];
            s.extend_from_slice(rest);
            self.reshape(&s)?.sum(0, false)?
        } else {
            self.clone()
        };
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 && t.shape[i] != 1 {
                t = t.sum(i, true)?;
            }
        }
        t.reshape(shape)
    }

    pub(crate) fn reduce_op(&self, op: ReduceOp, dim: usize, keepdim: bool) -> Result<Tensor> {
        self.check_dim(op.name(), dim)?;
        if matches!(op, ReduceOp::Mean) {
            self.require_float(op.name())?;
        }
        let rs = self.split_at_dim(dim);
        let mut shape = self.shape.clone();
        if keepdim {
            shape[dim] = 1;
        } else {
            shape.remove(dim);
        }
        map1!(self, shape, |s| s.reduce(op, rs))
    }

    // ---------------------------------------------------------------- in place

    /// Overwrites this tensor's elements with `src`'s (same shape, dtype and device).
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn assign_(&self, src: &Tensor) -> Result<()> {
        const OP: &str = "assign_";
        self.same_shape(OP, src)?;
        self.same_dtype(OP, src)?;
        if self.same_storage(src) {
            return Ok(());
        }
        let n = self.elem_count();
        let c = Copy2d::whole(n);
        mutate2!(self, OP, src, |d, s| s.copy2d(d, &c))
    }

    /// Sets every element to zero.
    ///
    /// # Errors
    /// Device errors.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }

    /// Sets every element to `value`.
    ///
    /// # Errors
    /// Device errors.
    pub fn fill_(&self, value: f64) -> Result<()> {
        match &mut *self.write() {
            Storage::Cpu(s) => s.fill(value),
            Storage::Cuda(s) => s.fill(value),
        }
    }

    /// `self += src`, with `src` broadcast to this shape (gradient accumulation).
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn add_assign_(&self, src: &Tensor) -> Result<()> {
        const OP: &str = "add_assign_";
        self.same_dtype(OP, src)?;
        let out = crate::ops::broadcast_shape(OP, &self.shape, &src.shape)?;
        if out != self.shape {
            return Err(self.shape_mismatch(OP, src));
        }
        let (ds, ss) = (self.shape.clone(), src.shape.clone());
        let op = cohort_kernels::binary::BinaryOp::Add;
        mutate2!(self, OP, src, |d, s| d.binary_assign(op, &ds, s, &ss))
    }
}

/// A tensor's elements on their way to the host ([`Tensor::read_later`]).
#[derive(Debug)]
pub struct HostRead(Pending);

#[derive(Debug)]
enum Pending {
    Ready(CpuStorage),
    Cuda(cuda::PendingHost),
}

impl HostRead {
    /// Whether the elements have arrived (without waiting).
    pub fn is_ready(&self) -> bool {
        match &self.0 {
            Pending::Ready(_) => true,
            Pending::Cuda(p) => p.is_done(),
        }
    }

    /// The elements, waiting for them if they have not arrived.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] when `T` is not the tensor's dtype; a queued kernel failed.
    pub fn wait<T: Element>(self) -> Result<Vec<T>> {
        let s = match self.0 {
            Pending::Ready(s) => s,
            Pending::Cuda(p) => p.wait()?,
        };
        T::slice(&s)
            .map(<[T]>::to_vec)
            .ok_or_else(|| Error::DTypeMismatch {
                op: "read_later",
                lhs: s.dtype(),
                rhs: T::DTYPE,
            })
    }
}
