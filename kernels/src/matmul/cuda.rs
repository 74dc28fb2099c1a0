//! CUDA matrix products: f32 through cuBLASLt on tuned algorithms (fp32, no TF32; see
//! [`lt`](super::lt)); f16 / bf16, and an f32 geometry cuBLASLt refuses, through cuBLAS GemmEx
//! with fp32 accumulation. Batches run as one strided-batched call (a single product as a batch
//! of one).
//!
//! cuBLAS is column-major: the row-major `out = op(lhs)·op(rhs)` is computed as the column-major
//! `outᵀ = op(rhs)ᵀ·op(lhs)ᵀ`, which needs no copy.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

use super::lt::Operands;
use super::{Epilogue, Geometry, MatmulShape};
use crate::cuda::{CudaType, Gpu, aligned16, cuda_err, unsupported};
use crate::{Error, Math, Result};

fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::Cuda(format!(
            "matmul: {what} = {v} exceeds cuBLAS's 32-bit limit; split the product"
        ))
    })
}

/// The column-major product `s` maps to, with A = rhs and B = lhs (see the module docs).
fn plan(s: &MatmulShape) -> Result<Geometry> {
    let mut s = *s;
    // [b, m, k] · [k, n] with a shared rhs and a plain lhs: one GEMM with b·m rows.
    if s.batch > 1 && !s.trans_lhs && s.rhs_batch_stride == 0 && s.lhs_batch_stride == s.m * s.k {
        s.m *= s.batch;
        s.batch = 1;
    }
    let lda = if s.trans_rhs { s.k } else { s.n };
    let ldb = if s.trans_lhs { s.m } else { s.k };
    Ok(Geometry {
        trans_a: s.trans_rhs,
        trans_b: s.trans_lhs,
        m: int("n", s.n)?,
        n: int("m", s.m)?,
        k: int("k", s.k)?,
        lda: int("leading dimension", lda.max(1))?,
        ldb: int("leading dimension", ldb.max(1))?,
        ldc: int("n", s.n.max(1))?,
        batch: int("batch", s.batch)?,
        stride_a: s.rhs_batch_stride as i64,
        stride_b: s.lhs_batch_stride as i64,
        stride_c: (s.m * s.n) as i64,
    })
}

/// cuBLAS's name for a stored-transposed operand or a plain one.
fn op(trans: bool) -> cublasOperation_t {
    if trans {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// `out[b] = op(lhs[b])·op(rhs[b])` for every batch entry (`out` contiguous `[batch, m, n]`).
/// f32 runs SGEMM; f16 and bf16 run GemmEx with fp32 accumulation.
///
/// # Safety
/// `lhs`, `rhs` and `out` must hold what `s` describes, in type `ty`, on this device; `out` must
/// not overlap the inputs.
///
/// # Errors
/// Another type, a dimension beyond 2³¹, or a cuBLAS failure.
pub unsafe fn matmul(
    gpu: &Gpu,
    ty: CudaType,
    lhs: u64,
    rhs: u64,
    out: u64,
    s: &MatmulShape,
) -> Result<()> {
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return Ok(());
    }
    if s.k == 0 {
        // SAFETY: out holds batch·m·n elements of ty.
        return unsafe { gpu.zero(out, s.batch * s.m * s.n * ty.size()) };
    }
    let p = plan(s)?;
    if ty == CudaType::F32 {
        let x = Operands {
            a: rhs,
            b: lhs,
            d: out,
            bias: 0,
        };
        // SAFETY: forwarded to the caller.
        if unsafe { lt_matmul(gpu, s, &p, Epilogue::None, x) }? {
            return Ok(());
        }
    }
    // SAFETY: forwarded to the caller.
    unsafe { gemm_ex(gpu, (ty, ty), Math::Fp32, (lhs, rhs, out), s, &p) }
}

/// `out[b] = op(lhs[b])·op(rhs[b])` with operands of the type `math` names and an output of `out_ty` (the
/// operands' type, or f32): a product under a precision policy. `Fp32` on f32 is [`matmul`]; `Tf32` runs f32
/// operands on TF32 tensor cores; `Bf16` and `F16` run 16-bit operands on tensor cores. Sums are fp32 in every
/// case; the non-fp32 forms run on cuBLAS's own algorithm choice (GemmEx), untuned.
///
/// # Safety
/// As [`matmul`], with the operands in the type `math` names and `out` in `out_ty`.
///
/// # Errors
/// An output type other than the operands' or f32, a dimension beyond 2³¹, or a cuBLAS failure.
pub unsafe fn matmul_as(
    gpu: &Gpu,
    math: Math,
    out_ty: CudaType,
    (lhs, rhs, out): (u64, u64, u64),
    s: &MatmulShape,
) -> Result<()> {
    let ty = CudaType::operands_of(math);
    if out_ty != ty && out_ty != CudaType::F32 {
        return Err(unsupported("matmul output", out_ty));
    }
    if math == Math::Fp32 {
        // SAFETY: forwarded to the caller.
        return unsafe { matmul(gpu, ty, lhs, rhs, out, s) };
    }
    if s.batch == 0 || s.m == 0 || s.n == 0 {
        return Ok(());
    }
    if s.k == 0 {
        // SAFETY: out holds batch·m·n elements of out_ty.
        return unsafe { gpu.zero(out, s.batch * s.m * s.n * out_ty.size()) };
    }
    let p = plan(s)?;
    // SAFETY: forwarded to the caller.
    unsafe { gemm_ex(gpu, (ty, out_ty), math, (lhs, rhs, out), s, &p) }
}

/// cuBLAS's name for one of the types products take.
fn data_type(ty: CudaType) -> Result<cudaDataType> {
    Ok(match ty {
        CudaType::F32 => cudaDataType::CUDA_R_32F,
        CudaType::F16 => cudaDataType::CUDA_R_16F,
        CudaType::BF16 => cudaDataType::CUDA_R_16BF,
        other => return Err(unsupported("matmul", other)),
    })
}

/// The plan `p` of `s` as one strided-batched GemmEx call: operands of `ty`, output of `out_ty`, fp32 sums (on
/// TF32 tensor cores under `Math::Tf32`).
///
/// # Safety
/// As [`matmul_as`].
unsafe fn gemm_ex(
    gpu: &Gpu,
    (ty, out_ty): (CudaType, CudaType),
    math: Math,
    (lhs, rhs, out): (u64, u64, u64),
    s: &MatmulShape,
    p: &Geometry,
) -> Result<()> {
    let (dt, ct) = (data_type(ty)?, data_type(out_ty)?);
    let compute = if math == Math::Tf32 {
        cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let tag = match math {
        Math::Fp32 => "",
        Math::Tf32 => " tf32",
        Math::Bf16 => " bf16",
        Math::F16 => " f16",
    };
    let alpha = 1.0f32;
    let beta = 0.0f32;
    gpu.timed(
        || label(s, tag),
        || {
            gpu.with_blas(|h| {
                // SAFETY: pointers and geometry per the caller; alpha / beta live on the stack for
                // the call (host pointer mode).
                unsafe {
                    cudarc::cublas::result::gemm_strided_batched_ex(
                        h,
                        op(p.trans_a),
                        op(p.trans_b),
                        p.m,
                        p.n,
                        p.k,
                        (&alpha) as *const f32 as *const c_void,
                        rhs as *const c_void,
                        dt,
                        p.lda,
                        p.stride_a,
                        lhs as *const c_void,
                        dt,
                        p.ldb,
                        p.stride_b,
                        (&beta) as *const f32 as *const c_void,
                        out as *mut c_void,
                        ct,
                        p.ldc,
                        p.stride_c,
                        p.batch,
                        compute,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| cuda_err("cublasGemmStridedBatchedEx", e))
            })
        },
    )
}

fn label(s: &MatmulShape, epilogue: &str) -> String {
    let t = |yes| if yes { 'T' } else { 'N' };
    let (a, b) = (t(s.trans_lhs), t(s.trans_rhs));
    format!("gemm{a}{b}{epilogue} {}x{}x{} x{}", s.m, s.n, s.k, s.batch)
}

/// The product `g` (the plan of `s`) through cuBLASLt; `false` when it has no algorithm for it.
///
/// # Safety
/// As [`matmul`], and the epilogue's vector as [`matmul_bias`] and [`matmul_rhs_sums`] describe.
unsafe fn lt_matmul(
    gpu: &Gpu,
    s: &MatmulShape,
    g: &Geometry,
    e: Epilogue,
    x: Operands,
) -> Result<bool> {
    // SAFETY: forwarded to the caller.
    gpu.with_lt(|lt| unsafe { lt.matmul(gpu, g, e, x, &|| label(s, e.tag())) })
}

/// The f32 product `s` with an epilogue that reads or writes one vector per batch entry, `stride`
/// elements apart, at `vector`; `false`, queuing nothing, where it cannot run: another type, an
/// empty product, a plan that merged per-entry vectors into one product, a vector not 16-byte
/// aligned, or no cuBLASLt algorithm.
///
/// # Safety
/// As [`matmul`]; `vector` must hold what `s` and `stride` describe, in f32.
unsafe fn with_vector(
    gpu: &Gpu,
    ty: CudaType,
    (lhs, rhs, out, vector): (u64, u64, u64, u64),
    s: &MatmulShape,
    stride: usize,
    epilogue: impl FnOnce(i64) -> Epilogue,
) -> Result<bool> {
    if ty != CudaType::F32 || s.batch == 0 || s.m == 0 || s.n == 0 || s.k == 0 {
        return Ok(false);
    }
    let g = plan(s)?;
    // A plan that merged the batch into one product cannot take a vector per batch entry.
    if g.batch as usize != s.batch && stride != 0 {
        return Ok(false);
    }
    let stride = if g.batch > 1 { stride } else { 0 };
    if !aligned16(&[vector, (stride * 4) as u64]) {
        return Ok(false);
    }
    let x = Operands {
        a: rhs,
        b: lhs,
        d: out,
        bias: vector,
    };
    // SAFETY: forwarded to the caller.
    unsafe { lt_matmul(gpu, s, &g, epilogue(stride as i64), x) }
}

/// `out[b] = op(lhs[b])·op(rhs[b]) + bias[b]`, then a ReLU when `relu`, in one cuBLASLt call:
/// a Linear layer's forward. `bias[b]` is the `n` elements at `bias + b·bias_batch_stride`
/// (stride 0: one bias for every batch entry), added to every row of `out[b]`.
///
/// Returns `false`, queuing nothing, where the epilogue cannot run: a type other than f32, a
/// bias not 16-byte aligned, or a geometry cuBLASLt has no such epilogue for. The caller then
/// runs the product and the bias apart.
///
/// # Safety
/// As [`matmul`]; `bias` must hold the biases `s` and the stride describe, in f32.
///
/// # Errors
/// A dimension beyond 2³¹, or a cuBLASLt failure.
pub unsafe fn matmul_bias(
    gpu: &Gpu,
    ty: CudaType,
    ptrs: (u64, u64, u64, u64),
    s: &MatmulShape,
    bias_batch_stride: usize,
    relu: bool,
) -> Result<bool> {
    // SAFETY: forwarded to the caller.
    unsafe {
        with_vector(gpu, ty, ptrs, s, bias_batch_stride, |stride| {
            Epilogue::Bias { stride, relu }
        })
    }
}

/// `out[b] = op(lhs[b])·rhs[b]`, and `sums[b]` the sums of `rhs[b]`'s `k` rows (`n` elements at
/// `sums + b·sums_batch_stride`), in one cuBLASLt call: a Linear layer's weight and bias
/// gradients from its input (`lhs`, transposed) and its output's gradient (`rhs`).
///
/// Returns `false`, queuing nothing, where that epilogue cannot run: a type other than f32, a
/// transposed `rhs`, sums not 16-byte aligned, or a geometry cuBLASLt has no such epilogue for.
///
/// # Safety
/// As [`matmul`]; `sums` must hold what `s` and the stride describe, in f32.
///
/// # Errors
/// A dimension beyond 2³¹, or a cuBLASLt failure.
pub unsafe fn matmul_rhs_sums(
    gpu: &Gpu,
    ty: CudaType,
    ptrs: (u64, u64, u64, u64),
    s: &MatmulShape,
    sums_batch_stride: usize,
) -> Result<bool> {
    if s.trans_rhs {
        return Ok(false);
    }
    // SAFETY: forwarded to the caller.
    unsafe {
        with_vector(gpu, ty, ptrs, s, sums_batch_stride, |stride| {
            Epilogue::SumsOfA { stride }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{cpu, thin};

    /// The thread-per-output kernel against the CPU on a head's products: its forward with a
    /// bias, its input gradient (10 contracted terms, batched), and a shared transposed lhs with a
    /// bias per batch entry and a ReLU.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_thread_per_output_matches_the_cpu() {
        let gpu = Gpu::get(0).unwrap();
        let shape = |batch, m, n, k, lhs_batch_stride, rhs_batch_stride, trans_lhs, trans_rhs| {
            MatmulShape {
                batch,
                m,
                n,
                k,
                lhs_batch_stride,
                rhs_batch_stride,
                trans_lhs,
                trans_rhs,
            }
        };
        for (s, bias_stride, relu) in [
            (shape(1, 256, 10, 128, 0, 0, false, false), Some(0), false),
            (shape(3, 256, 128, 10, 2560, 1280, false, true), None, false),
            (
                shape(2, 64, 16, 24, 0, 24 * 16, true, false),
                Some(16),
                true,
            ),
        ] {
            let a: Vec<f32> = (0..s.k * s.m + s.lhs_batch_stride * s.batch)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let b: Vec<f32> = (0..s.k * s.n + s.rhs_batch_stride * s.batch)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let bias: Vec<f32> = (0..s.n * s.batch).map(|i| i as f32 / 10.0 - 1.0).collect();
            let (da, db, dbias) = (
                gpu.upload_f32(&a),
                gpu.upload_f32(&b),
                gpu.upload_f32(&bias),
            );
            let len = s.batch * s.m * s.n;
            let out = gpu.upload_f32(&vec![f32::NAN; len]);
            let g = plan(&s).unwrap();
            let e = match bias_stride {
                Some(stride) => Epilogue::Bias {
                    stride: stride as i64,
                    relu,
                },
                None => Epilogue::None,
            };
            assert!(thin::eligible(&g, &e), "{s:?}");
            assert_eq!(
                g.batch as usize, s.batch,
                "one bias per batch entry needs the batch kept"
            );
            let x = Operands {
                a: db.ptr(),
                b: da.ptr(),
                d: out.ptr(),
                bias: if bias_stride.is_some() {
                    dbias.ptr()
                } else {
                    0
                },
            };
            // SAFETY: the buffers hold what `s` describes.
            unsafe { thin::run(&gpu, &g, &e, x).unwrap() };
            let mut got = vec![0f32; len];
            // SAFETY: `out` holds len f32.
            unsafe {
                gpu.dtoh(out.ptr(), bytemuck::cast_slice_mut(&mut got))
                    .unwrap()
            };
            let mut want = cpu::matmul(&a, &b, &s);
            if let Some(stride) = bias_stride {
                for (i, w) in want.iter_mut().enumerate() {
                    let (entry, col) = (i / (s.m * s.n), i % s.n);
                    *w += bias[entry * stride + col];
                    if relu {
                        *w = w.max(0.0);
                    }
                }
            }
            for (i, (x, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{s:?} element {i}: {x} vs {w}"
                );
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_product_split_at_a_column_equals_the_whole() {
        let gpu = Gpu::get(0).unwrap();
        // A weight gradient as fused members make it: 272 rows (256 + 16) of the row-major
        // output are D's columns; the split puts the last 16 in a second product.
        let s = MatmulShape {
            batch: 3,
            m: 272,
            n: 64,
            k: 96,
            lhs_batch_stride: 0,
            rhs_batch_stride: 96 * 64,
            trans_lhs: true,
            trans_rhs: false,
        };
        let a: Vec<f32> = (0..s.k * s.m)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let b: Vec<f32> = (0..s.batch * s.k * s.n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
            .collect();
        let (da, db) = (gpu.upload_f32(&a), gpu.upload_f32(&b));
        let len = s.batch * s.m * s.n;
        let out = gpu.upload_f32(&vec![f32::NAN; len]);
        let g = plan(&s).unwrap();
        let x = Operands {
            a: db.ptr(),
            b: da.ptr(),
            d: out.ptr(),
            bias: 0,
        };
        let ran = gpu
            .with_lt(|lt| {
                // SAFETY: the buffers hold what `s` describes.
                unsafe { lt.matmul_split(&gpu, &g, Epilogue::None, x, 256, &|| "split".into()) }
            })
            .unwrap();
        assert!(ran);
        let mut got = vec![0f32; len];
        // SAFETY: `out` holds len f32.
        unsafe {
            gpu.dtoh(out.ptr(), bytemuck::cast_slice_mut(&mut got))
                .unwrap()
        };
        let want = cpu::matmul(&a, &b, &s);
        for (i, (x, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (x - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "element {i}: {x} vs {w}"
            );
        }
    }
}
