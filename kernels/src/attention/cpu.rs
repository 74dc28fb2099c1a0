//! CPU fused attention: one rayon task per (sequence, head), each walking its queries in blocks of [`BLOCK`]
//! rows, so a task holds `BLOCK × L` scores at a time. The products run on the task's own thread through gemm.

use rayon::prelude::*;

use super::AttentionShape;
use crate::Float;
use crate::disjoint::Disjoint;
use crate::matmul::MatmulShape;
use crate::matmul::cpu::matmul_on_this_thread;

/// Queries per block: big enough for gemm to run well, small enough that the scores stay in cache.
const BLOCK: usize = 64;

/// The forward pass: `(out [n, L, D], lse [n, heads, L])` of `qkv` (`[n, L, 3D]`) and the key-padding `mask`
/// (`[mask_rows, L]`, empty when `mask_rows` is 0).
///
/// # Panics
/// When a buffer's length is not what `shape` says; callers validate shapes first.
pub fn forward<T: Float>(qkv: &[T], mask: &[T], shape: &AttentionShape) -> (Vec<T>, Vec<T>) {
    check(qkv, mask, shape);
    let (l, d) = (shape.len, shape.head_dim);
    let mut out = vec![T::ZERO; shape.out_len()];
    let mut lse = vec![T::ZERO; shape.lse_len()];
    let out_ptr = Disjoint(out.as_mut_ptr());
    lse.par_chunks_mut(l.max(1))
        .enumerate()
        .for_each(|(g, lse)| {
            let head = Head::new(shape, g, mask);
            let [q, k, v] = [0, 1, 2].map(|part| head.gather(qkv, part));
            let mut o = vec![T::ZERO; l * d];
            let mut p = vec![T::ZERO; BLOCK * l];
            for i0 in (0..l).step_by(BLOCK) {
                let (rows, keys) = head.block(i0);
                let p = &mut p[..rows * keys];
                head.scores(p, &q, &k, i0, rows, keys);
                for (r, row) in p.chunks_mut(keys).enumerate() {
                    lse[i0 + r] = softmax_row(row);
                }
                matmul_on_this_thread(
                    &mut o[i0 * d..],
                    false,
                    p,
                    &v,
                    &MatmulShape::plain(rows, d, keys),
                );
            }
            // SAFETY: task `g` writes only its own head's rows of `out`, which no other task touches.
            unsafe { head.scatter(out_ptr, shape.width(), 0, &o) };
        });
    (out, lse)
}

/// The backward pass: the gradient of `qkv` (`[n, L, 3D]`) given the forward's inputs, its `out` and `lse`, and
/// the output's gradient `dout`.
///
/// # Panics
/// When a buffer's length is not what `shape` says.
pub fn backward<T: Float>(
    qkv: &[T],
    mask: &[T],
    (out, lse): (&[T], &[T]),
    dout: &[T],
    shape: &AttentionShape,
) -> Vec<T> {
    check(qkv, mask, shape);
    assert!(
        out.len() == shape.out_len()
            && dout.len() == shape.out_len()
            && lse.len() == shape.lse_len(),
        "attention backward: buffers do not match the shape"
    );
    let (l, d) = (shape.len, shape.head_dim);
    let mut dqkv = vec![T::ZERO; shape.qkv_len()];
    let ptr = Disjoint(dqkv.as_mut_ptr());
    let width = shape.width();
    (0..shape.seqs * shape.heads).into_par_iter().for_each(|g| {
        let head = Head::new(shape, g, mask);
        let [q, k, v] = [0, 1, 2].map(|part| head.gather(qkv, part));
        let (o, dout) = (head.gather_rows(out, width), head.gather_rows(dout, width));
        let lse = &lse[g * l..(g + 1) * l];
        let (mut dq, mut dk, mut dv) = (
            vec![T::ZERO; l * d],
            vec![T::ZERO; l * d],
            vec![T::ZERO; l * d],
        );
        let (mut p, mut ds) = (vec![T::ZERO; BLOCK * l], vec![T::ZERO; BLOCK * l]);
        for i0 in (0..l).step_by(BLOCK) {
            let (rows, keys) = head.block(i0);
            let (p, ds) = (&mut p[..rows * keys], &mut ds[..rows * keys]);
            head.scores(p, &q, &k, i0, rows, keys);
            for (r, row) in p.chunks_mut(keys).enumerate() {
                let m = lse[i0 + r];
                for s in row {
                    // A key the query cannot see scored -inf; so did every key of a query that sees none.
                    *s = if *s == T::LOWEST {
                        T::ZERO
                    } else {
                        (*s - m).exp()
                    };
                }
            }
            // dP = dO · Vᵀ, then dS = P ∘ (dP − rowsum(dO ∘ O)).
            let dout_blk = &dout[i0 * d..(i0 + rows) * d];
            matmul_on_this_thread(ds, false, dout_blk, &v, &transposed_rhs(rows, keys, d));
            for r in 0..rows {
                let i = i0 + r;
                let delta = dot(&dout[i * d..(i + 1) * d], &o[i * d..(i + 1) * d]);
                let (pr, dsr) = (
                    &p[r * keys..(r + 1) * keys],
                    &mut ds[r * keys..(r + 1) * keys],
                );
                for (s, &pj) in dsr.iter_mut().zip(pr) {
                    *s = pj * (*s - delta);
                }
            }
            let q_blk = &q[i0 * d..(i0 + rows) * d];
            matmul_on_this_thread(
                &mut dq[i0 * d..],
                false,
                ds,
                &k,
                &MatmulShape::plain(rows, d, keys),
            );
            matmul_on_this_thread(&mut dk, true, ds, q_blk, &transposed_lhs(keys, d, rows));
            matmul_on_this_thread(&mut dv, true, p, dout_blk, &transposed_lhs(keys, d, rows));
        }
        let scale = T::from_f64(shape.scale);
        for x in dq.iter_mut().chain(dk.iter_mut()) {
            *x = *x * scale;
        }
        // SAFETY: task `g` writes only its own head's rows of the three parts of `dqkv`.
        unsafe {
            head.scatter(ptr, 3 * width, 0, &dq);
            head.scatter(ptr, 3 * width, width, &dk);
            head.scatter(ptr, 3 * width, 2 * width, &dv);
        }
    });
    dqkv
}

fn check<T>(qkv: &[T], mask: &[T], shape: &AttentionShape) {
    assert!(
        qkv.len() == shape.qkv_len() && mask.len() == shape.mask_len(),
        "attention: buffers do not match the shape"
    );
}

fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::ZERO, |s, (&x, &y)| s + x * y)
}

/// `[m, k] · ([n, k] stored)ᵀ`.
fn transposed_rhs(m: usize, n: usize, k: usize) -> MatmulShape {
    MatmulShape {
        trans_rhs: true,
        ..MatmulShape::plain(m, n, k)
    }
}

/// `([k, m] stored)ᵀ · [k, n]`.
fn transposed_lhs(m: usize, n: usize, k: usize) -> MatmulShape {
    MatmulShape {
        trans_lhs: true,
        ..MatmulShape::plain(m, n, k)
    }
}

/// Softmax of one row of scores in place (a score of -inf is a key the query cannot see); returns the row's
/// log-sum-exp, -inf (with the row all zeros) when it sees no key.
fn softmax_row<T: Float>(row: &mut [T]) -> T {
    let max = row.iter().fold(T::LOWEST, |m, &s| m.max(s));
    if max == T::LOWEST {
        row.fill(T::ZERO);
        return T::LOWEST;
    }
    let mut sum = T::ZERO;
    for s in row.iter_mut() {
        *s = (*s - max).exp();
        sum = sum + *s;
    }
    let inv = T::ONE / sum;
    for s in row.iter_mut() {
        *s = *s * inv;
    }
    max + sum.ln()
}

/// One (sequence, head) group of a call.
struct Head<'a, T> {
    shape: &'a AttentionShape,
    seq: usize,
    head: usize,
    /// The sequence's row of the key-padding mask (`None`: every key is one).
    keys: Option<&'a [T]>,
}

impl<'a, T: Float> Head<'a, T> {
    fn new(shape: &'a AttentionShape, g: usize, mask: &'a [T]) -> Head<'a, T> {
        let (seq, head) = (g / shape.heads, g % shape.heads);
        let keys = (shape.mask_rows > 0).then(|| {
            let r = seq % shape.mask_rows;
            &mask[r * shape.len..(r + 1) * shape.len]
        });
        Head {
            shape,
            seq,
            head,
            keys,
        }
    }

    /// Rows of the query block at `i0`, and how many keys any of them can see.
    fn block(&self, i0: usize) -> (usize, usize) {
        let rows = BLOCK.min(self.shape.len - i0);
        let keys = if self.shape.causal {
            i0 + rows
        } else {
            self.shape.len
        };
        (rows, keys)
    }

    /// This head's `[L, d]` part `part` (0 query, 1 key, 2 value) of `qkv`, contiguous.
    fn gather(&self, qkv: &[T], part: usize) -> Vec<T> {
        let w = self.shape.width();
        self.gather_rows(&qkv[part * w..], 3 * w)
    }

    /// This head's `[L, d]` rows of a buffer whose positions are `stride` apart.
    fn gather_rows(&self, x: &[T], stride: usize) -> Vec<T> {
        let (l, d) = (self.shape.len, self.shape.head_dim);
        let base = self.seq * l * stride + self.head * d;
        (0..l)
            .flat_map(|i| &x[base + i * stride..base + i * stride + d])
            .copied()
            .collect()
    }

    /// Writes `[L, d]` rows into this head's place at column `offset` of a buffer whose positions are `stride`
    /// apart.
    ///
    /// # Safety
    /// The rows must lie inside the buffer, and no other task may write them.
    unsafe fn scatter(&self, dst: Disjoint<T>, stride: usize, offset: usize, rows: &[T]) {
        let (l, d) = (self.shape.len, self.shape.head_dim);
        let base = self.seq * l * stride + offset + self.head * d;
        for (i, row) in rows.chunks(d).enumerate() {
            // SAFETY: per the caller.
            unsafe { dst.slice(base + i * stride, d) }.copy_from_slice(row);
        }
    }

    /// `p = scale · Q[i0..i0+rows] · K[..keys]ᵀ`, with -inf where a query cannot see a key.
    fn scores(&self, p: &mut [T], q: &[T], k: &[T], i0: usize, rows: usize, keys: usize) {
        let d = self.shape.head_dim;
        matmul_on_this_thread(p, false, &q[i0 * d..], k, &transposed_rhs(rows, keys, d));
        let scale = T::from_f64(self.shape.scale);
        for (r, row) in p.chunks_mut(keys).enumerate() {
            let i = i0 + r;
            for (j, s) in row.iter_mut().enumerate() {
                let hidden =
                    (self.shape.causal && j > i) || self.keys.is_some_and(|m| m[j] == T::ZERO);
                *s = if hidden { T::LOWEST } else { *s * scale };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of one head written out plainly: every score, a softmax per row, the weighted values.
    fn plain(
        [q, k, v]: [&[f64]; 3],
        (l, d, scale): (usize, usize, f64),
        see: impl Fn(usize, usize) -> bool,
    ) -> Vec<f64> {
        let mut out = vec![0.0; l * d];
        for i in 0..l {
            let s: Vec<f64> = (0..l)
                .map(|j| {
                    if see(i, j) {
                        dot(&q[i * d..(i + 1) * d], &k[j * d..(j + 1) * d]) * scale
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for j in 0..l {
                for c in 0..d {
                    out[i * d + c] += e[j] / z * v[j * d + c];
                }
            }
        }
        out
    }

    fn values(n: usize, salt: u64) -> Vec<f64> {
        (0..n as u64)
            .map(|i| {
                ((i.wrapping_mul(2_654_435_761).wrapping_add(salt * 97) % 1000) as f64 / 500.0)
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_the_plain_formula_with_both_masks_across_blocks() {
        // Two sequences, two heads, 70 positions (two query blocks), a padding mask on the second sequence
        // that hides every key a causal query 0..3 could see.
        let (n, l, h, d) = (2, 70, 2, 5);
        let shape = AttentionShape {
            seqs: n,
            len: l,
            heads: h,
            head_dim: d,
            scale: 1.0 / (d as f64).sqrt(),
            causal: true,
            mask_rows: 2,
        };
        let qkv = values(shape.qkv_len(), 1);
        let mut mask = vec![1.0; 2 * l];
        for j in [0, 1, 2, 3, 40, 69] {
            mask[l + j] = 0.0;
        }
        let (out, lse) = forward(&qkv, &mask, &shape);
        let w = h * d;
        for s in 0..n {
            for hd in 0..h {
                let part = |p: usize| -> Vec<f64> {
                    (0..l)
                        .flat_map(|i| {
                            let b = s * l * 3 * w + i * 3 * w + p * w + hd * d;
                            qkv[b..b + d].to_vec()
                        })
                        .collect()
                };
                let (qs, ks, vs) = (part(0), part(1), part(2));
                let want = plain([&qs, &ks, &vs], (l, d, shape.scale), |i, j| {
                    j <= i && mask[s * l + j] != 0.0
                });
                for i in 0..l {
                    for c in 0..d {
                        let got = out[s * l * w + i * w + hd * d + c];
                        assert!(
                            (got - want[i * d + c]).abs() < 1e-12,
                            "seq {s} head {hd} row {i}: {got} vs {}",
                            want[i * d + c]
                        );
                    }
                }
                let blind = lse[(s * h + hd) * l..][..4]
                    .iter()
                    .all(|&x| x == f64::NEG_INFINITY);
                assert_eq!(blind, s == 1, "a query that sees no key has lse -inf");
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (n, l, h, d) = (1, 9, 2, 3);
        let shape = AttentionShape {
            seqs: n,
            len: l,
            heads: h,
            head_dim: d,
            scale: 0.5,
            causal: false,
            mask_rows: 1,
        };
        let qkv = values(shape.qkv_len(), 7);
        let mut mask = vec![1.0; l];
        mask[4] = 0.0;
        let dout = values(shape.out_len(), 3);
        let loss = |x: &[f64]| dot(&forward(x, &mask, &shape).0, &dout);
        let (out, lse) = forward(&qkv, &mask, &shape);
        let grad = backward(&qkv, &mask, (&out, &lse), &dout, &shape);
        for (e, &g) in grad.iter().enumerate() {
            let mut hi = qkv.clone();
            hi[e] += 1e-6;
            let mut lo = qkv.clone();
            lo[e] -= 1e-6;
            let fd = (loss(&hi) - loss(&lo)) / 2e-6;
            assert!(
                (fd - g).abs() < 1e-7,
                "element {e}: analytic {g}, numeric {fd}"
            );
        }
        // The padded key (position 4) gets no gradient as a key or value; it still does as a query.
        let w = h * d;
        assert!(
            grad[4 * 3 * w + w..4 * 3 * w + 3 * w]
                .iter()
                .all(|&g| g == 0.0)
        );
        assert!(grad[4 * 3 * w..4 * 3 * w + w].iter().any(|&g| g != 0.0));
    }
}
