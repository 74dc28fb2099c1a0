//! Reductions and the softmax family on [`CudaStorage`] ([`Reductions`]).

use cohort_kernels::reduce::{ReduceOp, ReduceShape, cuda as reduce_cuda};
use cohort_kernels::softmax::cuda as softmax_cuda;

use super::{BINARY_TYPES, CudaStorage, indices, same_device, want};
use crate::backend::Reductions;
use crate::{DType, Result};

impl Reductions for CudaStorage {
    /// # Errors
    /// A dtype without kernels (f32: all; i32: sum, max, min), out of memory, or a launch failure.
    fn reduce(&self, op: ReduceOp, shape: ReduceShape) -> Result<CudaStorage> {
        let allowed: &[DType] = if op == ReduceOp::Mean {
            &[DType::F32]
        } else {
            &BINARY_TYPES
        };
        let t = want(op.name(), self, allowed)?;
        let out = self.sibling(shape.outer * shape.inner, self.dtype)?;
        // SAFETY: self holds outer·dim·inner elements, out outer·inner.
        unsafe {
            reduce_cuda::reduce(&self.gpu, op, t, self.device_ptr(), out.device_ptr(), shape)?
        };
        Ok(out)
    }

    /// # Errors
    /// Not f32 or i32, out of memory, or a launch failure.
    fn argmax(&self, shape: ReduceShape) -> Result<CudaStorage> {
        let t = want("argmax", self, &BINARY_TYPES)?;
        let out = self.sibling(shape.outer * shape.inner, DType::I32)?;
        // SAFETY: as in reduce; out holds i32.
        unsafe { reduce_cuda::argmax(&self.gpu, t, self.device_ptr(), out.device_ptr(), shape)? };
        Ok(out)
    }

    /// # Errors
    /// Not f32, out of memory, or a launch failure.
    fn softmax_last(&self, cols: usize, log: bool) -> Result<CudaStorage> {
        let op = if log {
            "log_softmax_last"
        } else {
            "softmax_last"
        };
        want(op, self, &[DType::F32])?;
        let out = self.sibling(self.len, self.dtype)?;
        let rows = self.len.checked_div(cols).unwrap_or(0);
        // SAFETY: both hold rows·cols f32.
        unsafe {
            softmax_cuda::softmax_last(
                &self.gpu,
                self.device_ptr(),
                out.device_ptr(),
                rows,
                cols,
                log,
            )?
        };
        Ok(out)
    }

    /// An out-of-range label is reported at the next read-back.
    ///
    /// # Errors
    /// Not f32, labels not i32, out of memory, or a launch failure.
    fn cross_entropy(
        &self,
        labels: &CudaStorage,
        cols: usize,
        scale: f64,
    ) -> Result<(CudaStorage, CudaStorage)> {
        indices("cross_entropy", labels)?;
        want("cross_entropy", self, &[DType::F32])?;
        same_device("cross_entropy", self, labels)?;
        let rows = self.len.checked_div(cols).unwrap_or(0);
        let loss = self.sibling(rows, DType::F32)?;
        let grad = self.sibling(self.len, DType::F32)?;
        // SAFETY: self and grad hold rows·cols f32, loss rows f32, labels labels.len i32 (the
        // caller checked that it divides rows).
        unsafe {
            softmax_cuda::cross_entropy(
                &self.gpu,
                self.device_ptr(),
                labels.device_ptr(),
                rows,
                cols,
                labels.len,
                scale as f32,
                loss.device_ptr(),
                grad.device_ptr(),
            )?
        };
        Ok((loss, grad))
    }
}
