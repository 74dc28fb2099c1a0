//! Element-wise ops on [`CudaStorage`] ([`Elementwise`]).

use cohort_kernels::binary::{BinaryOp, cuda as binary_cuda};
use cohort_kernels::cuda::CudaType;
use cohort_kernels::unary::{UnaryOp, cuda as unary_cuda};

use super::{BINARY_TYPES, CudaStorage, FLOAT_TYPES, mismatch, same_device, want};
use crate::backend::Elementwise;
use crate::{DType, Error, Result};

impl Elementwise for CudaStorage {
    /// # Errors
    /// Different dtypes or devices, a dtype without kernels (f32 and i32 have them), shapes that do
    /// not broadcast, out of memory, or a launch failure.
    fn binary(
        &self,
        op: BinaryOp,
        lhs_shape: &[usize],
        rhs: &CudaStorage,
        rhs_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<CudaStorage> {
        if self.dtype != rhs.dtype {
            return Err(mismatch(op.name(), self.dtype, rhs.dtype));
        }
        same_device(op.name(), self, rhs)?;
        let t = want(op.name(), self, &BINARY_TYPES)?;
        let out = self.sibling(out_shape.iter().product(), self.dtype)?;
        // SAFETY: each buffer holds its shape's elements.
        unsafe {
            binary_cuda::binary(
                &self.gpu,
                op,
                t,
                self.device_ptr(),
                lhs_shape,
                rhs.device_ptr(),
                rhs_shape,
                out.device_ptr(),
                out_shape,
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// As [`Elementwise::binary`].
    fn binary_assign(
        &mut self,
        op: BinaryOp,
        dst_shape: &[usize],
        src: &CudaStorage,
        src_shape: &[usize],
    ) -> Result<()> {
        if self.dtype != src.dtype {
            return Err(mismatch(op.name(), self.dtype, src.dtype));
        }
        same_device(op.name(), self, src)?;
        let t = want(op.name(), self, &BINARY_TYPES)?;
        let d = self.device_ptr();
        // SAFETY: element i of self is read and written by the same thread only (the output has
        // self's shape and layout), so updating in place is sound.
        unsafe {
            binary_cuda::binary(
                &self.gpu,
                op,
                t,
                d,
                dst_shape,
                src.device_ptr(),
                src_shape,
                d,
                dst_shape,
            )?
        };
        Ok(())
    }

    /// # Errors
    /// Not f32 (bf16 and f16 for ReLU), out of memory, or a launch failure.
    fn unary(&self, op: UnaryOp) -> Result<CudaStorage> {
        let t = want(op.name(), self, &FLOAT_TYPES)?;
        let out = self.sibling(self.len, self.dtype)?;
        // SAFETY: both hold len elements of t.
        unsafe {
            unary_cuda::unary(
                &self.gpu,
                op,
                t,
                self.device_ptr(),
                out.device_ptr(),
                self.len,
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Different value dtypes, unsupported dtypes (masks f32/i32/u8, values f32/i32), different
    /// lengths or devices, out of memory, or a launch failure.
    fn where_cond(&self, on_true: &CudaStorage, on_false: &CudaStorage) -> Result<CudaStorage> {
        if on_true.dtype != on_false.dtype {
            return Err(mismatch("where_cond", on_true.dtype, on_false.dtype));
        }
        same_device("where_cond", self, on_true)?;
        same_device("where_cond", self, on_false)?;
        let mt = want(
            "where_cond (mask)",
            self,
            &[DType::F32, DType::I32, DType::U8],
        )?;
        let vt = want("where_cond", on_true, &BINARY_TYPES)?;
        let n = self.len;
        if on_true.len != n || on_false.len != n {
            return Err(Error::InvalidArgument {
                op: "where_cond",
                reason: format!(
                    "mask, on_true and on_false hold {n}, {} and {} elements; broadcast them first",
                    on_true.len, on_false.len
                ),
            });
        }
        let out = self.sibling(n, on_true.dtype)?;
        // SAFETY: all four hold n elements.
        unsafe {
            binary_cuda::where_cond(
                &self.gpu,
                mt,
                vt,
                self.device_ptr(),
                &[n],
                on_true.device_ptr(),
                &[n],
                on_false.device_ptr(),
                &[n],
                out.device_ptr(),
                &[n],
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn bias_act(
        &self,
        b: &CudaStorage,
        cols: usize,
        group: usize,
        relu: bool,
    ) -> Result<CudaStorage> {
        want("bias_act", self, &[DType::F32])?;
        want("bias_act", b, &[DType::F32])?;
        same_device("bias_act", self, b)?;
        let y = self.sibling(self.len, DType::F32)?;
        // SAFETY: self and y hold len f32, b len / group · cols (checked by the caller's shapes).
        unsafe {
            unary_cuda::bias_act(
                &self.gpu,
                (self.device_ptr(), b.device_ptr(), y.device_ptr()),
                self.len,
                cols,
                group,
                relu,
            )?
        };
        Ok(y)
    }

    /// # Errors
    /// Not f32, bf16 or f16, different dtypes or devices, out of memory, or a launch failure.
    fn relu_backward(&self, y: &CudaStorage) -> Result<CudaStorage> {
        self.activation_backward("relu_backward", y, &FLOAT_TYPES, unary_cuda::relu_backward)
    }

    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn gelu_backward(&self, x: &CudaStorage) -> Result<CudaStorage> {
        self.activation_backward("gelu_backward", x, &[DType::F32], unary_cuda::gelu_backward)
    }
}

/// An activation's backward kernel: the element type, the gradient, what the forward saved, the input's gradient,
/// their length.
type BackwardKernel = unsafe fn(
    &cohort_kernels::cuda::Gpu,
    CudaType,
    u64,
    u64,
    u64,
    usize,
) -> cohort_kernels::Result<()>;

impl CudaStorage {
    /// The gradient `self` through an activation whose forward saved `saved` (its input or output, of `self`'s
    /// dtype, one of `types`), by `kernel`.
    fn activation_backward(
        &self,
        op: &'static str,
        saved: &CudaStorage,
        types: &[DType],
        kernel: BackwardKernel,
    ) -> Result<CudaStorage> {
        let t = want(op, self, types)?;
        if saved.dtype != self.dtype {
            return Err(mismatch(op, self.dtype, saved.dtype));
        }
        same_device(op, self, saved)?;
        let dx = self.sibling(self.len, self.dtype)?;
        // SAFETY: all three hold len elements of t (same shapes, checked by the caller).
        unsafe {
            kernel(
                &self.gpu,
                t,
                self.device_ptr(),
                saved.device_ptr(),
                dx.device_ptr(),
                self.len,
            )?
        };
        Ok(dx)
    }
}
