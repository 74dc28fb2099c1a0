//! Index ops on [`CudaStorage`] ([`Indexing`]): an out-of-range index is reported later (see the module docs
//! of `imp.rs`).

use cohort_kernels::index::cuda as index_cuda;

use super::{BINARY_TYPES, CudaStorage, indices, mismatch, same_device, ty, unsupported, want};
use crate::backend::Indexing;
use crate::{DType, Result};

impl Indexing for CudaStorage {
    /// # Errors
    /// Indices not i32, f64, out of memory, or a launch failure (an index outside `0..dim` is
    /// reported later, see the module docs).
    fn index_select(
        &self,
        idx: &CudaStorage,
        outer: usize,
        dim: usize,
        inner: usize,
    ) -> Result<CudaStorage> {
        indices("index_select", idx)?;
        let t = ty("index_select", self.dtype)?;
        same_device("index_select", self, idx)?;
        let out = self.sibling(outer * idx.len * inner, self.dtype)?;
        // SAFETY: self holds outer·dim·inner elements, idx idx.len i32, out outer·idx.len·inner.
        unsafe {
            index_cuda::index_select(
                &self.gpu,
                t,
                self.device_ptr(),
                outer,
                dim,
                inner,
                idx.device_ptr(),
                idx.len,
                out.device_ptr(),
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Indices not i32, dtypes other than f32 / i32 or different, or a launch failure.
    fn index_add(
        &mut self,
        idx: &CudaStorage,
        src: &CudaStorage,
        shape: (usize, usize, usize),
        repeat: usize,
    ) -> Result<()> {
        indices("index_add", idx)?;
        if self.dtype != src.dtype {
            return Err(mismatch("index_add", self.dtype, src.dtype));
        }
        same_device("index_add", self, src)?;
        same_device("index_add", self, idx)?;
        let t = want("index_add", self, &BINARY_TYPES)?;
        // SAFETY: self holds outer·dim·inner elements, src outer·idx.len·inner.
        unsafe {
            index_cuda::index_add(
                &self.gpu,
                t,
                self.device_ptr(),
                shape,
                (idx.device_ptr(), idx.len),
                (src.device_ptr(), repeat),
            )?
        };
        Ok(())
    }

    /// # Errors
    /// Indices not i32, a source other than f32 / i32, out of memory, or a launch failure.
    fn gather_last(&self, idx: &CudaStorage, cols: usize) -> Result<CudaStorage> {
        indices("gather_last", idx)?;
        let t = want("gather_last", self, &BINARY_TYPES)?;
        same_device("gather_last", self, idx)?;
        let out = self.sibling(idx.len, self.dtype)?;
        // SAFETY: self holds idx.len·cols elements, idx and out idx.len.
        unsafe {
            index_cuda::gather_last(
                &self.gpu,
                t,
                self.device_ptr(),
                idx.len,
                cols,
                idx.device_ptr(),
                out.device_ptr(),
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Indices not i32, dtypes other than f32 or different, or a launch failure.
    fn scatter_add_last(
        &mut self,
        idx: &CudaStorage,
        src: &CudaStorage,
        cols: usize,
    ) -> Result<()> {
        indices("scatter_add_last", idx)?;
        if self.dtype != src.dtype {
            return Err(mismatch("scatter_add_last", self.dtype, src.dtype));
        }
        want("scatter_add_last", self, &[DType::F32])?;
        same_device("scatter_add_last", self, src)?;
        // SAFETY: self holds idx.len·cols f32, idx and src idx.len elements.
        unsafe {
            index_cuda::scatter_add_last(
                &self.gpu,
                self.device_ptr(),
                idx.len,
                cols,
                idx.device_ptr(),
                src.device_ptr(),
            )?
        };
        Ok(())
    }

    /// # Errors
    /// Labels not i32, a dtype other than f32 / i32 / u8, out of memory, or a launch failure.
    fn one_hot(&self, classes: usize, dtype: DType) -> Result<CudaStorage> {
        indices("one_hot", self)?;
        let t = match dtype {
            DType::F32 | DType::I32 | DType::U8 => ty("one_hot", dtype)?,
            other => return Err(unsupported("one_hot", other)),
        };
        let out = self.sibling(self.len * classes, dtype)?;
        // SAFETY: self holds len i32, out len·classes elements.
        unsafe {
            index_cuda::one_hot(
                &self.gpu,
                t,
                self.device_ptr(),
                self.len,
                classes,
                out.device_ptr(),
            )?
        };
        Ok(out)
    }
}
