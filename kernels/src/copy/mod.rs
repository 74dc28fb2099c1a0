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
