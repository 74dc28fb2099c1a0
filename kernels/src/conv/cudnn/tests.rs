//! GPU tests of the cuDNN path: every algorithm it may pick against the CPU, timing, saved choices and their
//! adoption, deterministic mode. Each test makes [`Dnn`] states of its own beside the device's, so that it sees
//! its own decisions alone; tests that depend on the mode hold it ([`exclusive`]).

use std::sync::Arc;

use super::*;
use crate::conv::{ConvChoices, ConvDecision, cpu};
use crate::cuda::DeviceBuffer;
use crate::determinism::exclusive;

fn gpu() -> Arc<Gpu> {
    Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"))
}

/// A new cuDNN state of its own (its own handle) for this thread's bound context.
fn fresh(gpu: &Gpu) -> Dnn {
    gpu.bind().unwrap();
    Dnn::load().unwrap_or_else(|why| panic!("these tests need cuDNN 9: {why}"))
}

/// Values in [-1, 1) (xorshift).
fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first element of `got` further than `tolerance` times the largest magnitude of `want` from its value there
/// (a NaN always is: outputs start as NaN, so an element left unwritten is one), as a message.
fn off(got: &[f32], want: &[f32], tolerance: f32) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} where {} was due", got.len(), want.len()));
    }
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    let (i, (g, w)) = got.iter().zip(want).enumerate().find(|(_, (g, w))| {
        let d = (*g - *w).abs();
        d.is_nan() || d > tolerance * scale
    })?;
    Some(format!("element {i}: got {g}, want {w} (largest {scale})"))
}

/// Within 1e-4 of the largest magnitude of `want` ([`off`]).
#[track_caller]
fn assert_near(what: &str, got: &[f32], want: &[f32]) {
    if let Some(e) = off(got, want, 1e-4) {
        panic!("{what}: {e}");
    }
}

fn params(
    batch: usize,
    (c_in, c_out): (usize, usize),
    k: usize,
    stride: usize,
    padding: usize,
    groups: usize,
) -> ConvParams {
    ConvParams {
        batch,
        c_in,
        h: 13,
        w: 11,
        c_out,
        kh: k,
        kw: k,
        stride,
        padding,
        groups,
    }
}

/// Geometries of every kind the model zoo makes: a first layer, strided and padded 3x3, 5x5 without padding, 1x1,
/// grouped and depthwise (average pooling runs as one).
fn geometries() -> Vec<ConvParams> {
    vec![
        params(7, (3, 16), 3, 1, 1, 1),
        params(7, (64, 128), 3, 2, 1, 1),
        params(1, (64, 128), 5, 1, 0, 1),
        params(7, (64, 128), 1, 1, 0, 1),
        params(3, (16, 32), 3, 2, 1, 4),
        params(2, (32, 32), 3, 1, 1, 32),
    ]
}

const PASSES: [ConvPass; 4] = [
    ConvPass::Forward { bias: false },
    ConvPass::Forward { bias: true },
    ConvPass::BackwardData,
    ConvPass::BackwardFilter,
];

/// One geometry's operands on the device in the type `math` takes them (the bias f32), the buffer each pass writes
/// (NaN before it runs) and the CPU's values, on the same operands (rounded to bf16 under `Bf16`).
struct Case {
    p: ConvParams,
    math: Math,
    x: DeviceBuffer,
    w: DeviceBuffer,
    bias: DeviceBuffer,
    dy: DeviceBuffer,
    host: (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>),
}

impl Case {
    fn new(gpu: &Gpu, p: ConvParams, math: Math) -> Case {
        let operand = |n: usize, seed: u64| -> Vec<f32> {
            let v = rand_vec(n, seed);
            match math {
                Math::Bf16 => v
                    .into_iter()
                    .map(|x| half::bf16::from_f32(x).to_f32())
                    .collect(),
                _ => v,
            }
        };
        let x = operand(p.input_len(), 1);
        let w = operand(p.weight_len(), 2);
        let bias = rand_vec(p.c_out, 3);
        let dy = operand(p.output_len(), 4);
        Case {
            p,
            math,
            x: upload_as(gpu, &x, math),
            w: upload_as(gpu, &w, math),
            bias: gpu.upload_f32(&bias),
            dy: upload_as(gpu, &dy, math),
            host: (x, w, bias, dy),
        }
    }

    /// The CPU's result of `pass`.
    fn want(&self, pass: ConvPass) -> Vec<f32> {
        let (x, w, bias, dy) = &self.host;
        match pass {
            ConvPass::Forward { bias: false } => cpu::conv2d(x, w, None, &self.p),
            ConvPass::Forward { bias: true } => cpu::conv2d(x, w, Some(bias), &self.p),
            ConvPass::BackwardData => cpu::conv2d_backward_input(dy, w, &self.p),
            ConvPass::BackwardFilter => cpu::conv2d_backward_weight(x, dy, &self.p),
        }
    }

    /// A NaN-filled buffer for what `pass` writes, and the operands that point at it.
    fn target(&self, gpu: &Gpu, pass: ConvPass) -> (DeviceBuffer, usize, Operands) {
        let p = &self.p;
        let n = match pass {
            ConvPass::Forward { .. } => p.output_len(),
            ConvPass::BackwardData => p.input_len(),
            ConvPass::BackwardFilter => p.weight_len(),
        };
        let out = upload_as(gpu, &vec![f32::NAN; n], self.math);
        let mut x = Operands {
            x: self.x.ptr(),
            w: self.w.ptr(),
            y: self.dy.ptr(),
            bias: 0,
        };
        match pass {
            ConvPass::Forward { bias } => {
                x.y = out.ptr();
                if bias {
                    x.bias = self.bias.ptr();
                }
            }
            ConvPass::BackwardData => x.x = out.ptr(),
            ConvPass::BackwardFilter => x.w = out.ptr(),
        }
        (out, n, x)
    }

    /// The first `n` elements of what a pass wrote to `out`, as f32.
    fn read(&self, gpu: &Gpu, out: &DeviceBuffer, n: usize) -> Vec<f32> {
        download_as(gpu, out, n, self.math)
    }

    /// Variant `v` of `key`'s pass launched on fresh targets: how far it is off `want` beyond `tolerance` (see
    /// [`off`]), or why the launch failed; `None` when it matches.
    fn check(
        &self,
        gpu: &Gpu,
        dnn: &Dnn,
        (key, desc): (&Key, &Desc),
        v: Variant,
        (want, tolerance): (&[f32], f32),
    ) -> Option<String> {
        let (out, n, ops) = self.target(gpu, key.pass);
        let ws = gpu.alloc(v.workspace.max(1)).unwrap();
        // SAFETY: the operands hold what `key.p` describes in `key.math`'s type, the workspace what the algorithm
        // and its staging need.
        if let Err(e) = unsafe { dnn.launch(gpu, key, desc, v, ops, ws.ptr()) } {
            return Some(format!("launch failed: {e}"));
        }
        off(&self.read(gpu, &out, n), want, tolerance)
    }

    /// `pass` through `dnn` (choosing its algorithm if new); its result.
    fn run(&self, gpu: &Gpu, dnn: &mut Dnn, pass: ConvPass) -> Vec<f32> {
        let (out, n, x) = self.target(gpu, pass);
        let mut held: Vec<DeviceBuffer> = Vec::new();
        let mut workspace = |bytes: usize| -> Result<u64> {
            let b = gpu.alloc(bytes)?;
            let ptr = b.ptr();
            held.push(b);
            Ok(ptr)
        };
        // SAFETY: the operands hold what `p` describes for the pass.
        let ran = unsafe { dnn.run(gpu, (pass, self.math), &self.p, x, &mut workspace) }.unwrap();
        assert!(
            ran,
            "{}: cuDNN has no algorithm for it",
            label(&Key {
                pass,
                p: self.p,
                math: self.math
            })
        );
        self.read(gpu, &out, n)
    }
}

fn label_of(pass: ConvPass, p: &ConvParams) -> String {
    label(&Key {
        pass,
        p: *p,
        math: Math::Fp32,
    })
}

/// The algorithm `dnn` runs `pass` of `p` on.
#[track_caller]
fn kept(dnn: &Dnn, pass: ConvPass, p: &ConvParams) -> Variant {
    match dnn.table.get(&Key {
        pass,
        p: *p,
        math: Math::Fp32,
    }) {
        Some(Entry::Run(c)) => c.run,
        Some(Entry::Own) => panic!("{}: on the own kernels", label_of(pass, p)),
        None => panic!("{}: never decided", label_of(pass, p)),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_algorithm_cudnn_offers_matches_the_cpu() {
    let _mode = exclusive(false);
    let gpu = gpu();
    let dnn = fresh(&gpu);
    let mut fused = 0;
    let mut wrong = Vec::new();
    for p in geometries() {
        let case = Case::new(&gpu, p, Math::Fp32);
        for pass in PASSES {
            let key = Key {
                pass,
                p,
                math: Math::Fp32,
            };
            let what = label(&key);
            let desc = Desc::new(&key).unwrap_or_else(|| panic!("{what}: no descriptors"));
            let variants = dnn.variants(&key, &desc);
            assert!(!variants.is_empty(), "{what}: no algorithm offered");
            let want = case.want(pass);
            for v in variants {
                fused += usize::from(v.fused);
                if let Some(e) = case.check(&gpu, &dnn, (&key, &desc), v, (&want, 1e-4)) {
                    wrong.push(format!("{what} on {v:?}: {e}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} algorithm runs off the CPU's values:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        fused > 0,
        "no forward with a bias was offered IMPLICIT_PRECOMP_GEMM, so the fused bias never ran"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_fastest_algorithm_is_kept_and_saved_choices_run_without_timing() {
    let _mode = exclusive(false);
    assert_eq!(
        cudnn_mode(),
        CudnnMode::Timed,
        "run these tests without COHORT_CUDNN"
    );
    let gpu = gpu();
    let cases: Vec<Case> = geometries()[..3]
        .iter()
        .map(|&p| Case::new(&gpu, p, Math::Fp32))
        .collect();
    let mut first = fresh(&gpu);
    let mut got = Vec::new();
    for case in &cases {
        for pass in PASSES {
            let out = case.run(&gpu, &mut first, pass);
            let what = label_of(pass, &case.p);
            assert_near(&what, &out, &case.want(pass));
            // The same call again runs the kept algorithm (nothing is timed again): the same bits, where cuDNN
            // reports the algorithm as deterministic (one that adds with atomics may round otherwise).
            let deterministic = kept(&first, pass, &case.p).deterministic;
            let again = case.run(&gpu, &mut first, pass);
            if deterministic {
                assert_eq!(bits(&again), bits(&out), "{what}");
            } else {
                assert_near(&what, &again, &out);
            }
            got.push((what, deterministic, out));
        }
    }
    let report = first.take_report();
    assert_eq!(report.len(), cases.len() * PASSES.len(), "{report:?}");
    for t in &report {
        assert!(t.best_index < t.candidates && t.best_us > 0.0, "{t:?}");
        assert!(t.label.starts_with("cudnn "), "{t:?}");
    }
    let saved = first.choices();
    assert_eq!(saved.entries.len(), cases.len() * PASSES.len());
    assert_eq!(saved.cudnn_version, first.version() as u64);
    assert!(
        saved
            .entries
            .iter()
            .all(|e| matches!(e.decision, ConvDecision::Cudnn { .. })),
        "{saved:?}"
    );

    // A later process adopts them (through JSON, as tuning.json carries them) and times nothing.
    let json = serde_json::to_string(&saved).unwrap();
    let back: ConvChoices = serde_json::from_str(&json).unwrap();
    assert_eq!(back, saved);
    let mut second = fresh(&gpu);
    assert_eq!(second.adopt(&back), back.entries.len());
    let adopted = second.decisions();
    let mut again = Vec::new();
    for case in &cases {
        for pass in PASSES {
            again.push(case.run(&gpu, &mut second, pass));
        }
    }
    assert!(
        second.take_report().is_empty(),
        "adopted geometries were timed"
    );
    assert_eq!(second.decisions(), adopted, "a decision was made afresh");
    assert_eq!(
        second.choices(),
        saved,
        "the adopted state decided otherwise"
    );
    for (a, (what, deterministic, b)) in again.iter().zip(&got) {
        if *deterministic {
            assert_eq!(
                bits(a),
                bits(b),
                "{what}: the same algorithm gave other bits"
            );
        } else {
            assert_near(what, a, b);
        }
    }

    // Choices of another cuDNN are refused whole; an algorithm this cuDNN does not offer is left out alone.
    let mut third = fresh(&gpu);
    let foreign = ConvChoices {
        cudnn_version: saved.cudnn_version + 1,
        ..saved.clone()
    };
    assert_eq!(third.adopt(&foreign), 0);
    assert_eq!(third.decisions(), 0, "foreign choices were adopted");
    let mut broken = saved.clone();
    broken.entries[0].decision = ConvDecision::Cudnn {
        algo: 99,
        workspace: 0,
        fused_bias: false,
        channels_last: false,
        in_f32: false,
        math_type: None,
    };
    assert_eq!(third.adopt(&broken), saved.entries.len() - 1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn deterministic_mode_picks_the_same_deterministic_algorithms_in_every_state() {
    let _mode = exclusive(true);
    let gpu = gpu();
    // Backward data and filter have non-deterministic algorithms (atomic adds) at this size.
    let cases = [
        Case::new(&gpu, params(7, (64, 128), 3, 1, 1, 1), Math::Fp32),
        Case::new(&gpu, params(7, (3, 16), 5, 2, 1, 1), Math::Fp32),
    ];
    let mut runs: Vec<(ConvChoices, Vec<Vec<u32>>)> = Vec::new();
    for _ in 0..3 {
        let mut dnn = fresh(&gpu);
        let mut outs = Vec::new();
        for case in &cases {
            for pass in PASSES {
                let out = case.run(&gpu, &mut dnn, pass);
                assert_near(&label_of(pass, &case.p), &out, &case.want(pass));
                assert_eq!(bits(&case.run(&gpu, &mut dnn, pass)), bits(&out));
                outs.push(bits(&out));
            }
        }
        assert!(dnn.take_report().is_empty(), "deterministic mode timed");
        for (key, entry) in dnn.table.iter() {
            match entry {
                Entry::Run(c) => assert!(
                    c.run.deterministic && c.picked == Picked::Heuristic,
                    "{}: {:?} ({:?})",
                    label(key),
                    c.run,
                    c.picked
                ),
                Entry::Own => panic!("{}: cuDNN offered no deterministic algorithm", label(key)),
            }
        }
        runs.push((dnn.choices(), outs));
    }
    for (k, run) in runs.iter().enumerate().skip(1) {
        assert_eq!(run.0, runs[0].0, "state {k} chose otherwise");
        assert_eq!(run.1, runs[0].1, "state {k} gave other bits");
    }
}

#[test]
fn the_least_workspace_within_five_per_cent_of_the_fastest_is_kept() {
    let mib = 1 << 20;
    // Operands of 1 GiB: no workspace here is beyond one.
    let big = 1 << 30;
    // The fastest needs the most: a candidate 4 % slower with less is kept, one 6 % slower is not.
    assert_eq!(
        keep(
            &[Some(100.0), Some(104.0), Some(106.0)],
            &[300 * mib, 90 * mib, 0],
            big
        ),
        Some(1)
    );
    // Failed candidates are never kept, however little they need.
    assert_eq!(
        keep(&[None, Some(50.0), Some(51.0)], &[0, 8 * mib, 8 * mib], big),
        Some(1)
    );
    assert_eq!(keep(&[None, None], &[0, 0], big), None);
    assert_eq!(keep(&[Some(10.0), Some(30.0)], &[mib, 0], big), Some(0));
}

#[test]
fn workspace_beyond_the_largest_operand_must_buy_speed() {
    let mib = 1 << 20;
    // The ResNet's fp32 backward data pass over 16 MiB operands: 1.22x faster on 72 MiB (4.5 operands) does not
    // pay; the weighed time is 94.5 x 1.35 = 128 µs against 115.5.
    assert_eq!(
        keep(&[Some(115.5), Some(94.5)], &[0, 72 * mib], 16 * mib),
        Some(0)
    );
    // The CNN's forward over a 64 MiB output: 1.65x faster on 217 MiB (3.4 operands) does.
    assert_eq!(
        keep(&[Some(469.7), Some(284.6)], &[0, 217 * mib], 64 * mib),
        Some(1)
    );
    // Up to one operand's worth is free.
    assert_eq!(
        keep(&[Some(100.0), Some(80.0)], &[0, 16 * mib], 16 * mib),
        Some(1)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn winograd_is_an_fp32_candidate_for_wide_3x3_layers_within_tolerance_and_not_above_3x3() {
    let _mode = exclusive(false);
    let gpu = gpu();
    let dnn = fresh(&gpu);
    let wide = ConvParams {
        h: 32,
        w: 32,
        ..params(16, (64, 128), 3, 1, 1, 1)
    };
    let five = ConvParams {
        h: 32,
        w: 32,
        ..params(16, (64, 128), 5, 1, 2, 1)
    };
    let case = Case::new(&gpu, wide, Math::Fp32);
    for (pass, nonfused) in [
        (ConvPass::Forward { bias: false }, 7),
        (ConvPass::BackwardData, 5),
        (ConvPass::BackwardFilter, 5),
    ] {
        let key = Key {
            pass,
            p: wide,
            math: Math::Fp32,
        };
        let what = label(&key);
        let desc = Desc::new(&key).unwrap();
        let variants = dnn.variants(&key, &desc);
        let v = *variants
            .iter()
            .find(|v| v.algo == nonfused)
            .unwrap_or_else(|| panic!("{what}: WINOGRAD_NONFUSED not offered: {variants:?}"));
        let (out, n, x) = case.target(&gpu, pass);
        let ws = gpu.alloc(v.workspace.max(1)).unwrap();
        // SAFETY: the operands hold what `wide` describes, the workspace what the algorithm needs.
        unsafe { dnn.launch(&gpu, &key, &desc, v, x, ws.ptr()) }.unwrap();
        assert_near(
            &format!("{what} on {v:?}"),
            &gpu.download_f32(&out, n),
            &case.want(pass),
        );

        let key = Key { p: five, ..key };
        let desc = Desc::new(&key).unwrap();
        let algos: Vec<u32> = dnn.variants(&key, &desc).iter().map(|v| v.algo).collect();
        assert!(!algos.contains(&nonfused), "{}: {algos:?}", label(&key));
    }
}

/// `v` on the device as the operands of `math` are held: f32, or bf16 (the values rounded to it).
fn upload_as(gpu: &Gpu, v: &[f32], math: Math) -> DeviceBuffer {
    if math.f32_operands() {
        return gpu.upload_f32(v);
    }
    let h: Vec<u16> = v
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let buf = gpu.alloc(h.len().max(1) * 2).unwrap();
    // SAFETY: the buffer holds these bytes.
    unsafe { gpu.htod(buf.ptr(), bytemuck::cast_slice(&h)).unwrap() };
    buf
}

/// The first `n` elements of `buf`, held as `math`'s operands are, as f32.
fn download_as(gpu: &Gpu, buf: &DeviceBuffer, n: usize, math: Math) -> Vec<f32> {
    if math.f32_operands() {
        return gpu.download_f32(buf, n);
    }
    let mut h = vec![0u16; n];
    // SAFETY: the buffer holds n 16-bit elements.
    unsafe {
        gpu.dtoh(buf.ptr(), bytemuck::cast_slice_mut(&mut h))
            .unwrap()
    };
    h.into_iter()
        .map(|b| half::bf16::from_bits(b).to_f32())
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_algorithm_in_every_layout_matches_the_cpu_under_tf32_and_bf16() {
    let _mode = exclusive(false);
    let gpu = gpu();
    let dnn = fresh(&gpu);
    let (mut channels_last, mut in_f32) = (0, 0);
    let mut wrong = Vec::new();
    // Within these fractions of the largest magnitude: TF32 rounds the operands to 10-bit mantissas, bf16 to 7
    // bits and its output too (the CPU reference takes the same rounded operands).
    for (math, tolerance) in [(Math::Tf32, 5e-3), (Math::Bf16, 1e-2)] {
        // The 16-bit passes take no bias (`conv_pass_16bit`).
        let passes = PASSES
            .into_iter()
            .filter(|&pass| math == Math::Tf32 || pass != (ConvPass::Forward { bias: true }));
        for p in geometries() {
            let case = Case::new(&gpu, p, math);
            for pass in passes.clone() {
                let key = Key { pass, p, math };
                let what = label(&key);
                let desc = Desc::new(&key).unwrap_or_else(|| panic!("{what}: no descriptors"));
                let want = case.want(pass);
                let variants = dnn.variants(&key, &desc);
                // Enumerated rather than listed by the heuristics (`Dnn::filter_16bit`): still offered.
                assert!(
                    math != Math::Bf16
                        || pass != ConvPass::BackwardFilter
                        || variants.iter().any(|v| v.layout == Layout::Nchw),
                    "{what}: no NCHW candidate"
                );
                for v in variants {
                    channels_last += usize::from(v.layout == Layout::Nhwc);
                    in_f32 += usize::from(v.layout == Layout::F32);
                    if let Some(e) = case.check(&gpu, &dnn, (&key, &desc), v, (&want, tolerance)) {
                        wrong.push(format!("{what} on {v:?}: {e}"));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} algorithm runs off the CPU's values:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        channels_last > 0,
        "no channels-last algorithm was offered under TF32 or bf16"
    );
    assert!(in_f32 > 0, "no f32 algorithm was offered under bf16");
}
