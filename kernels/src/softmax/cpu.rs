//! CPU softmax over rows.

use rayon::prelude::*;

use crate::{Float, PAR_THRESHOLD};

/// Softmax (or log-softmax when `log`) of each of the `x.len() / cols` rows of `x`.
pub fn softmax_last<T: Float>(x: &[T], cols: usize, log: bool) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    if cols == 0 || x.is_empty() {
        return out;
    }
    let f = |(src, dst): (&[T], &mut [T])| row(src, dst, log);
    if x.len() >= PAR_THRESHOLD && x.len() / cols > 1 {
        x.par_chunks(cols).zip(out.par_chunks_mut(cols)).for_each(f);
    } else {
        x.chunks(cols).zip(out.chunks_mut(cols)).for_each(f);
    }
    out
}

fn row<T: Float>(src: &[T], dst: &mut [T], log: bool) {
    let mut max = T::LOWEST;
    for &v in src {
        max = max.max(v);
    }
    if max == T::LOWEST {
        // A row of -inf: every entry is equally (un)likely; avoid NaN from inf - inf.
        max = T::ZERO;
    }
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = (v - max).exp();
    }
    let sum = crate::reduce::cpu::sum_contiguous(dst);
    if log {
        let ls = sum.ln();
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v - max - ls;
        }
    } else {
        let inv = T::ONE / sum;
        for d in dst.iter_mut() {
            *d = *d * inv;
        }
    }
}
