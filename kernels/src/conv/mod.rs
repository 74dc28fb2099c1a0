//! 2-D convolution, NCHW, with stride, zero padding and groups: forward and both backward passes.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The geometry of a 2-D convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}
