//! Fused layer normalization on [`CudaStorage`] (see [`crate::cpu::layer_norm`]): f32 only.

use cohort_kernels::layernorm::{LayerNormShape, cuda as layernorm_cuda};

use super::{CudaStorage, f32_on_one_device};
use crate::{DType, Result};

/// See [`crate::cpu::layer_norm`].
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn layer_norm(
    x: &CudaStorage,
    (weight, bias): (&CudaStorage, &CudaStorage),
    shape: (&LayerNormShape, f64),
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    f32_on_one_device("layer_norm", x, &[weight, bias])?;
    let out = x.sibling(shape.0.len(), DType::F32)?;
    let mean = x.sibling(shape.0.stat_len(), DType::F32)?;
    let invstd = x.sibling(shape.0.stat_len(), DType::F32)?;
    // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
    unsafe {
        layernorm_cuda::forward(
            &x.gpu,
            shape,
            (x.device_ptr(), weight.device_ptr(), bias.device_ptr()),
            (out.device_ptr(), mean.device_ptr(), invstd.device_ptr()),
        )?
    };
    Ok((out, mean, invstd))
}

/// See [`crate::cpu::layer_norm_backward`].
///
/// # Errors
/// As [`layer_norm`].
pub fn layer_norm_backward(
    x: &CudaStorage,
    dout: &CudaStorage,
    (mean, invstd, weight): (&CudaStorage, &CudaStorage, &CudaStorage),
    shape: &LayerNormShape,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    f32_on_one_device("layer_norm_backward", x, &[dout, mean, invstd, weight])?;
    let dx = x.sibling(shape.len(), DType::F32)?;
    let dweight = x.sibling(shape.param_len(), DType::F32)?;
    let dbias = x.sibling(shape.param_len(), DType::F32)?;
    // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
    unsafe {
        layernorm_cuda::backward(
            &x.gpu,
            shape,
            (x.device_ptr(), dout.device_ptr()),
            (mean.device_ptr(), invstd.device_ptr(), weight.device_ptr()),
            (dx.device_ptr(), dweight.device_ptr(), dbias.device_ptr()),
        )?
    };
    Ok((dx, dweight, dbias))
}
