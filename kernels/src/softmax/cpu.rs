//! CPU softmax over rows.

use rayon::prelude::*;

use crate::{Error, Float, PAR_THRESHOLD, Result};

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

/// `dst = exp(src - max)`; returns the row's max and the sum of `dst`.
fn exp_shifted<T: Float>(src: &[T], dst: &mut [T]) -> (T, T) {
    let mut max = src.iter().fold(T::LOWEST, |m, &v| m.max(v));
    if max == T::LOWEST {
        // A row of -inf: every entry is equally (un)likely; avoid NaN from inf - inf.
        max = T::ZERO;
    }
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = (v - max).exp();
    }
    (max, crate::reduce::cpu::sum_contiguous(dst))
}

fn row<T: Float>(src: &[T], dst: &mut [T], log: bool) {
    let (max, sum) = exp_shifted(src, dst);
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

/// Rows per task of a cross-entropy split across threads. Each element costs an exponential, far more than an
/// element-wise kernel's work, so a split pays from a sixteenth of [`PAR_THRESHOLD`] elements: fused members'
/// logits (`[M, 256, 10]`, M >= 2) are split (on one thread they took 0.5 ms of a 13 ms step at M = 16), one
/// model's are not.
const XENT_ROWS_PER_TASK: usize = 128;

/// Softmax cross-entropy of each row of `cols` logits in `x` against `labels` (row `r` takes
/// `labels[r % labels.len()]`: one label per row, or a batch of them shared by every member; the
/// caller checks that the count divides the rows). Returns each row's loss
/// (`logsumexp - x[label]`) and the gradient `(softmax - onehot) · scale`.
///
/// # Errors
/// A label outside `0..cols`.
pub fn cross_entropy<T: Float>(
    x: &[T],
    cols: usize,
    labels: &[i32],
    scale: T,
) -> Result<(Vec<T>, Vec<T>)> {
    let rows = x.len().checked_div(cols).unwrap_or(0);
    let hot = (0..rows)
        .map(|r| {
            // No labels at all reads as label -1: out of range.
            let l = labels.get(r % labels.len().max(1)).copied().unwrap_or(-1);
            usize::try_from(l)
                .ok()
                .filter(|&u| u < cols)
                .ok_or(Error::IndexOutOfRange {
                    op: "cross_entropy",
                    index: i64::from(l),
                    size: cols,
                })
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut grad = vec![T::ZERO; x.len()];
    if cols == 0 {
        return Ok((vec![T::ZERO; rows], grad));
    }
    // Each row's loss, its gradient written in place.
    let f = |((g, xr), &h): ((&mut [T], &[T]), &usize)| {
        let (max, sum) = exp_shifted(xr, g);
        let inv = T::ONE / sum;
        for d in g.iter_mut() {
            *d = *d * inv * scale;
        }
        g[h] = g[h] - scale;
        max + sum.ln() - xr[h]
    };
    let mut loss = Vec::with_capacity(rows);
    if x.len() >= PAR_THRESHOLD / 16 && rows >= 2 * XENT_ROWS_PER_TASK {
        grad.par_chunks_mut(cols)
            .zip(x.par_chunks(cols))
            .zip(&hot)
            .with_min_len(XENT_ROWS_PER_TASK)
            .map(f)
            .collect_into_vec(&mut loss);
    } else {
        loss.extend(grad.chunks_mut(cols).zip(x.chunks(cols)).zip(&hot).map(f));
    }
    Ok((loss, grad))
}
