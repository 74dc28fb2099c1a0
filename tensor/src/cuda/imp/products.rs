//! Matrix products on [`CudaStorage`] ([`Products`]) through cuBLAS and cuBLASLt.

use cohort_kernels::matmul::{MatmulShape, cuda as matmul_cuda};

use super::{CudaStorage, mismatch, same_device, want};
use crate::backend::Products;
use crate::{DType, Result};

impl Products for CudaStorage {
    /// f16 and bf16 also run here (GemmEx, fp32 accumulation).
    ///
    /// # Errors
    /// Different dtypes or devices, i32 / u8 / f64, out of memory, or a cuBLAS failure.
    fn matmul(&self, rhs: &CudaStorage, shape: &MatmulShape) -> Result<CudaStorage> {
        if self.dtype != rhs.dtype {
            return Err(mismatch("matmul", self.dtype, rhs.dtype));
        }
        same_device("matmul", self, rhs)?;
        let t = want("matmul", self, &[DType::F32, DType::F16, DType::BF16])?;
        let out = self.sibling(shape.batch * shape.m * shape.n, self.dtype)?;
        // SAFETY: the tensor validated that self and rhs hold what `shape` describes.
        unsafe {
            matmul_cuda::matmul(
                &self.gpu,
                t,
                self.device_ptr(),
                rhs.device_ptr(),
                out.device_ptr(),
                shape,
            )?
        };
        Ok(out)
    }

    /// `x · w + bias` (then a ReLU) in one cuBLASLt call, the bias and ReLU in its epilogue;
    /// `None` where the epilogue cannot run (see [`matmul_cuda::matmul_bias`]).
    ///
    /// # Errors
    /// Different dtypes or devices, out of memory, or a cuBLASLt failure.
    fn linear(
        &self,
        w: &CudaStorage,
        bias: &CudaStorage,
        shape: &MatmulShape,
        bias_batch_stride: usize,
        relu: bool,
    ) -> Result<Option<CudaStorage>> {
        if self.dtype != w.dtype || self.dtype != bias.dtype {
            return Err(mismatch("linear", self.dtype, w.dtype));
        }
        same_device("linear", self, w)?;
        same_device("linear", self, bias)?;
        let t = want("linear", self, &[DType::F32, DType::F16, DType::BF16])?;
        let out = self.sibling(shape.batch * shape.m * shape.n, self.dtype)?;
        let ptrs = (
            self.device_ptr(),
            w.device_ptr(),
            out.device_ptr(),
            bias.device_ptr(),
        );
        // SAFETY: the tensor validated that self and w hold what `shape` describes and that the bias
        // holds n elements per product at the given stride.
        let done = unsafe {
            matmul_cuda::matmul_bias(&self.gpu, t, ptrs, shape, bias_batch_stride, relu)?
        };
        Ok(done.then_some(out))
    }
}
