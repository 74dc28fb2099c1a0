//! Models a Rust program hands to a cohort: `model = { custom = "NAME" }` in a member table names a function
//! registered here, which builds the member's [`Model`] from the data's example shape and [`BuildOptions`].
//!
//! A custom model is any [`cohort_autograd::nn::Module`] wrapped by [`Model::new`] (or a [`ModelSpec`] built in
//! code). It follows the member-dimension convention of `cohort_autograd::nn`: parameters `[M, ..]`, output
//! `[M, B, ..]`. The cohort gives it everything a config member has (optimizer, memory budget, checkpoints, logs,
//! OOM recovery, a control-file entry) but trains it unfused and eagerly (it may draw random masks that a CUDA
//! graph would replay).
//!
//! [`ModelSpec`]: cohort_autograd::ModelSpec

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cohort_autograd::{BuildOptions, Model};

/// Builds a model for examples of the given shape.
type Build = dyn Fn(&[usize], &BuildOptions) -> cohort_autograd::Result<Model> + Send + Sync;

/// Custom models by name.
#[derive(Clone, Default)]
pub struct Models {
    builders: BTreeMap<String, Arc<Build>>,
}

impl Models {
    /// No custom models.
    pub fn new() -> Models {
        Models::default()
    }

    /// Registers `build` under `name`: it gets the data's per-example shape (`[1, 28, 28]`) and the options (one
    /// seed per member, dtype, device, which it must honour: OOM recovery rebuilds a member on the CPU).
    pub fn with(
        mut self,
        name: &str,
        build: impl Fn(&[usize], &BuildOptions) -> cohort_autograd::Result<Model>
        + Send
        + Sync
        + 'static,
    ) -> Models {
        self.builders.insert(name.to_string(), Arc::new(build));
        self
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.builders.contains_key(name)
    }

    /// The registered names.
    pub fn names(&self) -> Vec<&str> {
        self.builders.keys().map(String::as_str).collect()
    }

    /// Builds the model registered as `name`.
    ///
    /// # Errors
    /// When nothing is registered under `name`, or the builder fails.
    pub(crate) fn build(
        &self,
        name: &str,
        data: &[usize],
        opts: &BuildOptions,
    ) -> std::result::Result<Model, String> {
        let build = self.builders.get(name).ok_or_else(|| self.unknown(name))?;
        build(data, opts).map_err(|e| format!("custom model \"{name}\": {e}"))
    }

    /// The message for a name nobody registered.
    pub(crate) fn unknown(&self, name: &str) -> String {
        let known = if self.builders.is_empty() {
            "none is registered".to_string()
        } else {
            format!("registered: {}", self.names().join(", "))
        };
        format!(
            "no custom model \"{name}\" ({known}); a program registers it with \
             RunOptions {{ models: Models::new().with(\"{name}\", ..) }} (the `cohort` binary has none)"
        )
    }
}

impl fmt::Debug for Models {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.builders.keys()).finish()
    }
}
