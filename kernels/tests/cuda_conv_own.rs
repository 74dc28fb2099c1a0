//! The own CUDA convolution kernels (im2col + cuBLAS in tiles of images), as they run where cuDNN is absent or
//! `COHORT_CUDNN=0` switches it off, in a process of their own (the switch is process-wide): the CPU kernels'
//! values, and a workspace bounded by the tile whatever the batch (`cargo test -p cohort-kernels --features cuda
//! --test cuda_conv_own -- --include-ignored` on a GPU).
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use cohort_kernels::Math;
use cohort_kernels::conv::{
    COLUMN_TILE_BYTES, ConvParams, CudnnMode, cpu as conv_cpu, cuda as conv_cuda,
};
use cohort_kernels::cuda::Gpu;

use common::{assert_near, down, rand_vec, up};

/// Device 0 with cuDNN switched off: every test of this process wants that, none turns it on.
fn gpu() -> Arc<Gpu> {
    conv_cuda::set_cudnn_mode(CudnnMode::Off);
    Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

fn params(
    batch: usize,
    (c_in, c_out): (usize, usize),
    hw: usize,
    k: usize,
    stride: usize,
    groups: usize,
) -> ConvParams {
    ConvParams {
        batch,
        c_in,
        h: hw,
        w: hw + 3,
        c_out,
        kh: k,
        kw: k,
        stride,
        padding: k / 2,
        groups,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn own_kernels_run_in_tiles_with_a_bounded_workspace_and_match_the_cpu() {
    let g = gpu();
    assert_eq!(g.cudnn_version(), None, "cuDNN is switched off");
    for p in [
        // One tile.
        params(7, (3, 16), 13, 3, 1, 1),
        params(1, (64, 128), 13, 5, 2, 1),
        params(7, (64, 128), 13, 1, 1, 1),
        // Several: 5 images a tile (3 tiles), grouped (2 tiles of 5 and 4), strided 5x5 (3 tiles).
        params(12, (64, 128), 64, 3, 1, 1),
        params(9, (64, 128), 64, 3, 1, 4),
        params(23, (64, 64), 64, 5, 2, 1),
    ] {
        let x = rand_vec(p.input_len(), 21);
        let w = rand_vec(p.weight_len(), 22);
        let bias = rand_vec(p.c_out, 23);
        let dy = rand_vec(p.output_len(), 24);
        let (dx, dw, db, ddy) = (up(&g, &x), up(&g, &w), up(&g, &bias), up(&g, &dy));
        let mut asked = Vec::new();
        let mut held = Vec::new();
        let mut workspace = |bytes: usize| -> cohort_kernels::Result<u64> {
            asked.push(bytes);
            let b = g.alloc(bytes)?;
            let ptr = b.ptr();
            held.push(b);
            Ok(ptr)
        };

        let out = up(&g, &vec![f32::NAN; p.output_len()]);
        // SAFETY: sizes from p.
        unsafe {
            conv_cuda::conv2d(
                &g,
                Math::Fp32,
                &p,
                (dx.ptr(), dw.ptr()),
                Some(db.ptr()),
                out.ptr(),
                &mut workspace,
            )
            .unwrap()
        };
        assert_near(
            &format!("forward {p:?}"),
            &down(&g, &out, p.output_len()),
            &conv_cpu::conv2d(&x, &w, Some(&bias), &p),
        );
        let gx = up(&g, &vec![f32::NAN; p.input_len()]);
        // SAFETY: sizes from p.
        unsafe {
            conv_cuda::conv2d_backward_input(
                &g,
                Math::Fp32,
                &p,
                ddy.ptr(),
                dw.ptr(),
                gx.ptr(),
                &mut workspace,
            )
            .unwrap()
        };
        assert_near(
            &format!("backward data {p:?}"),
            &down(&g, &gx, p.input_len()),
            &conv_cpu::conv2d_backward_input(&dy, &w, &p),
        );
        let gw = up(&g, &vec![f32::NAN; p.weight_len()]);
        // SAFETY: sizes from p.
        unsafe {
            conv_cuda::conv2d_backward_weight(
                &g,
                Math::Fp32,
                &p,
                dx.ptr(),
                ddy.ptr(),
                gw.ptr(),
                &mut workspace,
            )
            .unwrap()
        };
        assert_near(
            &format!("backward filter {p:?}"),
            &down(&g, &gw, p.weight_len()),
            &conv_cpu::conv2d_backward_weight(&x, &dy, &p),
        );

        // One workspace per pass, of the tiles' size: within the tile's bytes (and a partial weight gradient)
        // however large the batch, where the whole batch's columns would be far more.
        assert_eq!(asked, vec![p.own_workspace_len() * 4; 3], "{p:?}");
        let whole = (p.c_in * p.kh * p.kw + p.c_out) * p.batch * p.out_h() * p.out_w() * 4;
        assert!(
            asked[0] <= COLUMN_TILE_BYTES + p.weight_len() * 4,
            "{p:?}: {} bytes",
            asked[0]
        );
        if p.tiles() > 1 {
            assert!(asked[0] < whole, "{p:?}: {} of {whole} bytes", asked[0]);
        }
    }
    assert!(
        g.gemm_choices().convolutions.entries.is_empty(),
        "a convolution went through cuDNN"
    );
}
