//! 2-D max pooling (no padding) with the argmax indices its backward pass needs.
//!
//! It stays on these kernels, not cuDNN's pooling: cuDNN's max-pool backward wants the input and output again
//! instead of the indices the autograd keeps, and each pass here is one memory-bound sweep already. Average
//! pooling is a depthwise convolution (`AvgPool2d`), so it runs through cuDNN where convolutions do; global
//! average pooling is a mean.

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
    /// Whether the windows tile the planes (stride = kernel, dividing h and w, which hold at least one window) and
    /// every element's index fits in 32 bits: the kernels' fast case, in which each input element lies in exactly
    /// one window.
    pub fn tiles(&self) -> bool {
        let k = self.kernel;
        k > 0
            && self.stride == k
            && self.h >= k
            && self.w >= k
            && self.h % k == 0
            && self.w % k == 0
            && u32::try_from(self.planes * self.h * self.w).is_ok()
    }

    /// Output height.
    pub fn out_h(&self) -> usize {
        (self.h - self.kernel) / self.stride + 1
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        (self.w - self.kernel) / self.stride + 1
    }
}

#[cfg(test)]
mod tests {
    use super::PoolParams;

    fn pool(planes: usize, h: usize, w: usize, kernel: usize, stride: usize) -> PoolParams {
        PoolParams {
            planes,
            h,
            w,
            kernel,
            stride,
        }
    }

    /// Windows tile only where they are their own stride apart and divide both sides, with 32-bit indices.
    #[test]
    fn windows_tile_where_they_cover_each_element_once() {
        assert!(pool(8, 64, 64, 2, 2).tiles());
        assert!(pool(8, 12, 9, 3, 3).tiles());
        assert!(!pool(8, 13, 12, 2, 2).tiles(), "a row left out");
        assert!(!pool(8, 12, 12, 3, 2).tiles(), "overlapping windows");
        assert!(!pool(8, 12, 12, 2, 3).tiles(), "gaps between windows");
        assert!(!pool(8, 12, 12, 0, 0).tiles(), "no window");
        assert!(!pool(8, 0, 12, 2, 2).tiles(), "empty planes");
        assert!(!pool(1 << 20, 64, 64, 2, 2).tiles(), "indices past 32 bits");
    }
}
