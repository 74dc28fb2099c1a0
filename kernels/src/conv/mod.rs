//! 2-D convolution, NCHW, with stride, zero padding and groups: forward and both backward passes.
//!
//! On CUDA (`cuda`, with the `cuda` feature) a convolution runs through cuDNN where `libcudnn.so.9` loads, on the algorithm that timed
//! fastest for its geometry, and otherwise on cohort's own kernels: im2col and cuBLAS over tiles of
//! [`ConvParams::tile_images`] images, so that the column matrix never holds more than [`COLUMN_TILE_BYTES`].
//! `COHORT_CUDNN` ([`CudnnMode`]) chooses between them.

mod choices;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub(crate) mod cudnn;
pub mod pooled;

pub use choices::{ConvChoice, ConvChoices, ConvDecision, ConvPass};

use serde::{Deserialize, Serialize};

/// The geometry of a 2-D convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConvParams {
    /// Images in the batch (N).
    pub batch: usize,
    /// Input channels (C).
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels (O).
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (both dims).
    pub stride: usize,
    /// Zero padding (both dims, both sides).
    pub padding: usize,
    /// Channel groups; `c_in` and `c_out` are multiples of it.
    pub groups: usize,
}

/// Bytes of column matrix, with the `[O, ·]` product buffer beside it, that the own CUDA kernels hold at once:
/// they unfold the batch in tiles of as many images as fit (at least one), not all of it at once.
pub const COLUMN_TILE_BYTES: usize = 64 << 20;

impl ConvParams {
    /// Output height.
    pub fn out_h(&self) -> usize {
        (self.h + 2 * self.padding - self.kh) / self.stride + 1
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        (self.w + 2 * self.padding - self.kw) / self.stride + 1
    }

    /// Input channels per group.
    pub fn c_in_g(&self) -> usize {
        self.c_in / self.groups
    }

    /// Output channels per group.
    pub fn c_out_g(&self) -> usize {
        self.c_out / self.groups
    }

    /// Rows of one group's im2col matrix: `C/groups · kh · kw`.
    pub fn col_rows(&self) -> usize {
        self.c_in_g() * self.kh * self.kw
    }

    /// Elements of the input.
    pub fn input_len(&self) -> usize {
        self.batch * self.c_in * self.h * self.w
    }

    /// Elements of the weight `[O, C/groups, kh, kw]`.
    pub fn weight_len(&self) -> usize {
        self.c_out * self.col_rows()
    }

    /// Elements of the output `[N, O, out_h, out_w]`.
    pub fn output_len(&self) -> usize {
        self.batch * self.c_out * self.out_h() * self.out_w()
    }

    /// f32 elements one image takes in the own CUDA kernels' workspace: its columns (`C·kh·kw` rows) and its
    /// share of the product's `[O, ·]` buffer, `OH·OW` each.
    fn tile_elements_per_image(&self) -> usize {
        (self.c_in * self.kh * self.kw + self.c_out) * self.out_h() * self.out_w()
    }

    /// Images the own CUDA kernels unfold at once: as many as fit [`COLUMN_TILE_BYTES`], at least one, at most
    /// the batch.
    pub fn tile_images(&self) -> usize {
        let per_image = self.tile_elements_per_image() * 4;
        (COLUMN_TILE_BYTES / per_image.max(1)).clamp(1, self.batch.max(1))
    }

    /// Tiles the own CUDA kernels cut the batch into.
    pub fn tiles(&self) -> usize {
        self.batch.div_ceil(self.tile_images())
    }

    /// f32 elements of workspace the own CUDA kernels need for any of the three passes: one tile's columns and
    /// product buffer, and where the batch takes more than one tile a weight gradient's partial sum (the tiles'
    /// sums are added in order). At most [`COLUMN_TILE_BYTES`] / 4 plus the weight, unless a single image's
    /// columns are larger than that.
    pub fn own_workspace_len(&self) -> usize {
        let partial = if self.tiles() > 1 {
            self.weight_len()
        } else {
            0
        };
        self.tile_images() * self.tile_elements_per_image() + partial
    }
}

/// Where CUDA convolutions run, from `COHORT_CUDNN` unless `cuda::set_cudnn_mode` says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudnnMode {
    /// On cohort's own kernels (`COHORT_CUDNN=0`), even where cuDNN loads.
    Off,
    /// Through cuDNN on its heuristics' first pick for each geometry, timing nothing (`COHORT_CUDNN=heuristic`).
    Heuristic,
    /// Through cuDNN on the algorithm that timed fastest for each geometry (the default).
    Timed,
}

impl CudnnMode {
    /// What a value of `COHORT_CUDNN` asks for: `0`, `off`, `false` or `no` the own kernels; `heuristic` cuDNN's
    /// heuristics; anything else, or no value, cuDNN on timed choices.
    pub fn from_env_value(value: Option<&str>) -> CudnnMode {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("0" | "off" | "false" | "no") => CudnnMode::Off,
            Some("heuristic" | "heuristics") => CudnnMode::Heuristic,
            _ => CudnnMode::Timed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(batch: usize, c_in: usize, c_out: usize, hw: usize, k: usize) -> ConvParams {
        ConvParams {
            batch,
            c_in,
            h: hw,
            w: hw,
            c_out,
            kh: k,
            kw: k,
            stride: 1,
            padding: k / 2,
            groups: 1,
        }
    }

    #[test]
    fn a_small_batch_is_one_tile() {
        let p = params(7, 3, 16, 13, 3);
        assert_eq!(p.tile_images(), 7);
        assert_eq!(p.tiles(), 1);
        // One tile: no partial weight gradient.
        assert_eq!(p.own_workspace_len(), (3 * 9 + 16) * 13 * 13 * 7);
    }

    #[test]
    fn a_large_batch_is_cut_into_tiles_of_bounded_size() {
        // The CNN's second layer at batch 256: 64x64 images, 64 -> 128 channels, 3x3. The whole batch's columns
        // and product buffer would take (576 + 128) · 4096 · 256 f32 = 2.75 GiB.
        let p = params(256, 64, 128, 64, 3);
        let per_image = (64 * 9 + 128) * 64 * 64 * 4;
        assert_eq!(per_image, 11_534_336);
        assert_eq!(p.tile_images(), COLUMN_TILE_BYTES / per_image);
        assert_eq!(p.tile_images(), 5);
        assert_eq!(p.tiles(), 52, "51 tiles of 5 images and one of 1");
        let bytes = p.own_workspace_len() * 4;
        assert!(bytes <= COLUMN_TILE_BYTES + p.weight_len() * 4, "{bytes}");
        assert_eq!(bytes, 5 * per_image + p.weight_len() * 4);
        assert!(bytes * 40 < 256 * per_image, "{bytes}");
    }

    #[test]
    fn an_image_larger_than_the_tile_is_a_tile_of_its_own() {
        let p = params(3, 256, 256, 128, 5);
        let per_image = (256 * 25 + 256) * 128 * 128 * 4;
        assert!(per_image > COLUMN_TILE_BYTES);
        assert_eq!(p.tile_images(), 1);
        assert_eq!(p.tiles(), 3);
        assert_eq!(p.own_workspace_len() * 4, per_image + p.weight_len() * 4);
    }

    #[test]
    fn empty_geometries_still_have_one_image_per_tile() {
        let p = params(0, 3, 16, 13, 3);
        assert_eq!(p.tile_images(), 1);
        assert_eq!(p.tiles(), 0);
        assert_eq!(p.own_workspace_len(), (3 * 9 + 16) * 13 * 13);
    }

    #[test]
    fn cohort_cudnn_values() {
        use CudnnMode::*;
        for (v, want) in [
            (None, Timed),
            (Some("1"), Timed),
            (Some(""), Timed),
            (Some("0"), Off),
            (Some(" OFF "), Off),
            (Some("false"), Off),
            (Some("no"), Off),
            (Some("heuristic"), Heuristic),
            (Some("Heuristics"), Heuristic),
        ] {
            assert_eq!(CudnnMode::from_env_value(v), want, "{v:?}");
        }
    }
}
