//! Seeded synthetic data, for tests and benchmarks that must not depend on files: Gaussian class blobs and a
//! linear regression problem. The same seed gives the same data.

use crate::array::Array;
use crate::error::Result;
use crate::rng::Rng;

/// `n` examples of `features` dimensions in `classes` classes: class `c` is a unit Gaussian around a random centre
/// (coordinates uniform in `[-spread, spread]`). Returns features `f32 [n, features]` and labels `i32 [n]` (classes
/// in turn, so balanced).
///
/// # Errors
/// Never for valid sizes; an error only if `n * features` overflows memory limits of `Array`.
pub fn classification(
    n: usize,
    features: usize,
    classes: usize,
    spread: f64,
    seed: u64,
) -> Result<(Array, Array)> {
    let mut rng = Rng::new(seed);
    let classes = classes.max(1);
    let centres = draw_centres(&mut rng, classes * features, spread);
    let mut x = Vec::with_capacity(n * features);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let c = i % classes;
        y.push(c as i32);
        for f in 0..features {
            x.push((centres[c * features + f] + rng.normal()) as f32);
        }
    }
    Ok((
        Array::from_f32(x, &[n, features])?,
        Array::from_i32(y, &[n])?,
    ))
}

fn draw_centres(rng: &mut Rng, n: usize, spread: f64) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.uniform() * 2.0 - 1.0) * spread)
        .collect()
}

/// The class blobs of [`classification`], generated one example at a time: the centres are drawn from `seed` as
/// there, and example `i`'s noise from its own generator, so any example is made on demand, from any thread, and
/// always the same.
#[derive(Clone, Debug, PartialEq)]
pub struct Blobs {
    features: usize,
    classes: usize,
    centres: Vec<f64>,
    seed: u64,
}

impl Blobs {
    /// Blobs of `features` dimensions around `classes` (at least 1) centres uniform in `[-spread, spread]`.
    pub fn new(features: usize, classes: usize, spread: f64, seed: u64) -> Self {
        let classes = classes.max(1);
        let centres = draw_centres(&mut Rng::new(seed), classes * features, spread);
        Blobs {
            features,
            classes,
            centres,
            seed,
        }
    }

    /// Example `i`: its features and its class, `i % classes` (so every class has its share).
    pub fn example(&self, i: u64) -> (Vec<f32>, i32) {
        let c = (i % self.classes as u64) as usize;
        let mut rng = Rng::new(crate::rng::mix(self.seed, i));
        let centre = &self.centres[c * self.features..(c + 1) * self.features];
        let x = centre.iter().map(|m| (m + rng.normal()) as f32).collect();
        (x, c as i32)
    }
}

/// `n` examples of `y = x . w + b + noise * N(0, 1)` with `x` uniform in `[-1, 1]^features` and random `w`, `b`.
/// Returns `x f32 [n, features]`, `y f32 [n, 1]` and the true `(w, b)`.
///
/// # Errors
/// As [`classification`].
pub fn regression(
    n: usize,
    features: usize,
    noise: f64,
    seed: u64,
) -> Result<(Array, Array, Vec<f64>, f64)> {
    let mut rng = Rng::new(seed);
    let w: Vec<f64> = (0..features).map(|_| rng.normal()).collect();
    let b = rng.normal();
    let mut x = Vec::with_capacity(n * features);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let mut acc = b;
        for wf in &w {
            let v = rng.uniform() * 2.0 - 1.0;
            acc += wf * v;
            x.push(v as f32);
        }
        y.push((acc + noise * rng.normal()) as f32);
    }
    Ok((
        Array::from_f32(x, &[n, features])?,
        Array::from_f32(y, &[n, 1])?,
        w,
        b,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_shaped() {
        let (x, y) = classification(100, 4, 3, 5.0, 1).unwrap();
        let (x2, _) = classification(100, 4, 3, 5.0, 1).unwrap();
        let (x3, _) = classification(100, 4, 3, 5.0, 2).unwrap();
        assert_eq!(x.shape(), &[100, 4]);
        assert_eq!(x, x2);
        assert_ne!(x, x3);
        assert_eq!(y.as_i32().unwrap().iter().filter(|&&c| c == 2).count(), 33);
        let (x, y, w, b) = regression(50, 3, 0.0, 4).unwrap();
        let (xs, ys) = (x.as_f32().unwrap(), y.as_f32().unwrap());
        let pred = b + (0..3).map(|f| w[f] * f64::from(xs[f])).sum::<f64>();
        assert!((pred - f64::from(ys[0])).abs() < 1e-5);
    }
}
