//! CPU broadcast binary ops.

use rayon::prelude::*;

use super::{BinaryOp, BroadcastPlan};
use crate::{PAR_CHUNK, PAR_THRESHOLD, Scalar};

#[inline(always)]
fn bool_to<T: Scalar>(b: bool) -> T {
    if b { T::ONE } else { T::ZERO }
}

macro_rules! with_op {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |a: T, b: T| a.add(b);
                $body
            }
            BinaryOp::Sub => {
                let $f = |a: T, b: T| a.sub(b);
                $body
            }
            BinaryOp::Mul => {
                let $f = |a: T, b: T| a.mul(b);
                $body
            }
            BinaryOp::Div => {
                let $f = |a: T, b: T| a.div(b);
                $body
            }
            BinaryOp::Maximum => {
                let $f = |a: T, b: T| if b > a { b } else { a };
                $body
            }
            BinaryOp::Minimum => {
                let $f = |a: T, b: T| if b < a { b } else { a };
                $body
            }
            BinaryOp::Gt => {
                let $f = |a: T, b: T| bool_to::<T>(a > b);
                $body
            }
            BinaryOp::Ge => {
                let $f = |a: T, b: T| bool_to::<T>(a >= b);
                $body
            }
            BinaryOp::Lt => {
                let $f = |a: T, b: T| bool_to::<T>(a < b);
                $body
            }
            BinaryOp::Le => {
                let $f = |a: T, b: T| bool_to::<T>(a <= b);
                $body
            }
            BinaryOp::Eq => {
                let $f = |a: T, b: T| bool_to::<T>(a == b);
                $body
            }
        }
    };
}

/// `out = lhs (op) rhs` with numpy broadcasting of `lhs_shape` and `rhs_shape` to `out_shape`.
pub fn binary<T: Scalar>(
    op: BinaryOp,
    lhs: &[T],
    lhs_shape: &[usize],
    rhs: &[T],
    rhs_shape: &[usize],
    out_shape: &[usize],
) -> Vec<T> {
    let len: usize = out_shape.iter().product();
    if len < PAR_THRESHOLD {
        // One pass that writes each element once (no zero fill first).
        let mut out = Vec::with_capacity(len);
        with_op!(op, |f| {
            extend(&mut out, lhs, lhs_shape, rhs, rhs_shape, out_shape, f)
        });
        return out;
    }
    let mut out = vec![T::ZERO; len];
    with_op!(op, |f| {
        run(&mut out, lhs, lhs_shape, rhs, rhs_shape, out_shape, f)
    });
    out
}

fn extend<T: Scalar, F: Fn(T, T) -> T>(
    out: &mut Vec<T>,
    lhs: &[T],
    lhs_shape: &[usize],
    rhs: &[T],
    rhs_shape: &[usize],
    out_shape: &[usize],
    f: F,
) {
    let len: usize = out_shape.iter().product();
    if len == 0 {
        return;
    }
    if lhs_shape == rhs_shape {
        out.extend(lhs.iter().zip(rhs).map(|(&a, &b)| f(a, b)));
        return;
    }
    let plan = BroadcastPlan::new(lhs_shape, rhs_shape, out_shape);
    let n = plan.inner;
    for r in 0..plan.rows() {
        let (lo, ro) = plan.offsets(r);
        match (plan.lhs_inner_step, plan.rhs_inner_step) {
            (1, 1) => out.extend(
                lhs[lo..lo + n]
                    .iter()
                    .zip(&rhs[ro..ro + n])
                    .map(|(&a, &b)| f(a, b)),
            ),
            (1, 0) => {
                let y = rhs[ro];
                out.extend(lhs[lo..lo + n].iter().map(|&a| f(a, y)));
            }
            (0, 1) => {
                let x = lhs[lo];
                out.extend(rhs[ro..ro + n].iter().map(|&b| f(x, b)));
            }
            _ => {
                let v = f(lhs[lo], rhs[ro]);
                out.extend(std::iter::repeat_n(v, n));
            }
        }
    }
}

#[inline(always)]
fn row<T: Scalar, F: Fn(T, T) -> T>(out: &mut [T], a: &[T], la: usize, b: &[T], lb: usize, f: &F) {
    match (la, lb) {
        (1, 1) => {
            let (a, b) = (&a[..out.len()], &b[..out.len()]);
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (1, 0) => {
            let y = b[0];
            let n = out.len();
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        (0, 1) => {
            let x = a[0];
            let n = out.len();
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        _ => {
            let v = f(a[0], b[0]);
            out.fill(v);
        }
    }
}

fn run<T: Scalar, F: Fn(T, T) -> T + Sync>(
    out: &mut [T],
    lhs: &[T],
    lhs_shape: &[usize],
    rhs: &[T],
    rhs_shape: &[usize],
    out_shape: &[usize],
    f: F,
) {
    let plan = BroadcastPlan::new(lhs_shape, rhs_shape, out_shape);
    let inner = plan.inner;
    let (la, lb) = (plan.lhs_inner_step, plan.rhs_inner_step);
    if plan.rows() == 1 {
        out.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(c, o)| {
                let start = c * PAR_CHUNK;
                let a = if la == 1 { &lhs[start..] } else { lhs };
                let b = if lb == 1 { &rhs[start..] } else { rhs };
                row(o, a, la, b, lb, &f);
            });
    } else {
        let rows_per_task = PAR_CHUNK.div_ceil(inner).max(1);
        out.par_chunks_mut(rows_per_task * inner)
            .enumerate()
            .for_each(|(c, block)| {
                for (i, o) in block.chunks_mut(inner).enumerate() {
                    let (lo, ro) = plan.offsets(c * rows_per_task + i);
                    row(o, &lhs[lo..], la, &rhs[ro..], lb, &f);
                }
            });
    }
}

/// `dst = dst (op) src`, with `src` broadcast to `dst_shape`.
pub fn binary_assign<T: Scalar>(
    op: BinaryOp,
    dst: &mut [T],
    dst_shape: &[usize],
    src: &[T],
    src_shape: &[usize],
) {
    with_op!(op, |f| assign(dst, dst_shape, src, src_shape, f));
}

#[inline(always)]
fn row_assign<T: Scalar, F: Fn(T, T) -> T>(out: &mut [T], b: &[T], lb: usize, f: &F) {
    if lb == 1 {
        let n = out.len();
        for (o, &y) in out.iter_mut().zip(&b[..n]) {
            *o = f(*o, y);
        }
    } else {
        let y = b[0];
        for o in out.iter_mut() {
            *o = f(*o, y);
        }
    }
}

fn assign<T: Scalar, F: Fn(T, T) -> T + Sync>(
    dst: &mut [T],
    dst_shape: &[usize],
    src: &[T],
    src_shape: &[usize],
    f: F,
) {
    if dst.is_empty() {
        return;
    }
    let plan = BroadcastPlan::new(dst_shape, src_shape, dst_shape);
    let inner = plan.inner;
    let lb = plan.rhs_inner_step;
    let rows = plan.rows();
    if dst.len() < PAR_THRESHOLD {
        for (r, o) in dst.chunks_mut(inner).enumerate() {
            let (_, ro) = plan.offsets(r);
            row_assign(o, &src[ro..], lb, &f);
        }
    } else if rows == 1 {
        dst.par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(c, o)| {
                let b = if lb == 1 { &src[c * PAR_CHUNK..] } else { src };
                row_assign(o, b, lb, &f);
            });
    } else {
        let rows_per_task = PAR_CHUNK.div_ceil(inner).max(1);
        dst.par_chunks_mut(rows_per_task * inner)
            .enumerate()
            .for_each(|(c, block)| {
                for (i, o) in block.chunks_mut(inner).enumerate() {
                    let (_, ro) = plan.offsets(c * rows_per_task + i);
                    row_assign(o, &src[ro..], lb, &f);
                }
            });
    }
}
