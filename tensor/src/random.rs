//! Seeded host-side random numbers: the same seed gives the same tensor on every device.

/// SplitMix64: small, fast, and good enough for weight initialization and dropout masks.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// `n` values uniform in [lo, hi).
pub(crate) fn uniform(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut r = SplitMix64::new(seed);
    (0..n).map(|_| lo + (hi - lo) * r.next_f64()).collect()
}

/// `n` values from N(mean, std²), Box-Muller.
pub(crate) fn normal(n: usize, mean: f64, std: f64, seed: u64) -> Vec<f64> {
    let mut r = SplitMix64::new(seed);
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1 = 1.0 - r.next_f64(); // (0, 1]: ln is finite
        let u2 = r.next_f64();
        let rad = (-2.0 * u1.ln()).sqrt();
        let th = std::f64::consts::TAU * u2;
        out.push(mean + std * rad * th.cos());
        out.push(mean + std * rad * th.sin());
    }
    out.truncate(n);
    out
}
