//! Fused batch and layer normalization on [`CudaStorage`] ([`Normalization`]): f32 only.

use cohort_kernels::batchnorm::{BatchNormShape, cuda as batchnorm_cuda};
use cohort_kernels::layernorm::{LayerNormShape, cuda as layernorm_cuda};

use super::{CudaStorage, f32_on_one_device};
use crate::backend::Normalization;
use crate::{DType, Result};

impl Normalization for CudaStorage {
    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn batch_norm(
        &self,
        (weight, bias): (&CudaStorage, &CudaStorage),
        shape: (&BatchNormShape, f64),
        relu: bool,
        running: Option<(&mut CudaStorage, &mut CudaStorage, f64)>,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        const OP: &str = "batch_norm";
        f32_on_one_device(OP, self, &[weight, bias])?;
        let running = match running {
            Some((m, v, momentum)) => {
                f32_on_one_device(OP, self, &[m, v])?;
                Some((m.device_ptr(), v.device_ptr(), momentum))
            }
            None => None,
        };
        let out = self.sibling(shape.0.len(), DType::F32)?;
        let mean = self.sibling(shape.0.stat_len(), DType::F32)?;
        let invstd = self.sibling(shape.0.stat_len(), DType::F32)?;
        // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor); the running statistics
        // are held for writing by the caller.
        unsafe {
            batchnorm_cuda::forward(
                &self.gpu,
                shape,
                relu,
                (self.device_ptr(), weight.device_ptr(), bias.device_ptr()),
                (out.device_ptr(), mean.device_ptr(), invstd.device_ptr()),
                running,
            )?
        };
        Ok((out, mean, invstd))
    }

    /// # Errors
    /// As [`Normalization::batch_norm`].
    fn batch_norm_backward(
        &self,
        out: Option<&CudaStorage>,
        dout: &CudaStorage,
        (mean, invstd, weight): (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &BatchNormShape,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        const OP: &str = "batch_norm_backward";
        f32_on_one_device(OP, self, &[dout, mean, invstd, weight])?;
        let out = match out {
            Some(o) => {
                f32_on_one_device(OP, self, &[o])?;
                o.device_ptr()
            }
            None => 0,
        };
        let dx = self.sibling(shape.len(), DType::F32)?;
        let dweight = self.sibling(shape.stat_len(), DType::F32)?;
        let dbias = self.sibling(shape.stat_len(), DType::F32)?;
        // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
        unsafe {
            batchnorm_cuda::backward(
                &self.gpu,
                shape,
                (self.device_ptr(), out, dout.device_ptr()),
                (mean.device_ptr(), invstd.device_ptr(), weight.device_ptr()),
                (dx.device_ptr(), dweight.device_ptr(), dbias.device_ptr()),
            )?
        };
        Ok((dx, dweight, dbias))
    }

    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn layer_norm(
        &self,
        (weight, bias): (&CudaStorage, &CudaStorage),
        shape: (&LayerNormShape, f64),
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        f32_on_one_device("layer_norm", self, &[weight, bias])?;
        let out = self.sibling(shape.0.len(), DType::F32)?;
        let mean = self.sibling(shape.0.stat_len(), DType::F32)?;
        let invstd = self.sibling(shape.0.stat_len(), DType::F32)?;
        // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
        unsafe {
            layernorm_cuda::forward(
                &self.gpu,
                shape,
                (self.device_ptr(), weight.device_ptr(), bias.device_ptr()),
                (out.device_ptr(), mean.device_ptr(), invstd.device_ptr()),
            )?
        };
        Ok((out, mean, invstd))
    }

    /// # Errors
    /// As [`Normalization::layer_norm`].
    fn layer_norm_backward(
        &self,
        dout: &CudaStorage,
        (mean, invstd, weight): (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &LayerNormShape,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        f32_on_one_device("layer_norm_backward", self, &[dout, mean, invstd, weight])?;
        let dx = self.sibling(shape.len(), DType::F32)?;
        let dweight = self.sibling(shape.param_len(), DType::F32)?;
        let dbias = self.sibling(shape.param_len(), DType::F32)?;
        // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
        unsafe {
            layernorm_cuda::backward(
                &self.gpu,
                shape,
                (self.device_ptr(), dout.device_ptr()),
                (mean.device_ptr(), invstd.device_ptr(), weight.device_ptr()),
                (dx.device_ptr(), dweight.device_ptr(), dbias.device_ptr()),
            )?
        };
        Ok((dx, dweight, dbias))
    }
}
