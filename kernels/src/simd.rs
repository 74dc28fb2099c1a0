//! How the CPU kernels use the vector units: the widest instruction set they may run, and flush-to-zero.

/// The widest x86 vector extension the CPU kernels run.
///
/// AVX-512 needs the `avx512` feature (which also selects the `gemm` crate's AVX-512 microkernels) and a CPU that
/// has it; a build without the feature runs the AVX2 paths on any CPU, which is how figures for machines without
/// AVX-512 are measured on one that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F with FMA: 16 f32 lanes.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2,
    /// Neither (or not x86-64): what the compiler's baseline gives.
    Baseline,
}

impl Isa {
    /// What this build and this CPU allow, detected once.
    pub fn current() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(Isa::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> Isa {
        use std::arch::is_x86_feature_detected as has;
        if cfg!(feature = "avx512") && has!("avx512f") && has!("fma") {
            Isa::Avx512
        } else if has!("avx2") && has!("fma") {
            Isa::Avx2
        } else {
            Isa::Baseline
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Isa {
        Isa::Baseline
    }

    /// f32 lanes of one vector register.
    pub fn f32_lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
            Isa::Baseline => 4,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isa::Avx512 => "AVX-512",
            Isa::Avx2 => "AVX2",
            Isa::Baseline => "baseline SIMD",
        })
    }
}

/// Flushes denormal floats to zero on this thread while it lives, then restores the thread's mode.
///
/// An optimizer's moments decay geometrically toward zero: once a gradient's square falls below f32's normal range
/// (1.2e-38), every operation on it takes a microcode assist, and an Adam step took 6× as long here. TensorFlow and
/// XLA run their CPU kernels with flush-to-zero for the same reason (PyTorch offers `torch.set_flush_denormal`).
#[derive(Debug)]
pub(crate) struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

/// MXCSR's flush-to-zero (results) and denormals-are-zero (inputs) bits.
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

impl FlushDenormals {
    pub(crate) fn new() -> FlushDenormals {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = mxcsr();
            set_mxcsr(saved | FTZ_DAZ);
            FlushDenormals { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushDenormals {}
    }
}

impl Drop for FlushDenormals {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        set_mxcsr(self.saved);
    }
}

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut csr = 0u32;
    // SAFETY: stmxcsr stores the 32-bit control register into the local it points at; SSE is baseline on x86-64.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    csr
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(csr: u32) {
    // SAFETY: ldmxcsr loads a value read from the register with only the FTZ and DAZ bits changed, both valid.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denormals_flush_only_while_the_guard_lives() {
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let half = std::hint::black_box(0.5f32);
        assert!((tiny * half).is_subnormal());
        {
            let _ftz = FlushDenormals::new();
            let flushed = std::hint::black_box(tiny) * std::hint::black_box(half);
            if cfg!(target_arch = "x86_64") {
                assert_eq!(flushed, 0.0);
            }
        }
        assert!((std::hint::black_box(tiny) * half).is_subnormal());
    }

    #[test]
    fn the_isa_has_at_least_baseline_lanes() {
        assert!(Isa::current().f32_lanes() >= 4);
    }
}
