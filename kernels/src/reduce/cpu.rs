//! CPU reductions.

use rayon::prelude::*;

use super::{ReduceOp, ReduceShape};
use crate::{PAR_THRESHOLD, Scalar};

/// Reduces `x` (`[outer, dim, inner]`) along `dim` into `[outer, inner]`.
///
/// Max and min of an empty dim give the type's lowest / highest value; sum gives 0, mean NaN
/// (floats) or 0 (integers).
pub fn reduce<T: Scalar>(op: ReduceOp, x: &[T], s: ReduceShape) -> Vec<T> {
    let mut out = vec![T::ZERO; s.outer * s.inner];
    if out.is_empty() {
        return out;
    }
    let block = s.dim * s.inner;
    let work = |o: usize, dst: &mut [T]| {
        let src = &x[o * block..(o + 1) * block];
        reduce_block(op, src, s.dim, s.inner, dst);
    };
    if x.len() >= PAR_THRESHOLD && s.outer > 1 {
        out.par_chunks_mut(s.inner)
            .enumerate()
            .for_each(|(o, dst)| work(o, dst));
    } else {
        out.chunks_mut(s.inner)
            .enumerate()
            .for_each(|(o, dst)| work(o, dst));
    }
    if op == ReduceOp::Mean {
        let n = T::from_f64(s.dim as f64);
        for v in &mut out {
            *v = v.div(n);
        }
    }
    out
}

fn reduce_block<T: Scalar>(op: ReduceOp, src: &[T], dim: usize, inner: usize, dst: &mut [T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            if inner == 1 {
                dst[0] = sum_contiguous(src);
            } else {
                dst.fill(T::ZERO);
                for r in src.chunks_exact(inner) {
                    for (d, &v) in dst.iter_mut().zip(r) {
                        *d = d.add(v);
                    }
                }
            }
        }
        ReduceOp::Max => fold(
            src,
            dim,
            inner,
            dst,
            T::LOWEST,
            |a, b| if b > a { b } else { a },
        ),
        ReduceOp::Min => fold(
            src,
            dim,
            inner,
            dst,
            T::HIGHEST,
            |a, b| if b < a { b } else { a },
        ),
    }
}

fn fold<T: Scalar>(
    src: &[T],
    dim: usize,
    inner: usize,
    dst: &mut [T],
    init: T,
    f: impl Fn(T, T) -> T,
) {
    dst.fill(init);
    for r in src.chunks_exact(inner).take(dim) {
        for (d, &v) in dst.iter_mut().zip(r) {
            *d = f(*d, v);
        }
    }
}

/// Sum of a contiguous run with eight partial sums: vectorizes and loses less precision than one
/// running sum.
pub fn sum_contiguous<T: Scalar>(x: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] = acc[j].add(c[j]);
        }
    }
    let mut total = T::ZERO;
    for v in chunks.remainder() {
        total = total.add(*v);
    }
    let a = acc[0].add(acc[4]).add(acc[1].add(acc[5]));
    let b = acc[2].add(acc[6]).add(acc[3].add(acc[7]));
    total.add(a.add(b))
}

/// Index of the largest element along `dim` (the first one on ties), as `i32`.
pub fn argmax<T: Scalar>(x: &[T], s: ReduceShape) -> Vec<i32> {
    let mut out = vec![0i32; s.outer * s.inner];
    let block = s.dim * s.inner;
    for (o, dst) in out.chunks_mut(s.inner.max(1)).enumerate().take(s.outer) {
        let src = &x[o * block..(o + 1) * block];
        let mut best: Vec<T> = vec![T::LOWEST; s.inner];
        for (d, r) in src.chunks_exact(s.inner.max(1)).enumerate().take(s.dim) {
            for ((b, i), &v) in best.iter_mut().zip(dst.iter_mut()).zip(r) {
                // `d == 0` takes the first element even when it is the lowest value or NaN.
                if d == 0 || v > *b {
                    *b = v;
                    *i = d as i32;
                }
            }
        }
    }
    out
}
