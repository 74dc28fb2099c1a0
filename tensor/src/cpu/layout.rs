//! Creating, converting and moving elements on [`CpuStorage`] ([`Layout`]).

use cohort_kernels::copy::{Copy2d, cpu as copy_cpu};
use half::{bf16, f16};

use super::{mismatch, zeros};
use crate::backend::Layout;
use crate::storage::CpuStorage;
use crate::{DType, Result};

fn to_f32(s: &CpuStorage) -> Vec<f32> {
    match s {
        CpuStorage::F32(v) => v.clone(),
        CpuStorage::F64(v) => v.iter().map(|&x| x as f32).collect(),
        CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        CpuStorage::I32(v) => v.iter().map(|&x| x as f32).collect(),
        CpuStorage::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
    }
}

fn to_f64(s: &CpuStorage) -> Vec<f64> {
    match s {
        CpuStorage::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::F64(v) => v.clone(),
        CpuStorage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        CpuStorage::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        CpuStorage::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
    }
}

impl Layout for CpuStorage {
    /// `len` zeros (the CPU has one device).
    fn zeros_like(&self, len: usize, dtype: DType) -> Result<CpuStorage> {
        zeros(len, dtype)
    }

    /// Converts to `dtype`: floats round to nearest, float to integer truncates toward zero and
    /// saturates (NaN gives 0).
    fn cast(&self, dtype: DType) -> Result<CpuStorage> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(to_f32(self)),
            DType::F64 => CpuStorage::F64(to_f64(self)),
            DType::F16 => CpuStorage::F16(match self {
                CpuStorage::F64(v) => v.iter().map(|&x| f16::from_f64(x)).collect(),
                _ => to_f32(self).into_iter().map(f16::from_f32).collect(),
            }),
            DType::BF16 => CpuStorage::BF16(match self {
                CpuStorage::F64(v) => v.iter().map(|&x| bf16::from_f64(x)).collect(),
                _ => to_f32(self).into_iter().map(bf16::from_f32).collect(),
            }),
            DType::I32 => CpuStorage::I32(match self {
                CpuStorage::U8(v) => v.iter().map(|&x| i32::from(x)).collect(),
                _ => to_f64(self).into_iter().map(|x| x as i32).collect(),
            }),
            DType::U8 => CpuStorage::U8(to_f64(self).into_iter().map(|x| x as u8).collect()),
        })
    }

    /// Block copy from `src` into `dst` (same dtype).
    fn copy2d(&self, dst: &mut CpuStorage, c: &Copy2d) -> Result<()> {
        match (self, dst) {
            (CpuStorage::F32(s), CpuStorage::F32(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::F64(s), CpuStorage::F64(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::F16(s), CpuStorage::F16(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::BF16(s), CpuStorage::BF16(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::I32(s), CpuStorage::I32(d)) => copy_cpu::copy2d(s, d, c),
            (CpuStorage::U8(s), CpuStorage::U8(d)) => copy_cpu::copy2d(s, d, c),
            (s, d) => return Err(mismatch("copy", d, s)),
        }
        Ok(())
    }

    /// Transposes the last two dims of `[batch, rows, cols]`.
    fn transpose(&self, batch: usize, rows: usize, cols: usize) -> Result<CpuStorage> {
        Ok(any_map!(self, |v| copy_cpu::transpose(
            v, batch, rows, cols
        )))
    }

    /// Materializes a broadcast of `s` from `src_shape` to `out_shape`.
    fn broadcast(&self, src_shape: &[usize], out_shape: &[usize]) -> Result<CpuStorage> {
        Ok(any_map!(self, |v| copy_cpu::broadcast(
            v, src_shape, out_shape
        )))
    }

    /// Sets every element to `value`.
    fn fill(&mut self, value: f64) -> Result<()> {
        match self {
            CpuStorage::F32(v) => v.fill(value as f32),
            CpuStorage::F64(v) => v.fill(value),
            CpuStorage::F16(v) => v.fill(f16::from_f64(value)),
            CpuStorage::BF16(v) => v.fill(bf16::from_f64(value)),
            CpuStorage::I32(v) => v.fill(value as i32),
            CpuStorage::U8(v) => v.fill(value as u8),
        }
        Ok(())
    }
}
