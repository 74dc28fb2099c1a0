//! Image augmentation in the pipeline's workers: a random crop from the zero-padded image and a horizontal flip,
//! torchvision's `RandomCrop(size, padding)` and `RandomHorizontalFlip()`, on a channels-first `[C, H, W]` image in
//! place.
//!
//! The draws come from the caller's [`Rng`], so one derived per example (from the seed, the epoch and the index)
//! gives the same augmentation on every run and on a resumed one.

use crate::rng::Rng;

/// Which random changes to make to each training image. The default changes nothing.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(default, deny_unknown_fields)]
pub struct Augment {
    /// A random crop of the image's own size out of the image zero-padded by this many pixels on each side
    /// (torchvision `RandomCrop(size, padding=crop_padding)`); 0: no crop.
    pub crop_padding: usize,
    /// A horizontal flip with probability 1/2.
    pub flip: bool,
}

impl Augment {
    /// Whether `apply` leaves every image as it is (and draws nothing).
    pub fn is_identity(&self) -> bool {
        self.crop_padding == 0 && !self.flip
    }

    /// Augment one image `x` of `shape` `[C, H, W]` in place: first the crop offset is drawn (row, then column,
    /// each uniform in `0..=2 * crop_padding`), then the flip; every channel moves alike. Pixels that come from
    /// the padding are 0.
    ///
    /// # Panics
    /// When `shape` is not three sizes whose product is `x.len()` (a caller's mistake, not the data's).
    pub fn apply(&self, x: &mut [f32], shape: &[usize], rng: &mut Rng) {
        assert!(
            shape.len() == 3 && shape.iter().product::<usize>() == x.len(),
            "Augment::apply takes a [C, H, W] image: shape {shape:?} for {} values",
            x.len()
        );
        let (h, w) = (shape[1], shape[2]);
        if x.is_empty() {
            return;
        }
        let p = self.crop_padding;
        let shift = if p > 0 {
            let span = 2 * p as u64 + 1;
            let dy = rng.below(span) as isize - p as isize;
            let dx = rng.below(span) as isize - p as isize;
            Some((dy, dx))
        } else {
            None
        };
        let flip = self.flip && rng.below(2) == 1;
        for plane in x.chunks_exact_mut(h * w) {
            if let Some((dy, dx)) = shift {
                shift_plane(plane, h, w, dy, dx);
            }
            if flip {
                plane.chunks_exact_mut(w).for_each(<[f32]>::reverse);
            }
        }
    }
}

/// `out[y][x] = in[y + dy][x + dx]`, 0 where that falls outside, in place: rows are visited in the order that
/// reads every source row before it is overwritten (down for `dy > 0`, up for `dy < 0`), and within a row
/// `copy_within` moves overlapping ranges correctly.
fn shift_plane(plane: &mut [f32], h: usize, w: usize, dy: isize, dx: isize) {
    if dy == 0 && dx == 0 {
        return;
    }
    let ax = dx.unsigned_abs().min(w);
    // columns of an output row that have a source: [lo, hi), read from [lo + dx, hi + dx)
    let (lo, hi) = if dx >= 0 { (0, w - ax) } else { (ax, w) };
    let row = |y: usize, plane: &mut [f32]| {
        let dst = y * w;
        let sy = y as isize + dy;
        if sy < 0 || sy >= h as isize || lo >= hi {
            plane[dst..dst + w].fill(0.0);
            return;
        }
        let src = sy as usize * w;
        let from = (src + lo) as isize + dx;
        plane.copy_within(from as usize..from as usize + (hi - lo), dst + lo);
        plane[dst..dst + lo].fill(0.0);
        plane[dst + hi..dst + w].fill(0.0);
    };
    if dy > 0 {
        (0..h).for_each(|y| row(y, plane));
    } else {
        (0..h).rev().for_each(|y| row(y, plane));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-channel 5x6 image whose every pixel is distinct.
    fn image() -> (Vec<f32>, [usize; 3]) {
        let shape = [2, 5, 6];
        ((1..=60).map(|v| v as f32).collect(), shape)
    }

    #[test]
    fn flip_twice_is_identity_and_flip_reverses_rows() {
        let (orig, shape) = image();
        let flip = Augment {
            crop_padding: 0,
            flip: true,
        };
        // find a seed that flips, apply it twice
        let seed = (0..64)
            .find(|&s| {
                let mut x = orig.clone();
                flip.apply(&mut x, &shape, &mut Rng::new(s));
                x != orig
            })
            .expect("some seed flips");
        let mut x = orig.clone();
        flip.apply(&mut x, &shape, &mut Rng::new(seed));
        assert_eq!(&x[..6], &[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]);
        assert_eq!(&x[30..36], &[36.0, 35.0, 34.0, 33.0, 32.0, 31.0]);
        flip.apply(&mut x, &shape, &mut Rng::new(seed));
        assert_eq!(x, orig);
        // about half of the seeds flip
        let flips = (0..1000)
            .filter(|&s| {
                let mut x = orig.clone();
                flip.apply(&mut x, &shape, &mut Rng::new(s));
                x != orig
            })
            .count();
        assert!((400..600).contains(&flips), "{flips} flips of 1000");
    }

    #[test]
    fn padding_zero_without_flip_is_identity() {
        let (orig, shape) = image();
        let a = Augment::default();
        assert!(a.is_identity());
        assert!(
            !Augment {
                crop_padding: 1,
                flip: false
            }
            .is_identity()
        );
        let mut x = orig.clone();
        let mut rng = Rng::new(3);
        let before = rng.clone();
        a.apply(&mut x, &shape, &mut rng);
        assert_eq!(x, orig);
        assert_eq!(rng, before, "the identity draws nothing");
    }

    /// The reference: read each output pixel from the zero-padded image at the drawn offset.
    fn shifted(orig: &[f32], shape: [usize; 3], dy: isize, dx: isize) -> Vec<f32> {
        let [c, h, w] = shape;
        let mut out = vec![0.0; orig.len()];
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let (sy, sx) = (y as isize + dy, x as isize + dx);
                    if (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx) {
                        out[(ch * h + y) * w + x] = orig[(ch * h + sy as usize) * w + sx as usize];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn crop_moves_pixels_by_the_drawn_offset_and_fills_zeros() {
        let (orig, shape) = image();
        let p = 2;
        let a = Augment {
            crop_padding: p,
            flip: false,
        };
        let mut seen = std::collections::HashSet::new();
        for seed in 0..300 {
            let mut draw = Rng::new(seed);
            let dy = draw.below(2 * p as u64 + 1) as isize - p as isize;
            let dx = draw.below(2 * p as u64 + 1) as isize - p as isize;
            seen.insert((dy, dx));
            let mut x = orig.clone();
            a.apply(&mut x, &shape, &mut Rng::new(seed));
            assert_eq!(x, shifted(&orig, shape, dy, dx), "offset ({dy}, {dx})");
            if (dy, dx) != (0, 0) {
                assert!(x.contains(&0.0), "padding shows as zeros at ({dy}, {dx})");
            }
        }
        assert_eq!(seen.len(), 25, "every offset in -2..=2 x -2..=2 is drawn");
        // a padding wider than the image leaves only zeros at the far offsets
        let mut x = orig.clone();
        shift_plane(&mut x[..30], 5, 6, 0, 7);
        assert!(x[..30].iter().all(|&v| v == 0.0));
        assert_eq!(&x[30..], &orig[30..]);
    }

    #[test]
    fn same_rng_same_result() {
        let (orig, shape) = image();
        let a = Augment {
            crop_padding: 3,
            flip: true,
        };
        let run = |seed| {
            let mut x = orig.clone();
            a.apply(&mut x, &shape, &mut Rng::new(seed));
            x
        };
        assert_eq!(run(9), run(9));
        assert!((0..20).any(|s| run(s) != run(9)), "other seeds differ");
    }

    #[test]
    #[should_panic(expected = "[C, H, W]")]
    fn wrong_shape_names_it() {
        Augment::default().apply(&mut [0.0; 4], &[2, 3], &mut Rng::new(0));
    }
}
