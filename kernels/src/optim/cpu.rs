//! CPU optimizer steps, parallel over chunks of the parameter.

use rayon::prelude::*;

use super::{AdamParams, LossScaleState, SgdParams};
use crate::disjoint::Disjoint;
use crate::simd::{FlushDenormals, Isa};
use crate::{Float, PAR_CHUNK, PAR_THRESHOLD};

/// Calls `f(start, len, lr)` for each chunk of a buffer of `len` elements split into
/// `lrs.len()` members, in chunks of at most `PAR_CHUNK`, in parallel when large, with denormals flushed to zero
/// (the state decays toward them).
fn for_chunks(len: usize, lrs: &[f64], f: impl Fn(usize, usize, f64) + Sync) {
    let f = |s, n, lr| {
        let _ftz = FlushDenormals::new();
        f(s, n, lr)
    };
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
    let p = Disjoint(param.as_mut_ptr());
    let use_buf = h.momentum != 0.0;
    let buf = match momentum_buf {
        Some(b) => {
            assert_eq!(b.len(), len, "sgd_step: momentum buffer length");
            Disjoint(b.as_mut_ptr())
        }
        None => {
            assert!(!use_buf, "sgd_step: momentum needs a buffer");
            Disjoint(std::ptr::null_mut())
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
    let step = h.step.max(1);
    let bc1 = super::bias_correction(h.beta1, step);
    let bc2 = super::bias_correction(h.beta2, step);
    let b1 = T::from_f64(h.beta1);
    let b2 = T::from_f64(h.beta2);
    let one_b1 = T::from_f64(1.0 - h.beta1);
    let one_b2 = T::from_f64(1.0 - h.beta2);
    let eps = T::from_f64(h.eps);
    let inv_sqrt_bc2 = T::from_f64(1.0 / bc2.sqrt());
    let (pp, mp, vp) = (
        Disjoint(param.as_mut_ptr()),
        Disjoint(m.as_mut_ptr()),
        Disjoint(v.as_mut_ptr()),
    );
    let (wd, decoupled) = (h.weight_decay, h.decoupled);
    let isa = Isa::current();
    for_chunks(len, h.lrs, |s, n, lr| {
        let c = AdamChunk {
            b1,
            b2,
            one_b1,
            one_b2,
            eps,
            inv_sqrt_bc2,
            step_size: T::from_f64(lr / bc1),
            l2: T::from_f64(if decoupled { 0.0 } else { wd }),
            shrink: T::from_f64(if decoupled { 1.0 - lr * wd } else { 1.0 }),
        };
        // SAFETY: `for_chunks` hands out disjoint in-bounds ranges; all buffers have `len` elements.
        let (p, m, v) = unsafe { (pp.slice(s, n), mp.slice(s, n), vp.slice(s, n)) };
        let g = &grad[s..s + n];
        match isa {
            // SAFETY: the CPU supports AVX-512F (`Isa` checked it at run time).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { adam_chunk_avx512(p, g, m, v, &c) },
            // SAFETY: the CPU supports AVX2 and FMA (as above).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { adam_chunk_avx2(p, g, m, v, &c) },
            _ => adam_chunk(p, g, m, v, &c),
        }
    });
}

/// Constants of one Adam chunk.
struct AdamChunk<T> {
    b1: T,
    b2: T,
    one_b1: T,
    one_b2: T,
    eps: T,
    inv_sqrt_bc2: T,
    step_size: T,
    l2: T,
    shrink: T,
}

#[inline(always)]
fn adam_chunk<T: Float>(p: &mut [T], g: &[T], m: &mut [T], v: &mut [T], c: &AdamChunk<T>) {
    let n = p.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for i in 0..n {
        let gi = g[i] + c.l2 * p[i];
        let mi = c.b1 * m[i] + c.one_b1 * gi;
        let vi = c.b2 * v[i] + c.one_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        let denom = vi.sqrt() * c.inv_sqrt_bc2 + c.eps;
        p[i] = p[i] * c.shrink - c.step_size * mi / denom;
    }
}

/// [`adam_chunk`] compiled for AVX-512 (16 f32 lanes: sqrt and div dominate).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn adam_chunk_avx512<T: Float>(
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
    c: &AdamChunk<T>,
) {
    adam_chunk(p, g, m, v, c);
}

/// [`adam_chunk`] compiled for AVX2 with FMA (8 f32 lanes).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn adam_chunk_avx2<T: Float>(
    p: &mut [T],
    g: &[T],
    m: &mut [T],
    v: &mut [T],
    c: &AdamChunk<T>,
) {
    adam_chunk(p, g, m, v, c);
}

/// Divides the gradient `g` by a loss scale (times `inv`, its reciprocal) in place; whether every
/// quotient is finite.
pub fn unscale<T: Float>(g: &mut [T], inv: T) -> bool {
    g.iter_mut().fold(true, |finite, x| {
        *x = *x * inv;
        finite && x.to_f64().is_finite()
    })
}

/// Moves a loss scale state on after a step, as `update_scale_f32` in `optim.cu` does on the device:
/// an overflow halves the scale (not below `min_scale`) and counts a skipped step; `interval` clean
/// steps in a row double it (not above `max_scale`); the overflow flag clears.
pub fn update_scale(s: &mut LossScaleState, interval: u64, min_scale: f32, max_scale: f32) {
    if s.overflow != 0.0 {
        s.scale = (s.scale * 0.5).max(min_scale);
        s.clean = 0.0;
        s.skipped += 1.0;
    } else if s.clean + 1.0 >= interval as f32 {
        s.scale = (s.scale * 2.0).min(max_scale);
        s.clean = 0.0;
    } else {
        s.clean += 1.0;
    }
    s.overflow = 0.0;
}
