//! CPU data movement.

use rayon::prelude::*;

use super::Copy2d;
use crate::binary::BroadcastPlan;
use crate::{PAR_CHUNK, PAR_THRESHOLD, Scalar};

/// Performs the block copy `c` from `src` into `dst`.
///
/// # Panics
/// When a block lies outside a buffer; callers validate the geometry.
pub fn copy2d<T: Copy>(src: &[T], dst: &mut [T], c: &Copy2d) {
    if c.cols == 0 {
        return;
    }
    if c.src_stride == c.cols && c.dst_stride == c.cols {
        let n = c.rows * c.cols;
        dst[c.dst_offset..c.dst_offset + n].copy_from_slice(&src[c.src_offset..c.src_offset + n]);
        return;
    }
    for r in 0..c.rows {
        let s = c.src_offset + r * c.src_stride;
        let d = c.dst_offset + r * c.dst_stride;
        dst[d..d + c.cols].copy_from_slice(&src[s..s + c.cols]);
    }
}

/// Transposes the last two dims of `[batch, rows, cols]` into `[batch, cols, rows]`.
pub fn transpose<T: Copy + Send + Sync + Default>(
    src: &[T],
    batch: usize,
    rows: usize,
    cols: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); batch * rows * cols];
    if out.is_empty() {
        return out;
    }
    const TILE: usize = 32;
    let one = |(s, d): (&[T], &mut [T])| {
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..(c0 + TILE).min(cols) {
                        d[c * rows + r] = s[r * cols + c];
                    }
                }
            }
        }
    };
    let m = rows * cols;
    if src.len() >= PAR_THRESHOLD && batch > 1 {
        src.par_chunks(m).zip(out.par_chunks_mut(m)).for_each(one);
    } else {
        src.chunks(m).zip(out.chunks_mut(m)).for_each(one);
    }
    out
}

/// Materializes `src` (shape `src_shape`) broadcast to `out_shape`.
pub fn broadcast<T: Copy + Send + Sync + Default>(
    src: &[T],
    src_shape: &[usize],
    out_shape: &[usize],
) -> Vec<T> {
    let len: usize = out_shape.iter().product();
    let mut out = vec![T::default(); len];
    if len == 0 {
        return out;
    }
    let plan = BroadcastPlan::new(src_shape, src_shape, out_shape);
    let inner = plan.inner;
    let step = plan.lhs_inner_step;
    let fill_row = |r: usize, o: &mut [T]| {
        let (so, _) = plan.offsets(r);
        if step == 1 {
            o.copy_from_slice(&src[so..so + o.len()]);
        } else {
            o.fill(src[so]);
        }
    };
    if len >= PAR_THRESHOLD && plan.rows() > 1 {
        let rows_per_task = PAR_CHUNK.div_ceil(inner).max(1);
        out.par_chunks_mut(rows_per_task * inner)
            .enumerate()
            .for_each(|(c, block)| {
                for (i, o) in block.chunks_mut(inner).enumerate() {
                    fill_row(c * rows_per_task + i, o);
                }
            });
    } else {
        for (r, o) in out.chunks_mut(inner).enumerate() {
            fill_row(r, o);
        }
    }
    out
}

/// `out[i] = if mask[i] != 0 { on_true[i] } else { on_false[i] }` (all the same length).
pub fn where_cond<M: Scalar, T: Copy + Send + Sync>(
    mask: &[M],
    on_true: &[T],
    on_false: &[T],
) -> Vec<T> {
    let f = |((&m, &t), &e): ((&M, &T), &T)| if m != M::ZERO { t } else { e };
    if mask.len() >= PAR_THRESHOLD {
        let mut out = Vec::with_capacity(mask.len());
        mask.par_iter()
            .zip(on_true.par_iter())
            .zip(on_false.par_iter())
            .with_min_len(PAR_CHUNK)
            .map(f)
            .collect_into_vec(&mut out);
        out
    } else {
        mask.iter().zip(on_true).zip(on_false).map(f).collect()
    }
}
