//! Fused attention ([`Var::attention`]) against the unfused composition it replaced (scores, mask, softmax,
//! weighted values) in f64 on the CPU: outputs and gradients, with causal and padding masks, query and key counts
//! on and off the kernels' tiles, every head-width tier of the CUDA kernels, and widths with and without their
//! vector reads. On a GPU (f32) the same cases against that reference, also with the products on tensor cores in
//! bf16, f16 and TF32, and memory linear in the sequence length:
//! `cargo test -p cohort-autograd --features cohort-tensor/cuda --test attention -- --include-ignored`.

use cohort_autograd::{Result, Tape, Var};
use cohort_tensor::{DType, Device, Precision, Tensor, memory};

const CPU: Device = Device::Cpu;

/// One call's geometry and masks.
#[derive(Clone, Copy, Debug)]
struct Case {
    seqs: usize,
    len: usize,
    heads: usize,
    head_dim: usize,
    causal: bool,
    /// Padding on the last sequence's first keys (so its first causal queries see none) and on its last key.
    padded: bool,
}

impl Case {
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The key mask `[seqs, len]` (1 a key, 0 padding), in f64.
    fn keys(&self) -> Option<Tensor> {
        self.padded.then(|| {
            let mut m = vec![1.0f64; self.seqs * self.len];
            let last = (self.seqs - 1) * self.len;
            for j in (0..3.min(self.len)).chain([self.len - 1]) {
                m[last + j] = 0.0;
            }
            Tensor::from_vec(m, &[self.seqs, self.len], &CPU).unwrap()
        })
    }

    /// Does query `i` of sequence `s` see key `j`?
    fn sees(&self, keys: Option<&[f64]>, s: usize, i: usize, j: usize) -> bool {
        !(self.causal && j > i) && keys.is_none_or(|k| k[s * self.len + j] != 0.0)
    }
}

/// Attention written as separate ops: per head, `softmax(q·kᵀ/√d)` over the keys a query sees, times `v`; a
/// query that sees no key gives zeros.
fn composed(qkv: &Var, c: &Case) -> Result<Var> {
    let (n, l, h, d) = (c.seqs, c.len, c.heads, c.head_dim);
    let parts = qkv
        .reshape(&[n, l, 3 * h, d])?
        .swap_adjacent(1)?
        .reshape(&[n, 3, h * l * d])?;
    let part = |i| parts.narrow(1, i, 1)?.reshape(&[n * h, l, d]);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scores = q
        .matmul_t(&k, false, true)?
        .mul_scalar(1.0 / (d as f64).sqrt())?;
    let keys = c.keys().map(|k| k.to_vec::<f64>().unwrap());
    let mut allowed = vec![0.0f64; n * h * l * l];
    let mut any = vec![0.0f64; n * h * l];
    for g in 0..n * h {
        for i in 0..l {
            for j in 0..l {
                if c.sees(keys.as_deref(), g / h, i, j) {
                    allowed[(g * l + i) * l + j] = 1.0;
                    any[g * l + i] = 1.0;
                }
            }
        }
    }
    let allowed = Tensor::from_vec(allowed, &[n * h, l, l], &CPU)?;
    let low = Var::constant(Tensor::full(&[1], -1e300, DType::F64, &CPU)?);
    let att = Var::where_cond(&allowed, &scores, &low)?
        .softmax_last()?
        .mul(&Var::constant(Tensor::from_vec(any, &[n * h, l, 1], &CPU)?))?;
    att.matmul(&v)?
        .reshape(&[n, h, l, d])?
        .swap_adjacent(1)?
        .reshape(&[n, l, h * d])
}

/// `(output, gradient of qkv)` of `sum(attention(qkv) * r)`, on the host in f64.
fn run(
    qkv: &Tensor,
    r: &Tensor,
    attend: impl Fn(&Var) -> Result<Var>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let tape = Tape::new();
    let x = tape.watch(qkv.clone());
    let out = attend(&x)?;
    let r = Var::constant(r.to_dtype(qkv.dtype())?.to_device(&qkv.device())?);
    let grads = tape.backward(&out.mul(&r)?.sum_all()?)?;
    let host = |t: &Tensor| t.to_device(&CPU)?.to_dtype(DType::F64)?.to_vec::<f64>();
    Ok((
        host(out.value())?,
        host(grads.get(&x).expect("a gradient"))?,
    ))
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (seqs, len, heads, head_dim) in [
        (2, 37, 2, 8),
        (1, 70, 1, 64),
        (1, 150, 2, 32),
        (2, 33, 2, 100),
        (1, 70, 1, 128),
        (1, 19, 1, 160),
    ] {
        for (causal, padded) in [(false, false), (true, false), (false, true), (true, true)] {
            v.push(Case {
                seqs,
                len,
                heads,
                head_dim,
                causal,
                padded,
            });
        }
    }
    v.push(Case {
        seqs: 3,
        len: 1,
        heads: 4,
        head_dim: 2,
        causal: true,
        padded: false,
    });
    v
}

/// Enough 64-row tiles (640) to fill any device's SMs 4 times over: fp32 then runs as 3xTF32 on tensor cores,
/// where the smaller cases run the fp32 multiply-add kernels.
fn wide() -> Case {
    Case {
        seqs: 80,
        len: 128,
        heads: 4,
        head_dim: 64,
        causal: true,
        padded: true,
    }
}

/// Fused attention on `dev` (f64 on the CPU, f32 on CUDA) gives the composed ops' output and gradient.
fn fused_matches_composed(dev: &Device) -> Result<()> {
    if dev.is_cuda() {
        let mut all = cases();
        all.push(wide());
        matches_composed(dev, DType::F32, Precision::Fp32, 2e-5, &all)
    } else {
        matches_composed(dev, DType::F64, Precision::Fp32, 1e-11, &cases())
    }
}

/// Under a mixed policy on CUDA the products run on tensor cores in the 16-bit type, under TF32 in TF32 (heads up
/// to 128 wide; the 160-wide ones stay fp32): within the type's rounding of the composed f64 ops, relative to the
/// largest value.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_tensor_core_policies_match_composed() -> Result<()> {
    let dev = Device::Cuda(0);
    matches_composed(&dev, DType::F32, Precision::Bf16, 3e-2, &cases())?;
    matches_composed(&dev, DType::F32, Precision::F16, 5e-3, &cases())?;
    matches_composed(&dev, DType::F32, Precision::Tf32, 5e-3, &cases())?;
    // TF32 is not the fp32 kernels under another name: operands rounded to 10-bit mantissas give another output.
    let qkv = Tensor::rand_uniform(&[1, 70, 3 * 64], -2.0, 2.0, DType::F32, 7, &dev)?;
    let r = Tensor::rand_uniform(&[1, 70, 64], -1.0, 1.0, DType::F32, 8, &dev)?;
    let under = |p: Precision| {
        let _policy = p.enter();
        run(&qkv, &r, |x| x.attention(1, false, None))
    };
    assert_ne!(under(Precision::Fp32)?.0, under(Precision::Tf32)?.0);
    Ok(())
}

/// Fused attention on `dev` in `dt` under `precision` against the composed ops in f64 on the CPU: every output and
/// gradient within `tol` of the largest.
fn matches_composed(
    dev: &Device,
    dt: DType,
    precision: Precision,
    tol: f64,
    cases: &[Case],
) -> Result<()> {
    for (i, c) in cases.iter().enumerate() {
        let qkv = Tensor::rand_uniform(
            &[c.seqs, c.len, 3 * c.width()],
            -2.0,
            2.0,
            DType::F64,
            10 + i as u64,
            &CPU,
        )?;
        let r = Tensor::rand_uniform(
            &[c.seqs, c.len, c.width()],
            -1.0,
            1.0,
            DType::F64,
            90 + i as u64,
            &CPU,
        )?;
        let (want_out, want_grad) = run(&qkv, &r, |x| composed(x, c))?;
        let keys = c
            .keys()
            .map(|k| k.to_dtype(dt)?.to_device(dev))
            .transpose()?;
        let (out, grad) = {
            let _policy = precision.enter();
            run(&qkv.to_dtype(dt)?.to_device(dev)?, &r, |x| {
                x.attention(c.heads, c.causal, keys.as_ref())
            })?
        };
        let scale = |v: &[f64]| v.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for (what, got, want) in [("output", &out, &want_out), ("gradient", &grad, &want_grad)] {
            let s = scale(want);
            for (j, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                assert!(
                    (g - w).abs() <= tol * s,
                    "{c:?} on {dev:?} in {precision}: {what} [{j}]: {g}, composed {w}"
                );
            }
        }
        if c.padded && c.causal {
            // The last sequence's first three queries see no key: zeros out, and no gradient through them as queries.
            let w = c.width();
            let first = (c.seqs - 1) * c.len * w;
            assert!(
                out[first..first + 3.min(c.len) * w]
                    .iter()
                    .all(|&x| x == 0.0),
                "{c:?}: a blind query gives zeros"
            );
        }
    }
    Ok(())
}

/// Forward and backward at 8,192 positions hold a few copies of the inputs, not the 2 GiB of scores. The work runs
/// under a tenant of its own: the test harness runs this binary's other tests beside it, on the default tenant.
fn memory_is_linear_in_the_sequence_length(dev: &Device) -> Result<()> {
    let (n, l, h, d) = (2, 8192, 4, 64);
    let alloc = memory::allocator(dev)?;
    let tenant = alloc
        .add_tenant("attention-memory-test", Default::default())
        .expect("a tenant of its own");
    memory::with_tenant(tenant, || {
        let qkv = Tensor::rand_uniform(&[n, l, 3 * h * d], -1.0, 1.0, DType::F32, 1, dev)?;
        let r = Tensor::rand_uniform(&[n, l, h * d], -1.0, 1.0, DType::F32, 2, dev)?;
        alloc.reset_tenant_peak(tenant);
        let before = alloc.tenant_stats(tenant).expect("the tenant").in_use;
        let tape = Tape::new();
        let x = tape.watch(qkv.clone());
        let out = x.attention(h, true, None)?;
        let grads = tape.backward(&out.mul(&Var::constant(r))?.sum_all()?)?;
        assert_eq!(grads.get(&x).expect("a gradient").shape(), qkv.shape());
        let peak = alloc.tenant_stats(tenant).expect("the tenant").peak_in_use - before;
        let qkv_bytes = (qkv.elem_count() * 4) as u64;
        let scores = (n * h * l * l * 4) as u64;
        assert!(
            peak < 6 * qkv_bytes && peak < scores / 16,
            "peak {peak} B for qkv of {qkv_bytes} B (scores would be {scores} B)"
        );
        Ok(())
    })
}

#[test]
fn shapes_that_do_not_fit_are_refused_with_the_reason() {
    let t = |s: &[usize]| Tensor::zeros(s, DType::F32, &CPU).unwrap();
    let msg = |r: cohort_tensor::Result<(Tensor, Tensor)>| r.unwrap_err().to_string();
    let plain = cohort_tensor::AttentionMask::default();
    assert!(msg(t(&[4, 12]).attention(2, plain)).contains("packed projection"));
    assert!(msg(t(&[1, 4, 12]).attention(5, plain)).contains("heads dividing"));
    let keys = t(&[3, 4]);
    let masked = cohort_tensor::AttentionMask {
        causal: false,
        keys: Some(&keys),
    };
    assert!(msg(t(&[2, 4, 12]).attention(2, masked)).contains("R dividing 2"));
    let f64_keys = Tensor::zeros(&[2, 4], DType::F64, &CPU).unwrap();
    let wrong_type = cohort_tensor::AttentionMask {
        causal: false,
        keys: Some(&f64_keys),
    };
    assert!(t(&[2, 4, 12]).attention(2, wrong_type).is_err());
}

macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        mod cpu {
            $(
                #[test]
                fn $name() -> cohort_autograd::Result<()> {
                    super::$name(&cohort_tensor::Device::Cpu)
                }
            )*
        }
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a CUDA GPU"]
                fn $name() -> cohort_autograd::Result<()> {
                    super::$name(&cohort_tensor::Device::Cuda(0))
                }
            )*
        }
    };
}

device_tests!(fused_matches_composed);

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_memory_is_linear_in_the_sequence_length() -> Result<()> {
    memory_is_linear_in_the_sequence_length(&Device::Cuda(0))
}
