//! Convolutions and max pooling on [`CudaStorage`] ([`Convolutions`]), and the workspace their kernels ask
//! for.

use cohort_kernels::Math;
use cohort_kernels::conv::{ConvParams, cuda as conv_cuda};
use cohort_kernels::cuda::CudaType;
use cohort_kernels::pool::{PoolParams, cuda as pool_cuda};

use super::{CudaStorage, indices, mismatch, same_device, want};
use crate::backend::{Convolutions, Layout};
use crate::{DType, Error, Result};

fn conv_check(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(mismatch(op, a.dtype, b.dtype));
    }
    same_device(op, a, b)?;
    want(op, a, &[DType::F32])?;
    Ok(())
}

/// A convolution's workspace as its kernels ask for it ([`conv_cuda::Workspace`]): a block of the device's
/// allocator charged to the current tenant (during a capture, of the graph's pool), replaced by a larger one when
/// more is asked for, and given back when the op returns, stream-ordered after the work that uses it.
pub(super) struct ConvWorkspace<'a> {
    like: &'a CudaStorage,
    block: Option<CudaStorage>,
}

impl<'a> ConvWorkspace<'a> {
    pub(super) fn new(like: &'a CudaStorage) -> Self {
        ConvWorkspace { like, block: None }
    }

    pub(super) fn get(&mut self, bytes: usize) -> cohort_kernels::Result<u64> {
        if let Some(b) = &self.block {
            if b.len() * 4 >= bytes {
                return Ok(b.device_ptr());
            }
        }
        let block = self
            .like
            .sibling(bytes.div_ceil(4), DType::F32)
            .map_err(|e| match e {
                // The allocator's error travels inside the kernels' one, and comes out as itself again
                // (`From<cohort_kernels::Error>`): an out-of-memory stays one for the member's recovery.
                Error::Alloc(source) => cohort_kernels::Error::DeviceMemory {
                    what: format!("{bytes} bytes of convolution workspace"),
                    source: Box::new(source),
                },
                Error::Kernel(e) => e,
                other => cohort_kernels::Error::Cuda(other.to_string()),
            })?;
        let ptr = block.device_ptr();
        self.block = Some(block);
        Ok(ptr)
    }
}

impl CudaStorage {
    /// The pooled output and the maxima's indices, each max then given its channel's bias (f32, `channels` of
    /// them) and a ReLU where `bias` is given.
    ///
    /// # Errors
    /// Not f32, bf16 or f16, a bias not f32 or on another device, windows that do not tile under a bias, out of
    /// memory, or a launch failure.
    pub(super) fn max_pool(
        &self,
        op: &'static str,
        p: &PoolParams,
        bias: Option<(&CudaStorage, usize)>,
    ) -> Result<(CudaStorage, CudaStorage)> {
        let ty = want(op, self, &[DType::F32, DType::BF16, DType::F16])?;
        if let Some((b, _)) = bias {
            want(op, b, &[DType::F32])?;
            same_device(op, self, b)?;
        }
        let n = p.planes * p.out_h() * p.out_w();
        let out = self.sibling(n, self.dtype)?;
        let idx = self.sibling(n, DType::I32)?;
        // SAFETY: self holds planes·h·w elements of ty, a bias `channels` f32 (checked by the tensor); out and idx
        // n elements.
        unsafe {
            pool_cuda::max_pool2d(
                &self.gpu,
                ty,
                p,
                bias.map(|(b, c)| (b.device_ptr(), c)),
                self.device_ptr(),
                out.device_ptr(),
                idx.device_ptr(),
            )?
        };
        Ok((out, idx))
    }
}

impl Convolutions for CudaStorage {
    /// # Errors
    /// Not f32, different dtypes or devices, out of memory (output or workspace), or a failure.
    fn conv2d(
        &self,
        weight: &CudaStorage,
        bias: Option<&CudaStorage>,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        conv_check("conv2d", self, weight)?;
        if let Some(b) = bias {
            if b.dtype != self.dtype {
                return Err(mismatch("conv2d (bias)", self.dtype, b.dtype));
            }
            same_device("conv2d (bias)", self, b)?;
        }
        let out = self.sibling(p.output_len(), DType::F32)?;
        let mut ws = ConvWorkspace::new(self);
        // SAFETY: sizes from p (validated by the tensor); the workspace is this device's.
        unsafe {
            conv_cuda::conv2d(
                &self.gpu,
                math,
                p,
                (self.device_ptr(), weight.device_ptr()),
                bias.map(CudaStorage::device_ptr),
                out.device_ptr(),
                &mut |bytes| ws.get(bytes),
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// As [`Convolutions::conv2d`].
    fn conv2d_backward_input(
        &self,
        weight: &CudaStorage,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        conv_check("conv2d_backward_input", self, weight)?;
        let out = self.sibling(p.input_len(), DType::F32)?;
        let mut ws = ConvWorkspace::new(self);
        // SAFETY: as in conv2d.
        unsafe {
            conv_cuda::conv2d_backward_input(
                &self.gpu,
                math,
                p,
                self.device_ptr(),
                weight.device_ptr(),
                out.device_ptr(),
                &mut |bytes| ws.get(bytes),
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// As [`Convolutions::conv2d`].
    fn conv2d_backward_weight(
        &self,
        grad_out: &CudaStorage,
        p: &ConvParams,
        math: Math,
    ) -> Result<CudaStorage> {
        conv_check("conv2d_backward_weight", self, grad_out)?;
        let out = self.sibling(p.weight_len(), DType::F32)?;
        let mut ws = ConvWorkspace::new(self);
        // SAFETY: as in conv2d.
        unsafe {
            conv_cuda::conv2d_backward_weight(
                &self.gpu,
                math,
                p,
                self.device_ptr(),
                grad_out.device_ptr(),
                out.device_ptr(),
                &mut |bytes| ws.get(bytes),
            )?
        };
        Ok(out)
    }

    /// # Errors
    /// Not f32, bf16 or f16, out of memory, or a launch failure.
    fn max_pool2d(&self, p: &PoolParams) -> Result<(CudaStorage, CudaStorage)> {
        self.max_pool("max_pool2d", p, None)
    }

    /// Gradients of bf16 and f16 windows that do not overlap are gathered in their type; those of overlapping
    /// ones add up in f32.
    ///
    /// # Errors
    /// Not f32, bf16 or f16, indices not i32, out of memory, or a launch failure (an index outside its plane
    /// is reported later, see the module docs).
    fn max_pool2d_backward(&self, indices: &CudaStorage, p: &PoolParams) -> Result<CudaStorage> {
        const OP: &str = "max_pool2d_backward";
        self::indices(OP, indices)?;
        let ty = want(OP, self, &[DType::F32, DType::BF16, DType::F16])?;
        same_device(OP, self, indices)?;
        if ty != CudaType::F32 && p.stride < p.kernel {
            return self
                .cast(DType::F32)?
                .max_pool2d_backward(indices, p)?
                .cast(self.dtype);
        }
        let out = self.sibling(p.planes * p.h * p.w, self.dtype)?;
        if ty != CudaType::F32 || p.tiles() {
            // SAFETY: self and indices hold planes·out_h·out_w elements, out planes·h·w, of ty.
            unsafe {
                pool_cuda::max_pool2d_backward_gather(
                    &self.gpu,
                    ty,
                    p,
                    self.device_ptr(),
                    indices.device_ptr(),
                    out.device_ptr(),
                )?
            };
            return Ok(out);
        }
        // SAFETY: self and indices hold planes·plane_out elements, out planes·plane_in f32.
        unsafe {
            pool_cuda::max_pool2d_backward(
                &self.gpu,
                p.planes,
                p.h * p.w,
                p.out_h() * p.out_w(),
                self.device_ptr(),
                indices.device_ptr(),
                out.device_ptr(),
            )?
        };
        Ok(out)
    }
}
