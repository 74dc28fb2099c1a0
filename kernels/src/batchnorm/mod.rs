//! Batch normalization in training, fused: each channel's statistics in one pass over the input, the normalized
//! (and optionally rectified) output in one more, and in the backward pass the two sums per channel it needs in
//! one pass and the input's gradient in one more, where a composition of element-wise ops and reductions takes
//! some forty passes over the activations.
//!
//! Layout: the input is `[outer, members, rows, channels, inner]`, row-major; channel `(g, c)` of
//! `members × channels` gathers every element with that member and channel index, `outer · rows · inner` of them.
//! Images packed by member, `[B, M·C, H, W]`, are `[B, M, 1, C, H·W]`; features per member `[M, B, C]` are
//! `[1, M, B, C, 1]`.
//!
//! The statistics are the batch's mean and biased variance (PyTorch's), summed from each channel's first element
//! as a shift so that a mean far from zero costs no precision. The running statistics move towards the batch's,
//! the variance unbiased: `running = (1 - momentum) · running + momentum · batch`.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The geometry of one batch normalization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormShape {
    /// Leading dimension reduced over (the batch of packed images; 1 for features per member).
    pub outer: usize,
    /// Members (1 for one model).
    pub members: usize,
    /// Dimension between the member and the channel reduced over (the batch of features per member).
    pub rows: usize,
    /// Channels per member.
    pub channels: usize,
    /// Trailing dimension reduced over (an image's pixels; 1 for features).
    pub inner: usize,
}

impl BatchNormShape {
    /// Elements of the input (and the output, and their gradients).
    pub fn len(&self) -> usize {
        self.outer * self.members * self.rows * self.channels * self.inner
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Statistics (and weights, biases): one per member and channel.
    pub fn stat_len(&self) -> usize {
        self.members * self.channels
    }

    /// Elements each channel's statistics are taken over.
    pub fn per_channel(&self) -> usize {
        self.outer * self.rows * self.inner
    }

    /// The channel (`member · channels + channel`) of row `row` of the input seen as `[.., inner]`.
    pub(crate) fn channel_of_row(&self, row: usize) -> usize {
        let c = row % self.channels;
        let g = (row / (self.rows * self.channels)) % self.members;
        g * self.channels + c
    }

    /// The offset of element `e` (in `0..per_channel()`) of channel `ch`.
    pub(crate) fn offset(&self, ch: usize, e: usize) -> usize {
        let (g, c) = (ch / self.channels, ch % self.channels);
        let (pr, q) = (e / self.inner, e % self.inner);
        let (p, r) = (pr / self.rows, pr % self.rows);
        (((p * self.members + g) * self.rows + r) * self.channels + c) * self.inner + q
    }
}

/// Where the running statistics are and how fast they move.
#[derive(Debug)]
pub struct Running<'a, T> {
    /// The running mean per channel, updated in place.
    pub mean: &'a mut [T],
    /// The running (unbiased) variance per channel, updated in place.
    pub var: &'a mut [T],
    /// The weight of this batch's statistics.
    pub momentum: f64,
}

/// A channel's batch statistics from its count `n`, shift `k` (its first element), and the sums of the shifted
/// values and their squares: `(mean, biased variance)`.
pub(crate) fn moments(n: f64, k: f64, s1: f64, s2: f64) -> (f64, f64) {
    let m = s1 / n;
    (k + m, (s2 / n - m * m).max(0.0))
}

/// `running` moved towards a batch's mean and biased variance over `n` elements.
pub(crate) fn updated(
    running: (f64, f64),
    (mean, var): (f64, f64),
    n: f64,
    momentum: f64,
) -> (f64, f64) {
    let unbiased = if n > 1.0 { var * n / (n - 1.0) } else { var };
    (
        (1.0 - momentum) * running.0 + momentum * mean,
        (1.0 - momentum) * running.1 + momentum * unbiased,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_walk_each_channel_of_packed_images_and_of_features_per_member() {
        // Packed images [B=2, M=2, 1, C=3, HW=2]: channel (1, 2) is at member 1, channel 2 of each image.
        let s = BatchNormShape {
            outer: 2,
            members: 2,
            rows: 1,
            channels: 3,
            inner: 2,
        };
        let ch = 3 + 2;
        let all: Vec<usize> = (0..s.per_channel()).map(|e| s.offset(ch, e)).collect();
        assert_eq!(all, vec![10, 11, 22, 23]);
        for o in all {
            assert_eq!(s.channel_of_row(o / s.inner), ch);
        }
        // Features per member [M=2, B=3, C=2]: channel (1, 0) is member 1's column 0.
        let f = BatchNormShape {
            outer: 1,
            members: 2,
            rows: 3,
            channels: 2,
            inner: 1,
        };
        let all: Vec<usize> = (0..f.per_channel()).map(|e| f.offset(2, e)).collect();
        assert_eq!(all, vec![6, 8, 10]);
        assert!(all.iter().all(|&o| f.channel_of_row(o) == 2));
    }

    #[test]
    fn shifted_moments_keep_the_variance_of_values_far_from_zero() {
        let xs: Vec<f64> = (0..1000).map(|i| 1e4 + (i % 7) as f64 * 1e-2).collect();
        let k = xs[0];
        let s1: f64 = xs.iter().map(|x| x - k).sum();
        let s2: f64 = xs.iter().map(|x| (x - k) * (x - k)).sum();
        let (mean, var) = moments(xs.len() as f64, k, s1, s2);
        let m: f64 = xs.iter().sum::<f64>() / 1000.0;
        let v: f64 = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 1000.0;
        assert!((mean - m).abs() < 1e-9);
        assert!(
            (var - v).abs() < 1e-9 * v.max(1e-12) + 1e-15,
            "{var} vs {v}"
        );
    }
}
