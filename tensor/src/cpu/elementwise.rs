//! Element-wise ops on [`CpuStorage`] ([`Elementwise`]).

use cohort_kernels::binary::{BinaryOp, cpu as binary_cpu};
use cohort_kernels::copy::cpu as copy_cpu;
use cohort_kernels::unary::{UnaryOp, cpu as unary_cpu};

use super::{mismatch, unsupported};
use crate::Result;
use crate::backend::Elementwise;
use crate::storage::CpuStorage;

impl Elementwise for CpuStorage {
    /// Broadcast binary op (numeric dtypes).
    fn binary(
        &self,
        op: BinaryOp,
        lhs_shape: &[usize],
        rhs: &CpuStorage,
        rhs_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<CpuStorage> {
        macro_rules! go {
            ($a:expr, $b:expr) => {
                binary_cpu::binary(op, $a, lhs_shape, $b, rhs_shape, out_shape)
            };
        }
        Ok(match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(go!(a, b)),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(go!(a, b)),
            (CpuStorage::I32(a), CpuStorage::I32(b)) => CpuStorage::I32(go!(a, b)),
            (CpuStorage::U8(a), CpuStorage::U8(b)) => CpuStorage::U8(go!(a, b)),
            (a, b) if a.dtype() == b.dtype() => return Err(unsupported(op.name(), a.dtype())),
            (a, b) => return Err(mismatch(op.name(), a, b)),
        })
    }

    /// `dst = dst (op) src`, `src` broadcast to `dst_shape`.
    fn binary_assign(
        &mut self,
        op: BinaryOp,
        dst_shape: &[usize],
        src: &CpuStorage,
        src_shape: &[usize],
    ) -> Result<()> {
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::I32(d), CpuStorage::I32(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (CpuStorage::U8(d), CpuStorage::U8(s)) => {
                binary_cpu::binary_assign(op, d, dst_shape, s, src_shape)
            }
            (d, s) if d.dtype() == s.dtype() => return Err(unsupported(op.name(), d.dtype())),
            (d, s) => return Err(mismatch(op.name(), d, s)),
        }
        Ok(())
    }

    /// Unary float op.
    fn unary(&self, op: UnaryOp) -> Result<CpuStorage> {
        Ok(float_map!(op.name(), self, |v| unary_cpu::unary(op, v)))
    }

    /// Picks `on_true` where `mask != 0`, else `on_false` (all the same length; mask of any numeric
    /// dtype).
    fn where_cond(&self, on_true: &CpuStorage, on_false: &CpuStorage) -> Result<CpuStorage> {
        if on_true.dtype() != on_false.dtype() {
            return Err(mismatch("where_cond", on_true, on_false));
        }
        macro_rules! pick {
            ($m:expr) => {
                match (on_true, on_false) {
                    (CpuStorage::F32(t), CpuStorage::F32(f)) => {
                        CpuStorage::F32(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::F64(t), CpuStorage::F64(f)) => {
                        CpuStorage::F64(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::F16(t), CpuStorage::F16(f)) => {
                        CpuStorage::F16(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::BF16(t), CpuStorage::BF16(f)) => {
                        CpuStorage::BF16(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::I32(t), CpuStorage::I32(f)) => {
                        CpuStorage::I32(copy_cpu::where_cond($m, t, f))
                    }
                    (CpuStorage::U8(t), CpuStorage::U8(f)) => {
                        CpuStorage::U8(copy_cpu::where_cond($m, t, f))
                    }
                    (t, f) => return Err(mismatch("where_cond", t, f)),
                }
            };
        }
        Ok(match self {
            CpuStorage::F32(m) => pick!(m),
            CpuStorage::F64(m) => pick!(m),
            CpuStorage::I32(m) => pick!(m),
            CpuStorage::U8(m) => pick!(m),
            other => return Err(unsupported("where_cond (mask)", other.dtype())),
        })
    }

    /// `x + b`, then a ReLU when `relu`, with `b` `[groups, cols]` broadcast over `group`-element blocks of `x`.
    fn bias_act(
        &self,
        b: &CpuStorage,
        cols: usize,
        group: usize,
        relu: bool,
    ) -> Result<CpuStorage> {
        Ok(match (self, b) {
            (CpuStorage::F32(x), CpuStorage::F32(b)) => {
                CpuStorage::F32(unary_cpu::bias_act(x, b, cols, group, relu))
            }
            (CpuStorage::F64(x), CpuStorage::F64(b)) => {
                CpuStorage::F64(unary_cpu::bias_act(x, b, cols, group, relu))
            }
            (x, b) if x.dtype() != b.dtype() => return Err(mismatch("bias_act", x, b)),
            (x, _) => return Err(unsupported("bias_act", x.dtype())),
        })
    }

    /// ReLU's backward from its output: `dy` where `y > 0`, else 0.
    fn relu_backward(&self, y: &CpuStorage) -> Result<CpuStorage> {
        Ok(match (self, y) {
            (CpuStorage::F32(g), CpuStorage::F32(y)) => {
                CpuStorage::F32(unary_cpu::relu_backward(g, y))
            }
            (CpuStorage::F64(g), CpuStorage::F64(y)) => {
                CpuStorage::F64(unary_cpu::relu_backward(g, y))
            }
            (g, y) if g.dtype() != y.dtype() => return Err(mismatch("relu_backward", g, y)),
            (g, _) => return Err(unsupported("relu_backward", g.dtype())),
        })
    }

    /// GELU's backward from its input: `dy · gelu'(x)`.
    fn gelu_backward(&self, x: &CpuStorage) -> Result<CpuStorage> {
        Ok(match (self, x) {
            (CpuStorage::F32(g), CpuStorage::F32(x)) => {
                CpuStorage::F32(unary_cpu::gelu_backward(g, x))
            }
            (CpuStorage::F64(g), CpuStorage::F64(x)) => {
                CpuStorage::F64(unary_cpu::gelu_backward(g, x))
            }
            (g, x) if g.dtype() != x.dtype() => return Err(mismatch("gelu_backward", g, x)),
            (g, _) => return Err(unsupported("gelu_backward", g.dtype())),
        })
    }
}
