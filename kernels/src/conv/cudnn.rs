//! Convolutions through cuDNN (its convolution API, `libcudnn.so.9` loaded at run time), each geometry and pass
//! on the algorithm that timed fastest.
//!
//! The first time a geometry's pass is met outside a graph capture, every algorithm cuDNN's heuristics offer for
//! it (`cudnnGet*Algorithm_v7`, those it reports as supported) runs on the real operands, timed with events, and
//! the fastest is kept, as PyTorch's `cudnn.benchmark` does; a forward with a bias also tries the convolution and
//! its bias in one call (below). A geometry first met while capturing runs the heuristics' first pick, and is
//! timed at its next eager call. `COHORT_CUDNN=heuristic` keeps the heuristics' pick; in deterministic mode
//! ([`crate::determinism`]) nothing is timed and only algorithms cuDNN reports as deterministic are taken, the
//! heuristics' first of them, the same in every process. The decisions can be saved and adopted by a later
//! process ([`saved`]), which then times nothing it adopted.
//!
//! Precision ([`Math`], part of every key): under `Fp32` a descriptor asks for `CUDNN_FMA_MATH`, plain fp32
//! multiply-adds; under `Tf32` `CUDNN_DEFAULT_MATH`, which lets f32 convolutions run on TF32 tensor cores; under
//! `Bf16` and `F16` the operands are of that type and `CUDNN_TENSOR_OP_MATH` runs them on tensor cores, with fp32
//! sums in every case (the choices PyTorch makes for `allow_tf32` and autocast). Candidates that round worse than
//! their policy promises are never taken ([`inexact`]): tensor-core math under `Fp32`, `WINOGRAD_NONFUSED` on
//! filters above 3x3, atomic 16-bit accumulation.
//!
//! Workspaces: an algorithm runs with the workspace `cudnnGet*WorkspaceSize` names for it, from the caller
//! ([`Workspace`]: the member's tenant), at most [`workspace_cap`] bytes; cuDNN allocates none itself. A workspace
//! is memory at the member's peak (a backward pass runs beside most of the saved activations), so [`keep`] weighs
//! each candidate's time by the workspace it needs beyond the pass's largest operand, and of those within
//! [`NEAR_FASTEST`] of the best weighed time keeps the one with the least workspace: a few per cent of one
//! convolution are not worth a member's peak memory.
//!
//! Layouts: under `Tf32`, `Bf16` and `F16` every algorithm is also a candidate on channels-last operands,
//! transposed inside its workspace around the call ([`desc`]): cuDNN's tensor-core kernels are NHWC ones. Under
//! `Bf16` and `F16` every f32 algorithm (TF32 math) is one too, on the operands converted to f32 in its workspace:
//! for a few channels cuDNN's 16-bit kernels are legacy engines many times slower than its f32 ones.
//!
//! Fusion: the forward's only epilogue is a bias (the `conv2d` entry point has no activation flag), which cuDNN
//! fuses in `cudnnConvolutionBiasActivationForward` with an identity activation, only on
//! `IMPLICIT_PRECOMP_GEMM`; that candidate is timed beside every algorithm followed by `cudnnAddTensor`.

mod desc;
mod saved;
#[cfg(test)]
mod tests;

use std::ffi::{CStr, CString, c_void};
use std::mem::{align_of, size_of};
use std::path::{Path, PathBuf};

use cudarc::cudnn::{result as dnn, sys};

use self::desc::{Desc, Layout, Staging, Views, dims, policy_math};
use super::cuda::{Operands, Workspace, cudnn_mode};
use super::{ConvParams, ConvPass, CudnnMode};
use crate::copy::cuda::cast;
use crate::cuda::decisions::Decisions;
use crate::cuda::{CudaType, GemmTuning, Gpu, cuda_err};
use crate::matmul::lt::time_runs;
use crate::{Error, Math, Result};

/// Algorithms asked of the heuristics: more than any pass has (cuDNN 9: 8 forward, 6 data, 7 filter).
const CANDIDATES: usize = 8;
/// The least of the most workspace one algorithm may take (see [`workspace_cap`]).
const MIN_WORKSPACE_CAP: usize = 128 << 20;
/// How much slower than the fastest a candidate may time and still be kept for needing less workspace.
const NEAR_FASTEST: f64 = 1.05;
/// The weight on a candidate's time per operand's worth of workspace beyond the pass's largest operand: such
/// workspace must buy 10 % of speed per operand. In fp32, a ResNet's backward passes over 16 MiB operands ran 1.2x
/// to 1.4x faster on 4.5 to 19 operands of workspace, which set its peak; a CNN's 3x3 passes run 1.65x to 3.1x
/// faster on 3.4 to 4.6 (Winograd), which they keep.
const WORKSPACE_PRICE: f64 = 0.1;
/// Workspace the candidates are held to when the largest any of them needs cannot be had.
const SMALL_WORKSPACE: usize = 8 << 20;

/// `CUDNN_STATUS_SUCCESS`.
const SUCCESS: u32 = 0;
/// `CUDNN_DETERMINISTIC`.
const DETERMINISTIC: u32 = 1;
/// `CUDNN_TENSOR_OP_MATH` and `CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION`: tensor-core results, which the FMA
/// descriptors should never be offered.
const TENSOR_OP_MATH: [u32; 2] = [1, 2];
/// The backward filter algorithms cuDNN documents as deterministic, in the order its heuristics ranked them for
/// 16-bit passes: `ALGO_1`, `WINOGRAD_NONFUSED`, `FFT`, `FFT_TILING` (a 16-bit pass takes no other: [`inexact`]).
const FILTER_16BIT: [u32; 4] = [1, 5, 2, 6];
/// `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`, the one algorithm that fuses a bias with no activation.
const IMPLICIT_PRECOMP_GEMM: u32 = 1;

/// The math type a candidate cuDNN listed with `listed` (a `cudnnMathType_t` value) runs with under `math`: its
/// own, as PyTorch sets it (the heuristics list an algorithm once per math type, and under bf16 the
/// `DEFAULT_MATH` entry of `IMPLICIT_PRECOMP_GEMM` ran up to 1.6x faster than its `TENSOR_OP_MATH` one on the
/// H100), except that fp32 stays on FMA and no policy lets cuDNN convert f32 operands to f16
/// (`TENSOR_OP_MATH_ALLOW_CONVERSION`, 2: `None`).
fn run_math(math: Math, listed: u32) -> Option<sys::cudnnMathType_t> {
    use sys::cudnnMathType_t::*;
    match (math, listed) {
        (Math::Fp32, _) => Some(CUDNN_FMA_MATH),
        (_, 0) => Some(CUDNN_DEFAULT_MATH),
        (_, 1) => Some(CUDNN_TENSOR_OP_MATH),
        (_, 3) => Some(CUDNN_FMA_MATH),
        _ => None,
    }
}

/// Sets the math type `m` on `conv`: the one descriptor of a key serves candidates of several math types.
fn set_math(conv: sys::cudnnConvolutionDescriptor_t, m: sys::cudnnMathType_t) -> Result<()> {
    // SAFETY: the descriptor is live; cuDNN reads the value during the call.
    unsafe { dnn::set_convolution_math_type(conv, m) }
        .map_err(|e| cuda_err("cudnnSetConvolutionMathType", e))
}

/// Whether cuDNN's candidate `c` is none for `key`, for how it rounds:
/// - under every policy, `WINOGRAD_NONFUSED` on a filter larger than 3x3, whose larger transform tiles lose as much
///   as TF32 does in fp32 (H200: 8.4e-4 of the output's scale on a 5x5 forward, where every other algorithm stays
///   within 1e-4) and seven times TF32's own loss under TF32 (H100: 5.5e-3 on a 5x5 backward data pass). On 3x3
///   filters it stays within 6.3e-5 in fp32 (5e-6 on most geometries, against TF32's 2.5e-4 to 7.7e-4) and is the
///   fastest fp32 algorithm for wide layers by 1.9x to 3.3x;
/// - under `Fp32`, tensor-core math;
/// - under `Bf16` and `F16`, a backward pass cuDNN reports as non-deterministic: it adds partial sums into the
///   16-bit gradient atomically, each add rounding (H100: 1.0e-2 of the scale on a 5x5 backward data pass, five
///   times one rounding).
fn inexact(key: &Key, c: &Perf) -> bool {
    let nonfused = match key.pass {
        ConvPass::Forward { .. } => 7,
        ConvPass::BackwardData | ConvPass::BackwardFilter => 5,
    };
    let wide_winograd = c.algo == nonfused && key.p.kh.max(key.p.kw) > 3;
    let backward = !matches!(key.pass, ConvPass::Forward { .. });
    wide_winograd
        || match key.math {
            Math::Fp32 => TENSOR_OP_MATH.contains(&c.math_type),
            Math::Tf32 => false,
            Math::Bf16 | Math::F16 => backward && c.determinism != DETERMINISTIC,
        }
}

/// The library functions used here: checked at load, since a missing one would panic at its first call.
const SYMBOLS: [&str; 31] = [
    "cudnnGetVersion",
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnCreateTensorDescriptor",
    "cudnnSetTensor4dDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionMathType",
    "cudnnSetConvolutionGroupCount",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnCreateActivationDescriptor",
    "cudnnSetActivationDescriptor",
    "cudnnDestroyActivationDescriptor",
    "cudnnGetConvolution2dForwardOutputDim",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnGetConvolutionForwardWorkspaceSize",
    "cudnnGetConvolutionBackwardDataWorkspaceSize",
    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
    "cudnnConvolutionForward",
    "cudnnConvolutionBiasActivationForward",
    "cudnnAddTensor",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
    "cudnnTransformTensor",
];

/// The libraries `libcudnn.so.9` (a shim) loads for the convolution API, from its own folder or the library path.
/// Where one is missing it aborts the process at its first call, so they are looked for before any.
const PARTS: [&str; 3] = [
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
];

/// The folder the loaded `libcudnn.so.9` came from, as the dynamic loader says.
fn shim_folder() -> Option<PathBuf> {
    // SAFETY: the library is open; looking a symbol up and asking the loader which file holds it call nothing of
    // cuDNN; the loader's file name is a NUL-terminated string it owns while the library stays loaded.
    unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn()>(b"cudnnGetVersion")
            .ok()?;
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(*f as *const libc::c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let file = CStr::from_ptr(info.dli_fname).to_str().ok()?;
        Some(Path::new(file).parent()?.to_path_buf())
    }
}

/// Whether the dynamic loader finds `name` on the library path.
fn loadable(name: &str) -> bool {
    let Ok(c) = CString::new(name) else {
        return false;
    };
    // SAFETY: opens a library by name and closes it again; cuDNN loads it itself later.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

/// A part of cuDNN ([`PARTS`]) neither beside `libcudnn.so.9` nor on the library path.
fn missing_part() -> Option<&'static str> {
    let folder = shim_folder();
    PARTS.into_iter().find(|part| {
        let beside = folder.as_ref().is_some_and(|f| f.join(part).exists());
        !beside && !loadable(part)
    })
}

/// The most workspace one algorithm may take for `p`: 128 MiB, or four times the pass's largest operand in f32
/// where that is more. Winograd's transforms of a 3x3 layer need 2.3 to 4.6 operands (and run it 1.9x to 4.7x
/// faster than the direct algorithms, in fp32 and TF32 alike); FFTs of large batches need more, for little gain.
pub(crate) fn workspace_cap(p: &ConvParams) -> usize {
    MIN_WORKSPACE_CAP.max(4 * largest_operand(p))
}

/// Bytes of the pass's largest operand (input, output or filter) in f32.
fn largest_operand(p: &ConvParams) -> usize {
    size_of::<f32>() * p.input_len().max(p.output_len()).max(p.weight_len())
}

/// Which of the timed candidates (`None`: it failed) to keep for a pass whose largest operand holds `operand` bytes:
/// each time weighed by 1 + [`WORKSPACE_PRICE`] per operand's worth of workspace beyond the first, the one needing
/// the least workspace among those within [`NEAR_FASTEST`] of the best weighed time, the earlier (the heuristics'
/// preference) on a tie.
fn keep(times: &[Option<f64>], workspaces: &[usize], operand: usize) -> Option<usize> {
    let excess = |i: usize| (workspaces[i] as f64 / operand.max(1) as f64 - 1.0).max(0.0);
    let weighed = |i: usize| times[i].map(|t| t * (1.0 + WORKSPACE_PRICE * excess(i)));
    let best = (0..times.len())
        .filter_map(weighed)
        .min_by(f64::total_cmp)?;
    (0..times.len())
        .filter(|&i| weighed(i).is_some_and(|w| w <= best * NEAR_FASTEST))
        .min_by_key(|&i| workspaces[i])
}

/// One of cuDNN's `cudnnConvolution*AlgoPerf_t`, read as plain integers: a status or enum value this binding does
/// not list must not be read into a Rust enum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Perf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

const _: () = {
    assert!(size_of::<Perf>() == size_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
    assert!(size_of::<Perf>() == size_of::<sys::cudnnConvolutionBwdDataAlgoPerf_t>());
    assert!(size_of::<Perf>() == size_of::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>());
    assert!(align_of::<Perf>() == align_of::<sys::cudnnConvolutionFwdAlgoPerf_t>());
};

fn unknown_algo(pass: ConvPass, algo: u32) -> Error {
    Error::Cuda(format!("cuDNN has no {pass:?} algorithm {algo}"))
}

/// The forward algorithm of value `algo`.
fn fwd_algo(algo: u32) -> Result<sys::cudnnConvolutionFwdAlgo_t> {
    use sys::cudnnConvolutionFwdAlgo_t::*;
    Ok(match algo {
        0 => CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return Err(unknown_algo(ConvPass::Forward { bias: false }, algo)),
    })
}

/// The backward data algorithm of value `algo`.
fn data_algo(algo: u32) -> Result<sys::cudnnConvolutionBwdDataAlgo_t> {
    use sys::cudnnConvolutionBwdDataAlgo_t::*;
    Ok(match algo {
        0 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
        1 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
        2 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
        3 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
        4 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
        5 => CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        _ => return Err(unknown_algo(ConvPass::BackwardData, algo)),
    })
}

/// The backward filter algorithm of value `algo`.
fn filter_algo(algo: u32) -> Result<sys::cudnnConvolutionBwdFilterAlgo_t> {
    use sys::cudnnConvolutionBwdFilterAlgo_t::*;
    Ok(match algo {
        0 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
        1 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        2 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
        3 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        4 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD,
        5 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        6 => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        _ => return Err(unknown_algo(ConvPass::BackwardFilter, algo)),
    })
}

/// `91400` as `9.14.0`: cuDNN 9 numbers its versions major·10000 + minor·100 + patch, cuDNN 8 major·1000 +
/// minor·100 + patch.
pub(crate) fn version_string(v: usize) -> String {
    if v >= 90_000 {
        format!("{}.{}.{}", v / 10_000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    }
}

/// One pass of one geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    pass: ConvPass,
    p: ConvParams,
    math: Math,
}

impl Key {
    /// The key a candidate of `layout` is listed, filtered and run under ([`Layout::math`]).
    fn listed_as(&self, layout: Layout) -> Key {
        Key {
            math: layout.math(self.math),
            ..*self
        }
    }
}

/// `cudnn fwd+bias 7x64x13x11 -> 128 k3x3 s2 p1`: a pass's label in profiles and tuning reports.
fn label(key: &Key) -> String {
    let p = &key.p;
    let pass = match key.pass {
        ConvPass::Forward { bias: false } => "fwd",
        ConvPass::Forward { bias: true } => "fwd+bias",
        ConvPass::BackwardData => "bwd data",
        ConvPass::BackwardFilter => "bwd filter",
    };
    let groups = if p.groups > 1 {
        format!(" g{}", p.groups)
    } else {
        String::new()
    };
    let math = match key.math {
        Math::Fp32 => "",
        Math::Tf32 => " tf32",
        Math::Bf16 => " bf16",
        Math::F16 => " f16",
    };
    format!(
        "cudnn {pass} {}x{}x{}x{} -> {} k{}x{} s{} p{}{groups}{math}",
        p.batch, p.c_in, p.h, p.w, p.c_out, p.kh, p.kw, p.stride, p.padding
    )
}

impl Desc {
    /// The descriptors of `key`; `None` where cuDNN cannot describe the geometry or sees another output shape.
    fn new(key: &Key) -> Option<Desc> {
        match Desc::describe(key.pass, key.math, dims(&key.p)?) {
            Ok(Some(d)) => Some(d),
            Ok(None) => {
                tracing::debug!("{}: cuDNN sees another output shape", label(key));
                None
            }
            Err(e) => {
                tracing::debug!("{}: cuDNN cannot describe it ({e:?})", label(key));
                None
            }
        }
    }
}

/// One of a pass's three operands.
#[derive(Clone, Copy, Debug)]
enum Part {
    /// The input (or its gradient).
    X,
    /// The weight (or its gradient).
    W,
    /// The output (or its gradient).
    Y,
}

/// How a [`Choice`] was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Picked {
    /// The heuristics' first pick, timed at the key's next call that may time.
    Heuristic,
    /// The fastest candidate.
    Timed,
    /// From saved choices: never timed.
    Adopted,
}

/// An algorithm as a candidate.
#[derive(Clone, Copy, Debug)]
struct Variant {
    algo: u32,
    /// Workspace bytes.
    workspace: usize,
    /// The bias in the convolution's call.
    fused: bool,
    /// cuDNN reports it as deterministic.
    deterministic: bool,
    /// How its operands lie; `workspace` includes the channels-last staging.
    layout: Layout,
    /// The math type it runs with ([`run_math`]).
    math_type: sys::cudnnMathType_t,
}

/// The descriptors of one key and the algorithm it runs.
struct Choice {
    desc: Desc,
    run: Variant,
    picked: Picked,
    /// It has run in this process: the heuristics may offer an algorithm that then refuses the geometry.
    ran: bool,
}

/// How a key runs.
enum Entry {
    /// cuDNN offers nothing for it: the own kernels run it.
    Own,
    Run(Choice),
}

/// A device's cuDNN handle and the algorithm chosen per geometry and pass.
pub(crate) struct Dnn {
    handle: sys::cudnnHandle_t,
    version: usize,
    /// How each geometry runs, the decisions made and the timings to report.
    table: Decisions<Key, Entry>,
}

// SAFETY: the handle and the descriptors are used by one thread at a time, under the Gpu's mutex (cuDNN allows a
// handle on any thread as long as no two use it at once).
unsafe impl Send for Dnn {}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.table.clear();
        // SAFETY: created by cudnnCreate, destroyed once, after every descriptor.
        let _ = unsafe { dnn::destroy_handle(self.handle) };
    }
}

impl Dnn {
    /// A cuDNN handle for the bound context, or why there can be none here (for the one warning that says so).
    pub(crate) fn load() -> std::result::Result<Dnn, String> {
        // SAFETY: only tries to open the shared library.
        if !unsafe { sys::is_culib_present() } {
            return Err("libcudnn.so.9 was not found".to_string());
        }
        let missing = SYMBOLS.iter().find(|name| {
            // SAFETY: the library opens (above); looking a symbol up calls nothing.
            unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
        });
        if let Some(name) = missing {
            return Err(format!("the cuDNN found has no {name}"));
        }
        if let Some(part) = missing_part() {
            return Err(format!("libcudnn.so.9 was found without {part}"));
        }
        let version = dnn::get_version();
        if !(90_000..100_000).contains(&version) {
            return Err(format!(
                "cuDNN {} was found, cohort needs cuDNN 9",
                version_string(version)
            ));
        }
        let handle = dnn::create_handle().map_err(|e| {
            format!(
                "cudnnCreate failed ({e:?}) with cuDNN {}",
                version_string(version)
            )
        })?;
        Ok(Dnn {
            handle,
            version,
            table: Decisions::new(),
        })
    }

    /// `cudnnGetVersion()`: 91400 for 9.14.0.
    pub(crate) fn version(&self) -> usize {
        self.version
    }

    /// The tunings made since the last call.
    pub(crate) fn take_report(&mut self) -> Vec<GemmTuning> {
        self.table.take_report()
    }

    /// Queues `pass` of `p` on the operands `x`, choosing its algorithm first if the geometry is new. Returns
    /// `false`, queuing nothing, where cuDNN has no algorithm for it.
    ///
    /// # Safety
    /// The operands hold what `p` describes for the pass, in the type `math` names, on `gpu`; `workspace` gives
    /// memory of `gpu`.
    pub(crate) unsafe fn run(
        &mut self,
        gpu: &Gpu,
        (pass, math): (ConvPass, Math),
        p: &ConvParams,
        x: Operands,
        workspace: &mut Workspace<'_>,
    ) -> Result<bool> {
        let key = Key { pass, p: *p, math };
        let det = crate::deterministic();
        // Timing waits for the device, which a capture cannot, and its pick depends on the moment, which
        // deterministic mode forbids.
        let timing = cudnn_mode() == CudnnMode::Timed && !gpu.is_capturing() && !det;
        let fresh = match self.table.get(&key) {
            None => true,
            Some(Entry::Own) => return Ok(false),
            Some(Entry::Run(c)) => {
                (timing && c.picked == Picked::Heuristic) || (det && !c.run.deterministic)
            }
        };
        if fresh {
            let desc = match self.table.remove(&key) {
                Some(Entry::Run(c)) => Some(c.desc),
                _ => Desc::new(&key),
            };
            let entry = match desc {
                // SAFETY: forwarded to the caller.
                Some(desc) => unsafe { self.choose(gpu, &key, desc, x, workspace, timing) }?,
                None => Entry::Own,
            };
            self.table.decide(key, entry);
        }
        let Some(Entry::Run(c)) = self.table.get(&key) else {
            return Ok(false);
        };
        let (v, ran) = (c.run, c.ran);
        let ws = if v.workspace == 0 {
            0
        } else {
            workspace(v.workspace)?
        };
        let launched = gpu.timed(
            || label(&key),
            // SAFETY: forwarded to the caller; the workspace holds what the algorithm needs.
            || unsafe { self.launch(gpu, &key, &c.desc, v, x, ws) },
        );
        match launched {
            Ok(()) => {
                // Once: from then on a failure is the device's, not the algorithm's.
                if !ran && let Some(Entry::Run(c)) = self.table.get_mut(&key) {
                    c.ran = true;
                }
                Ok(true)
            }
            // An algorithm the heuristics offered (or a saved choice named) that refuses the geometry, where
            // nothing else ran it before: the own kernels run it from now on (they write every output element,
            // so what a half-done call wrote does not matter).
            Err(e) if !ran => {
                tracing::warn!(
                    "{}: cuDNN's algorithm {} failed ({e}); cohort's own kernels run it",
                    label(&key),
                    v.algo
                );
                self.table.decide(key, Entry::Own);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The heuristics' first pick for `key`, or (when `timing`) the candidate [`keep`] takes of those timed;
    /// [`Entry::Own`] where cuDNN offers none that runs.
    ///
    /// # Safety
    /// As [`Dnn::run`].
    unsafe fn choose(
        &mut self,
        gpu: &Gpu,
        key: &Key,
        desc: Desc,
        x: Operands,
        workspace: &mut Workspace<'_>,
        timing: bool,
    ) -> Result<Entry> {
        let mut variants = self.variants(key, &desc);
        let Some(&first) = variants.first() else {
            return Ok(Entry::Own);
        };
        if !timing {
            return Ok(Entry::Run(Choice {
                desc,
                run: first,
                picked: Picked::Heuristic,
                ran: false,
            }));
        }
        let most = |vs: &[Variant]| vs.iter().map(|v| v.workspace).max().unwrap_or(0);
        // One workspace for every candidate: the largest any needs, or where that cannot be had, a small one for
        // those that need little (the allocator's error stands where none does).
        let ws = match most(&variants) {
            0 => 0,
            bytes => match workspace(bytes) {
                Ok(ws) => ws,
                Err(Error::DeviceMemory { what, source }) => {
                    variants.retain(|v| v.workspace <= SMALL_WORKSPACE);
                    if variants.is_empty() {
                        return Err(Error::DeviceMemory { what, source });
                    }
                    match most(&variants) {
                        0 => 0,
                        bytes => workspace(bytes)?,
                    }
                }
                Err(e) => return Err(e),
            },
        };
        let times: Vec<Option<f64>> = variants
            .iter()
            .map(|&v| {
                // SAFETY: forwarded to the caller; the workspace holds what every candidate needs. One that
                // fails is skipped.
                time_runs(gpu, || unsafe { self.launch(gpu, key, &desc, v, x, ws) }).ok()
            })
            .collect();
        let workspaces: Vec<usize> = variants.iter().map(|v| v.workspace).collect();
        let Some(best) = keep(&times, &workspaces, largest_operand(&key.p)) else {
            return Ok(Entry::Own);
        };
        let best_us = times[best].unwrap_or_default();
        let kept = variants[best];
        let what = format!(
            "{}{}",
            label(key),
            match kept.layout {
                Layout::Nchw => "",
                Layout::Nhwc => " (channels last)",
                Layout::F32 => " (in f32)",
            }
        );
        tracing::debug!(
            "{what}: algorithm {}{} at {best_us:.1} µs, of {} candidates",
            kept.algo,
            if kept.fused { " (bias fused)" } else { "" },
            variants.len()
        );
        self.table.note(GemmTuning {
            label: what,
            candidates: variants.len(),
            heuristic_us: times[0],
            best_us,
            best_index: best,
            workspace: kept.workspace,
        });
        Ok(Entry::Run(Choice {
            desc,
            run: variants[best],
            picked: Picked::Timed,
            ran: true,
        }))
    }

    /// The candidates for `key`, the heuristics' order kept, NCHW first, then (under a policy with tensor-core
    /// math) channels last, then (under a 16-bit one) in f32: every algorithm cuDNN reports as supported for the
    /// layout but those [`inexact`] names, within [`workspace_cap`] with its staging, in deterministic mode only
    /// those it reports as deterministic, each once per layout; a forward with a bias also as one call where cuDNN
    /// allows it (NCHW only), tried before the same algorithm unfused.
    fn variants(&self, key: &Key, desc: &Desc) -> Vec<Variant> {
        let det = crate::deterministic();
        let cap = workspace_cap(&key.p);
        let mut variants = Vec::new();
        for layout in [Layout::Nchw, Layout::Nhwc, Layout::F32] {
            let Some(views) = desc.views(layout) else {
                continue;
            };
            let staging = Staging::new(layout, &key.p, key.math).bytes();
            let listed = key.listed_as(layout);
            for c in self.candidates(&listed, desc.conv, views) {
                let deterministic = c.determinism == DETERMINISTIC;
                let Some(math_type) = run_math(listed.math, c.math_type) else {
                    continue;
                };
                let again = variants.iter().any(|v: &Variant| {
                    (v.algo, v.layout, v.math_type) == (c.algo, layout, math_type)
                });
                if again || (det && !deterministic) {
                    continue;
                }
                let Ok(own) = self.workspace_size(key.pass, (desc.conv, math_type), views, c.algo)
                else {
                    continue;
                };
                let workspace = own + staging;
                if workspace > cap {
                    continue;
                }
                let v = Variant {
                    algo: c.algo,
                    workspace,
                    fused: false,
                    deterministic,
                    layout,
                    math_type,
                };
                if key.pass == (ConvPass::Forward { bias: true })
                    && c.algo == IMPLICIT_PRECOMP_GEMM
                    && layout == Layout::Nchw
                {
                    variants.push(Variant { fused: true, ..v });
                }
                variants.push(v);
            }
        }
        variants
    }

    /// What `cudnnGet*Algorithm_v7` reports as supported for `key` on the views `d` (listed under `key.math`: see
    /// [`Key::listed_as`]), in its order (best expected first); empty where it fails.
    fn candidates(
        &self,
        key: &Key,
        conv: sys::cudnnConvolutionDescriptor_t,
        d: &Views,
    ) -> Vec<Perf> {
        let pass = key.pass;
        if pass == ConvPass::BackwardFilter && !key.math.f32_operands() {
            return self.filter_16bit(key, conv, d);
        }
        // The listing depends on the descriptor's math type, which a candidate's run changes.
        if set_math(conv, policy_math(key.math)).is_err() {
            return Vec::new();
        }
        let mut perf = [Perf::default(); CANDIDATES];
        let mut n = 0i32;
        let (h, want) = (self.handle, CANDIDATES as i32);
        // SAFETY: the descriptors are live; `perf` has room for `want` results, whose layout `Perf` mirrors.
        let status = unsafe {
            match pass {
                ConvPass::Forward { .. } => sys::cudnnGetConvolutionForwardAlgorithm_v7(
                    h,
                    d.x,
                    d.w,
                    conv,
                    d.y,
                    want,
                    &mut n,
                    perf.as_mut_ptr().cast(),
                ),
                ConvPass::BackwardData => sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    h,
                    d.w,
                    d.y,
                    conv,
                    d.x,
                    want,
                    &mut n,
                    perf.as_mut_ptr().cast(),
                ),
                ConvPass::BackwardFilter => sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    h,
                    d.x,
                    d.y,
                    conv,
                    d.w,
                    want,
                    &mut n,
                    perf.as_mut_ptr().cast(),
                ),
            }
        };
        if status.result().is_err() {
            return Vec::new();
        }
        let known = |a: u32| match pass {
            ConvPass::Forward { .. } => fwd_algo(a).is_ok(),
            ConvPass::BackwardData => data_algo(a).is_ok(),
            ConvPass::BackwardFilter => filter_algo(a).is_ok(),
        };
        perf[..usize::try_from(n).unwrap_or(0).min(CANDIDATES)]
            .iter()
            .filter(|c| c.status == SUCCESS && known(c.algo) && !inexact(key, c))
            .copied()
            .collect()
    }

    /// The candidates for a 16-bit backward filter pass (`key`) on the views `d`, without the heuristics: on the
    /// H100 with cuDNN 9.14 `cudnnGetConvolutionBackwardFilterAlgorithm_v7` took 1.9 to 2.7 s for every such call
    /// on NCHW operands (every other pass and layout lists in under 3 ms), which a run paid per geometry and made
    /// a short bf16 run many times slower than an fp32 one. Instead, each algorithm [`FILTER_16BIT`] names, with
    /// each math type, is a candidate where cuDNN gives its workspace size (it refuses the unsupported ones) and
    /// [`inexact`] does not rule it out.
    fn filter_16bit(
        &self,
        key: &Key,
        conv: sys::cudnnConvolutionDescriptor_t,
        d: &Views,
    ) -> Vec<Perf> {
        use sys::cudnnMathType_t::{CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH};
        let mut found = Vec::new();
        for algo in FILTER_16BIT {
            for math in [CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH] {
                let Ok(memory) = self.workspace_size(key.pass, (conv, math), d, algo) else {
                    continue;
                };
                let c = Perf {
                    algo,
                    status: SUCCESS,
                    memory,
                    determinism: DETERMINISTIC,
                    math_type: math as u32,
                    ..Perf::default()
                };
                if !inexact(key, &c) {
                    found.push(c);
                }
            }
        }
        found
    }

    /// Bytes of workspace `algo` needs for `pass` on `d`.
    fn workspace_size(
        &self,
        pass: ConvPass,
        (conv, math): (sys::cudnnConvolutionDescriptor_t, sys::cudnnMathType_t),
        d: &Views,
        algo: u32,
    ) -> Result<usize> {
        let h = self.handle;
        set_math(conv, math)?;
        // SAFETY: the descriptors are live; the algorithm is a value of the pass's enum.
        unsafe {
            match pass {
                ConvPass::Forward { .. } => dnn::get_convolution_forward_workspace_size(
                    h,
                    d.x,
                    d.w,
                    conv,
                    d.y,
                    fwd_algo(algo)?,
                ),
                ConvPass::BackwardData => dnn::get_convolution_backward_data_workspace_size(
                    h,
                    d.w,
                    d.y,
                    conv,
                    d.x,
                    data_algo(algo)?,
                ),
                ConvPass::BackwardFilter => dnn::get_convolution_backward_filter_workspace_size(
                    h,
                    d.x,
                    d.y,
                    conv,
                    d.w,
                    filter_algo(algo)?,
                ),
            }
        }
        .map_err(|e| cuda_err("cudnnGetConvolution*WorkspaceSize", e))
    }

    /// Queues `key`'s pass with `v` on the stream this thread's work goes to, with the workspace at `ws`
    /// (`v.workspace` bytes): channels last, the pass's inputs transposed into the workspace's staging first and
    /// its output back after; then a bias the call did not fuse.
    ///
    /// # Safety
    /// As [`Dnn::run`]; `ws` holds `v.workspace` bytes of `gpu`'s memory.
    unsafe fn launch(
        &self,
        gpu: &Gpu,
        key: &Key,
        d: &Desc,
        v: Variant,
        x: Operands,
        ws: u64,
    ) -> Result<()> {
        let h = self.handle;
        // SAFETY: the handle is live, the stream one of this device's, which outlive the handle's use.
        unsafe { dnn::set_stream(h, gpu.stream().cu_stream() as sys::cudaStream_t) }
            .map_err(|e| cuda_err("cudnnSetStream", e))?;
        match v.layout {
            // SAFETY: forwarded to the caller; the workspace is the algorithm's alone.
            Layout::Nchw => unsafe { self.convolve(key, (d, &d.nchw), v, x, (ws, v.workspace)) }?,
            staged => {
                let views = d.views(staged).ok_or_else(|| {
                    Error::Cuda(format!(
                        "{}: a {staged:?} algorithm with no descriptors for it",
                        label(key)
                    ))
                })?;
                let staging = Staging::new(staged, &key.p, key.math);
                let [sx, sw, sy] = staging.at(ws);
                let own = (ws + staging.bytes() as u64, v.workspace - staging.bytes());
                let (ins, out) = match key.pass {
                    ConvPass::Forward { .. } => ([Part::X, Part::W], Part::Y),
                    ConvPass::BackwardData => ([Part::W, Part::Y], Part::X),
                    ConvPass::BackwardFilter => ([Part::X, Part::Y], Part::W),
                };
                let at = Operands {
                    x: sx,
                    w: sw,
                    y: sy,
                    bias: 0,
                };
                // SAFETY: forwarded to the caller; the staging holds the three staged operands and the
                // algorithm's own workspace follows it, disjoint parts of the caller's `v.workspace` bytes.
                unsafe {
                    for part in ins {
                        self.stage(gpu, (key, d), staged, part, (x, at), true)?;
                    }
                    self.convolve(key, (d, views), v, at, own)?;
                    self.stage(gpu, (key, d), staged, out, (x, at), false)?;
                }
            }
        }
        if key.pass == (ConvPass::Forward { bias: true }) && !v.fused {
            let one = (&1.0f32) as *const f32 as *const c_void;
            // SAFETY: the bias and output descriptors describe the caller's NCHW operands.
            unsafe {
                sys::cudnnAddTensor(
                    h,
                    one,
                    d.bias,
                    x.bias as *const c_void,
                    one,
                    d.nchw.y,
                    x.y as *mut c_void,
                )
                .result()
                .map_err(|e| cuda_err("cudnnAddTensor", e))?;
            }
        }
        Ok(())
    }

    /// Copies operand `part` between the caller's operands `x` and their staged copies `at` in `layout`: into the
    /// staging when `inward`, else back out.
    ///
    /// # Safety
    /// `x` holds the pass's operands as [`Dnn::run`] says, `at` room for their staged copies, on `gpu`.
    unsafe fn stage(
        &self,
        gpu: &Gpu,
        (key, d): (&Key, &Desc),
        layout: Layout,
        part: Part,
        (x, at): (Operands, Operands),
        inward: bool,
    ) -> Result<()> {
        let p = &key.p;
        let (held, staged, n) = match part {
            Part::X => (x.x, at.x, p.input_len()),
            Part::W => (x.w, at.w, p.weight_len()),
            Part::Y => (x.y, at.y, p.output_len()),
        };
        match (layout, &d.nhwc) {
            (Layout::Nhwc, Some(last)) => {
                let (nchw, nhwc) = match part {
                    Part::X => (d.nchw.x, last.views.x),
                    Part::W => (last.w_nchw, last.w_nhwc),
                    Part::Y => (d.nchw.y, last.views.y),
                };
                let (from, to) = ((nchw, held), (nhwc, staged));
                let (from, to) = if inward { (from, to) } else { (to, from) };
                // SAFETY: per the caller; the descriptors describe the operand in either layout.
                unsafe { self.transpose(from, to) }
            }
            (Layout::F32, _) => {
                let (held_ty, f32) = (CudaType::operands_of(key.math), CudaType::F32);
                // SAFETY: per the caller: `n` elements of the held type at `held`, room for as many f32 at
                // `staged`.
                unsafe {
                    if inward {
                        cast(gpu, held_ty, f32, held, staged, n)
                    } else {
                        cast(gpu, f32, held_ty, staged, held, n)
                    }
                }
            }
            _ => Err(Error::Cuda(format!(
                "{}: no {layout:?} staging for its operands",
                label(key)
            ))),
        }
    }

    /// Copies the tensor `from` describes into the layout `to` describes.
    ///
    /// # Safety
    /// Both addresses hold what their descriptors describe, on the handle's stream's device.
    unsafe fn transpose(
        &self,
        (from, src): (sys::cudnnTensorDescriptor_t, u64),
        (to, dst): (sys::cudnnTensorDescriptor_t, u64),
    ) -> Result<()> {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: per the caller; alpha and beta are host f32, read during the call.
        unsafe {
            sys::cudnnTransformTensor(
                self.handle,
                (&one) as *const f32 as *const c_void,
                from,
                src as *const c_void,
                (&zero) as *const f32 as *const c_void,
                to,
                dst as *mut c_void,
            )
        }
        .result()
        .map_err(|e| cuda_err("cudnnTransformTensor", e))
    }

    /// The convolution of `key`'s pass alone (with the bias where `v` fuses it), on the operands `x` that the
    /// views `d` of `desc` describe, with the algorithm's workspace `(address, bytes)`.
    ///
    /// # Safety
    /// As [`Dnn::run`], for operands laid out as `d` says.
    unsafe fn convolve(
        &self,
        key: &Key,
        (desc, d): (&Desc, &Views),
        v: Variant,
        x: Operands,
        (ws, bytes): (u64, usize),
    ) -> Result<()> {
        let (h, conv) = (self.handle, desc.conv);
        set_math(conv, v.math_type)?;
        let (one, zero) = (1.0f32, 0.0f32);
        let one = (&one) as *const f32 as *const c_void;
        let zero = (&zero) as *const f32 as *const c_void;
        let wsp = ws as *mut c_void;
        let src = |a: u64| a as *const c_void;
        let dst = |a: u64| a as *mut c_void;
        // SAFETY: the descriptors describe the caller's operands (`key`); alpha and beta are host f32 read during
        // the call; the workspace holds `bytes` bytes.
        unsafe {
            match key.pass {
                ConvPass::Forward { .. } if v.fused => {
                    // z is the output with alpha2 = 0: cuDNN does not read it (XLA passes the output so too).
                    dnn::convolution_bias_activation_forward(
                        h,
                        one,
                        d.x,
                        src(x.x),
                        d.w,
                        src(x.w),
                        conv,
                        fwd_algo(v.algo)?,
                        wsp,
                        bytes,
                        zero,
                        d.y,
                        src(x.y),
                        desc.bias,
                        src(x.bias),
                        desc.act,
                        d.y,
                        dst(x.y),
                    )
                    .map_err(|e| cuda_err("cudnnConvolutionBiasActivationForward", e))
                }
                ConvPass::Forward { .. } => dnn::convolution_forward(
                    h,
                    one,
                    d.x,
                    src(x.x),
                    d.w,
                    src(x.w),
                    conv,
                    fwd_algo(v.algo)?,
                    wsp,
                    bytes,
                    zero,
                    d.y,
                    dst(x.y),
                )
                .map_err(|e| cuda_err("cudnnConvolutionForward", e)),
                ConvPass::BackwardData => dnn::convolution_backward_data(
                    h,
                    one,
                    d.w,
                    src(x.w),
                    d.y,
                    src(x.y),
                    conv,
                    data_algo(v.algo)?,
                    wsp,
                    bytes,
                    zero,
                    d.x,
                    dst(x.x),
                )
                .map_err(|e| cuda_err("cudnnConvolutionBackwardData", e)),
                ConvPass::BackwardFilter => dnn::convolution_backward_filter(
                    h,
                    one,
                    d.x,
                    src(x.x),
                    d.y,
                    src(x.y),
                    conv,
                    filter_algo(v.algo)?,
                    wsp,
                    bytes,
                    zero,
                    d.w,
                    dst(x.w),
                )
                .map_err(|e| cuda_err("cudnnConvolutionBackwardFilter", e)),
            }
        }
    }
}
