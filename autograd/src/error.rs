//! The crate's error type.

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong while recording, differentiating or building a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (shapes, dtypes, devices, memory).
    #[error(transparent)]
    Tensor(#[from] cohort_tensor::Error),
    /// A model spec names a layer that cannot be built as written.
    #[error("layer {index} ({kind}): {reason}")]
    Spec {
        /// Position of the layer in `layers` (0-based).
        index: usize,
        /// The layer's kind as written (`linear`, `conv`, ...), or `?` when it has none.
        kind: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// An input given to a layer or loss does not have the shape it needs.
    #[error("{op}: {reason}")]
    Shape {
        /// The layer, op or loss that refused the input.
        op: &'static str,
        /// The shapes involved and what was expected.
        reason: String,
    },
    /// Two variables recorded on different tapes (or an old recording of a tape) met in one op.
    #[error(
        "{0}: variables come from different tapes or from a tape already differentiated; record them again"
    )]
    TapeMismatch(&'static str),
    /// A named parameter given to `load_*` is not in the model, or has the wrong shape.
    #[error("parameter `{name}`: {reason}")]
    Param {
        /// The parameter's name (`layers.0.weight`).
        name: String,
        /// What is wrong.
        reason: String,
    },
}
