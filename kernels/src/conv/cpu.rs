//! CPU convolution: im2col + gemm per image and group, images in parallel.

use rayon::prelude::*;

use super::ConvParams;
use crate::Float;
use crate::matmul::{MatmulShape, cpu::matmul_into};

/// Writes the im2col matrix `[C/groups·kh·kw, out_h·out_w]` of group `g` of one image.
fn im2col<T: Float>(img: &[T], p: &ConvParams, g: usize, col: &mut [T]) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let cg = p.c_in_g();
    let mut r = 0;
    for c in 0..cg {
        let plane = &img[(g * cg + c) * p.h * p.w..][..p.h * p.w];
        for ky in 0..p.kh {
            for kx in 0..p.kw {
                let dst = &mut col[r * oh * ow..(r + 1) * oh * ow];
                for oy in 0..oh {
                    let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                    let drow = &mut dst[oy * ow..(oy + 1) * ow];
                    if iy < 0 || iy as usize >= p.h {
                        drow.fill(T::ZERO);
                        continue;
                    }
                    let srow = &plane[iy as usize * p.w..][..p.w];
                    for (ox, d) in drow.iter_mut().enumerate() {
                        let ix = (ox * p.stride + kx) as isize - p.padding as isize;
                        *d = if ix < 0 || ix as usize >= p.w {
                            T::ZERO
                        } else {
                            srow[ix as usize]
                        };
                    }
                }
                r += 1;
            }
        }
    }
}

/// Adds the im2col-shaped `col` of group `g` back into the image gradient `img`.
fn col2im<T: Float>(col: &[T], p: &ConvParams, g: usize, img: &mut [T]) {
    let (oh, ow) = (p.out_h(), p.out_w());
    let cg = p.c_in_g();
    let mut r = 0;
    for c in 0..cg {
        let plane = &mut img[(g * cg + c) * p.h * p.w..][..p.h * p.w];
        for ky in 0..p.kh {
            for kx in 0..p.kw {
                let src = &col[r * oh * ow..(r + 1) * oh * ow];
                for oy in 0..oh {
                    let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                    if iy < 0 || iy as usize >= p.h {
                        continue;
                    }
                    let drow = &mut plane[iy as usize * p.w..][..p.w];
                    for (ox, &v) in src[oy * ow..(oy + 1) * ow].iter().enumerate() {
                        let ix = (ox * p.stride + kx) as isize - p.padding as isize;
                        if ix >= 0 && (ix as usize) < p.w {
                            drow[ix as usize] = drow[ix as usize] + v;
                        }
                    }
                }
                r += 1;
            }
        }
    }
}

/// Forward convolution: `input [N,C,H,W]`, `weight [O,C/g,kh,kw]`, optional `bias [O]`.
pub fn conv2d<T: Float>(input: &[T], weight: &[T], bias: Option<&[T]>, p: &ConvParams) -> Vec<T> {
    let (oh, ow) = (p.out_h(), p.out_w());
    let ohw = oh * ow;
    let mut out = vec![T::ZERO; p.output_len()];
    if out.is_empty() {
        return out;
    }
    let in_img = p.c_in * p.h * p.w;
    let (og, rows) = (p.c_out_g(), p.col_rows());
    let shape = MatmulShape::plain(og, ohw, rows);
    out.par_chunks_mut(p.c_out * ohw).enumerate().for_each_init(
        || vec![T::ZERO; rows * ohw],
        |col, (b, dst)| {
            let img = &input[b * in_img..(b + 1) * in_img];
            for g in 0..p.groups {
                im2col(img, p, g, col);
                let w = &weight[g * og * rows..(g + 1) * og * rows];
                matmul_into(
                    &mut dst[g * og * ohw..(g + 1) * og * ohw],
                    false,
                    w,
                    col,
                    &shape,
                );
            }
            if let Some(bias) = bias {
                for (o, plane) in dst.chunks_mut(ohw).enumerate() {
                    let bv = bias[o];
                    plane.iter_mut().for_each(|v| *v = *v + bv);
                }
            }
        },
    );
    out
}

/// Gradient of the convolution with respect to its input, `[N,C,H,W]`.
pub fn conv2d_backward_input<T: Float>(grad_out: &[T], weight: &[T], p: &ConvParams) -> Vec<T> {
    let ohw = p.out_h() * p.out_w();
    let in_img = p.c_in * p.h * p.w;
    let mut grad_in = vec![T::ZERO; p.input_len()];
    if grad_in.is_empty() {
        return grad_in;
    }
    let (og, rows) = (p.c_out_g(), p.col_rows());
    // grad_col = W_gᵀ · grad_out_g: W_g is stored [og, rows], i.e. the transposed lhs.
    let shape = MatmulShape {
        trans_lhs: true,
        ..MatmulShape::plain(rows, ohw, og)
    };
    grad_in.par_chunks_mut(in_img).enumerate().for_each_init(
        || vec![T::ZERO; rows * ohw],
        |col, (b, dst)| {
            let go = &grad_out[b * p.c_out * ohw..(b + 1) * p.c_out * ohw];
            for g in 0..p.groups {
                let w = &weight[g * og * rows..(g + 1) * og * rows];
                matmul_into(col, false, w, &go[g * og * ohw..(g + 1) * og * ohw], &shape);
                col2im(col, p, g, dst);
            }
        },
    );
    grad_in
}

/// Images per partial sum of the weight gradient. The batch is cut into runs of this many images whatever the
/// thread count, each run summed in order on one thread and the runs' sums added in order: the gradient is the
/// same bits with one thread or many (rayon's fold would group images by work stealing, so the order, and the
/// rounding, changed from run to run).
const WEIGHT_GRAD_RUN: usize = 4;

/// Gradient of the convolution with respect to its weight, `[O,C/g,kh,kw]`, summed over the batch; the same bits
/// whatever the number of threads.
pub fn conv2d_backward_weight<T: Float>(input: &[T], grad_out: &[T], p: &ConvParams) -> Vec<T> {
    let ohw = p.out_h() * p.out_w();
    let in_img = p.c_in * p.h * p.w;
    let (og, rows) = (p.c_out_g(), p.col_rows());
    // dW_g += grad_out_g [og, ohw] · colᵀ, col stored [rows, ohw] = the transposed rhs.
    let shape = MatmulShape {
        trans_rhs: true,
        ..MatmulShape::plain(og, rows, ohw)
    };
    let wlen = p.weight_len();
    let partials: Vec<Vec<T>> = (0..p.batch.div_ceil(WEIGHT_GRAD_RUN))
        .into_par_iter()
        .map_init(
            || vec![T::ZERO; rows * ohw],
            |col, run| {
                let mut dw = vec![T::ZERO; wlen];
                let images = run * WEIGHT_GRAD_RUN..((run + 1) * WEIGHT_GRAD_RUN).min(p.batch);
                for b in images {
                    let img = &input[b * in_img..(b + 1) * in_img];
                    let go = &grad_out[b * p.c_out * ohw..(b + 1) * p.c_out * ohw];
                    for g in 0..p.groups {
                        im2col(img, p, g, col);
                        let dst = &mut dw[g * og * rows..(g + 1) * og * rows];
                        matmul_into(
                            dst,
                            true,
                            &go[g * og * ohw..(g + 1) * og * ohw],
                            col,
                            &shape,
                        );
                    }
                }
                dw
            },
        )
        .collect();
    let mut runs = partials.into_iter();
    let mut dw = runs.next().unwrap_or_else(|| vec![T::ZERO; wlen]);
    for run in runs {
        dw.iter_mut().zip(&run).for_each(|(x, &y)| *x = *x + y);
    }
    dw
}
