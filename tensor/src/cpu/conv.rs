//! Convolutions and max pooling on [`CpuStorage`] ([`Convolutions`]).

use cohort_kernels::Math;
use cohort_kernels::conv::{ConvParams, cpu as conv_cpu};
use cohort_kernels::pool::{PoolParams, cpu as pool_cpu};

use super::{mismatch, unsupported};
use crate::Result;
use crate::backend::Convolutions;
use crate::storage::CpuStorage;

impl Convolutions for CpuStorage {
    /// Forward 2-D convolution.
    fn conv2d(
        &self,
        weight: &CpuStorage,
        bias: Option<&CpuStorage>,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, weight, bias) {
            (CpuStorage::F32(x), CpuStorage::F32(w), None) => {
                CpuStorage::F32(conv_cpu::conv2d(x, w, None, p))
            }
            (CpuStorage::F32(x), CpuStorage::F32(w), Some(CpuStorage::F32(b))) => {
                CpuStorage::F32(conv_cpu::conv2d(x, w, Some(b), p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), None) => {
                CpuStorage::F64(conv_cpu::conv2d(x, w, None, p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), Some(CpuStorage::F64(b))) => {
                CpuStorage::F64(conv_cpu::conv2d(x, w, Some(b), p))
            }
            (x, w, _) if x.dtype() != w.dtype() => return Err(mismatch("conv2d", x, w)),
            (x, _, Some(b)) if x.dtype() != b.dtype() => {
                return Err(mismatch("conv2d (bias)", x, b));
            }
            (x, _, _) => return Err(unsupported("conv2d", x.dtype())),
        })
    }

    /// Gradient of a convolution with respect to its input.
    fn conv2d_backward_input(
        &self,
        weight: &CpuStorage,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, weight) {
            (CpuStorage::F32(g), CpuStorage::F32(w)) => {
                CpuStorage::F32(conv_cpu::conv2d_backward_input(g, w, p))
            }
            (CpuStorage::F64(g), CpuStorage::F64(w)) => {
                CpuStorage::F64(conv_cpu::conv2d_backward_input(g, w, p))
            }
            (a, b) if a.dtype() == b.dtype() => {
                return Err(unsupported("conv2d_backward_input", a.dtype()));
            }
            (a, b) => return Err(mismatch("conv2d_backward_input", a, b)),
        })
    }

    /// Gradient of a convolution with respect to its weight.
    fn conv2d_backward_weight(
        &self,
        grad_out: &CpuStorage,
        p: &ConvParams,
        _math: Math,
    ) -> Result<CpuStorage> {
        Ok(match (self, grad_out) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(conv_cpu::conv2d_backward_weight(x, g, p))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(conv_cpu::conv2d_backward_weight(x, g, p))
            }
            (a, b) if a.dtype() == b.dtype() => {
                return Err(unsupported("conv2d_backward_weight", a.dtype()));
            }
            (a, b) => return Err(mismatch("conv2d_backward_weight", a, b)),
        })
    }

    /// Max pool; returns the values and the i32 argmax indices.
    fn max_pool2d(&self, p: &PoolParams) -> Result<(CpuStorage, CpuStorage)> {
        Ok(match self {
            CpuStorage::F32(v) => {
                let (o, i) = pool_cpu::max_pool2d(v, p);
                (CpuStorage::F32(o), CpuStorage::I32(i))
            }
            CpuStorage::F64(v) => {
                let (o, i) = pool_cpu::max_pool2d(v, p);
                (CpuStorage::F64(o), CpuStorage::I32(i))
            }
            other => return Err(unsupported("max_pool2d", other.dtype())),
        })
    }

    /// Backward of [`Convolutions::max_pool2d`].
    fn max_pool2d_backward(&self, indices: &CpuStorage, p: &PoolParams) -> Result<CpuStorage> {
        let idx = super::indices("max_pool2d_backward", indices)?;
        let (plane_in, plane_out) = (p.h * p.w, p.out_h() * p.out_w());
        Ok(float_map!("max_pool2d_backward", self, |g| {
            pool_cpu::max_pool2d_backward(g, idx, p.planes, plane_in, plane_out)?
        }))
    }
}
