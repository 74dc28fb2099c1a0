//! f32 products through cuBLASLt, each geometry on the algorithm that timed fastest.
//!
//! cuBLAS runs the first algorithm of its heuristics. For the thin and batched products of small
//! and fused models that pick is often not the fastest one it offers. So the first time a
//! geometry is met outside a graph capture, every candidate of the heuristics runs on the real
//! operands, timed with events, and the fastest is kept for that geometry (PyTorch's TunableOp
//! and XLA's autotuner do the same). A geometry first met while capturing runs the heuristic's
//! pick, and is tuned at its next eager call. `COHORT_GEMM_TUNING=0` keeps the heuristic's pick.
//! Two more candidates are timed where they apply: the product split in two at a ragged last
//! tile of columns, and for thin products a thread per output element ([`super::thin`]).
//!
//! The decisions can be saved and adopted by a later process ([`saved`]), which then times
//! nothing it adopted. In deterministic mode ([`crate::determinism`]) nothing is timed: every
//! geometry runs the heuristic's first pick, the same in every process.

mod saved;
#[cfg(test)]
mod tests;

pub(crate) use saved::device;

use std::ffi::c_void;
use std::mem::{MaybeUninit, size_of_val};

use cudarc::cublaslt::{result as lt, sys};

use super::{Epilogue, Geometry, thin};
use crate::cuda::decisions::Decisions;
use crate::cuda::{GemmTuning, Gpu, cuda_err};
use crate::{Error, Result};

/// Most workspace one product may use (split-K partial sums).
const MAX_WORKSPACE: usize = 8 << 20;
/// Candidates asked of the heuristics.
const CANDIDATES: usize = 16;
/// Parts the contracted dimension of a candidate is also tried split into.
const SPLITS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// Timed runs per candidate, after one untimed.
const RUNS: usize = 4;

impl Epilogue {
    fn kind(&self) -> sys::cublasLtEpilogue_t {
        use sys::cublasLtEpilogue_t::*;
        match self {
            Epilogue::None => CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias { relu: false, .. } => CUBLASLT_EPILOGUE_BIAS,
            Epilogue::Bias { relu: true, .. } => CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::SumsOfA { .. } => CUBLASLT_EPILOGUE_BGRADA,
        }
    }
}

/// A geometry with its epilogue and the alignment (bytes, at most 256) of each operand's batches.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    g: Geometry,
    epilogue: Epilogue,
    align: [u32; 3],
}

impl Key {
    fn of(g: &Geometry, epilogue: Epilogue, x: Operands) -> Key {
        Key {
            g: *g,
            epilogue,
            align: [
                alignment(x.a, g.stride_a, g.batch),
                alignment(x.b, g.stride_b, g.batch),
                alignment(x.d, g.stride_c, g.batch),
            ],
        }
    }
}

/// Largest power of two up to 256 dividing the address of every batch of an f32 operand.
fn alignment(ptr: u64, stride: i64, batch: i32) -> u32 {
    let stride_bytes = if batch > 1 { stride as u64 * 4 } else { 0 };
    1 << (ptr | stride_bytes | 256).trailing_zeros()
}

/// `g` as two products over D's columns `..n0` and `n0..`, with the operands of the second.
fn halves(g: &Geometry, x: Operands, n0: i32) -> (Geometry, Geometry, Operands) {
    let head = Geometry { n: n0, ..*g };
    let tail = Geometry { n: g.n - n0, ..*g };
    // Column n0 of op(B): row n0 of a transposed B, else column n0; of D, column n0.
    let b_off = if g.trans_b {
        n0 as u64
    } else {
        n0 as u64 * g.ldb as u64
    };
    let d_off = n0 as u64 * g.ldc as u64;
    let xt = Operands {
        b: x.b + 4 * b_off,
        d: x.d + 4 * d_off,
        ..x
    };
    (head, tail, xt)
}

/// The cuBLASLt handle of a device and the algorithm chosen per geometry.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// How each geometry runs, the decisions made and the timings to report.
    table: Decisions<Key, Entry>,
    tune: bool,
}

// SAFETY: the handle is only used under the Gpu's mutex, one thread at a time.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.table.clear();
        // SAFETY: created by cublasLtCreate, destroyed once, after every descriptor made with it.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// How a geometry runs.
enum Entry {
    /// cuBLASLt has no algorithm for it: it runs on cuBLAS.
    Refused,
    /// As two products, the columns before the given one and the rest.
    Split(i32),
    /// A thread per output element ([`thin`]).
    Thin,
    Run(Choice),
}

/// The descriptors of one geometry and the algorithm it runs.
struct Choice {
    desc: Desc,
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
    picked: Picked,
}

/// How a [`Choice`] was made.
#[derive(Clone, Copy)]
enum Picked {
    /// The heuristic's first pick, timed at the geometry's next call that may time.
    Heuristic,
    /// The fastest candidate, at this many µs per product.
    Timed(f64),
    /// From saved choices: never timed.
    Adopted,
}

impl Picked {
    fn us(self) -> Option<f64> {
        match self {
            Picked::Timed(us) => Some(us),
            _ => None,
        }
    }
}

/// Operation and layout descriptors, destroyed when dropped.
struct Desc {
    op: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: each was created once by this value and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matmul_desc(self.op);
        }
    }
}

/// A column-major f32 layout of `rows x cols` with leading dimension `ld`, batched when `batch > 1`.
fn layout(
    rows: i32,
    cols: i32,
    ld: i32,
    batch: i32,
    stride: i64,
) -> Result<sys::cublasLtMatrixLayout_t> {
    let l = lt::create_matrix_layout(
        sys::cudaDataType::CUDA_R_32F,
        rows as u64,
        cols as u64,
        ld as i64,
    )
    .map_err(|e| cuda_err("cublasLtMatrixLayoutCreate", e))?;
    if batch > 1 {
        let set = |attr, v: *const c_void, size| {
            // SAFETY: `l` is live; `v` points at `size` bytes of the attribute's type.
            unsafe { lt::set_matrix_layout_attribute(l, attr, v, size) }
                .map_err(|e| cuda_err("cublasLtMatrixLayoutSetAttribute", e))
        };
        let r = set(
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&batch) as *const i32 as *const c_void,
            size_of_val(&batch),
        )
        .and_then(|_| {
            set(
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride) as *const i64 as *const c_void,
                size_of_val(&stride),
            )
        });
        if let Err(e) = r {
            // SAFETY: created above, not used after.
            let _ = unsafe { lt::destroy_matrix_layout(l) };
            return Err(e);
        }
    }
    Ok(l)
}

impl Desc {
    fn new(g: &Geometry, e: &Epilogue) -> Result<Desc> {
        let op = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| cuda_err("cublasLtMatmulDescCreate", e))?;
        // Built field by field so that whatever was made is dropped on an error.
        let mut d = Desc {
            op,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
        };
        for (attr, t) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                g.trans_a,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                g.trans_b,
            ),
        ] {
            let op: i32 = i32::from(t); // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
            // SAFETY: the descriptor is live; the attribute is a cublasOperation_t (an i32).
            unsafe {
                lt::set_matmul_desc_attribute(d.op, attr, (&op) as *const i32 as *const c_void, 4)
            }
            .map_err(|e| cuda_err("cublasLtMatmulDescSetAttribute", e))?;
        }
        let (kind, stride) = (e.kind() as u32, e.stride());
        // SAFETY: the descriptor is live; the epilogue is a cublasLtEpilogue_t (a u32), the
        // bias's batch stride an i64.
        unsafe {
            lt::set_matmul_desc_attribute(
                d.op,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&kind) as *const u32 as *const c_void,
                4,
            )
            .and_then(|_| {
                lt::set_matmul_desc_attribute(
                    d.op,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                    (&stride) as *const i64 as *const c_void,
                    8,
                )
            })
        }
        .map_err(|e| cuda_err("cublasLtMatmulDescSetAttribute", e))?;
        let (ar, ac) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
        let (br, bc) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
        d.a = layout(ar, ac, g.lda, g.batch, g.stride_a)?;
        d.b = layout(br, bc, g.ldb, g.batch, g.stride_b)?;
        d.c = layout(g.m, g.n, g.ldc, g.batch, g.stride_c)?;
        Ok(d)
    }

    /// The heuristic's candidates for operands aligned to `align` bytes (A, B, C and D).
    fn candidates(
        &self,
        handle: sys::cublasLtHandle_t,
        align: [u32; 3],
    ) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>> {
        let pref =
            lt::create_matmul_pref().map_err(|e| cuda_err("cublasLtMatmulPreferenceCreate", e))?;
        let ws = MAX_WORKSPACE as u64;
        let attrs = [
            (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]),
            (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]),
            (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]),
            (sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]),
        ];
        // SAFETY: `pref` is live until destroyed below; each value has its attribute's type.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const c_void,
                8,
            )
            .and_then(|_| {
                attrs.iter().try_for_each(|(attr, v)| {
                    lt::set_matmul_pref_attribute(pref, *attr, v as *const u32 as *const c_void, 4)
                })
            })
        }
        .map_err(|e| cuda_err("cublasLtMatmulPreferenceSetAttribute", e));
        let mut found =
            vec![MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed(); CANDIDATES];
        let mut count = 0i32;
        let r = r.and_then(|_| {
            // SAFETY: every descriptor is live; `found` has room for CANDIDATES results.
            unsafe {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    handle,
                    self.op,
                    self.a,
                    self.b,
                    self.c,
                    self.c,
                    pref,
                    CANDIDATES as i32,
                    found.as_mut_ptr().cast(),
                    &mut count,
                )
            }
            .result()
            .map_err(|e| cuda_err("cublasLtMatmulAlgoGetHeuristic", e))
        });
        // SAFETY: created above, not used after.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        r?;
        Ok(found
            .into_iter()
            .take(count.max(0) as usize)
            // SAFETY: zero-initialised plain data, the first `count` filled in by cuBLASLt.
            .map(|r| unsafe { r.assume_init() })
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .collect())
    }
}

impl Desc {
    /// `cands` and, for each, its variants splitting the contracted dimension in 1 to 32 parts
    /// (those cuBLASLt accepts for this product within the workspace). The heuristics rarely
    /// offer a split for small products, where spreading K over more blocks is what fills the GPU.
    fn with_split_k(
        &self,
        handle: sys::cublasLtHandle_t,
        cands: Vec<sys::cublasLtMatmulHeuristicResult_t>,
    ) -> Vec<sys::cublasLtMatmulHeuristicResult_t> {
        use sys::cublasLtMatmulAlgoConfigAttributes_t::*;
        let mut all = cands.clone();
        for c in &cands {
            for splits in SPLITS {
                let mut algo = c.algo;
                let scheme = if splits == 1 {
                    sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE
                } else {
                    sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                } as u32;
                // SAFETY: `algo` is a copy of an initialised algorithm; the attributes are u32.
                let set = unsafe {
                    sys::cublasLtMatmulAlgoConfigSetAttribute(
                        &mut algo,
                        CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                        (&splits) as *const u32 as *const c_void,
                        4,
                    )
                    .result()
                    .and_then(|_| {
                        sys::cublasLtMatmulAlgoConfigSetAttribute(
                            &mut algo,
                            CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                            (&scheme) as *const u32 as *const c_void,
                            4,
                        )
                        .result()
                    })
                };
                let Some(checked) = set.ok().and_then(|_| self.check(handle, &algo)) else {
                    continue;
                };
                let fits = checked.workspaceSize <= MAX_WORKSPACE;
                if fits && all.iter().all(|a| a.algo.data != algo.data) {
                    all.push(sys::cublasLtMatmulHeuristicResult_t { algo, ..checked });
                }
            }
        }
        all
    }

    /// cuBLASLt's verdict on running `algo` for this product: `None` where it cannot, else the
    /// result with the workspace it needs.
    fn check(
        &self,
        handle: sys::cublasLtHandle_t,
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> Option<sys::cublasLtMatmulHeuristicResult_t> {
        let mut checked = MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
        // SAFETY: the descriptors are live; `algo` holds words cuBLASLt made (in this process, or
        // saved by one on the same device and library), which this call validates; `checked`
        // has room for one result.
        unsafe {
            sys::cublasLtMatmulAlgoCheck(
                handle,
                self.op,
                self.a,
                self.b,
                self.c,
                self.c,
                algo,
                checked.as_mut_ptr(),
            )
        }
        .result()
        .ok()?;
        // SAFETY: filled in by a successful check.
        Some(unsafe { checked.assume_init() })
    }
}

/// Operands of one call: A, B, the output (column-major roles) and the epilogue's bias (0:
/// none), as device addresses.
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    pub a: u64,
    pub b: u64,
    pub d: u64,
    pub bias: u64,
}

impl Lt {
    pub(crate) fn new() -> Result<Lt> {
        // SAFETY: only tries to open the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Cuda(
                "cuBLASLt (libcublasLt.so.13) was not found: install the CUDA 13 toolkit's cuBLAS \
                 or put its lib folder on LD_LIBRARY_PATH"
                    .to_string(),
            ));
        }
        let handle = lt::create_handle().map_err(|e| cuda_err("cublasLtCreate", e))?;
        let tune = std::env::var("COHORT_GEMM_TUNING").map_or(true, |v| v != "0");
        Ok(Lt {
            handle,
            table: Decisions::new(),
            tune,
        })
    }

    /// The tunings made since the last call.
    pub(crate) fn take_report(&mut self) -> Vec<GemmTuning> {
        self.table.take_report()
    }

    /// Queues `D = epilogue(op(A)·op(B))` on the compute stream, tuning the geometry first if it
    /// is new.
    /// Returns `false`, queuing nothing, for a geometry cuBLASLt offers no algorithm for.
    ///
    /// # Safety
    /// The operands must hold what `g` describes, in f32, on `gpu`; D must not overlap A or B.
    pub(crate) unsafe fn matmul(
        &mut self,
        gpu: &Gpu,
        g: &Geometry,
        epilogue: Epilogue,
        x: Operands,
        label: &dyn Fn() -> String,
    ) -> Result<bool> {
        let key = Key::of(g, epilogue, x);
        // Timing waits for the device, which a capture cannot, and its pick depends on the moment,
        // which deterministic mode forbids.
        let timing = self.tune && !gpu.is_capturing() && !crate::deterministic();
        match self.table.get(&key) {
            Some(Entry::Refused) => return Ok(false),
            Some(&Entry::Split(n0)) => {
                // SAFETY: forwarded to the caller; the two halves cover D's columns.
                return unsafe { self.matmul_split(gpu, g, epilogue, x, n0, label) };
            }
            Some(Entry::Thin) => {}
            Some(Entry::Run(c)) if !timing || !matches!(c.picked, Picked::Heuristic) => {}
            _ => match self.choose(gpu, &key, x, timing, label)? {
                None => {
                    self.table.decide(key, Entry::Refused);
                    return Ok(false);
                }
                Some(c) => {
                    let tuned = c.picked.us();
                    self.table.decide(key, Entry::Run(c));
                    let thin = match tuned {
                        // SAFETY: forwarded to the caller.
                        Some(best) => unsafe { self.thin_pays(gpu, &key, x, best) }?,
                        None => false,
                    };
                    if thin {
                        self.table.decide(key, Entry::Thin);
                    } else {
                        // SAFETY: forwarded to the caller.
                        let split = unsafe { self.split_pays(gpu, &key, x, label) }?;
                        if let Some(n0) = split {
                            // SAFETY: as above.
                            return unsafe { self.matmul_split(gpu, g, epilogue, x, n0, label) };
                        }
                    }
                }
            },
        }
        match self.table.get(&key) {
            Some(Entry::Run(c)) => {
                // SAFETY: forwarded to the caller.
                gpu.timed(label, || unsafe {
                    self.run(gpu, &c.desc, &c.algo, c.workspace, x)
                })?;
            }
            Some(Entry::Thin) => {
                // SAFETY: forwarded to the caller.
                gpu.timed(label, || unsafe { thin::run(gpu, g, &epilogue, x) })?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The first `n0` columns of D, then the rest, as two products (B's and D's columns split
    /// alike).
    ///
    /// # Safety
    /// As [`Lt::matmul`].
    pub(crate) unsafe fn matmul_split(
        &mut self,
        gpu: &Gpu,
        g: &Geometry,
        epilogue: Epilogue,
        x: Operands,
        n0: i32,
        label: &dyn Fn() -> String,
    ) -> Result<bool> {
        let (head, tail, xt) = halves(g, x, n0);
        let part = |n: i32| move || format!("{} (columns of {n})", label());
        // SAFETY: each half addresses a part of the caller's operands.
        unsafe {
            Ok(self.matmul(gpu, &head, epilogue, x, &part(head.n))?
                && self.matmul(gpu, &tail, epilogue, xt, &part(tail.n))?)
        }
    }

    /// Where the just tuned `key` runs faster as two products, the column that splits them: one
    /// product over D's columns up to the last multiple of 128 (no tile of it mostly padding), one
    /// over the ragged rest. Tried for plain products with at least 256 columns and a rest of at
    /// most 32; the split is kept (as the key's entry) if the two halves time at least 3 % faster.
    ///
    /// # Safety
    /// As [`Lt::matmul`].
    unsafe fn split_pays(
        &mut self,
        gpu: &Gpu,
        key: &Key,
        x: Operands,
        label: &dyn Fn() -> String,
    ) -> Result<Option<i32>> {
        let g = key.g;
        let rest = g.n % 128;
        let whole = match self.table.get(key) {
            Some(Entry::Run(c)) if key.epilogue == Epilogue::None => c.picked.us(),
            _ => None,
        };
        let Some(whole) = whole else {
            return Ok(None);
        };
        if g.n < 256 || rest == 0 || rest > 32 {
            return Ok(None);
        }
        let n0 = g.n - rest;
        let (head, tail, xt) = halves(&g, x, n0);
        let mut us = 0.0;
        for (part, xp) in [(head, x), (tail, xt)] {
            let k = Key::of(&part, key.epilogue, xp);
            let n = part.n;
            let Some(c) = self.choose(gpu, &k, xp, true, &|| {
                format!("{} (columns of {n})", label())
            })?
            else {
                return Ok(None);
            };
            us += c.picked.us().unwrap_or(f64::INFINITY);
            self.table.decide(k, Entry::Run(c));
        }
        if us >= 0.97 * whole {
            return Ok(None);
        }
        self.table.decide(*key, Entry::Split(n0));
        Ok(Some(n0))
    }

    /// The heuristic's pick, or (when `timing`) the fastest candidate; `None` when the heuristics
    /// offer nothing for this geometry.
    fn choose(
        &mut self,
        gpu: &Gpu,
        key: &Key,
        x: Operands,
        timing: bool,
        label: &dyn Fn() -> String,
    ) -> Result<Option<Choice>> {
        let desc = Desc::new(&key.g, &key.epilogue)?;
        let Ok(cands) = desc.candidates(self.handle, key.align) else {
            return Ok(None);
        };
        let Some(first) = cands.first() else {
            return Ok(None);
        };
        if !timing {
            return Ok(Some(Choice {
                algo: first.algo,
                workspace: first.workspaceSize,
                desc,
                picked: Picked::Heuristic,
            }));
        }
        // The heuristic's candidates come first, its own pick at 0.
        let cands = desc.with_split_k(self.handle, cands);
        let mut times = Vec::with_capacity(cands.len());
        for c in &cands {
            // SAFETY: the caller's operands; a candidate that fails is skipped.
            times.push(unsafe { self.time(gpu, &desc, c, x) }.ok());
        }
        let best = times
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (i, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((best, best_us)) = best else {
            return Ok(None);
        };
        self.table.note(GemmTuning {
            label: label(),
            candidates: cands.len(),
            heuristic_us: times[0],
            best_us,
            best_index: best,
            workspace: cands[best].workspaceSize,
        });
        Ok(Some(Choice {
            algo: cands[best].algo,
            workspace: cands[best].workspaceSize,
            desc,
            picked: Picked::Timed(best_us),
        }))
    }

    /// Whether a thread per output element ([`thin`]) runs the just tuned `key` at least 3 %
    /// faster than its fastest cuBLASLt algorithm (`best` µs); the tuning report says so if it does.
    ///
    /// # Safety
    /// As [`Lt::matmul`].
    unsafe fn thin_pays(&mut self, gpu: &Gpu, key: &Key, x: Operands, best: f64) -> Result<bool> {
        if !thin::eligible(&key.g, &key.epilogue) {
            return Ok(false);
        }
        // SAFETY: forwarded to the caller.
        let us = time_runs(gpu, || unsafe { thin::run(gpu, &key.g, &key.epilogue, x) })?;
        if us >= 0.97 * best {
            return Ok(false);
        }
        if let Some(r) = self.table.last_noted() {
            r.best_index = r.candidates;
            r.candidates += 1;
            r.best_us = us;
            r.workspace = 0;
        }
        Ok(true)
    }

    /// Mean µs of `c` over RUNS runs after one untimed run (waits for the device).
    unsafe fn time(
        &self,
        gpu: &Gpu,
        desc: &Desc,
        c: &sys::cublasLtMatmulHeuristicResult_t,
        x: Operands,
    ) -> Result<f64> {
        // SAFETY: forwarded to the caller.
        time_runs(gpu, || unsafe {
            self.run(gpu, desc, &c.algo, c.workspaceSize, x)
        })
    }

    /// Queues one product with `algo` and a workspace of `workspace` bytes.
    unsafe fn run(
        &self,
        gpu: &Gpu,
        desc: &Desc,
        algo: &sys::cublasLtMatmulAlgo_t,
        workspace: usize,
        x: Operands,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        if x.bias != 0 {
            // SAFETY: the descriptor is live (and used by this thread only, under the Gpu's
            // mutex); the bias pointer is a device address (a u64).
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc.op,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&x.bias) as *const u64 as *const c_void,
                    8,
                )
            }
            .map_err(|e| cuda_err("cublasLtMatmulDescSetAttribute", e))?;
        }
        gpu.with_scratch(workspace.max(1), |ws| {
            // SAFETY: descriptors live; operands per the caller; alpha / beta are host scalars
            // read during the call; the workspace is the stream's (or the graph's) own.
            unsafe {
                lt::matmul(
                    self.handle,
                    desc.op,
                    (&alpha) as *const f32 as *const c_void,
                    (&beta) as *const f32 as *const c_void,
                    x.a as *const c_void,
                    desc.a,
                    x.b as *const c_void,
                    desc.b,
                    x.d as *const c_void,
                    desc.c,
                    x.d as *mut c_void,
                    desc.c,
                    algo,
                    ws as *mut c_void,
                    workspace,
                    gpu.stream().cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| cuda_err("cublasLtMatmul", e))
        })
    }
}

/// Mean µs of `run` over RUNS runs after one untimed run (waits for the device).
pub(crate) fn time_runs(gpu: &Gpu, run: impl Fn() -> Result<()>) -> Result<f64> {
    run()?;
    let start = gpu.mark()?;
    for _ in 0..RUNS {
        run()?;
    }
    let end = gpu.mark()?;
    // Waits for both events.
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| cuda_err("reading a timing event", e))?;
    Ok(f64::from(ms) * 1e3 / RUNS as f64)
}
