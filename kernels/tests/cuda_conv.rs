//! Convolutions through cuDNN against the CPU kernels, in every geometry of the model zoo's kinds, and their
//! choices riding in the GEMM choices (run on a GPU with cuDNN 9: `cargo test -p cohort-kernels --features cuda
//! --test cuda_conv -- --include-ignored`). The own kernels' tests run in a process of their own
//! (`cuda_conv_own.rs`): the switch between the two is process-wide.
#![cfg(feature = "cuda")]

mod common;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cohort_kernels::Math;
use cohort_kernels::conv::{
    ConvDecision, ConvParams, ConvPass, CudnnMode, cpu as conv_cpu, cuda as conv_cuda,
};
use cohort_kernels::cuda::{DeviceBuffer, Gpu};
use cohort_kernels::matmul::GemmChoices;

use common::{assert_near, down, rand_vec, up};

fn gpu() -> Arc<Gpu> {
    Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

/// One test at a time: they count the device's decisions.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A workspace from the device, as the tensor crate gives one from its allocator: every request answered with a
/// buffer of its own, the largest request kept.
struct Workspaces {
    g: Arc<Gpu>,
    held: Vec<DeviceBuffer>,
    largest: usize,
}

impl Workspaces {
    fn new(g: &Arc<Gpu>) -> Workspaces {
        Workspaces {
            g: g.clone(),
            held: Vec::new(),
            largest: 0,
        }
    }

    fn get(&mut self, bytes: usize) -> cohort_kernels::Result<u64> {
        self.largest = self.largest.max(bytes);
        let b = self.g.alloc(bytes)?;
        let ptr = b.ptr();
        self.held.push(b);
        Ok(ptr)
    }
}

/// The geometries the issue asks for: strides 1 and 2, padding 0 and 1, 1x1, 3x3 and 5x5 kernels, batches of 1
/// and 7, 3 -> 16 and 64 -> 128 channels, on 13x11 images.
fn geometries() -> Vec<ConvParams> {
    let mut all = Vec::new();
    for (c_in, c_out) in [(3, 16), (64, 128)] {
        for k in [1, 3, 5] {
            for stride in [1, 2] {
                for padding in [0, 1] {
                    for batch in [1, 7] {
                        all.push(ConvParams {
                            batch,
                            c_in,
                            h: 13,
                            w: 11,
                            c_out,
                            kh: k,
                            kw: k,
                            stride,
                            padding,
                            groups: 1,
                        });
                    }
                }
            }
        }
    }
    all
}

/// Runs every pass of `p` on the device (the forward with and without a bias), checks each against the CPU
/// within 1e-4 of its largest value, and returns the largest workspace asked for.
fn check(g: &Arc<Gpu>, p: &ConvParams) -> usize {
    let x = rand_vec(p.input_len(), 11);
    let w = rand_vec(p.weight_len(), 12);
    let bias = rand_vec(p.c_out, 13);
    let dy = rand_vec(p.output_len(), 14);
    let (dx, dw, db, ddy) = (up(g, &x), up(g, &w), up(g, &bias), up(g, &dy));
    let mut ws = Workspaces::new(g);
    for with_bias in [false, true] {
        let out = up(g, &vec![f32::NAN; p.output_len()]);
        let b = with_bias.then(|| db.ptr());
        // SAFETY: sizes from p.
        unsafe {
            conv_cuda::conv2d(
                g,
                Math::Fp32,
                p,
                (dx.ptr(), dw.ptr()),
                b,
                out.ptr(),
                &mut |n| ws.get(n),
            )
            .unwrap()
        };
        let want = conv_cpu::conv2d(&x, &w, with_bias.then_some(&bias[..]), p);
        assert_near(
            &format!("forward (bias {with_bias}) {p:?}"),
            &down(g, &out, p.output_len()),
            &want,
        );
    }
    let gx = up(g, &vec![f32::NAN; p.input_len()]);
    // SAFETY: sizes from p.
    unsafe {
        conv_cuda::conv2d_backward_input(
            g,
            Math::Fp32,
            p,
            ddy.ptr(),
            dw.ptr(),
            gx.ptr(),
            &mut |n| ws.get(n),
        )
        .unwrap()
    };
    assert_near(
        &format!("backward data {p:?}"),
        &down(g, &gx, p.input_len()),
        &conv_cpu::conv2d_backward_input(&dy, &w, p),
    );
    let gw = up(g, &vec![f32::NAN; p.weight_len()]);
    // SAFETY: sizes from p.
    unsafe {
        conv_cuda::conv2d_backward_weight(
            g,
            Math::Fp32,
            p,
            dx.ptr(),
            ddy.ptr(),
            gw.ptr(),
            &mut |n| ws.get(n),
        )
        .unwrap()
    };
    assert_near(
        &format!("backward filter {p:?}"),
        &down(g, &gw, p.weight_len()),
        &conv_cpu::conv2d_backward_weight(&x, &dy, p),
    );
    ws.largest
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudnn_9_is_in_use_on_this_device() {
    let _serial = serial();
    assert_eq!(
        conv_cuda::cudnn_mode(),
        CudnnMode::Timed,
        "run these tests without COHORT_CUDNN"
    );
    let v = gpu().cudnn_version();
    assert!(
        v.is_some_and(|v| (90_000..100_000).contains(&v)),
        "cuDNN 9 did not load (see the log's warning): {v:?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn convolutions_through_cudnn_match_the_cpu_in_every_geometry() {
    let _serial = serial();
    let g = gpu();
    for p in geometries() {
        let largest = check(&g, &p);
        // An algorithm's workspace is held to 128 MiB or four times the pass's largest operand in f32.
        let cap = (128 << 20).max(16 * p.input_len().max(p.output_len()).max(p.weight_len()));
        assert!(largest <= cap, "{p:?}: a workspace of {largest} bytes");
    }
    // Every pass ran through cuDNN, none on the own kernels.
    let saved = g.gemm_choices().convolutions;
    for p in geometries() {
        for pass in [
            ConvPass::Forward { bias: false },
            ConvPass::Forward { bias: true },
            ConvPass::BackwardData,
            ConvPass::BackwardFilter,
        ] {
            let e = saved
                .entries
                .iter()
                .find(|e| e.pass == pass && e.params == p)
                .unwrap_or_else(|| panic!("{pass:?} {p:?} has no choice"));
            assert!(
                matches!(e.decision, ConvDecision::Cudnn { .. }),
                "{pass:?} {p:?} ran on the own kernels"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn conv_choices_ride_in_the_gemm_choices() {
    let _serial = serial();
    let g = gpu();
    // A geometry no other test makes.
    let p = ConvParams {
        batch: 5,
        c_in: 8,
        h: 17,
        w: 9,
        c_out: 24,
        kh: 3,
        kw: 3,
        stride: 1,
        padding: 1,
        groups: 1,
    };
    g.gemm_tuning(); // forget earlier tunings
    let before = g.gemm_choice_count();
    check(&g, &p);
    let after = g.gemm_choice_count();
    assert!(
        after == before + 4,
        "four new convolution passes counted as {before} -> {after}"
    );
    let tuned: Vec<_> = g
        .gemm_tuning()
        .into_iter()
        .filter(|t| t.label.contains("5x8x17x9 -> 24"))
        .collect();
    assert_eq!(tuned.len(), 4, "{tuned:?}");
    let saved = g.gemm_choices();
    assert_eq!(
        saved.convolutions.cudnn_version,
        g.cudnn_version().unwrap() as u64
    );
    assert_eq!(
        saved
            .convolutions
            .entries
            .iter()
            .filter(|e| e.params == p)
            .count(),
        4
    );
    // tuning.json's round trip: the device adopts its own choices again, keeping every entry it has.
    let json = serde_json::to_string_pretty(&saved).unwrap();
    assert!(json.contains("\"convolutions\""), "{json}");
    let back: GemmChoices = serde_json::from_str(&json).unwrap();
    assert_eq!(back, saved);
    g.adopt_gemm_choices(&back).unwrap();
    assert_eq!(
        g.gemm_choice_count(),
        after,
        "kept entries were decided again"
    );
    assert_eq!(g.gemm_choices(), saved);
}
