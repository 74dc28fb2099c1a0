//! Fused batch and layer normalization on [`CudaStorage`] ([`Normalization`]): f32, and batch norm's
//! activations also in bf16 and f16 (a mixed policy keeps them in the low type) beside f32 parameters and
//! statistics.

use cohort_kernels::batchnorm::{BatchNormShape, cuda as batchnorm_cuda};
use cohort_kernels::layernorm::{LayerNormShape, cuda as layernorm_cuda};

use super::{CudaStorage, FLOAT_TYPES, f32_on_one_device, mismatch, same_device, want};
use crate::backend::Normalization;
use crate::{DType, Result};

/// Checks batch norm's activations `acts` (the first one's type, f32, bf16 or f16, for all) and its f32
/// parameters and statistics `stats`, all on one device; the activations' kernel type.
fn batch_norm_types(
    op: &'static str,
    acts: &[&CudaStorage],
    stats: &[&CudaStorage],
) -> Result<cohort_kernels::cuda::CudaType> {
    let x = acts[0];
    let ty = want(op, x, &FLOAT_TYPES)?;
    for a in &acts[1..] {
        if a.dtype != x.dtype {
            return Err(mismatch(op, x.dtype, a.dtype));
        }
        same_device(op, x, a)?;
    }
    for s in stats {
        want(op, s, &[DType::F32])?;
        same_device(op, x, s)?;
    }
    Ok(ty)
}

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
        let ty = batch_norm_types(OP, &[self], &[weight, bias])?;
        let running = match running {
            Some((m, v, momentum)) => {
                batch_norm_types(OP, &[self], &[m, v])?;
                Some((m.device_ptr(), v.device_ptr(), momentum))
            }
            None => None,
        };
        let out = self.sibling(shape.0.len(), self.dtype)?;
        let mean = self.sibling(shape.0.stat_len(), DType::F32)?;
        let invstd = self.sibling(shape.0.stat_len(), DType::F32)?;
        // SAFETY: every buffer holds the count the shape gives it, of its type (checked by the tensor); the running
        // statistics are held for writing by the caller.
        unsafe {
            batchnorm_cuda::forward(
                &self.gpu,
                ty,
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
        let acts: Vec<&CudaStorage> = [self, dout].into_iter().chain(out).collect();
        let ty = batch_norm_types(OP, &acts, &[mean, invstd, weight])?;
        let out = out.map_or(0, CudaStorage::device_ptr);
        let dx = self.sibling(shape.len(), self.dtype)?;
        let dweight = self.sibling(shape.stat_len(), DType::F32)?;
        let dbias = self.sibling(shape.stat_len(), DType::F32)?;
        // SAFETY: every buffer holds the count the shape gives it, of its type (checked by the tensor).
        unsafe {
            batchnorm_cuda::backward(
                &self.gpu,
                ty,
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
