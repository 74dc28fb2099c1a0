//! CPU index ops. Indices are `i32`; any index outside its dim is an error, never a panic.

use crate::{Error, Result, Scalar};

fn check(op: &'static str, i: i32, size: usize) -> Result<usize> {
    match usize::try_from(i) {
        Ok(u) if u < size => Ok(u),
        _ => Err(Error::IndexOutOfRange {
            op,
            index: i64::from(i),
            size,
        }),
    }
}

/// `src` is `[outer, dim, inner]`; the result is `[outer, idx.len(), inner]` with
/// `out[o, i, :] = src[o, idx[i], :]`.
///
/// # Errors
/// [`Error::IndexOutOfRange`] when an index is outside `0..dim`.
pub fn index_select<T: Copy>(
    src: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    idx: &[i32],
) -> Result<Vec<T>> {
    let rows: Vec<usize> = idx
        .iter()
        .map(|&i| check("index_select", i, dim))
        .collect::<Result<_>>()?;
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &r in &rows {
            let start = (o * dim + r) * inner;
            out.extend_from_slice(&src[start..start + inner]);
        }
    }
    Ok(out)
}

/// `dst` is `[outer, dim, inner]`, `src` `[outer, idx.len() / repeat, inner]`:
/// `dst[o, idx[i], :] += src[o, i / repeat, :]` (repeated indices accumulate; `repeat` consecutive indices share
/// a row of `src`, as the ids of a bag share its gradient).
///
/// # Errors
/// [`Error::IndexOutOfRange`] when an index is outside `0..dim`; `dst` is then unchanged.
pub fn index_add<T: Scalar>(
    dst: &mut [T],
    (outer, dim, inner): (usize, usize, usize),
    idx: &[i32],
    src: &[T],
    repeat: usize,
) -> Result<()> {
    let rows: Vec<usize> = idx
        .iter()
        .map(|&i| check("index_add", i, dim))
        .collect::<Result<_>>()?;
    let per = rows.len() / repeat.max(1);
    for o in 0..outer {
        for (i, &r) in rows.iter().enumerate() {
            let s = &src[(o * per + i / repeat.max(1)) * inner..][..inner];
            let d = &mut dst[(o * dim + r) * inner..][..inner];
            for (a, &b) in d.iter_mut().zip(s) {
                *a = a.add(b);
            }
        }
    }
    Ok(())
}

/// `src` is `[rows, cols]`, `idx` `[rows]`: `out[r] = src[r, idx[r]]`.
///
/// # Errors
/// [`Error::IndexOutOfRange`] when an index is outside `0..cols`.
pub fn gather_last<T: Copy>(src: &[T], cols: usize, idx: &[i32]) -> Result<Vec<T>> {
    idx.iter()
        .enumerate()
        .map(|(r, &i)| Ok(src[r * cols + check("gather_last", i, cols)?]))
        .collect()
}

/// `dst` is `[rows, cols]`, `idx` `[rows]`: `dst[r, idx[r]] += src[r]` (the backward of
/// [`gather_last`]).
///
/// # Errors
/// [`Error::IndexOutOfRange`] when an index is outside `0..cols`; `dst` may then be partly updated.
pub fn scatter_add_last<T: Scalar>(
    dst: &mut [T],
    cols: usize,
    idx: &[i32],
    src: &[T],
) -> Result<()> {
    for (r, (&i, &v)) in idx.iter().zip(src).enumerate() {
        let c = check("scatter_add_last", i, cols)?;
        dst[r * cols + c] = dst[r * cols + c].add(v);
    }
    Ok(())
}

/// `[labels.len(), classes]` with a 1 at each label's column.
///
/// # Errors
/// [`Error::IndexOutOfRange`] when a label is outside `0..classes`.
pub fn one_hot<T: Scalar>(labels: &[i32], classes: usize) -> Result<Vec<T>> {
    let mut out = vec![T::ZERO; labels.len() * classes];
    for (r, &l) in labels.iter().enumerate() {
        out[r * classes + check("one_hot", l, classes)?] = T::ONE;
    }
    Ok(out)
}
