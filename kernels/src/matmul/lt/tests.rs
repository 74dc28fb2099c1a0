//! GPU tests of saved choices, their adoption and deterministic mode. Each test makes [`Lt`] states of its own
//! beside the device's, so that it sees its own decisions alone; tests that depend on the mode hold it
//! ([`exclusive`]).

use super::*;
use crate::cuda::DeviceBuffer;
use crate::determinism::exclusive;
use crate::matmul::{GemmChoices, GemmDecision, GemmDevice, MatmulShape, cuda as mm_cuda};

fn up(gpu: &Gpu, v: &[f32]) -> DeviceBuffer {
    let buf = gpu.alloc(v.len() * 4).unwrap();
    // SAFETY: the buffer holds exactly these bytes.
    unsafe { gpu.htod(buf.ptr(), bytemuck::cast_slice(v)).unwrap() };
    buf
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A new cuBLASLt state on this thread, timing whatever it may (whatever `COHORT_GEMM_TUNING` says).
fn fresh(gpu: &Gpu) -> Lt {
    gpu.bind().unwrap();
    let mut lt = Lt::new().unwrap();
    lt.tune = true;
    lt
}

/// `batch` column-major products D = A·B on device buffers, with one A for all, and their values from the host.
struct Product {
    g: Geometry,
    a: DeviceBuffer,
    b: DeviceBuffer,
    d: DeviceBuffer,
    want: Vec<f32>,
}

impl Product {
    fn new(gpu: &Gpu, m: usize, n: usize, k: usize, batch: usize) -> Product {
        let g = Geometry {
            trans_a: false,
            trans_b: false,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            lda: m as i32,
            ldb: k as i32,
            ldc: m as i32,
            batch: batch as i32,
            stride_a: 0,
            stride_b: (k * n) as i64,
            stride_c: (m * n) as i64,
        };
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let b: Vec<f32> = (0..batch * k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
            .collect();
        let mut want = vec![0f32; batch * m * n];
        for e in 0..batch {
            for j in 0..n {
                for i in 0..m {
                    let sum: f64 = (0..k)
                        .map(|p| f64::from(a[i + p * m]) * f64::from(b[e * k * n + p + j * k]))
                        .sum();
                    want[e * m * n + i + j * m] = sum as f32;
                }
            }
        }
        Product {
            g,
            a: up(gpu, &a),
            b: up(gpu, &b),
            d: up(gpu, &vec![f32::NAN; want.len()]),
            want,
        }
    }

    fn x(&self) -> Operands {
        Operands {
            a: self.a.ptr(),
            b: self.b.ptr(),
            d: self.d.ptr(),
            bias: 0,
        }
    }

    fn key(&self) -> Key {
        Key::of(&self.g, Epilogue::None, self.x())
    }

    /// Runs it on `lt` twice (the second time on its entry alone), checks D and returns it.
    fn run(&self, gpu: &Gpu, lt: &mut Lt) -> Vec<f32> {
        for _ in 0..2 {
            // SAFETY: the buffers hold what `g` describes; D overlaps neither input.
            let ran =
                unsafe { lt.matmul(gpu, &self.g, Epilogue::None, self.x(), &|| "test".into()) };
            assert!(ran.unwrap(), "cuBLASLt refused {:?}", self.g);
        }
        let mut got = vec![0f32; self.want.len()];
        // SAFETY: D holds want.len() f32.
        unsafe {
            gpu.dtoh(self.d.ptr(), bytemuck::cast_slice_mut(&mut got))
                .unwrap()
        };
        for (i, (x, w)) in got.iter().zip(&self.want).enumerate() {
            assert!(
                (x - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "element {i}: {x} vs {w}"
            );
        }
        got
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn saved_choices_round_trip_and_a_fresh_state_adopts_them_without_timing() {
    let _mode = exclusive(false);
    let gpu = Gpu::get(0).unwrap();
    let p = Product::new(&gpu, 88, 52, 40, 3);
    let mut first = fresh(&gpu);
    let got = p.run(&gpu, &mut first);
    assert!(
        !first.take_report().is_empty(),
        "the fresh geometry was not tuned"
    );
    let made = first.decisions();
    assert!(made > 0);
    let saved = first.choices(&gpu);
    assert_eq!(saved.device, device(&gpu));
    let key = p.key();
    assert!(
        saved
            .entries
            .iter()
            .any(|e| e.geometry == key.g && e.align == key.align),
        "{saved:?}"
    );
    let json = serde_json::to_string(&saved).unwrap();
    let back: GemmChoices = serde_json::from_str(&json).unwrap();
    assert_eq!(back, saved);

    // The state that made them has each one already: it keeps its own and counts nothing new.
    assert_eq!(first.adopt(&gpu, &back).unwrap(), 0);
    assert_eq!(first.decisions(), made);

    let mut second = fresh(&gpu);
    assert_eq!(second.adopt(&gpu, &back).unwrap(), back.entries.len());
    let adopted = second.decisions();
    assert_eq!(adopted, back.entries.len() as u64);
    let again = p.run(&gpu, &mut second);
    let report = second.take_report();
    assert!(
        report.is_empty(),
        "adopted geometries were timed: {report:?}"
    );
    assert_eq!(second.decisions(), adopted, "a decision was made afresh");
    assert_eq!(
        second.choices(&gpu),
        saved,
        "the adopted state decided otherwise"
    );
    assert_eq!(
        bits(&again),
        bits(&got),
        "the same algorithm gave other bits"
    );

    // Choices of another device or cuBLASLt are refused whole.
    for foreign in [
        GemmChoices {
            device: GemmDevice {
                sm_count: saved.device.sm_count + 1,
                ..saved.device.clone()
            },
            ..saved.clone()
        },
        GemmChoices {
            device: GemmDevice {
                cublaslt_version: saved.device.cublaslt_version + 1,
                ..saved.device.clone()
            },
            ..saved.clone()
        },
    ] {
        let mut third = fresh(&gpu);
        match third.adopt(&gpu, &foreign) {
            Err(Error::ForeignGemmChoices { made_on, this }) => {
                assert_ne!(made_on, this);
                assert!(this.contains(gpu.name()), "{this}");
            }
            other => panic!("foreign choices gave {other:?}"),
        }
        assert_eq!(third.decisions(), 0, "foreign choices were adopted");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_counts_its_decisions_and_keeps_its_own_on_adoption() {
    let _mode = exclusive(false);
    let gpu = Gpu::get(0).unwrap();
    let before = gpu.gemm_choice_count();
    // A product no other test makes.
    let s = MatmulShape::plain(40, 24, 104);
    let (a, b) = (
        up(&gpu, &vec![0.5; 40 * 104]),
        up(&gpu, &vec![0.25; 104 * 24]),
    );
    let out = up(&gpu, &[0.0; 40 * 24]);
    // SAFETY: the buffers hold what `s` describes.
    unsafe {
        mm_cuda::matmul(
            &gpu,
            crate::cuda::CudaType::F32,
            a.ptr(),
            b.ptr(),
            out.ptr(),
            &s,
        )
    }
    .unwrap();
    gpu.synchronize().unwrap();
    assert!(
        gpu.gemm_choice_count() > before,
        "a new geometry was not counted"
    );
    let saved = gpu.gemm_choices();
    assert_eq!(saved.device, device(&gpu));
    assert!(saved.device.cublaslt_version > 0 && saved.device.compute_capability.0 >= 7);
    assert!(!saved.entries.is_empty());
    // Entries only ever grow or change, never go: every saved one is still decided on.
    assert_eq!(gpu.adopt_gemm_choices(&saved).unwrap(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn deterministic_mode_takes_the_heuristics_first_pick_in_every_state() {
    let _mode = exclusive(true);
    let gpu = Gpu::get(0).unwrap();
    // Thin (24 contracted terms) and wide with a ragged last tile (272 columns of D): timing would try the
    // thread-per-output kernel and a split, which deterministic mode never picks.
    let p = Product::new(&gpu, 64, 272, 24, 1);
    let (mut one, mut two) = (fresh(&gpu), fresh(&gpu));
    let a = p.run(&gpu, &mut one);
    let b = p.run(&gpu, &mut two);
    assert!(
        one.take_report().is_empty() && two.take_report().is_empty(),
        "deterministic mode timed"
    );
    // The words of one pick may differ between heuristic queries in a process by one that is no part of its
    // configuration (seen on an H200 with cuBLASLt 13.1), so algorithms are compared by their configuration.
    let key = p.key();
    let desc = Desc::new(&key.g, &key.epilogue).unwrap();
    let first = config(&desc.candidates(fresh(&gpu).handle, key.align).unwrap()[0].algo);
    for lt in [&one, &two] {
        let made = lt.choices(&gpu);
        let [c] = &made.entries[..] else {
            panic!("one product made {made:?}");
        };
        let GemmDecision::Algorithm { algo, .. } = c.decision else {
            panic!("not an algorithm: {made:?}");
        };
        let got = config(&sys::cublasLtMatmulAlgo_t { data: algo });
        assert_eq!(got, first, "not the heuristic's first pick: {made:?}");
    }
    assert_eq!(bits(&a), bits(&b), "the same algorithm gave other bits");
}

/// An algorithm's configuration attributes (id, tile, split-K, reduction, swizzle, custom option, stages, inner and
/// cluster shape).
fn config(algo: &sys::cublasLtMatmulAlgo_t) -> Vec<u64> {
    use sys::cublasLtMatmulAlgoConfigAttributes_t::*;
    [
        CUBLASLT_ALGO_CONFIG_ID,
        CUBLASLT_ALGO_CONFIG_TILE_ID,
        CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
        CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
        CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
        CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
        CUBLASLT_ALGO_CONFIG_STAGES_ID,
        CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID,
        CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
    ]
    .into_iter()
    .map(|attr| {
        let (mut size, mut v) = (0usize, 0u64);
        // SAFETY: a size query (no buffer), then a read of that many bytes (at most 8) into `v`.
        unsafe {
            sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                attr,
                std::ptr::null_mut(),
                0,
                &mut size,
            )
            .result()
            .unwrap();
            assert!(size <= 8, "{attr:?} is {size} bytes");
            let mut written = 0usize;
            sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                attr,
                (&mut v) as *mut u64 as *mut c_void,
                size,
                &mut written,
            )
            .result()
            .unwrap();
        }
        v
    })
    .collect()
}
