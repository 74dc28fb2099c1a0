//! CPU layer normalization: a rayon task per row for the statistics, the output and the input's gradient; the
//! parameters' gradients summed over fixed blocks of rows, then over the blocks in order, in f64, so the bits
//! do not depend on the thread count.

use rayon::prelude::*;

use super::LayerNormShape;
use crate::Float;

/// Rows a block of the parameters' gradient sums.
const BLOCK_ROWS: usize = 64;

fn check<T>(s: &LayerNormShape, x: &[T], params: &[&[T]], stats: &[&[T]]) {
    assert_eq!(
        x.len(),
        s.len(),
        "layer norm input of {} for {s:?}",
        x.len()
    );
    assert!(s.dim > 0, "layer norm over rows of no element: {s:?}");
    for v in params {
        assert_eq!(v.len(), s.param_len(), "layer norm parameters for {s:?}");
    }
    for v in stats {
        assert_eq!(v.len(), s.stat_len(), "layer norm statistics for {s:?}");
    }
}

/// The forward pass: `(out, mean, invstd)`, where `out = (x - mean) · invstd · weight + bias` per row, `mean`
/// the row's and `invstd = 1 / √(var + eps)` of its biased variance.
///
/// # Panics
/// When a buffer's length is not what `s` says, or rows are empty; callers validate shapes first.
pub fn forward<T: Float>(
    x: &[T],
    (weight, bias): (&[T], &[T]),
    (s, eps): (&LayerNormShape, f64),
) -> (Vec<T>, Vec<T>, Vec<T>) {
    check(s, x, &[weight, bias], &[]);
    let d = s.dim;
    let mut out = vec![T::ZERO; x.len()];
    let (mut mean, mut invstd) = (vec![T::ZERO; s.stat_len()], vec![T::ZERO; s.stat_len()]);
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .zip(mean.par_iter_mut().zip(invstd.par_iter_mut()))
        .enumerate()
        .for_each(|(row, ((y, x), (m, i)))| {
            let g = row / s.rows;
            let (w, b) = (&weight[g * d..][..d], &bias[g * d..][..d]);
            let mu = x.iter().map(|v| v.to_f64()).sum::<f64>() / d as f64;
            let var = x.iter().map(|v| (v.to_f64() - mu).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                *y = T::from_f64((x.to_f64() - mu) * inv * w.to_f64() + b.to_f64());
            }
            (*m, *i) = (T::from_f64(mu), T::from_f64(inv));
        });
    (out, mean, invstd)
}

/// The backward pass: `(dx, dweight, dbias)` given the forward's input `x`, the output's gradient `dout`, the
/// forward's `mean` and `invstd`, and `weight`:
/// `dx = invstd · (g - mean(g) - x̂ · mean(g · x̂))` per row with `g = dout · weight` and `x̂` the normalized
/// input; `dweight = Σ_rows dout · x̂`, `dbias = Σ_rows dout` per member.
///
/// # Panics
/// As [`forward`].
pub fn backward<T: Float>(
    x: &[T],
    dout: &[T],
    (mean, invstd, weight): (&[T], &[T], &[T]),
    s: &LayerNormShape,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    check(s, x, &[weight], &[mean, invstd]);
    assert_eq!(dout.len(), x.len(), "layer norm gradient for {s:?}");
    let d = s.dim;
    let xhat = |row: usize, c: usize| {
        (x[row * d + c].to_f64() - mean[row].to_f64()) * invstd[row].to_f64()
    };
    let mut dx = vec![T::ZERO; x.len()];
    dx.par_chunks_mut(d).enumerate().for_each(|(row, dx)| {
        let w = &weight[(row / s.rows) * d..][..d];
        let dy = &dout[row * d..][..d];
        let (mut sg, mut sgx) = (0.0, 0.0);
        for c in 0..d {
            let g = dy[c].to_f64() * w[c].to_f64();
            sg += g;
            sgx += g * xhat(row, c);
        }
        let (mg, mgx, inv) = (sg / d as f64, sgx / d as f64, invstd[row].to_f64());
        for (c, dx) in dx.iter_mut().enumerate() {
            let g = dy[c].to_f64() * w[c].to_f64();
            *dx = T::from_f64(inv * (g - mg - xhat(row, c) * mgx));
        }
    });
    // Per member, partial sums over blocks of BLOCK_ROWS rows, then the blocks in order.
    let blocks = s.rows.div_ceil(BLOCK_ROWS).max(1);
    let partial: Vec<Vec<(f64, f64)>> = (0..s.members * blocks)
        .into_par_iter()
        .map(|mb| {
            let (g, blk) = (mb / blocks, mb % blocks);
            let mut acc = vec![(0.0, 0.0); d];
            for r in blk * BLOCK_ROWS..((blk + 1) * BLOCK_ROWS).min(s.rows) {
                let row = g * s.rows + r;
                for (c, a) in acc.iter_mut().enumerate() {
                    let dy = dout[row * d + c].to_f64();
                    a.0 += dy * xhat(row, c);
                    a.1 += dy;
                }
            }
            acc
        })
        .collect();
    let (mut dw, mut db) = (vec![T::ZERO; s.param_len()], vec![T::ZERO; s.param_len()]);
    for g in 0..s.members {
        for c in 0..d {
            let (w, b) = partial[g * blocks..][..blocks]
                .iter()
                .fold((0.0, 0.0), |(w, b), p| (w + p[c].0, b + p[c].1));
            dw[g * d + c] = T::from_f64(w);
            db[g * d + c] = T::from_f64(b);
        }
    }
    (dx, dw, db)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LayerNormShape {
        LayerNormShape {
            members: 2,
            rows: 70,
            dim: 9,
        }
    }

    fn data(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| 5.0 + ((i * 7919 + seed * 131) % 1013) as f64 / 1013.0 * 3.0 - (i % 4) as f64)
            .collect()
    }

    #[test]
    fn rows_come_out_with_zero_mean_and_unit_variance_before_the_affine() {
        let s = shape();
        let x = data(s.len(), 1);
        let (w, b) = (vec![1.0; s.param_len()], vec![0.0; s.param_len()]);
        let (y, mean, invstd) = forward(&x, (&w, &b), (&s, 0.0));
        for (row, y) in y.chunks(s.dim).enumerate() {
            let m = y.iter().sum::<f64>() / s.dim as f64;
            let v = y.iter().map(|v| v * v).sum::<f64>() / s.dim as f64;
            assert!(
                m.abs() < 1e-12 && (v - 1.0).abs() < 1e-9,
                "row {row}: mean {m}, var {v}"
            );
            let xr = &x[row * s.dim..][..s.dim];
            let mu = xr.iter().sum::<f64>() / s.dim as f64;
            assert!((mean[row] - mu).abs() < 1e-12);
            assert!((invstd[row] * (xr[0] - mu) - y[0]).abs() < 1e-12);
        }
    }

    /// The analytic gradients against central differences of `Σ out · r` for a fixed `r`.
    #[test]
    fn the_backward_pass_matches_central_differences() {
        let s = shape();
        let eps = 1e-5;
        let x = data(s.len(), 2);
        let w: Vec<f64> = (0..s.param_len()).map(|i| 0.5 + i as f64 * 0.05).collect();
        let b: Vec<f64> = (0..s.param_len()).map(|i| i as f64 * 0.1 - 0.4).collect();
        let r = data(s.len(), 3);
        let loss = |x: &[f64], w: &[f64], b: &[f64]| {
            let (y, _, _) = forward(x, (w, b), (&s, eps));
            y.iter().zip(&r).map(|(y, r)| y * r).sum::<f64>()
        };
        let (_, mean, invstd) = forward(&x, (&w, &b), (&s, eps));
        let (dx, dw, db) = backward(&x, &r, (&mean, &invstd, &w), &s);
        let h = 1e-6;
        let num = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
        for i in [0, 17, 200, s.len() - 1] {
            let n = num(&|e| {
                let mut x = x.clone();
                x[i] += e;
                loss(&x, &w, &b)
            });
            assert!(
                (n - dx[i]).abs() < 1e-5 * (1.0 + n.abs()),
                "dx[{i}]: {} vs {n}",
                dx[i]
            );
        }
        for i in [0, 5, s.param_len() - 1] {
            let nw = num(&|e| {
                let mut w = w.clone();
                w[i] += e;
                loss(&x, &w, &b)
            });
            let nb = num(&|e| {
                let mut b = b.clone();
                b[i] += e;
                loss(&x, &w, &b)
            });
            assert!(
                (nw - dw[i]).abs() < 1e-5 * (1.0 + nw.abs()),
                "dw[{i}]: {} vs {nw}",
                dw[i]
            );
            assert!(
                (nb - db[i]).abs() < 1e-5 * (1.0 + nb.abs()),
                "db[{i}]: {} vs {nb}",
                db[i]
            );
        }
    }
}
