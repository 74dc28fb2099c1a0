//! The precision policy: in what arithmetic the products (matrix products, convolutions and fused
//! attention's products) of the ops on this thread run, as PyTorch's `allow_tf32` flags and
//! `torch.autocast` choose it.
//!
//! - [`Precision::Fp32`] (the default): fp32 multiply-adds, results the CPU's to rounding; fused
//!   attention's products run as three TF32 tensor-core products each (3xTF32, fp32's accuracy,
//!   as PyTorch's fp32 attention does).
//! - [`Precision::Tf32`]: f32 tensors, products on TF32 tensor cores (10-bit mantissas in, fp32
//!   sums), PyTorch's `torch.backends.{cuda.matmul,cudnn}.allow_tf32 = True`; fused attention's
//!   products too (heads up to 128 wide), where PyTorch's fp32 attention keeps fp32's accuracy
//!   whatever the flags.
//! - [`Precision::Bf16`], [`Precision::F16`]: mixed precision, `torch.autocast(dtype=...)`: f32
//!   operands of a product are cast to the low type, the product sums in fp32 and returns f32;
//!   a convolution given an input already in the low type returns its output (and the input's
//!   gradient) in that type, so that a model's activations stay 16-bit through the convolutions,
//!   ReLUs, max pooling, batch norm (f32 statistics) and residual sums between them, as autocast
//!   keeps them (autograd's layers cast to f32 where another layer follows);
//!   fused attention rounds its operands to the low type inside the kernel (tensor cores, heads up
//!   to 128 wide), its softmax and tensors staying f32.
//!   Parameters, their gradients and optimizer state stay f32 (the master weights); the autograd
//!   ops keep the low copies of what a product's backward needs, which halves that memory. f16's
//!   narrow range needs loss scaling (`cohort_optim::LossScaler`); bf16's does not.
//!
//! The policy applies on CUDA. The CPU has no TF32 and no low-type products here, so its products
//! stay fp32 whatever the policy (as PyTorch's `allow_tf32` has no effect on the CPU).
//!
//! A policy holds for the thread while a [`PrecisionScope`] lives (see [`Precision::enter`]);
//! autograd records each product's policy so that its backward runs in the same one.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

use crate::DType;

/// In what arithmetic products run (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Precision {
    /// fp32 multiply-adds.
    #[default]
    Fp32,
    /// f32 tensors, TF32 tensor-core products.
    Tf32,
    /// Mixed: products in bfloat16, summed in fp32.
    Bf16,
    /// Mixed: products in float16, summed in fp32 (wants loss scaling).
    F16,
}

thread_local! {
    static CURRENT: Cell<Precision> = const { Cell::new(Precision::Fp32) };
}

impl Precision {
    /// Every policy, in the order of the docs.
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Bf16,
        Precision::F16,
    ];

    /// The policy of this thread's ops.
    #[must_use]
    pub fn current() -> Precision {
        CURRENT.with(Cell::get)
    }

    /// Makes `self` this thread's policy until the returned scope drops (scopes nest).
    #[must_use = "the policy holds only while the scope lives"]
    pub fn enter(self) -> PrecisionScope {
        PrecisionScope {
            before: CURRENT.with(|c| c.replace(self)),
        }
    }

    /// The type products run in under a mixed policy; `None` under `fp32` and `tf32`.
    #[must_use]
    pub fn low(self) -> Option<DType> {
        match self {
            Precision::Fp32 | Precision::Tf32 => None,
            Precision::Bf16 => Some(DType::BF16),
            Precision::F16 => Some(DType::F16),
        }
    }

    /// Whether f32 products may run on TF32 tensor cores.
    #[must_use]
    pub fn tf32(self) -> bool {
        self == Precision::Tf32
    }

    /// The name used in configurations and reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown precision {s:?}: expected \"fp32\" (the default), \"tf32\" (TF32 tensor cores), \
                     \"bf16\" or \"f16\" (mixed precision, fp32 master weights)"
                )
            })
    }
}

/// This thread's policy until it drops; then the one before it again.
#[derive(Debug)]
pub struct PrecisionScope {
    before: Precision,
}

impl Drop for PrecisionScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.before));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(Precision::current(), Precision::Fp32);
        {
            let _a = Precision::Bf16.enter();
            assert_eq!(Precision::current(), Precision::Bf16);
            {
                let _b = Precision::Tf32.enter();
                assert_eq!(Precision::current(), Precision::Tf32);
            }
            assert_eq!(Precision::current(), Precision::Bf16);
        }
        assert_eq!(Precision::current(), Precision::Fp32);
        // Another thread keeps its own policy.
        let _c = Precision::F16.enter();
        let there = std::thread::spawn(Precision::current).join().unwrap();
        assert_eq!(there, Precision::Fp32);
    }

    #[test]
    fn names_read_back_and_bad_ones_say_what_is_accepted() {
        for p in Precision::ALL {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        let e = "fp16".parse::<Precision>().unwrap_err();
        assert!(e.contains("\"fp16\"") && e.contains("\"bf16\""), "{e}");
        assert_eq!(Precision::Bf16.low(), Some(DType::BF16));
        assert_eq!(Precision::Tf32.low(), None);
        assert!(Precision::Tf32.tf32() && !Precision::Bf16.tf32());
    }
}
