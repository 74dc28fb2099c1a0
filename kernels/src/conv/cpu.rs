//! CPU convolution: the batch is cut into tiles of a few images, and each group's pass over a tile is one product
//! at gemm's speed: `W_g · col` forward, `W_gᵀ · dY` then col2im for the input gradient, `dY · colᵀ` for the
//! weight gradient, where `col` is the tile's unfolded input `[C/g·kh·kw, images·span]` (see [`Layout`]). Tiles
//! run in parallel, each product on its own thread.
//!
//! The tiling depends on the geometry alone, never on the thread count, and the weight gradient adds the tiles'
//! sums in tile order: every pass gives the same bits with one thread or many.

use std::any::Any;
use std::cell::Cell;
use std::ops::Range;

use rayon::prelude::*;

use super::ConvParams;
use crate::Float;
use crate::matmul::MatmulShape;
use crate::matmul::cpu::matmul_on_this_thread as product;

/// Bytes of column matrix one tile unfolds: a tile's columns and its product stay in a core's L2 while gemm
/// reads them, and a batch makes several tiles for the threads to share.
const COLUMN_TILE_BYTES: usize = 512 << 10;

/// Where one image's outputs lie along the columns of a tile's matrices: output `(oy, ox)` at column
/// `oy·pitch + ox` of the image's `span = OH·pitch` columns.
///
/// With stride 1 and no padding the layout is wide, `pitch = W`: a kernel offset's columns are then one contiguous
/// run of the input plane, so unfolding takes one copy per plane and offset instead of one per output row (the
/// rows are short: 11 to 26 outputs in the default CNN). The `W − OW` columns past each row's end are computed and
/// dropped; in the gradients' operands they are zeros, so they add nothing while the inputs are finite. Otherwise
/// the layout is compact, `pitch = OW`.
#[derive(Clone, Copy)]
struct Layout {
    pitch: usize,
    span: usize,
}

impl Layout {
    fn new(p: &ConvParams) -> Layout {
        let pitch = if p.stride == 1 && p.padding == 0 {
            p.w
        } else {
            p.out_w()
        };
        Layout {
            pitch,
            span: p.out_h() * pitch,
        }
    }

    fn is_wide(&self, p: &ConvParams) -> bool {
        self.pitch != p.out_w()
    }

    /// Runs of outputs, each as (its range in the image's columns, its range in the `OH·OW` output plane), that
    /// together cover the plane: the whole plane at once when compact, a row at a time when wide.
    fn runs(&self, p: &ConvParams) -> impl Iterator<Item = (Range<usize>, Range<usize>)> + use<> {
        let (oh, ow, pitch) = (p.out_h(), p.out_w(), self.pitch);
        let (count, len) = if pitch == ow { (1, oh * ow) } else { (oh, ow) };
        (0..count).map(move |r| (r * pitch..r * pitch + len, r * ow..r * ow + len))
    }
}

/// The batch cut into `count` tiles of consecutive images, of sizes differing by at most one.
struct Tiling {
    batch: usize,
    count: usize,
}

impl Tiling {
    fn new<T>(p: &ConvParams, layout: &Layout) -> Tiling {
        let image_bytes = p.col_rows() * layout.span * size_of::<T>();
        let images = (COLUMN_TILE_BYTES / image_bytes.max(1)).clamp(1, p.batch.max(1));
        Tiling {
            batch: p.batch,
            count: p.batch.div_ceil(images),
        }
    }

    /// The images of tile `t`.
    fn images(&self, t: usize) -> Range<usize> {
        t * self.batch / self.count..(t + 1) * self.batch / self.count
    }

    /// `buf`, holding `per_image` elements per image of the batch, cut into one slice per tile.
    fn split<'a, T>(&self, mut buf: &'a mut [T], per_image: usize) -> Vec<&'a mut [T]> {
        (0..self.count)
            .map(|t| {
                let (tile, rest) =
                    std::mem::take(&mut buf).split_at_mut(self.images(t).len() * per_image);
                buf = rest;
                tile
            })
            .collect()
    }
}

/// One thread's buffers for a tile: its columns `[rows, images·span]` and the `[O/g, images·span]` operand or
/// result of its product.
struct Workspace<T> {
    col: Vec<T>,
    channels: Vec<T>,
}

thread_local! {
    /// This thread's workspace from its last tile, of whichever float type: the tiles of every call reuse it rather
    /// than allocate and zero a few megabytes each.
    static WORKSPACE: Cell<Option<Box<dyn Any>>> = const { Cell::new(None) };
}

/// Runs `f` on this thread's workspace, grown to `col` and `channels` elements.
fn with_workspace<T: Float>(col: usize, channels: usize, f: impl FnOnce(&mut [T], &mut [T])) {
    let mut ws = WORKSPACE
        .take()
        .and_then(|ws| ws.downcast::<Workspace<T>>().ok())
        .unwrap_or_else(|| {
            Box::new(Workspace {
                col: Vec::new(),
                channels: Vec::new(),
            })
        });
    for (buf, len) in [(&mut ws.col, col), (&mut ws.channels, channels)] {
        if buf.len() < len {
            buf.resize(len, T::ZERO);
        }
    }
    f(&mut ws.col[..col], &mut ws.channels[..channels]);
    WORKSPACE.set(Some(ws));
}

/// The outputs `o` along one axis whose input `o·stride + k − padding` lies in `0..len`.
fn inside(out: usize, len: usize, k: usize, p: &ConvParams) -> Range<usize> {
    let lo = p.padding.saturating_sub(k).div_ceil(p.stride).min(out);
    let hi = (len + p.padding)
        .saturating_sub(k)
        .div_ceil(p.stride)
        .min(out);
    lo..hi.max(lo)
}

/// Where kernel offset `(ky, kx)` reads inside the input: the output rows `ys` and columns `xs` that do; the
/// other outputs read padding.
struct Tap {
    ys: Range<usize>,
    xs: Range<usize>,
    ky: usize,
    kx: usize,
}

impl Tap {
    fn new(p: &ConvParams, ky: usize, kx: usize) -> Tap {
        Tap {
            ys: inside(p.out_h(), p.h, ky, p),
            xs: inside(p.out_w(), p.w, kx, p),
            ky,
            kx,
        }
    }

    /// Each output row that reads inside, with the offset in the plane of the first input it reads there.
    fn rows<'a>(&'a self, p: &'a ConvParams) -> impl Iterator<Item = (usize, usize)> + 'a {
        let x0 = (self.xs.start * p.stride + self.kx).saturating_sub(p.padding);
        let ys = if self.xs.is_empty() {
            0..0
        } else {
            self.ys.clone()
        };
        ys.map(move |oy| (oy, (oy * p.stride + self.ky - p.padding) * p.w + x0))
    }
}

/// Writes the `OH·OW` columns of kernel offset `(ky, kx)` of one input plane into `dst`, zeros where they read
/// padding.
fn unfold_tap<T: Float>(plane: &[T], p: &ConvParams, tap: &Tap, dst: &mut [T]) {
    let ow = p.out_w();
    for (oy, drow) in dst.chunks_exact_mut(ow).enumerate() {
        if tap.ys.contains(&oy) {
            drow[..tap.xs.start].fill(T::ZERO);
            drow[tap.xs.end..].fill(T::ZERO);
        } else {
            drow.fill(T::ZERO);
        }
    }
    for (oy, at) in tap.rows(p) {
        let drow = &mut dst[oy * ow..][tap.xs.clone()];
        let src = &plane[at..];
        if p.stride == 1 {
            drow.copy_from_slice(&src[..drow.len()]);
        } else {
            drow.iter_mut()
                .zip(src.iter().step_by(p.stride))
                .for_each(|(d, &v)| *d = v);
        }
    }
}

/// Adds the `OH·OW` columns of kernel offset `(ky, kx)` back into the input plane they were unfolded from.
fn fold_tap<T: Float>(src: &[T], p: &ConvParams, tap: &Tap, plane: &mut [T]) {
    let ow = p.out_w();
    for (oy, at) in tap.rows(p) {
        let srow = &src[oy * ow..][tap.xs.clone()];
        let drow = &mut plane[at..];
        if p.stride == 1 {
            drow.iter_mut().zip(srow).for_each(|(d, &v)| *d = *d + v);
        } else {
            drow.iter_mut()
                .step_by(p.stride)
                .zip(srow)
                .for_each(|(d, &v)| *d = *d + v);
        }
    }
}

/// Calls `each(plane, tap, columns)` for every image and column row of group `g` of a tile: `plane` the offset in
/// the tile of the input plane the row reads, `columns` the range of the image's columns in the tile's
/// `[rows, images·span]` matrix.
fn for_each_column_row(
    p: &ConvParams,
    layout: &Layout,
    g: usize,
    images: usize,
    mut each: impl FnMut(usize, &Tap, Range<usize>),
) {
    let (span, hw) = (layout.span, p.h * p.w);
    let n = images * span;
    let mut r = 0;
    for c in g * p.c_in_g()..(g + 1) * p.c_in_g() {
        for ky in 0..p.kh {
            for kx in 0..p.kw {
                let tap = Tap::new(p, ky, kx);
                for i in 0..images {
                    let cols = r * n + i * span..r * n + (i + 1) * span;
                    each((i * p.c_in + c) * hw, &tap, cols);
                }
                r += 1;
            }
        }
    }
}

/// In the wide layout, the range of the input plane that kernel offset `(ky, kx)` reads: the first `len` of the
/// image's columns are that range, copied whole.
fn wide_run(p: &ConvParams, tap: &Tap) -> Range<usize> {
    let start = tap.ky * p.w + tap.kx;
    start..start + (p.out_h() - 1) * p.w + p.out_w()
}

/// Unfolds group `g` of the tile's images `x` (`[images, C, H, W]`) into `col` (`[rows, images·span]`).
fn im2col<T: Float>(
    x: &[T],
    p: &ConvParams,
    layout: &Layout,
    g: usize,
    images: usize,
    col: &mut [T],
) {
    let hw = p.h * p.w;
    let wide = layout.is_wide(p);
    for_each_column_row(p, layout, g, images, |plane, tap, cols| {
        let (plane, dst) = (&x[plane..plane + hw], &mut col[cols]);
        if wide {
            let run = wide_run(p, tap);
            let len = run.len();
            dst[..len].copy_from_slice(&plane[run]);
            dst[len..].fill(T::ZERO);
        } else {
            unfold_tap(plane, p, tap, dst);
        }
    });
}

/// Adds the tile's columns `col` of group `g` back into the images' gradient `dx` (`[images, C, H, W]`).
fn col2im<T: Float>(
    col: &[T],
    p: &ConvParams,
    layout: &Layout,
    g: usize,
    images: usize,
    dx: &mut [T],
) {
    let hw = p.h * p.w;
    let wide = layout.is_wide(p);
    for_each_column_row(p, layout, g, images, |plane, tap, cols| {
        let (src, plane) = (&col[cols], &mut dx[plane..plane + hw]);
        if wide {
            let run = wide_run(p, tap);
            plane[run]
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = *d + v);
        } else {
            fold_tap(src, p, tap, plane);
        }
    });
}

/// Copies the channels of group `g` of the tile's `[images, O, OH·OW]` tensor `y` into `[O/g, images·span]`, the
/// layout of a product over the tile, with zeros in the columns that are no output.
fn gather_channels<T: Float>(
    y: &[T],
    p: &ConvParams,
    layout: &Layout,
    g: usize,
    images: usize,
    dst: &mut [T],
) {
    let (ohw, span, og) = (p.out_h() * p.out_w(), layout.span, p.c_out_g());
    if layout.is_wide(p) {
        dst.fill(T::ZERO);
    }
    for o in 0..og {
        for i in 0..images {
            let src = &y[(i * p.c_out + g * og + o) * ohw..][..ohw];
            let dst = &mut dst[(o * images + i) * span..][..span];
            for (cols, outs) in layout.runs(p) {
                dst[cols].copy_from_slice(&src[outs]);
            }
        }
    }
}

/// Scatters group `g`'s product `[O/g, images·span]` into the tile's `[images, O, OH·OW]` output `y`, adding the
/// bias on the way.
fn scatter_channels<T: Float>(
    prod: &[T],
    bias: Option<&[T]>,
    p: &ConvParams,
    layout: &Layout,
    g: usize,
    images: usize,
    y: &mut [T],
) {
    let (ohw, span, og) = (p.out_h() * p.out_w(), layout.span, p.c_out_g());
    for o in 0..og {
        let bv = bias.map_or(T::ZERO, |b| b[g * og + o]);
        for i in 0..images {
            let src = &prod[(o * images + i) * span..][..span];
            let dst = &mut y[(i * p.c_out + g * og + o) * ohw..][..ohw];
            for (cols, outs) in layout.runs(p) {
                dst[outs]
                    .iter_mut()
                    .zip(&src[cols])
                    .for_each(|(d, &v)| *d = v + bv);
            }
        }
    }
}

/// Forward convolution: `input [N,C,H,W]`, `weight [O,C/g,kh,kw]`, optional `bias [O]`.
pub fn conv2d<T: Float>(input: &[T], weight: &[T], bias: Option<&[T]>, p: &ConvParams) -> Vec<T> {
    let mut out = vec![T::ZERO; p.output_len()];
    if out.is_empty() {
        return out;
    }
    let layout = Layout::new(p);
    let tiling = Tiling::new::<T>(p, &layout);
    let (in_img, out_img) = (p.c_in * p.h * p.w, p.c_out * p.out_h() * p.out_w());
    let (og, rows) = (p.c_out_g(), p.col_rows());
    let tiles = tiling.split(&mut out, out_img);
    tiles.into_par_iter().enumerate().for_each(|(t, y)| {
        let images = tiling.images(t);
        let x = &input[images.start * in_img..images.end * in_img];
        let n = images.len() * layout.span;
        with_workspace(rows * n, og * n, |col, prod| {
            for g in 0..p.groups {
                im2col(x, p, &layout, g, images.len(), col);
                let w = &weight[g * og * rows..(g + 1) * og * rows];
                product(prod, false, w, col, &MatmulShape::plain(og, n, rows));
                scatter_channels(prod, bias, p, &layout, g, images.len(), y);
            }
        });
    });
    out
}

/// Gradient of the convolution with respect to its input, `[N,C,H,W]`.
pub fn conv2d_backward_input<T: Float>(grad_out: &[T], weight: &[T], p: &ConvParams) -> Vec<T> {
    let mut grad_in = vec![T::ZERO; p.input_len()];
    if grad_in.is_empty() {
        return grad_in;
    }
    let layout = Layout::new(p);
    let tiling = Tiling::new::<T>(p, &layout);
    let (in_img, out_img) = (p.c_in * p.h * p.w, p.c_out * p.out_h() * p.out_w());
    let (og, rows) = (p.c_out_g(), p.col_rows());
    let tiles = tiling.split(&mut grad_in, in_img);
    tiles.into_par_iter().enumerate().for_each(|(t, dx)| {
        let images = tiling.images(t);
        let dy = &grad_out[images.start * out_img..images.end * out_img];
        let n = images.len() * layout.span;
        // grad_col = W_gᵀ · dY_g: W_g is stored [og, rows], i.e. the transposed lhs.
        let shape = MatmulShape {
            trans_lhs: true,
            ..MatmulShape::plain(rows, n, og)
        };
        with_workspace(rows * n, og * n, |col, dy_g| {
            for g in 0..p.groups {
                gather_channels(dy, p, &layout, g, images.len(), dy_g);
                let w = &weight[g * og * rows..(g + 1) * og * rows];
                product(col, false, w, dy_g, &shape);
                col2im(col, p, &layout, g, images.len(), dx);
            }
        });
    });
    grad_in
}

/// Gradient of the convolution with respect to its weight, `[O,C/g,kh,kw]`, summed over the batch: one product
/// per tile and group, the tiles' sums added in tile order (rayon's fold would group images by work stealing,
/// so the order, and the rounding, would change from run to run), so the same bits whatever the thread count.
pub fn conv2d_backward_weight<T: Float>(input: &[T], grad_out: &[T], p: &ConvParams) -> Vec<T> {
    let layout = Layout::new(p);
    let tiling = Tiling::new::<T>(p, &layout);
    let (in_img, out_img) = (p.c_in * p.h * p.w, p.c_out * p.out_h() * p.out_w());
    let (og, rows) = (p.c_out_g(), p.col_rows());
    let wlen = p.weight_len();
    let partials: Vec<Vec<T>> = (0..tiling.count)
        .into_par_iter()
        .map(|t| {
            let images = tiling.images(t);
            let x = &input[images.start * in_img..images.end * in_img];
            let dy = &grad_out[images.start * out_img..images.end * out_img];
            let n = images.len() * layout.span;
            // dW_g = dY_g [og, n] · colᵀ, col stored [rows, n] = the transposed rhs.
            let shape = MatmulShape {
                trans_rhs: true,
                ..MatmulShape::plain(og, rows, n)
            };
            let mut dw = vec![T::ZERO; wlen];
            with_workspace(rows * n, og * n, |col, dy_g| {
                for g in 0..p.groups {
                    im2col(x, p, &layout, g, images.len(), col);
                    gather_channels(dy, p, &layout, g, images.len(), dy_g);
                    let dst = &mut dw[g * og * rows..(g + 1) * og * rows];
                    product(dst, false, dy_g, col, &shape);
                }
            });
            dw
        })
        .collect();
    let mut tiles = partials.into_iter();
    let mut dw = tiles.next().unwrap_or_else(|| vec![T::ZERO; wlen]);
    for tile in tiles {
        dw.iter_mut().zip(&tile).for_each(|(x, &y)| *x = *x + y);
    }
    dw
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f(b, o, ci, oy, ox, iy, ix, ky, kx)` for every product term of the convolution, straight from its
    /// definition.
    fn for_each_term(p: &ConvParams, mut f: impl FnMut([usize; 9])) {
        let (cg, og) = (p.c_in_g(), p.c_out_g());
        for b in 0..p.batch {
            for o in 0..p.c_out {
                for ci in 0..cg {
                    for (oy, ox) in (0..p.out_h()).flat_map(|y| (0..p.out_w()).map(move |x| (y, x)))
                    {
                        for (ky, kx) in (0..p.kh).flat_map(|y| (0..p.kw).map(move |x| (y, x))) {
                            let iy = (oy * p.stride + ky)
                                .checked_sub(p.padding)
                                .filter(|&y| y < p.h);
                            let ix = (ox * p.stride + kx)
                                .checked_sub(p.padding)
                                .filter(|&x| x < p.w);
                            if let (Some(iy), Some(ix)) = (iy, ix) {
                                f([b, o, (o / og) * cg + ci, oy, ox, iy, ix, ky, kx]);
                            }
                        }
                    }
                }
            }
        }
    }

    fn close(what: &str, got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-10 * (1.0 + w.abs()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    /// The three passes against the definition, on a compact layout (stride 2, padding 1) and a wide one (stride
    /// 1, no padding), with groups, odd sizes and a batch of several tiles.
    #[test]
    fn passes_match_the_definition_on_both_layouts() {
        for (stride, padding) in [(2, 1), (1, 0)] {
            let p = ConvParams {
                batch: 190,
                c_in: 4,
                h: 9,
                w: 7,
                c_out: 6,
                kh: 3,
                kw: 3,
                stride,
                padding,
                groups: 2,
            };
            assert!(Tiling::new::<f64>(&p, &Layout::new(&p)).count > 1);
            let rand = |n: usize, seed: u64| -> Vec<f64> {
                let mut s = seed;
                (0..n)
                    .map(|_| {
                        s = s
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                    })
                    .collect()
            };
            let (x, w, bias, dy) = (
                rand(p.input_len(), 1),
                rand(p.weight_len(), 2),
                rand(p.c_out, 3),
                rand(p.output_len(), 4),
            );
            let (oh, ow, cg) = (p.out_h(), p.out_w(), p.c_in_g());
            let xi = |b, c, y, x_| ((b * p.c_in + c) * p.h + y) * p.w + x_;
            let yi = |b, o, y, x_| ((b * p.c_out + o) * oh + y) * ow + x_;
            let wi = |o, ci, ky, kx| ((o * cg + ci) * p.kh + ky) * p.kw + kx;
            let mut y = vec![0.0; p.output_len()];
            for b in 0..p.batch {
                for o in 0..p.c_out {
                    y[yi(b, o, 0, 0)..][..oh * ow].fill(bias[o]);
                }
            }
            let (mut dx, mut dw) = (vec![0.0; p.input_len()], vec![0.0; p.weight_len()]);
            for_each_term(&p, |[b, o, c, oy, ox, iy, ix, ky, kx]| {
                let ci = c % cg;
                y[yi(b, o, oy, ox)] += w[wi(o, ci, ky, kx)] * x[xi(b, c, iy, ix)];
                dx[xi(b, c, iy, ix)] += w[wi(o, ci, ky, kx)] * dy[yi(b, o, oy, ox)];
                dw[wi(o, ci, ky, kx)] += x[xi(b, c, iy, ix)] * dy[yi(b, o, oy, ox)];
            });
            close("forward", &conv2d(&x, &w, Some(&bias), &p), &y);
            close("input gradient", &conv2d_backward_input(&dy, &w, &p), &dx);
            close("weight gradient", &conv2d_backward_weight(&x, &dy, &p), &dw);
        }
    }
}
