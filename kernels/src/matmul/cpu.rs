//! CPU matrix products through the `gemm` crate.
//!
//! Transposed operands are passed to gemm as strides, so they cost no copy.

use gemm::Parallelism;
use rayon::prelude::*;

use super::MatmulShape;
use crate::Float;

/// Work (m·n·k) under which one product runs on one thread: waking rayon costs more than it saves.
const GEMM_PAR_WORK: usize = 48 * 48 * 48;

/// Computes the product described by `shape` into a new buffer of `batch·m·n` elements.
pub fn matmul<T: Float>(lhs: &[T], rhs: &[T], shape: &MatmulShape) -> Vec<T> {
    let mut out = vec![T::ZERO; shape.batch * shape.m * shape.n];
    matmul_into(&mut out, false, lhs, rhs, shape);
    out
}

/// Computes `dst = lhs · rhs` (or `dst += lhs · rhs` when `accumulate`) for every batch entry.
///
/// # Panics
/// When a buffer is shorter than `shape` says; callers validate shapes first.
pub fn matmul_into<T: Float>(
    dst: &mut [T],
    accumulate: bool,
    lhs: &[T],
    rhs: &[T],
    shape: &MatmulShape,
) {
    let MatmulShape { batch, m, n, k, .. } = *shape;
    assert!(
        dst.len() >= batch * m * n,
        "matmul: output buffer too small"
    );
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    let lhs_need = (batch - 1) * shape.lhs_batch_stride + m * k;
    let rhs_need = (batch - 1) * shape.rhs_batch_stride + k * n;
    assert!(lhs.len() >= lhs_need, "matmul: lhs buffer too small");
    assert!(rhs.len() >= rhs_need, "matmul: rhs buffer too small");
    let work = m * n * k.max(1);
    let threads = rayon::current_num_threads();
    if batch > 1 && work < GEMM_PAR_WORK * 8 && threads > 1 {
        // Many small products: one product per task, each single-threaded.
        dst.par_chunks_mut(m * n)
            .take(batch)
            .enumerate()
            .for_each(|(b, out)| {
                one(out, accumulate, lhs, rhs, shape, b, Parallelism::None);
            });
    } else {
        let par = if work < GEMM_PAR_WORK || threads == 1 {
            Parallelism::None
        } else {
            Parallelism::Rayon(threads)
        };
        for (b, out) in dst.chunks_mut(m * n).take(batch).enumerate() {
            one(out, accumulate, lhs, rhs, shape, b, par);
        }
    }
}

fn one<T: Float>(
    out: &mut [T],
    accumulate: bool,
    lhs: &[T],
    rhs: &[T],
    s: &MatmulShape,
    b: usize,
    par: Parallelism,
) {
    let (m, n, k) = (s.m, s.n, s.k);
    if k == 0 {
        if !accumulate {
            out.fill(T::ZERO);
        }
        return;
    }
    let lhs = &lhs[b * s.lhs_batch_stride..b * s.lhs_batch_stride + m * k];
    let rhs = &rhs[b * s.rhs_batch_stride..b * s.rhs_batch_stride + k * n];
    // (row stride, column stride) of the logical [m, k] and [k, n] operands.
    let (lhs_rs, lhs_cs) = if s.trans_lhs { (1, m) } else { (k, 1) };
    let (rhs_rs, rhs_cs) = if s.trans_rhs { (1, k) } else { (n, 1) };
    // SAFETY: the slices above hold exactly m·k and k·n elements and `out` holds m·n (checked by
    // the caller); the strides address only elements inside them; `out` does not alias the inputs
    // because it is a unique borrow. gemm supports f32 and f64, the only `Float` types.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}
