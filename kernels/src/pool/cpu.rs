//! CPU max pooling, parallel over planes.

use rayon::prelude::*;

use super::PoolParams;
use crate::{PAR_THRESHOLD, Scalar};

/// Planes per parallel task: enough work to pay for a task whatever the plane size, and the same split whatever the
/// thread count.
fn planes_per_task(plane_len: usize) -> usize {
    (PAR_THRESHOLD / plane_len.max(1)).max(1)
}

/// Max over each window; also returns, per output, the flat index (`y·w + x`) of the maximum in
/// its input plane (the first one on ties).
pub fn max_pool2d<T: Scalar>(x: &[T], p: &PoolParams) -> (Vec<T>, Vec<i32>) {
    let (plane_in, plane_out) = (p.h * p.w, p.out_h() * p.out_w());
    let mut out = vec![T::ZERO; p.planes * plane_out];
    let mut idx = vec![0i32; p.planes * plane_out];
    if out.is_empty() {
        return (out, idx);
    }
    let per_task = planes_per_task(plane_in);
    // The window's offsets `(ky, kx)` in reading order, which decides ties.
    let taps: Vec<(usize, usize)> = (0..p.kernel)
        .flat_map(|ky| (0..p.kernel).map(move |kx| (ky, kx)))
        .collect();
    out.par_chunks_mut(per_task * plane_out)
        .zip(idx.par_chunks_mut(per_task * plane_out))
        .zip(x.par_chunks(per_task * plane_in))
        .for_each(|((o, ix), src)| {
            for ((o, ix), src) in o
                .chunks_mut(plane_out)
                .zip(ix.chunks_mut(plane_out))
                .zip(src.chunks(plane_in))
            {
                pool_plane(src, p, &taps, o, ix);
            }
        });
    (out, idx)
}

/// Pools one plane, an output row at a time and in two passes without branches on the data (a branch on random
/// data mispredicts every other element): the maxima, then the first window element equal to each.
fn pool_plane<T: Scalar>(
    src: &[T],
    p: &PoolParams,
    taps: &[(usize, usize)],
    out: &mut [T],
    idx: &mut [i32],
) {
    let ow = p.out_w();
    let (first, rest) = taps.split_first().expect("a pool window holds an element");
    let span = (ow - 1) * p.stride + 1;
    for (oy, (best, at)) in out.chunks_mut(ow).zip(idx.chunks_mut(ow)).enumerate() {
        // Output `ox` reads window element `(ky, kx)` at `tap + ox·stride` in the plane.
        let tap = |&(ky, kx): &(usize, usize)| (oy * p.stride + ky) * p.w + kx;
        let row = |t| &src[tap(t)..tap(t) + span];
        let r = row(first);
        for (ox, b) in best.iter_mut().enumerate() {
            *b = r[ox * p.stride];
        }
        // The first element stands until beaten, so a NaN there stays the maximum.
        for t in rest {
            let r = row(t);
            for (ox, b) in best.iter_mut().enumerate() {
                let v = r[ox * p.stride];
                *b = if v > *b { v } else { *b };
            }
        }
        for (ox, a) in at.iter_mut().enumerate() {
            *a = (tap(first) + ox * p.stride) as i32;
        }
        // Every tap, the first among them, from the last to the first: on ties the earliest one writes last.
        for t in taps.iter().rev() {
            let (r, at0) = (row(t), tap(t));
            for (ox, (a, &b)) in at.iter_mut().zip(best.iter()).enumerate() {
                let i = ox * p.stride;
                // A bit mask rather than `if`: LLVM would branch on the comparison.
                let take = -i32::from(r[i] == b);
                *a = (*a & !take) | ((at0 + i) as i32 & take);
            }
        }
    }
}

/// Routes each output gradient to the input element its window took the max from: `grad_out` and
/// `indices` hold `planes` planes of `plane_out` elements, the result `planes` planes of `plane_in`.
///
/// # Errors
/// [`crate::Error::IndexOutOfRange`] when an index lies outside its plane.
pub fn max_pool2d_backward<T: Scalar>(
    grad_out: &[T],
    indices: &[i32],
    planes: usize,
    plane_in: usize,
    plane_out: usize,
) -> crate::Result<Vec<T>> {
    let mut grad_in = vec![T::ZERO; planes * plane_in];
    if grad_in.is_empty() || plane_out == 0 {
        return Ok(grad_in);
    }
    let per_task = planes_per_task(plane_in);
    grad_in
        .par_chunks_mut(per_task * plane_in)
        .zip(grad_out.par_chunks(per_task * plane_out))
        .zip(indices.par_chunks(per_task * plane_out))
        .try_for_each(|((gi, go), ix)| {
            for ((gi, go), ix) in gi
                .chunks_mut(plane_in)
                .zip(go.chunks(plane_out))
                .zip(ix.chunks(plane_out))
            {
                route_plane(go, ix, gi)?;
            }
            Ok(())
        })?;
    Ok(grad_in)
}

/// Adds one plane's output gradients `go` into `gi` at `ix`, in output order (windows may overlap).
fn route_plane<T: Scalar>(go: &[T], ix: &[i32], gi: &mut [T]) -> crate::Result<()> {
    let plane_in = gi.len();
    for (&g, &i) in go.iter().zip(ix) {
        let Some(slot) = usize::try_from(i).ok().and_then(|i| gi.get_mut(i)) else {
            return Err(crate::Error::IndexOutOfRange {
                op: "max_pool2d_backward",
                index: i64::from(i),
                size: plane_in,
            });
        };
        *slot = slot.add(g);
    }
    Ok(())
}
