//! CPU unary ops.

use rayon::prelude::*;

use super::UnaryOp;
use crate::{Float, PAR_CHUNK, PAR_THRESHOLD};

macro_rules! with_op {
    ($op:expr, |$f:ident| $body:expr) => {{
        let half = T::from_f64(0.5);
        let one = T::ONE;
        match $op {
            UnaryOp::Neg => {
                let $f = |x: T| -x;
                $body
            }
            UnaryOp::Relu => {
                let $f = |x: T| if x > T::ZERO { x } else { T::ZERO };
                $body
            }
            UnaryOp::Gelu => {
                let c = T::from_f64((2.0 / std::f64::consts::PI).sqrt());
                let a = T::from_f64(0.044715);
                let $f = move |x: T| half * x * (one + (c * (x + a * x * x * x)).tanh());
                $body
            }
            UnaryOp::Tanh => {
                let $f = |x: T| x.tanh();
                $body
            }
            UnaryOp::Sigmoid => {
                let $f = move |x: T| one / (one + (-x).exp());
                $body
            }
            UnaryOp::Exp => {
                let $f = |x: T| x.exp();
                $body
            }
            UnaryOp::Log => {
                let $f = |x: T| x.ln();
                $body
            }
            UnaryOp::Sqrt => {
                let $f = |x: T| x.sqrt();
                $body
            }
            UnaryOp::Abs => {
                let $f = |x: T| x.abs();
                $body
            }
            UnaryOp::Square => {
                let $f = |x: T| x * x;
                $body
            }
            UnaryOp::AddScalar(c) => {
                let c = T::from_f64(c);
                let $f = move |x: T| x + c;
                $body
            }
            UnaryOp::MulScalar(c) => {
                let c = T::from_f64(c);
                let $f = move |x: T| x * c;
                $body
            }
            UnaryOp::Powf(c) => {
                let cf = T::from_f64(c);
                if c == 2.0 {
                    let $f = |x: T| x * x;
                    $body
                } else {
                    let $f = move |x: T| x.powf(cf);
                    $body
                }
            }
            UnaryOp::GtScalar(c) => {
                let c = T::from_f64(c);
                let $f = move |x: T| if x > c { one } else { T::ZERO };
                $body
            }
            UnaryOp::LtScalar(c) => {
                let c = T::from_f64(c);
                let $f = move |x: T| if x < c { one } else { T::ZERO };
                $body
            }
        }
    }};
}

/// `op(x)` for every element, into a new buffer.
pub fn unary<T: Float>(op: UnaryOp, x: &[T]) -> Vec<T> {
    with_op!(op, |f| map(x, f))
}

/// `x = op(x)` for every element.
pub fn unary_inplace<T: Float>(op: UnaryOp, x: &mut [T]) {
    with_op!(op, |f| map_inplace(x, f))
}

fn map<T: Float, F: Fn(T) -> T + Sync + Send>(x: &[T], f: F) -> Vec<T> {
    if x.len() < PAR_THRESHOLD {
        x.iter().map(|&v| f(v)).collect()
    } else {
        let mut out = Vec::with_capacity(x.len());
        x.par_iter()
            .with_min_len(PAR_CHUNK)
            .map(|&v| f(v))
            .collect_into_vec(&mut out);
        out
    }
}

fn map_inplace<T: Float, F: Fn(T) -> T + Sync + Send>(x: &mut [T], f: F) {
    if x.len() < PAR_THRESHOLD {
        x.iter_mut().for_each(|v| *v = f(*v));
    } else {
        x.par_chunks_mut(PAR_CHUNK)
            .for_each(|c| c.iter_mut().for_each(|v| *v = f(*v)));
    }
}

/// `x + b`, then a ReLU when `relu`, with `b` `[groups, cols]` broadcast over `group`-element blocks of `x`
/// (`[groups, rows, cols]`, `group = rows · cols`): element `i` takes `b[(i / group) · cols + i % cols]`.
pub fn bias_act<T: Float>(x: &[T], b: &[T], cols: usize, group: usize, relu: bool) -> Vec<T> {
    let mut y = x.to_vec();
    let row = |(k, r): (usize, &mut [T])| {
        let bias = &b[(k * cols / group) * cols..][..cols];
        for (v, &bv) in r.iter_mut().zip(bias) {
            let s = *v + bv;
            *v = if !relu || s > T::ZERO { s } else { T::ZERO };
        }
    };
    if x.len() < PAR_THRESHOLD {
        y.chunks_mut(cols).enumerate().for_each(row);
    } else {
        y.par_chunks_mut(cols).enumerate().for_each(row);
    }
    y
}

/// ReLU's backward from its output: `y > 0 ? dy : 0`.
pub fn relu_backward<T: Float>(dy: &[T], y: &[T]) -> Vec<T> {
    let f = |(&g, &v): (&T, &T)| if v > T::ZERO { g } else { T::ZERO };
    if dy.len() < PAR_THRESHOLD {
        dy.iter().zip(y).map(f).collect()
    } else {
        let mut out = Vec::with_capacity(dy.len());
        dy.par_iter()
            .zip(y.par_iter())
            .with_min_len(PAR_CHUNK)
            .map(f)
            .collect_into_vec(&mut out);
        out
    }
}

/// GELU's (tanh form) backward from its input `x`: `dy · gelu'(x)`.
pub fn gelu_backward<T: Float>(dy: &[T], x: &[T]) -> Vec<T> {
    let f = |(&g, &v): (&T, &T)| T::from_f64(g.to_f64() * gelu_derivative(v.to_f64()));
    if dy.len() < PAR_THRESHOLD {
        dy.iter().zip(x).map(f).collect()
    } else {
        let mut out = Vec::with_capacity(dy.len());
        dy.par_iter()
            .zip(x.par_iter())
            .with_min_len(PAR_CHUNK)
            .map(f)
            .collect_into_vec(&mut out);
        out
    }
}

/// d/dx of GELU's tanh form, 0.5 x (1 + tanh(u)) with u = c (x + k x^3).
fn gelu_derivative(x: f64) -> f64 {
    let (c, k) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    let t = (c * (x + k * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_backward_is_the_derivative_of_gelu() {
        let x: Vec<f64> = (-40..=40).map(|i| f64::from(i) * 0.1 + 0.013).collect();
        let dy: Vec<f64> = x.iter().map(|v| 1.0 - 0.3 * v).collect();
        let got = gelu_backward(&dy, &x);
        let h = 1e-5;
        for ((&v, &g), &d) in x.iter().zip(&dy).zip(&got) {
            let f = |t: f64| UnaryOp::Gelu.apply_f64(t);
            let want = g * (f(v + h) - f(v - h)) / (2.0 * h);
            assert!(
                (d - want).abs() <= 1e-8 * (1.0 + want.abs()),
                "x {v}: {d} vs {want}"
            );
        }
    }
}
