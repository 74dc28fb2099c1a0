//! CPU max pooling.

use rayon::prelude::*;

use super::PoolParams;
use crate::{PAR_THRESHOLD, Scalar};

/// Max over each window; also returns, per output, the flat index (`y·w + x`) of the maximum in
/// its input plane (the first one on ties).
pub fn max_pool2d<T: Scalar>(x: &[T], p: &PoolParams) -> (Vec<T>, Vec<i32>) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let plane_out = oh * ow;
    let mut out = vec![T::ZERO; p.planes * plane_out];
    let mut idx = vec![0i32; p.planes * plane_out];
    if out.is_empty() {
        return (out, idx);
    }
    let f = |(pl, (o, ix)): (usize, (&mut [T], &mut [i32]))| {
        let src = &x[pl * p.h * p.w..(pl + 1) * p.h * p.w];
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = T::LOWEST;
                let mut bi = ((oy * p.stride) * p.w + ox * p.stride) as i32;
                let mut first = true;
                for ky in 0..p.kernel {
                    let y = oy * p.stride + ky;
                    for kx in 0..p.kernel {
                        let xx = ox * p.stride + kx;
                        let v = src[y * p.w + xx];
                        if first || v > best {
                            best = v;
                            bi = (y * p.w + xx) as i32;
                            first = false;
                        }
                    }
                }
                o[oy * ow + ox] = best;
                ix[oy * ow + ox] = bi;
            }
        }
    };
    if x.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(plane_out)
            .zip(idx.par_chunks_mut(plane_out))
            .enumerate()
            .for_each(f);
    } else {
        out.chunks_mut(plane_out)
            .zip(idx.chunks_mut(plane_out))
            .enumerate()
            .for_each(f);
    }
    (out, idx)
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
    for ((gi, go), ix) in grad_in
        .chunks_mut(plane_in)
        .zip(grad_out.chunks(plane_out))
        .zip(indices.chunks(plane_out))
    {
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
    }
    Ok(grad_in)
}
