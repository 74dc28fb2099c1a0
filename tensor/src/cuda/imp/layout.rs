//! Creating, converting and moving elements on [`CudaStorage`] ([`Layout`]).

use cohort_kernels::copy::{Copy2d, cuda as copy_cuda};

use super::{CudaStorage, mismatch, same_device, ty};
use crate::backend::{CudaBackend, Layout};
use crate::{DType, Error, Result};

/// A block copy must stay inside its buffer: the kernels do not check.
fn check_block(
    op: &'static str,
    rows: usize,
    cols: usize,
    stride: usize,
    offset: usize,
    len: usize,
) -> Result<()> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let end = offset + (rows - 1) * stride + cols;
    if end > len {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "a block copy of {rows}x{cols} (stride {stride}, offset {offset}) reaches element {end} of a buffer of {len}"
            ),
        });
    }
    Ok(())
}

impl Layout for CudaStorage {
    fn zeros_like(&self, len: usize, dtype: DType) -> Result<CudaStorage> {
        CudaStorage::zeros(len, dtype, self.ordinal)
    }

    /// # Errors
    /// f64 on either side, out of memory, or a launch failure.
    fn cast(&self, dtype: DType) -> Result<CudaStorage> {
        let from = ty("to_dtype", self.dtype)?;
        let to = ty("to_dtype", dtype)?;
        let out = self.sibling(self.len, dtype)?;
        // SAFETY: self holds len elements of `from`, out len of `to`.
        unsafe {
            copy_cuda::cast(
                &self.gpu,
                from,
                to,
                self.device_ptr(),
                out.device_ptr(),
                self.len,
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Different dtypes or devices, or a launch failure.
    fn copy2d(&self, dst: &mut CudaStorage, c: &Copy2d) -> Result<()> {
        if self.dtype != dst.dtype {
            return Err(mismatch("copy", dst.dtype, self.dtype));
        }
        same_device("copy", dst, self)?;
        check_block("copy", c.rows, c.cols, c.src_stride, c.src_offset, self.len)?;
        check_block("copy", c.rows, c.cols, c.dst_stride, c.dst_offset, dst.len)?;
        // SAFETY: both block geometries were checked against the buffers.
        unsafe {
            copy_cuda::copy2d(
                &self.gpu,
                self.dtype.size_in_bytes(),
                self.device_ptr(),
                dst.device_ptr(),
                c,
            )?
        };
        Ok(())
    }

    /// # Errors
    /// f64, out of memory, or a launch failure.
    fn transpose(&self, batch: usize, rows: usize, cols: usize) -> Result<CudaStorage> {
        ty("transpose", self.dtype)?;
        let out = self.sibling(self.len, self.dtype)?;
        // SAFETY: both hold batch·rows·cols elements (the tensor validated the shape).
        unsafe {
            copy_cuda::transpose(
                &self.gpu,
                self.dtype.size_in_bytes(),
                self.device_ptr(),
                out.device_ptr(),
                batch,
                rows,
                cols,
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// f64, shapes that do not broadcast, out of memory, or a launch failure.
    fn broadcast(&self, src_shape: &[usize], out_shape: &[usize]) -> Result<CudaStorage> {
        ty("broadcast_to", self.dtype)?;
        let out = self.sibling(out_shape.iter().product(), self.dtype)?;
        // SAFETY: self holds src_shape'self elements, out out_shape'self.
        unsafe {
            copy_cuda::broadcast(
                &self.gpu,
                self.dtype.size_in_bytes(),
                self.device_ptr(),
                src_shape,
                out.device_ptr(),
                out_shape,
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// f64, or a driver failure.
    fn fill(&mut self, value: f64) -> Result<()> {
        let t = ty("fill", self.dtype)?;
        // SAFETY: self holds len elements of its dtype.
        unsafe { copy_cuda::fill(&self.gpu, t, self.device_ptr(), self.len, value)? };
        Ok(())
    }
}
