//! Index ops on [`CpuStorage`] ([`Indexing`]): an out-of-range index fails the op.

use cohort_kernels::index::cpu as index_cpu;

use super::{indices, mismatch, unsupported};
use crate::backend::Indexing;
use crate::storage::CpuStorage;
use crate::{DType, Result};

impl Indexing for CpuStorage {
    /// Selects rows along the middle dim of `[outer, dim, inner]`.
    fn index_select(
        &self,
        idx: &CpuStorage,
        outer: usize,
        dim: usize,
        inner: usize,
    ) -> Result<CpuStorage> {
        let idx = indices("index_select", idx)?;
        Ok(any_map!(self, |v| index_cpu::index_select(
            v, outer, dim, inner, idx
        )?))
    }

    /// `dst[o, idx[i], :] += src[o, i, :]`.
    fn index_add(
        &mut self,
        idx: &CpuStorage,
        src: &CpuStorage,
        shape: (usize, usize, usize),
        repeat: usize,
    ) -> Result<()> {
        let idx = indices("index_add", idx)?;
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                index_cpu::index_add(d, shape, idx, s, repeat)?
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                index_cpu::index_add(d, shape, idx, s, repeat)?
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                index_cpu::index_add(d, shape, idx, s, repeat)?
            }
            (CpuStorage::U8(d), CpuStorage::U8(s)) => {
                index_cpu::index_add(d, shape, idx, s, repeat)?
            }
            (d, s) if d.dtype() == s.dtype() => return Err(unsupported("index_add", d.dtype())),
            (d, s) => return Err(mismatch("index_add", d, s)),
        }
        Ok(())
    }

    /// `out[r] = src[r, idx[r]]` for `[rows, cols]` sources.
    fn gather_last(&self, idx: &CpuStorage, cols: usize) -> Result<CpuStorage> {
        let idx = indices("gather_last", idx)?;
        Ok(any_map!(self, |v| index_cpu::gather_last(v, cols, idx)?))
    }

    /// `dst[r, idx[r]] += src[r]`.
    fn scatter_add_last(&mut self, idx: &CpuStorage, src: &CpuStorage, cols: usize) -> Result<()> {
        let idx = indices("scatter_add_last", idx)?;
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                index_cpu::scatter_add_last(d, cols, idx, s)?
            }
            (d, s) if d.dtype() == s.dtype() => {
                return Err(unsupported("scatter_add_last", d.dtype()));
            }
            (d, s) => return Err(mismatch("scatter_add_last", d, s)),
        }
        Ok(())
    }

    /// One-hot rows of `classes` columns.
    fn one_hot(&self, classes: usize, dtype: DType) -> Result<CpuStorage> {
        let l = indices("one_hot", self)?;
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(index_cpu::one_hot(l, classes)?),
            DType::F64 => CpuStorage::F64(index_cpu::one_hot(l, classes)?),
            DType::I32 => CpuStorage::I32(index_cpu::one_hot(l, classes)?),
            DType::U8 => CpuStorage::U8(index_cpu::one_hot(l, classes)?),
            other => return Err(unsupported("one_hot", other)),
        })
    }
}
