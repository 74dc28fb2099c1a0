//! Stand-ins for builds without the `cuda` feature: every entry point reports
//! [`Error::NotCompiledWithCuda`].

use std::sync::Arc;

use crate::{Error, Result};

/// A CUDA device. This build has no CUDA support, so no value of it can exist.
#[derive(Debug)]
pub enum Gpu {}

impl Gpu {
    /// Always fails: this build has no CUDA support.
    ///
    /// # Errors
    /// [`Error::NotCompiledWithCuda`].
    pub fn get(_ordinal: usize) -> Result<Arc<Gpu>> {
        Err(Error::NotCompiledWithCuda)
    }
}

/// Always `false`: this build has no CUDA support.
pub fn driver_present() -> bool {
    false
}

/// Always 0: this build has no CUDA support.
///
/// # Errors
/// Never; the signature matches the CUDA build.
pub fn device_count() -> Result<usize> {
    Ok(0)
}

/// Nothing to keep: this build compiles no kernels. The signature matches the CUDA build.
pub fn set_kernel_cache(_dir: Option<std::path::PathBuf>) {}
