//! CPU batch normalization: a rayon task per channel for the sums, per row of `inner` elements for the
//! element-wise passes; every sum in f64, in one order, so the bits do not depend on the thread count.

use rayon::prelude::*;

use super::{BatchNormShape, Running, moments, updated};
use crate::Float;

/// Folds `f(offset)` over channel `ch`'s elements, run by run.
fn fold_channel<A>(s: &BatchNormShape, ch: usize, init: A, mut f: impl FnMut(A, usize) -> A) -> A {
    let mut acc = init;
    for run in 0..s.outer * s.rows {
        let base = s.offset(ch, run * s.inner);
        for o in base..base + s.inner {
            acc = f(acc, o);
        }
    }
    acc
}

fn check<T>(s: &BatchNormShape, x: &[T], per_channel: &[&[T]]) {
    assert_eq!(
        x.len(),
        s.len(),
        "batch norm input of {} for {s:?}",
        x.len()
    );
    assert!(
        s.per_channel() > 0,
        "batch norm over no element per channel: {s:?}"
    );
    for v in per_channel {
        assert_eq!(v.len(), s.stat_len(), "batch norm statistics for {s:?}");
    }
}

/// The forward pass in training: `(out, mean, invstd)`, where `out = (x - mean) · invstd · gamma + beta` per
/// channel (rectified when `relu`), `mean` the batch's and `invstd = 1 / √(var + eps)`; `running`, when given,
/// moves towards the batch's statistics.
///
/// # Panics
/// When a buffer's length is not what `s` says, or a channel has no element; callers validate shapes first.
pub fn forward<T: Float>(
    x: &[T],
    (gamma, beta): (&[T], &[T]),
    (s, eps): (&BatchNormShape, f64),
    relu: bool,
    running: Option<Running<'_, T>>,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    check(s, x, &[gamma, beta]);
    let n = s.per_channel() as f64;
    let stats: Vec<(f64, f64)> = (0..s.stat_len())
        .into_par_iter()
        .map(|ch| {
            let k = x[s.offset(ch, 0)].to_f64();
            let (s1, s2) = fold_channel(s, ch, (0.0, 0.0), |(s1, s2), o| {
                let d = x[o].to_f64() - k;
                (s1 + d, s2 + d * d)
            });
            moments(n, k, s1, s2)
        })
        .collect();
    let mean: Vec<T> = stats.iter().map(|&(m, _)| T::from_f64(m)).collect();
    let invstd: Vec<T> = stats
        .iter()
        .map(|&(_, v)| T::from_f64(1.0 / (v + eps).sqrt()))
        .collect();
    if let Some(r) = running {
        for (ch, &batch) in stats.iter().enumerate() {
            let (m, v) = updated(
                (r.mean[ch].to_f64(), r.var[ch].to_f64()),
                batch,
                n,
                r.momentum,
            );
            r.mean[ch] = T::from_f64(m);
            r.var[ch] = T::from_f64(v);
        }
    }
    let mut out = vec![T::ZERO; x.len()];
    out.par_chunks_mut(s.inner)
        .zip(x.par_chunks(s.inner))
        .enumerate()
        .for_each(|(row, (y, x))| {
            let ch = s.channel_of_row(row);
            let (m, a, b) = (mean[ch], invstd[ch] * gamma[ch], beta[ch]);
            for (y, &x) in y.iter_mut().zip(x) {
                let v = (x - m) * a + b;
                *y = if relu && v < T::ZERO { T::ZERO } else { v };
            }
        });
    (out, mean, invstd)
}

/// The backward pass: `(dx, dgamma, dbeta)` given the forward's input `x`, its `mean` and `invstd`, and the
/// output's gradient `dout`; `out` is the forward's output when it was rectified (its gradient passes where it is
/// positive), `None` when it was not.
///
/// # Panics
/// As [`forward`].
pub fn backward<T: Float>(
    x: &[T],
    out: Option<&[T]>,
    dout: &[T],
    (mean, invstd, gamma): (&[T], &[T], &[T]),
    s: &BatchNormShape,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    check(s, x, &[mean, invstd, gamma]);
    assert_eq!(dout.len(), x.len());
    assert!(out.is_none_or(|y| y.len() == x.len()));
    let passes = |o: usize| out.is_none_or(|y| y[o] > T::ZERO);
    let sums: Vec<(f64, f64)> = (0..s.stat_len())
        .into_par_iter()
        .map(|ch| {
            let m = mean[ch].to_f64();
            fold_channel(s, ch, (0.0, 0.0), |(sd, sdx), o| {
                if passes(o) {
                    let d = dout[o].to_f64();
                    (sd + d, sdx + d * (x[o].to_f64() - m))
                } else {
                    (sd, sdx)
                }
            })
        })
        .collect();
    let dbeta: Vec<T> = sums.iter().map(|&(sd, _)| T::from_f64(sd)).collect();
    let dgamma: Vec<T> = sums
        .iter()
        .zip(invstd)
        .map(|(&(_, sdx), &is)| T::from_f64(sdx * is.to_f64()))
        .collect();
    let n = T::from_f64(s.per_channel() as f64);
    let mut dx = vec![T::ZERO; x.len()];
    dx.par_chunks_mut(s.inner)
        .enumerate()
        .for_each(|(row, dx)| {
            let ch = s.channel_of_row(row);
            let (m, is) = (mean[ch], invstd[ch]);
            let (a, db, dg) = (gamma[ch] * is, dbeta[ch] / n, dgamma[ch] / n);
            let base = row * s.inner;
            for (q, dx) in dx.iter_mut().enumerate() {
                let o = base + q;
                let d = if passes(o) { dout[o] } else { T::ZERO };
                *dx = a * (d - db - (x[o] - m) * is * dg);
            }
        });
    (dx, dgamma, dbeta)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed images [B=3, M=2, 1, C=2, HW=4] of values far from zero.
    fn shape() -> BatchNormShape {
        BatchNormShape {
            outer: 3,
            members: 2,
            rows: 1,
            channels: 2,
            inner: 4,
        }
    }

    fn input(s: &BatchNormShape) -> Vec<f64> {
        (0..s.len())
            .map(|i| 50.0 + ((i * 37) % 11) as f64 * 0.5 - (i % 3) as f64)
            .collect()
    }

    /// Channel `ch`'s elements.
    fn channel(s: &BatchNormShape, v: &[f64], ch: usize) -> Vec<f64> {
        (0..s.per_channel()).map(|e| v[s.offset(ch, e)]).collect()
    }

    #[test]
    fn each_channel_comes_out_with_zero_mean_unit_variance_then_scaled_and_the_running_stats_move()
    {
        let s = shape();
        let x = input(&s);
        let gamma = [1.0, 2.0, 0.5, 1.0];
        let beta = [0.0, 1.0, -1.0, 3.0];
        let (mut rm, mut rv) = (vec![0.0; 4], vec![1.0; 4]);
        let running = Running {
            mean: &mut rm,
            var: &mut rv,
            momentum: 0.1,
        };
        let (y, mean, invstd) = forward(&x, (&gamma, &beta), (&s, 1e-5), false, Some(running));
        for ch in 0..4 {
            let xs = channel(&s, &x, ch);
            let n = xs.len() as f64;
            let m = xs.iter().sum::<f64>() / n;
            let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
            assert!((mean[ch] - m).abs() < 1e-12);
            assert!((invstd[ch] - 1.0 / (v + 1e-5).sqrt()).abs() < 1e-9);
            let ys = channel(&s, &y, ch);
            let ym = ys.iter().sum::<f64>() / n;
            let yv = ys.iter().map(|y| (y - ym).powi(2)).sum::<f64>() / n;
            assert!((ym - beta[ch]).abs() < 1e-9, "channel {ch}: mean {ym}");
            assert!((yv.sqrt() - gamma[ch] * (v / (v + 1e-5)).sqrt()).abs() < 1e-9);
            assert!((rm[ch] - 0.1 * m).abs() < 1e-12);
            assert!((rv[ch] - (0.9 + 0.1 * v * n / (n - 1.0))).abs() < 1e-12);
        }
        let (r, ..) = forward(&x, (&gamma, &beta), (&s, 1e-5), true, None);
        assert!(r.iter().zip(&y).all(|(r, y)| *r == y.max(0.0)));
    }

    /// A loss `Σ w·y` and its gradient by central differences against the backward pass, plain and rectified.
    #[test]
    fn the_backward_pass_matches_central_differences() {
        let s = shape();
        let x = input(&s);
        let gamma = [1.0, 2.0, 0.5, 1.5];
        let beta = [0.0, 0.3, -0.2, 0.1];
        let w: Vec<f64> = (0..s.len()).map(|i| ((i * 13) % 7) as f64 - 3.0).collect();
        for relu in [false, true] {
            let loss = |x: &[f64], g: &[f64], b: &[f64]| -> f64 {
                let (y, ..) = forward(x, (g, b), (&s, 1e-5), relu, None);
                y.iter().zip(&w).map(|(y, w)| y * w).sum()
            };
            let (y, mean, invstd) = forward(&x, (&gamma, &beta), (&s, 1e-5), relu, None);
            let out = relu.then_some(&y[..]);
            let (dx, dg, db) = backward(&x, out, &w, (&mean, &invstd, &gamma), &s);
            let h = 1e-5;
            let diff = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
            for i in [0, 5, 17, 30, 47] {
                let num = diff(&|d| {
                    let mut x = x.clone();
                    x[i] += d;
                    loss(&x, &gamma, &beta)
                });
                assert!(
                    (num - dx[i]).abs() < 1e-5,
                    "relu {relu}: dx[{i}] {} vs {num}",
                    dx[i]
                );
            }
            for ch in 0..4 {
                let ng = diff(&|d| {
                    let mut g = gamma;
                    g[ch] += d;
                    loss(&x, &g, &beta)
                });
                let nb = diff(&|d| {
                    let mut b = beta;
                    b[ch] += d;
                    loss(&x, &gamma, &b)
                });
                assert!(
                    (ng - dg[ch]).abs() < 1e-5,
                    "relu {relu}: dgamma[{ch}] {} vs {ng}",
                    dg[ch]
                );
                assert!(
                    (nb - db[ch]).abs() < 1e-5,
                    "relu {relu}: dbeta[{ch}] {} vs {nb}",
                    db[ch]
                );
            }
        }
    }
}
