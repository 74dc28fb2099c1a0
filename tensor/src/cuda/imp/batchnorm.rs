//! Fused batch normalization on [`CudaStorage`] (see [`crate::cpu::batch_norm`]): f32 only.

use cohort_kernels::batchnorm::{BatchNormShape, cuda as batchnorm_cuda};

use super::{CudaStorage, f32_on_one_device};
use crate::{DType, Result};

/// See [`crate::cpu::batch_norm`].
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn batch_norm(
    x: &CudaStorage,
    (weight, bias): (&CudaStorage, &CudaStorage),
    shape: (&BatchNormShape, f64),
    relu: bool,
    running: Option<(&mut CudaStorage, &mut CudaStorage, f64)>,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    const OP: &str = "batch_norm";
    f32_on_one_device(OP, x, &[weight, bias])?;
    let running = match running {
        Some((m, v, momentum)) => {
            f32_on_one_device(OP, x, &[m, v])?;
            Some((m.device_ptr(), v.device_ptr(), momentum))
        }
        None => None,
    };
    let out = x.sibling(shape.0.len(), DType::F32)?;
    let mean = x.sibling(shape.0.stat_len(), DType::F32)?;
    let invstd = x.sibling(shape.0.stat_len(), DType::F32)?;
    // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor); the running statistics
    // are held for writing by the caller.
    unsafe {
        batchnorm_cuda::forward(
            &x.gpu,
            shape,
            relu,
            (x.device_ptr(), weight.device_ptr(), bias.device_ptr()),
            (out.device_ptr(), mean.device_ptr(), invstd.device_ptr()),
            running,
        )?
    };
    Ok((out, mean, invstd))
}

/// See [`crate::cpu::batch_norm_backward`].
///
/// # Errors
/// As [`batch_norm`].
pub fn batch_norm_backward(
    x: &CudaStorage,
    out: Option<&CudaStorage>,
    dout: &CudaStorage,
    (mean, invstd, weight): (&CudaStorage, &CudaStorage, &CudaStorage),
    shape: &BatchNormShape,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    const OP: &str = "batch_norm_backward";
    f32_on_one_device(OP, x, &[dout, mean, invstd, weight])?;
    let out = match out {
        Some(o) => {
            f32_on_one_device(OP, x, &[o])?;
            o.device_ptr()
        }
        None => 0,
    };
    let dx = x.sibling(shape.len(), DType::F32)?;
    let dweight = x.sibling(shape.stat_len(), DType::F32)?;
    let dbias = x.sibling(shape.stat_len(), DType::F32)?;
    // SAFETY: every buffer holds the f32 count the shape gives it (checked by the tensor).
    unsafe {
        batchnorm_cuda::backward(
            &x.gpu,
            shape,
            (x.device_ptr(), out, dout.device_ptr()),
            (mean.device_ptr(), invstd.device_ptr(), weight.device_ptr()),
            (dx.device_ptr(), dweight.device_ptr(), dbias.device_ptr()),
        )?
    };
    Ok((dx, dweight, dbias))
}
