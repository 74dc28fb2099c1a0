//! A convolution of few input channels and the max pool, bias and ReLU after it, as one op: an image CNN's first
//! layer (`pooled.cu`). cuDNN runs a three-channel 3x3 convolution far below the memory's speed, and its full-size
//! output exists only to be pooled; the one-pass kernels write the pooled output and its maxima's indices, and make
//! the weight's gradient from the pooled gradient, with no full-size tensor either way.

#[cfg(feature = "cuda")]
pub mod cuda;

use super::ConvParams;

/// Input channels the one-pass kernels take at most (`POOLED_MAX_C`): beyond a few, cuDNN's products win.
pub const MAX_CHANNELS: usize = 4;
/// Images a forward launch takes: a grid's third dimension.
const MAX_GRID_Z: usize = 65_535;

/// A convolution (`conv`) and the `pool` x `pool` max pool of stride `pool` after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PooledConv {
    pub conv: ConvParams,
    pub pool: usize,
}

impl PooledConv {
    /// Pooled height.
    pub fn out_h(&self) -> usize {
        self.conv.out_h() / self.pool
    }

    /// Pooled width.
    pub fn out_w(&self) -> usize {
        self.conv.out_w() / self.pool
    }

    /// Whether the one-pass kernels run it: stride 1, one group, a square 3x3 or 5x5 kernel, at most
    /// [`MAX_CHANNELS`] input channels, 2x2 windows that tile the convolution's output (at least one a side), a
    /// batch of at most 65,535 images (a grid's third dimension), and u32 indices.
    pub fn fuses(&self) -> bool {
        let c = &self.conv;
        let (oh, ow) = (c.out_h(), c.out_w());
        c.stride == 1
            && c.groups == 1
            && c.kh == c.kw
            && matches!((c.kh, self.pool), (3 | 5, 2))
            && (1..=MAX_CHANNELS).contains(&c.c_in)
            && oh >= self.pool
            && ow >= self.pool
            && oh % self.pool == 0
            && ow % self.pool == 0
            && (1..=MAX_GRID_Z).contains(&c.batch)
            && c.c_out > 0
            && c.input_len().max(c.batch * c.c_out * oh * ow) < u32::MAX as usize
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn first_layer(c_in: usize, side: usize, k: usize, padding: usize) -> PooledConv {
        PooledConv {
            conv: ConvParams {
                batch: 128,
                c_in,
                h: side,
                w: side,
                c_out: 64,
                kh: k,
                kw: k,
                stride: 1,
                padding,
                groups: 1,
            },
            pool: 2,
        }
    }

    #[test]
    fn an_image_cnns_first_layer_fuses_and_wide_or_odd_ones_do_not() {
        let p = first_layer(3, 64, 3, 1);
        assert!(p.fuses());
        assert_eq!((p.out_h(), p.out_w()), (32, 32));
        assert!(first_layer(1, 28, 5, 2).fuses(), "LeNet's");
        assert!(first_layer(4, 32, 3, 1).fuses());
        assert!(
            !first_layer(5, 64, 3, 1).fuses(),
            "more channels than the kernels take"
        );
        assert!(
            !first_layer(3, 63, 3, 1).fuses(),
            "63x63 outputs: 2x2 windows do not tile"
        );
        assert!(!first_layer(3, 64, 7, 3).fuses(), "no 7x7 kernels");
        assert!(
            !first_layer(3, 4096, 3, 1).fuses(),
            "a band's rows beyond shared memory"
        );
        let mut strided = first_layer(3, 64, 3, 1);
        strided.conv.stride = 2;
        assert!(!strided.fuses());
        let mut pooled3 = first_layer(3, 66, 3, 1);
        pooled3.pool = 3;
        assert!(!pooled3.fuses(), "3x3 windows");
        let mut empty = first_layer(3, 64, 3, 1);
        empty.conv.batch = 0;
        assert!(!empty.fuses());
        let mut many = first_layer(1, 4, 3, 1);
        many.conv.batch = 65_536;
        assert!(!many.fuses(), "more images than a grid's third dimension");
    }
}
