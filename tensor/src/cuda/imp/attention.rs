//! Fused self-attention on [`CudaStorage`] (see [`crate::cpu::attention`]): f32 only.

use cohort_kernels::attention::{AttentionShape, cuda as attention_cuda};

use super::{CudaStorage, same_device, want};
use crate::{DType, Result};

/// An f32 key-padding mask on `qkv`'s device: its address, 0 for none.
fn mask_ptr(op: &'static str, qkv: &CudaStorage, mask: Option<&CudaStorage>) -> Result<u64> {
    match mask {
        Some(m) => {
            want(op, m, &[DType::F32])?;
            same_device(op, qkv, m)?;
            Ok(m.device_ptr())
        }
        None => Ok(0),
    }
}

/// See [`crate::cpu::attention`].
///
/// # Errors
/// Not f32, a head wider than the kernels take, out of memory, or a launch failure.
pub fn attention(
    qkv: &CudaStorage,
    mask: Option<&CudaStorage>,
    shape: &AttentionShape,
) -> Result<(CudaStorage, CudaStorage)> {
    want("attention", qkv, &[DType::F32])?;
    let m = mask_ptr("attention", qkv, mask)?;
    let out = qkv.sibling(shape.out_len(), DType::F32)?;
    let lse = qkv.sibling(shape.lse_len(), DType::F32)?;
    // SAFETY: qkv, the mask, out and lse hold the f32 counts `shape` gives them (checked by the tensor).
    unsafe {
        attention_cuda::forward(
            &qkv.gpu,
            shape,
            (qkv.device_ptr(), m),
            (out.device_ptr(), lse.device_ptr()),
        )?
    };
    Ok((out, lse))
}

/// See [`crate::cpu::attention_backward`].
///
/// # Errors
/// Not f32, different devices, out of memory, or a launch failure.
pub fn attention_backward(
    qkv: &CudaStorage,
    mask: Option<&CudaStorage>,
    (out, lse, dout): (&CudaStorage, &CudaStorage, &CudaStorage),
    shape: &AttentionShape,
) -> Result<CudaStorage> {
    const OP: &str = "attention_backward";
    for s in [qkv, out, lse, dout] {
        want(OP, s, &[DType::F32])?;
        same_device(OP, qkv, s)?;
    }
    let m = mask_ptr(OP, qkv, mask)?;
    let delta = qkv.sibling(shape.lse_len(), DType::F32)?;
    let dqkv = qkv.sibling(shape.qkv_len(), DType::F32)?;
    // SAFETY: every buffer holds the f32 count `shape` gives it (checked by the tensor); delta is scratch of the
    // log-sum-exps' size, kept alive until the kernels that use it are queued (the stream orders its reuse).
    unsafe {
        attention_cuda::backward(
            &qkv.gpu,
            shape,
            (
                qkv.device_ptr(),
                m,
                out.device_ptr(),
                lse.device_ptr(),
                dout.device_ptr(),
            ),
            delta.device_ptr(),
            dqkv.device_ptr(),
        )?
    };
    Ok(dqkv)
}
