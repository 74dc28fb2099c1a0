//! Data movement: strided block copies (narrow, cat, slice assignment), transposes, broadcasts and
//! masked selection.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// A copy of `rows` blocks of `cols` contiguous elements between two buffers with their own row
/// strides and start offsets (all in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2d {
    /// Number of blocks.
    pub rows: usize,
    /// Elements per block.
    pub cols: usize,
    /// Elements between block starts in the source.
    pub src_stride: usize,
    /// Elements between block starts in the destination.
    pub dst_stride: usize,
    /// First source element.
    pub src_offset: usize,
    /// First destination element.
    pub dst_offset: usize,
}

impl Copy2d {
    /// All `n` elements, as one block from the start of both buffers.
    pub fn whole(n: usize) -> Copy2d {
        Copy2d {
            rows: 1,
            cols: n,
            src_stride: n,
            dst_stride: n,
            src_offset: 0,
            dst_offset: 0,
        }
    }
}
