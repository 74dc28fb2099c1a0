//! A thread per output element (`thin.cu`) for the products of small models' output layers: a
//! 10-class head's forward (10 rows of D) and its input gradient (10 contracted terms) are latency
//! bound on a tiled GEMM, and one such launch takes a fraction of cuBLASLt's time there. The tuner
//! ([`super::lt`]) times it beside cuBLASLt's fastest and keeps whichever is faster.

use super::lt::Operands;
use super::{Epilogue, Geometry};
use crate::Result;
use crate::cuda::{Gpu, kernel_args, sources::MATMUL_THIN as SRC};

/// Products with at most this many contracted terms, or rows or columns of D, are tried.
const THIN: i32 = 32;

#[repr(C)]
#[derive(Clone, Copy)]
struct ThinGeometry {
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
    ldc: i32,
    trans_a: i32,
    trans_b: i32,
    batch: i32,
    relu: i32,
    stride_a: i64,
    stride_b: i64,
    stride_c: i64,
    bias_stride: i64,
}

/// Whether `g` with `e` is thin enough to try, and an epilogue the kernel has.
pub(crate) fn eligible(g: &Geometry, e: &Epilogue) -> bool {
    matches!(e, Epilogue::None | Epilogue::Bias { .. }) && g.k.min(g.m).min(g.n) <= THIN
}

/// Queues `D = epilogue(op(A)·op(B))` as [`super::lt::Lt::matmul`] would.
///
/// # Safety
/// The operands must hold what `g` describes, in f32, on `gpu` (the bias when `e` has one); D
/// must not overlap A or B.
pub(crate) unsafe fn run(gpu: &Gpu, g: &Geometry, e: &Epilogue, x: Operands) -> Result<()> {
    let (relu, bias_stride) = match *e {
        Epilogue::Bias { stride, relu } => (i32::from(relu), stride),
        _ => (0, 0),
    };
    let geometry = ThinGeometry {
        m: g.m,
        n: g.n,
        k: g.k,
        lda: g.lda,
        ldb: g.ldb,
        ldc: g.ldc,
        trans_a: i32::from(g.trans_a),
        trans_b: i32::from(g.trans_b),
        batch: g.batch,
        relu,
        stride_a: g.stride_a,
        stride_b: g.stride_b,
        stride_c: g.stride_c,
        bias_stride,
    };
    let total = g.m as usize * g.n as usize * g.batch as usize;
    let (a, b, d, bias) = (x.a, x.b, x.d, x.bias);
    let mut args = kernel_args![a, b, d, bias, geometry];
    // SAFETY: matches `gemm_thin_f32(const float*, const float*, float*, const float*,
    // ThinGeometry)`; operands per the caller.
    unsafe { gpu.launch(&SRC, "gemm_thin_f32", gpu.grid(total, 256), &mut args) }
}
