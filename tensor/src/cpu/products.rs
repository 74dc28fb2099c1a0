//! Matrix products on [`CpuStorage`] ([`Products`]).

use cohort_kernels::matmul::{MatmulShape, cpu as matmul_cpu};

use super::{mismatch, unsupported};
use crate::Result;
use crate::backend::Products;
use crate::storage::CpuStorage;

impl Products for CpuStorage {
    /// (Batched) matrix product.
    fn matmul(&self, rhs: &CpuStorage, shape: &MatmulShape) -> Result<CpuStorage> {
        Ok(match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(matmul_cpu::matmul(a, b, shape))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                CpuStorage::F64(matmul_cpu::matmul(a, b, shape))
            }
            (a, b) if a.dtype() == b.dtype() => return Err(unsupported("matmul", a.dtype())),
            (a, b) => return Err(mismatch("matmul", a, b)),
        })
    }

    /// A Linear layer's forward: `lhs · rhs + bias`, then a ReLU when `relu` (see the kernel's `linear`).
    fn linear(
        &self,
        rhs: &CpuStorage,
        bias: &CpuStorage,
        shape: &MatmulShape,
        bias_stride: usize,
        relu: bool,
    ) -> Result<Option<CpuStorage>> {
        Ok(Some(match (self, rhs, bias) {
            (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(c)) => {
                CpuStorage::F32(matmul_cpu::linear(a, b, c, bias_stride, relu, shape))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(c)) => {
                CpuStorage::F64(matmul_cpu::linear(a, b, c, bias_stride, relu, shape))
            }
            (a, b, _) if a.dtype() != b.dtype() => return Err(mismatch("linear", a, b)),
            (a, _, c) if a.dtype() != c.dtype() => return Err(mismatch("linear", a, c)),
            (a, _, _) => return Err(unsupported("linear", a.dtype())),
        }))
    }
}
