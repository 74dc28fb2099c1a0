//! CPU matrix products through the `gemm` crate, and a Linear layer's forward (bias and ReLU) around them.
//!
//! Transposed operands are passed to gemm as strides, so they cost no copy. New outputs are not zeroed first:
//! every product overwrites (or, for a Linear layer, accumulates onto the bias written into) its whole output.
//!
//! Every gemm call runs on one thread. The threads share out whole products (fused members) or, where there are
//! fewer products than threads, bands of a product's rows. gemm's own split syncs its threads inside every product;
//! with bands instead, one model of the cohort benchmark (AVX2, two threads) trained 9-10 % faster.

use std::ops::Range;

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
    new_output(shape, |out, b, rows| {
        // SAFETY: `new_output` hands each task its own rows of a product; gemm writes them all (read_dst off).
        unsafe { one(out, false, lhs, rhs, shape, b, rows) }
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
    each_band(shape, |b, rows| {
        // SAFETY: each task gets its own rows of product `b` in `dst`, which holds all products (asserted).
        unsafe {
            one(
                out.at(b * shape.m * shape.n),
                accumulate,
                lhs,
                rhs,
                shape,
                b,
                rows,
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
            0..shape.m,
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
    new_output(shape, |out: *mut T, b, rows: Range<usize>| {
        let row = &bias[b * bias_stride..][..n];
        for r in rows.clone() {
            // SAFETY: `out` has this product's `m·n` elements, of which this task holds `rows`; they do not
            // overlap `bias`.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), out.add(r * n), n) };
        }
        // SAFETY: as above, now initialised; gemm accumulates onto them.
        unsafe { one(out, true, lhs, rhs, shape, b, rows.clone()) };
        if relu {
            // SAFETY: the task's rows are initialised and only this task holds them.
            let y =
                unsafe { std::slice::from_raw_parts_mut(out.add(rows.start * n), rows.len() * n) };
            y.iter_mut().for_each(|v| *v = v.max(T::ZERO));
        }
    })
}

/// A new `batch·m·n` buffer whose products `fill(out, b, rows)` writes: `out` is product `b`'s first element, and
/// each call writes all of the product's `rows` (the calls of one product cover them all).
fn new_output<T: Float>(
    shape: &MatmulShape,
    fill: impl Fn(*mut T, usize, Range<usize>) + Sync,
) -> Vec<T> {
    let len = shape
        .batch
        .checked_mul(shape.m * shape.n)
        .expect("matmul: output size overflows");
    let mut out = Vec::<T>::with_capacity(len);
    let ptr = Disjoint(out.as_mut_ptr());
    each_band(shape, |b, rows| {
        // SAFETY: each product's range lies inside the capacity, and each task writes only its rows of it.
        let start = unsafe { ptr.at(b * shape.m * shape.n) };
        fill(start, b, rows)
    });
    // SAFETY: every product wrote all of its elements (the contract of `fill`), so all `len` are initialised.
    unsafe { out.set_len(len) };
    out
}

/// Rows of a band come in multiples of this: gemm's AVX2 microkernel height, half its AVX-512 one, so that a band
/// of an even split has no ragged edge.
const BAND_ROWS: usize = 16;

/// Runs `task(b, rows)` over every product `b` and all of its rows, one gemm call per task on one thread: fused
/// members shared out whole across the threads, or, where products are fewer than threads, each product cut into
/// one band of rows per thread (rather than every thread inside each member's product, which syncs them once per
/// product). A product under eight times [`GEMM_PAR_WORK`] stays whole: with the benchmark MLP's second layer
/// (256x10x128) banded too, one model ran at 1,070 model-steps/s against 1,176 (AVX2, two threads). A band computes each of its outputs in the same order as the whole product, so the bits do not depend
/// on the thread count.
fn each_band(shape: &MatmulShape, task: impl Fn(usize, Range<usize>) + Sync) {
    let MatmulShape { batch, m, n, k, .. } = *shape;
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    let work = m * n * k.max(1);
    let threads = rayon::current_num_threads();
    if threads == 1 || batch * work < GEMM_PAR_WORK {
        (0..batch).for_each(|b| task(b, 0..m));
    } else if batch >= threads || work < GEMM_PAR_WORK * 8 {
        (0..batch).into_par_iter().for_each(|b| task(b, 0..m));
    } else {
        let band = m.div_ceil(threads).next_multiple_of(BAND_ROWS);
        let bands = m.div_ceil(band);
        (0..batch * bands).into_par_iter().for_each(|i| {
            let start = (i % bands) * band;
            task(i / bands, start..m.min(start + band))
        });
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

/// Rows `rows` of product `b` of `shape` into the `m·n` elements at `out`, or added onto them when `accumulate`.
///
/// # Safety
/// `out` must be valid for writes of `m·n` elements, of which no other task touches `rows`, initialised when
/// `accumulate`; `lhs` and `rhs` must hold what `shape` says (see [`check_inputs`]).
unsafe fn one<T: Float>(
    out: *mut T,
    accumulate: bool,
    lhs: &[T],
    rhs: &[T],
    s: &MatmulShape,
    b: usize,
    rows: Range<usize>,
) {
    let (m, n, k) = (s.m, s.n, s.k);
    debug_assert!(rows.end <= m);
    // SAFETY: `rows` lie inside the product's `m·n` elements (the caller's contract).
    let out = unsafe { out.add(rows.start * n) };
    if k == 0 {
        if !accumulate {
            // SAFETY: `out` is valid for the band's writes; all-zero bits are 0.0 for f32 and f64.
            unsafe { std::ptr::write_bytes(out, 0, rows.len() * n) };
        }
        return;
    }
    let lhs = &lhs[b * s.lhs_batch_stride..b * s.lhs_batch_stride + m * k];
    let rhs = &rhs[b * s.rhs_batch_stride..b * s.rhs_batch_stride + k * n];
    // (row stride, column stride) of the logical [m, k] and [k, n] operands.
    let (lhs_rs, lhs_cs) = if s.trans_lhs { (1, m) } else { (k, 1) };
    let (rhs_rs, rhs_cs) = if s.trans_rhs { (1, k) } else { (n, 1) };
    let lhs = &lhs[rows.start * lhs_rs..];
    // SAFETY: the slices above hold the product's m·k and k·n elements (the lhs from the band's first row) and
    // `out` is valid for the band's rows (the caller's contract); the strides address only elements inside them;
    // `out` does not alias the inputs (it is this task's alone). gemm supports f32 and f64, the only `Float` types.
    unsafe {
        gemm::gemm(
            rows.len(),
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
            Parallelism::None,
        );
    }
}
