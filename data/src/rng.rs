//! The pipeline's random numbers: a small, fast, serializable generator (PCG-XSH-RR 64/32) and the seed mixing
//! that derives every random stage's stream from its own seed and the epoch, so that the same seed and epoch always
//! give the same order.

/// Mix two 64-bit values into a well-spread seed (SplitMix64's finaliser over their combination).
pub fn mix(a: u64, b: u64) -> u64 {
    splitmix64(a ^ splitmix64(b.wrapping_add(0x9E37_79B9_7F4A_7C15)))
}

/// One step of SplitMix64 as a hash of `x`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A PCG-XSH-RR generator: 64 bits of state, 32-bit outputs, serializable so its state can be saved.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rng {
    state: u64,
    inc: u64,
}

impl Rng {
    const MUL: u64 = 6_364_136_223_846_793_005;

    /// A generator for `seed`; different seeds give independent-looking streams.
    pub fn new(seed: u64) -> Self {
        let mut r = Rng {
            state: 0,
            inc: (splitmix64(seed ^ 0xDA3E_39CB_94B9_5BDB) << 1) | 1,
        };
        r.next_u32();
        r.state = r.state.wrapping_add(splitmix64(seed));
        r.next_u32();
        r
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(Self::MUL).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        (u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())
    }

    /// A uniform integer in `0..n` without modulo bias (Lemire's method); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// A uniform float in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffle a slice in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seed_dependent() {
        let a: Vec<u32> = (0..8)
            .scan(Rng::new(1), |r, _| Some(r.next_u32()))
            .collect();
        let b: Vec<u32> = (0..8)
            .scan(Rng::new(1), |r, _| Some(r.next_u32()))
            .collect();
        let c: Vec<u32> = (0..8)
            .scan(Rng::new(2), |r, _| Some(r.next_u32()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(3);
        let xs: Vec<f64> = (0..50_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
    }

    #[test]
    fn state_round_trips_through_serde() {
        let mut r = Rng::new(11);
        r.next_u64();
        let json = serde_json::to_string(&r).unwrap();
        let mut s: Rng = serde_json::from_str(&json).unwrap();
        assert_eq!(r.next_u64(), s.next_u64());
    }
}
