//! 2-D max pooling (no padding) with the argmax indices its backward pass needs.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The geometry of a max pool over `planes` (= N·C) planes of `h × w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolParams {
    /// N · C.
    pub planes: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Window size (both dims).
    pub kernel: usize,
    /// Stride (both dims).
    pub stride: usize,
}

impl PoolParams {
    /// Output height.
    pub fn out_h(&self) -> usize {
        (self.h - self.kernel) / self.stride + 1
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        (self.w - self.kernel) / self.stride + 1
    }
}
