//! CPU optimizer steps, parallel over chunks of the parameter.

use rayon::prelude::*;

use super::{AdamParams, SgdParams};
use crate::{Float, PAR_CHUNK, PAR_THRESHOLD};

/// Calls `f(start, len, lr)` for each chunk of a buffer of `len` elements split into
/// `lrs.len()` members, in chunks of at most `PAR_CHUNK`, in parallel when large.
fn for_chunks(len: usize, lrs: &[f64], f: impl Fn(usize, usize, f64) + Sync) {
    let members = lrs.len().max(1);
    let per = len / members;
    let mut jobs = Vec::new();
    for (mi, &lr) in lrs.iter().enumerate() {
        let mut s = mi * per;
        let end = (mi + 1) * per;
        while s < end {
            let n = PAR_CHUNK.min(end - s);
            jobs.push((s, n, lr));
            s += n;
        }
    }
    if len >= PAR_THRESHOLD {
        jobs.par_iter().for_each(|&(s, n, lr)| f(s, n, lr));
    } else {
        jobs.iter().for_each(|&(s, n, lr)| f(s, n, lr));
    }
}

/// A raw pointer that may cross threads: chunks handed to different tasks never overlap.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: used only to hand disjoint chunks of one buffer to rayon tasks (see `for_chunks`).
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above; no two tasks touch the same element.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// # Safety
    /// `start + len` must lie inside the buffer and no other live slice may overlap the range.
    unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// One SGD step. `momentum_buf` is required when `momentum != 0`; it starts at zero, so the first
/// step stores `(1 - dampening)·g` (PyTorch stores `g`; the same when `dampening = 0`).
///
/// # Panics
/// When the buffers differ in length or `momentum_buf` is missing with momentum; callers check.
pub fn sgd_step<T: Float>(
    param: &mut [T],
    grad: &[T],
    momentum_buf: Option<&mut [T]>,
    h: &SgdParams<'_>,
) {
    let len = param.len();
    assert_eq!(grad.len(), len, "sgd_step: grad length");
    let wd = T::from_f64(h.weight_decay);
    let mom = T::from_f64(h.momentum);
    let damp = T::from_f64(1.0 - h.dampening);
    let nesterov = h.nesterov;
    let p = Shared(param.as_mut_ptr());
    let use_buf = h.momentum != 0.0;
    let buf = match momentum_buf {
        Some(b) => {
            assert_eq!(b.len(), len, "sgd_step: momentum buffer length");
            Shared(b.as_mut_ptr())
        }
        None => {
            assert!(!use_buf, "sgd_step: momentum needs a buffer");
            Shared(std::ptr::null_mut())
        }
    };
    for_chunks(len, h.lrs, |s, n, lr| {
        let lr = T::from_f64(lr);
        // SAFETY: `for_chunks` hands out disjoint in-bounds ranges of `len` elements.
        let p = unsafe { p.slice(s, n) };
        let g = &grad[s..s + n];
        if use_buf {
            // SAFETY: as above; the buffer has `len` elements.
            let b = unsafe { buf.slice(s, n) };
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let g = g + wd * *p;
                *b = mom * *b + damp * g;
                let d = if nesterov { g + mom * *b } else { *b };
                *p = *p - lr * d;
            }
        } else {
            for (p, &g) in p.iter_mut().zip(g) {
                let g = g + wd * *p;
                *p = *p - lr * g;
            }
        }
    });
}

/// One Adam / AdamW step on `param` with moments `m` and `v`.
///
/// # Panics
/// When the buffers differ in length; callers check.
pub fn adam_step<T: Float>(
    param: &mut [T],
    grad: &[T],
    m: &mut [T],
    v: &mut [T],
    h: &AdamParams<'_>,
) {
    let len = param.len();
    assert!(
        grad.len() == len && m.len() == len && v.len() == len,
        "adam_step: buffer lengths"
    );
    let step = h.step.max(1) as i32;
    let bc1 = 1.0 - h.beta1.powi(step);
    let bc2 = 1.0 - h.beta2.powi(step);
    let b1 = T::from_f64(h.beta1);
    let b2 = T::from_f64(h.beta2);
    let one_b1 = T::from_f64(1.0 - h.beta1);
    let one_b2 = T::from_f64(1.0 - h.beta2);
    let eps = T::from_f64(h.eps);
    let inv_sqrt_bc2 = T::from_f64(1.0 / bc2.sqrt());
    let (pp, mp, vp) = (
        Shared(param.as_mut_ptr()),
        Shared(m.as_mut_ptr()),
        Shared(v.as_mut_ptr()),
    );
    let (wd, decoupled) = (h.weight_decay, h.decoupled);
    for_chunks(len, h.lrs, |s, n, lr| {
        let step_size = T::from_f64(lr / bc1);
        let l2 = T::from_f64(if decoupled { 0.0 } else { wd });
        let shrink = T::from_f64(if decoupled { 1.0 - lr * wd } else { 1.0 });
        // SAFETY: `for_chunks` hands out disjoint in-bounds ranges; all buffers have `len` elements.
        let (p, m, v) = unsafe { (pp.slice(s, n), mp.slice(s, n), vp.slice(s, n)) };
        let g = &grad[s..s + n];
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = g + l2 * *p;
            let pv = *p * shrink;
            *m = b1 * *m + one_b1 * g;
            *v = b2 * *v + one_b2 * g * g;
            let denom = v.sqrt() * inv_sqrt_bc2 + eps;
            *p = pv - step_size * *m / denom;
        }
    });
}
