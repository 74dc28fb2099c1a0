//! CPU matrix products through the `gemm` crate, and a Linear layer's forward (bias and ReLU) around them.
//!
//! Transposed operands are passed to gemm as strides, so they cost no copy. New outputs are not zeroed first:
//! every product overwrites (or, for a Linear layer, accumulates onto the bias written into) its whole output.

use gemm::Parallelism;
use rayon::prelude::*;

use super::MatmulShape;
use crate::Float;
use crate::disjoint::Disjoint;

/// Work (m·n·k) under which one product runs on one thread: waking rayon costs more than it saves.
const GEMM_PAR_WORK: usize = 48 * 48 * 48;

/// Computes the product described by `shape` into a new buffer of `batch·m·n` elements.
pub fn matmul<T: Float>(lhs: &[T], rhs: &[T], shape: &MatmulShape) -> Vec<T> {
    check_inputs(lhs, rhs, shape);
    new_output(shape, |out, b, par| {
        // SAFETY: `new_output` hands each product its own `m·n` elements; gemm writes them all (read_dst off).
        unsafe { one(out, false, lhs, rhs, shape, b, par) }
    })
}

/// `dst = lhs · rhs` (or `dst += lhs · rhs` when `accumulate`) for every batch entry.
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
    assert!(
        dst.len() >= shape.batch * shape.m * shape.n,
        "matmul: output buffer too small"
    );
    check_inputs(lhs, rhs, shape);
    let out = Disjoint(dst.as_mut_ptr());
    each_product(shape, |b, par| {
        // SAFETY: each product gets its own `m·n` elements of `dst`, which holds all of them (asserted).
        unsafe {
            one(
                out.at(b * shape.m * shape.n),
                accumulate,
                lhs,
                rhs,
                shape,
                b,
                par,
            )
        }
    });
}

/// [`matmul_into`] of one product (`shape.batch` ignored) on the calling thread: for callers whose tasks are
/// already the parallel work (a convolution's tiles).
///
/// # Panics
/// When a buffer is shorter than `shape` says.
pub fn matmul_on_this_thread<T: Float>(
    dst: &mut [T],
    accumulate: bool,
    lhs: &[T],
    rhs: &[T],
    shape: &MatmulShape,
) {
    let one_product = MatmulShape { batch: 1, ..*shape };
    assert!(
        dst.len() >= shape.m * shape.n,
        "matmul: output buffer too small"
    );
    check_inputs(lhs, rhs, &one_product);
    // SAFETY: `dst` holds the product's `m·n` elements (asserted) and is this call's alone; the inputs were checked.
    unsafe {
        one(
            dst.as_mut_ptr(),
            accumulate,
            lhs,
            rhs,
            &one_product,
            0,
            Parallelism::None,
        )
    };
}

/// A Linear layer's forward: `lhs[b] · rhs[b] + bias`, then `max(·, 0)` when `relu`. Product `b` adds the bias row
/// at `b · bias_stride` of `bias` (0: one row for all) to each of its rows. Each product is finished by the task
/// that computes it, with its output still in cache: the bias written first, the product accumulated onto it, the
/// ReLU applied in place.
///
/// # Panics
/// When a buffer is shorter than `shape` and `bias_stride` say.
pub fn linear<T: Float>(
    lhs: &[T],
    rhs: &[T],
    bias: &[T],
    bias_stride: usize,
    relu: bool,
    shape: &MatmulShape,
) -> Vec<T> {
    let n = shape.n;
    assert!(
        bias.len() >= (shape.batch.max(1) - 1) * bias_stride + n,
        "linear: bias too short"
    );
    check_inputs(lhs, rhs, shape);
    new_output(shape, |out: *mut T, b, par| {
        let len = shape.m * n;
        let row = &bias[b * bias_stride..][..n];
        for r in 0..shape.m {
            // SAFETY: `out` has this product's `m·n` elements; rows do not overlap `bias`.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * n), n) };
        }
        // SAFETY: as above, now initialised; gemm accumulates onto them.
        unsafe { one(out, true, lhs, rhs, shape, b, par) };
        if relu {
            // SAFETY: the product's elements are initialised and only this task holds them.
            let y = unsafe { std::slice::from_raw_parts_mut(out, len) };
            y.iter_mut().for_each(|v| *v = v.max(T::ZERO));
        }
    })
}

/// A new `batch·m·n` buffer whose products `fill(out, b, par)` writes, each its whole `m·n` elements from `out`.
fn new_output<T: Float>(
    shape: &MatmulShape,
    fill: impl Fn(*mut T, usize, Parallelism) + Sync,
) -> Vec<T> {
    let len = shape
        .batch
        .checked_mul(shape.m * shape.n)
        .expect("matmul: output size overflows");
    let mut out = Vec::<T>::with_capacity(len);
    let ptr = Disjoint(out.as_mut_ptr());
    each_product(shape, |b, par| {
        // SAFETY: each product's range lies inside the capacity and belongs to that product alone.
        let start = unsafe { ptr.at(b * shape.m * shape.n) };
        fill(start, b, par)
    });
    // SAFETY: every product wrote all of its elements (the contract of `fill`), so all `len` are initialised.
    unsafe { out.set_len(len) };
    out
}

/// Runs `product(b, par)` for every batch entry: fused members split across the threads, one product a task on one
/// thread (rather than every thread inside each member's product, which syncs them once per product); a single
/// product, or fewer large products than threads, split inside by gemm.
fn each_product(shape: &MatmulShape, product: impl Fn(usize, Parallelism) + Sync) {
    let MatmulShape { batch, m, n, k, .. } = *shape;
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    let work = m * n * k.max(1);
    let threads = rayon::current_num_threads();
    if batch > 1 && (batch >= threads || work < GEMM_PAR_WORK * 8) && threads > 1 {
        (0..batch)
            .into_par_iter()
            .for_each(|b| product(b, Parallelism::None));
    } else {
        let par = if work < GEMM_PAR_WORK || threads == 1 {
            Parallelism::None
        } else {
            Parallelism::Rayon(threads)
        };
        (0..batch).for_each(|b| product(b, par));
    }
}

fn check_inputs<T>(lhs: &[T], rhs: &[T], s: &MatmulShape) {
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return;
    }
    let lhs_need = (s.batch - 1) * s.lhs_batch_stride + s.m * s.k;
    let rhs_need = (s.batch - 1) * s.rhs_batch_stride + s.k * s.n;
    assert!(lhs.len() >= lhs_need, "matmul: lhs buffer too small");
    assert!(rhs.len() >= rhs_need, "matmul: rhs buffer too small");
}

/// Product `b` of `shape` into the `m·n` elements at `out`, or added onto them when `accumulate`.
///
/// # Safety
/// `out` must be valid for writes of `m·n` elements that no other task touches, initialised when `accumulate`;
/// `lhs` and `rhs` must hold what `shape` says (see [`check_inputs`]).
unsafe fn one<T: Float>(
    out: *mut T,
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
            // SAFETY: `out` is valid for `m·n` writes; all-zero bits are 0.0 for f32 and f64.
            unsafe { std::ptr::write_bytes(out, 0, m * n) };
        }
        return;
    }
    let lhs = &lhs[b * s.lhs_batch_stride..b * s.lhs_batch_stride + m * k];
    let rhs = &rhs[b * s.rhs_batch_stride..b * s.rhs_batch_stride + k * n];
    // (row stride, column stride) of the logical [m, k] and [k, n] operands.
    let (lhs_rs, lhs_cs) = if s.trans_lhs { (1, m) } else { (k, 1) };
    let (rhs_rs, rhs_cs) = if s.trans_rhs { (1, k) } else { (n, 1) };
    // SAFETY: the slices above hold exactly m·k and k·n elements and `out` is valid for m·n (the caller's
    // contract); the strides address only elements inside them; `out` does not alias the inputs (it is this
    // task's alone). gemm supports f32 and f64, the only `Float` types.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
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
