//! Fused self-attention on [`CudaStorage`] ([`Attention`]): f32 tensors, the products on tensor cores in the
//! thread's precision policy's 16-bit type under a mixed one (as PyTorch's SDPA under autocast) and in TF32 under
//! `tf32` (as every other product of that policy), and under `fp32` as three TF32 products on tensor cores
//! (3xTF32: fp32's accuracy, as PyTorch's fp32 SDPA runs), or fp32 multiply-adds where tensor cores cannot take it.

use cohort_kernels::attention::AttentionShape;
use cohort_kernels::attention::cuda::{self as attention_cuda, AttentionMath};

use super::{CudaStorage, same_device, want};
use crate::backend::Attention;
use crate::{DType, Precision, Result};

/// The arithmetic of attention's products under this thread's policy.
fn math() -> AttentionMath {
    match Precision::current() {
        Precision::Bf16 => AttentionMath::Bf16,
        Precision::F16 => AttentionMath::F16,
        Precision::Tf32 => AttentionMath::Tf32,
        Precision::Fp32 => AttentionMath::F32,
    }
}

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

impl CudaStorage {
    /// Scratch for the tensor-core kernels' packed inputs ([`attention_cuda::packed_bytes`]), from this tensor's
    /// tenant; none where the kernels read their inputs as they are.
    fn packed(
        &self,
        shape: &AttentionShape,
        math: AttentionMath,
        backward: bool,
    ) -> Result<Option<CudaStorage>> {
        let bytes = attention_cuda::packed_bytes(&self.gpu, shape, math, backward)?;
        (bytes > 0)
            .then(|| self.sibling(bytes, DType::U8))
            .transpose()
    }
}

/// A scratch buffer's address, 0 for none.
fn address(scratch: Option<&CudaStorage>) -> u64 {
    scratch.map_or(0, CudaStorage::device_ptr)
}

impl Attention for CudaStorage {
    /// # Errors
    /// Not f32, a head wider than the kernels take, out of memory, or a launch failure.
    fn attention(
        &self,
        mask: Option<&CudaStorage>,
        shape: &AttentionShape,
    ) -> Result<(CudaStorage, CudaStorage)> {
        want("attention", self, &[DType::F32])?;
        let m = mask_ptr("attention", self, mask)?;
        let math = math();
        let out = self.sibling(shape.out_len(), DType::F32)?;
        let lse = self.sibling(shape.lse_len(), DType::F32)?;
        let packed = self.packed(shape, math, false)?;
        // SAFETY: self, the mask, out and lse hold the f32 counts `shape` gives them (checked by the tensor), packed
        // its bytes; packed is freed as the call returns, which the stream orders after the kernels.
        unsafe {
            attention_cuda::forward(
                &self.gpu,
                shape,
                math,
                (self.device_ptr(), m),
                address(packed.as_ref()),
                (out.device_ptr(), lse.device_ptr()),
            )?
        };
        Ok((out, lse))
    }

    /// # Errors
    /// Not f32, different devices, out of memory, or a launch failure.
    fn attention_backward(
        &self,
        mask: Option<&CudaStorage>,
        (out, lse, dout): (&CudaStorage, &CudaStorage, &CudaStorage),
        shape: &AttentionShape,
    ) -> Result<CudaStorage> {
        const OP: &str = "attention_backward";
        for s in [self, out, lse, dout] {
            want(OP, s, &[DType::F32])?;
            same_device(OP, self, s)?;
        }
        let m = mask_ptr(OP, self, mask)?;
        let math = math();
        let delta = self.sibling(shape.lse_len(), DType::F32)?;
        let packed = self.packed(shape, math, true)?;
        let dqkv = self.sibling(shape.qkv_len(), DType::F32)?;
        // SAFETY: every buffer holds the f32 count `shape` gives it (checked by the tensor); delta and packed are
        // scratch of their sizes, kept alive until the kernels that use them are queued (the stream orders their
        // reuse).
        unsafe {
            attention_cuda::backward(
                &self.gpu,
                shape,
                math,
                (
                    self.device_ptr(),
                    m,
                    out.device_ptr(),
                    lse.device_ptr(),
                    dout.device_ptr(),
                ),
                (delta.device_ptr(), address(packed.as_ref())),
                dqkv.device_ptr(),
            )?
        };
        Ok(dqkv)
    }
}
