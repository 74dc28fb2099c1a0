//! The process-wide determinism setting: PyTorch's `torch.use_deterministic_algorithms(True)` together with
//! `torch.backends.cudnn.benchmark = False`. Off by default, as in PyTorch.
//!
//! The CPU kernels need no setting: every float sum is grouped the same way whatever the number of rayon threads
//! (work is split into fixed-size pieces combined in order, never by `current_num_threads` or work stealing), so a
//! run gives the same bits with one thread or many.
//!
//! On the GPU, the same kernels on the same device and library versions give the same bits, except where a choice
//! is made by timing or a float sum is left to the order in which threads arrive. With the setting on:
//!
//! - f32 products take the first algorithm of cuBLASLt's heuristics for every geometry and time nothing, so there
//!   are no split products and no thread-per-output kernel either (both are chosen by timing): two fresh processes
//!   make the same choices. Choices adopted with `Gpu::adopt_gemm_choices` are kept as they were saved. cuBLAS
//!   (f16, bf16 and the products cuBLASLt refuses) gets a workspace of one size on every stream and in graphs, since
//!   its own choice of kernel may depend on the workspace it is given.
//! - convolutions through cuDNN take the heuristics' first algorithm that cuDNN reports as deterministic, and time
//!   nothing (the own kernels, where cuDNN is absent, add in a fixed order); a choice made before the setting
//!   that is not deterministic is made again.
//! - the kernels whose float sums took several `atomicAdd`s into one element run a variant that adds in a fixed
//!   order (the CPU kernel's order): max-pool's backward where windows overlap, and `index_add` (an embedding's
//!   gradient with repeated indices). Every other `atomicAdd` meets at most one float per element in a launch, or
//!   counts integers, so its result does not depend on the order.
//!
//! No GPU op is left that cannot be made deterministic, so none is refused. Change the setting before the first
//! product: choices already made stay in use.
//!
//! ```
//! cohort_kernels::set_deterministic(true);
//! assert!(cohort_kernels::deterministic());
//! cohort_kernels::set_deterministic(false);
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Turns deterministic algorithms on or off for the whole process (see the [module docs](self)).
pub fn set_deterministic(on: bool) {
    DETERMINISTIC.store(on, Ordering::Relaxed);
}

/// Whether deterministic algorithms are on (see [`set_deterministic`]).
pub fn deterministic() -> bool {
    DETERMINISTIC.load(Ordering::Relaxed)
}

/// Serializes the unit tests that set the mode or depend on it (one process runs them side by side); the mode is
/// off again when the guard drops.
#[cfg(all(test, feature = "cuda"))]
pub(crate) fn exclusive(on: bool) -> impl Drop {
    use std::sync::{Mutex, MutexGuard, PoisonError};
    static LOCK: Mutex<()> = Mutex::new(());
    struct Mode {
        _lock: MutexGuard<'static, ()>,
    }
    impl Drop for Mode {
        fn drop(&mut self) {
            set_deterministic(false);
        }
    }
    let guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    set_deterministic(on);
    Mode { _lock: guard }
}
