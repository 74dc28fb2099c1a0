//! Helpers shared by the op tests: seeded inputs, naive f64 references, tolerances, and the
//! per-device test macro.
#![allow(dead_code)]

use cohort_tensor::{DType, Device, Result, Tensor};

/// The float dtypes a device computes in.
pub fn float_dtypes(dev: &Device) -> Vec<DType> {
    if dev.is_cuda() {
        vec![DType::F32]
    } else {
        vec![DType::F32, DType::F64]
    }
}

/// Relative error bound per dtype.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        _ => 2e-5,
    }
}

/// A fresh uniform [-1, 1) tensor; the seed mixes in a per-test salt so inputs differ per case.
pub fn rand(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::rand_uniform(shape, -1.0, 1.0, dtype, seed, dev)
}

/// A positive tensor in [lo, hi).
pub fn rand_pos(shape: &[usize], seed: u64, dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::rand_uniform(shape, 0.1, 2.0, dtype, seed, dev)
}

/// The elements as f64 on the host.
pub fn host(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu)
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec::<f64>())
        .expect("reading a tensor back")
}

/// Asserts `got` has `shape` and each element is within `tol·(1 + |want|)` of `want`.
pub fn assert_close(what: &str, got: &Tensor, shape: &[usize], want: &[f64], tol: f64) {
    assert_eq!(got.shape(), shape, "{what}: shape");
    let g = host(got);
    assert_eq!(g.len(), want.len(), "{what}: element count");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let ok = (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan()) || a == b;
        assert!(
            ok,
            "{what}: element {i}: got {a}, want {b} (tol {tol}, dtype {})",
            got.dtype()
        );
    }
}

/// Row-major strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The multi-index of flat index `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// Reads `v` (shape `shape`) at a multi-index of the broadcast shape `out` (right-aligned).
pub fn at_broadcast(v: &[f64], shape: &[usize], out_idx: &[usize]) -> f64 {
    let pad = out_idx.len() - shape.len();
    let st = strides(shape);
    let mut off = 0;
    for d in 0..shape.len() {
        let i = if shape[d] == 1 { 0 } else { out_idx[pad + d] };
        off += i * st[d];
    }
    v[off]
}

/// Expands `case(dev)` bodies into one test per device: `cpu::name` runs, `cuda::name` is ignored
/// without a GPU (run with `--include-ignored` on one).
#[macro_export]
macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $name() -> cohort_tensor::Result<()> {
                    super::$name(&cohort_tensor::Device::Cpu)
                }
            )*
        }
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU"]
                fn $name() -> cohort_tensor::Result<()> {
                    super::$name(&cohort_tensor::Device::Cuda(0))
                }
            )*
        }
    };
}
