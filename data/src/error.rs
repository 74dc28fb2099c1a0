//! The crate's error type.

use std::path::PathBuf;
use std::sync::Arc;

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while reading data or running a pipeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened or read.
    #[error("{}: {source} (check that the file exists and is readable)", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An IDX file (the MNIST format) is truncated or corrupt.
    #[error(
        "{}: corrupt IDX file at byte {offset}{}: {reason} (re-download or re-extract the file)",
        path.display(),
        if *compressed { " of the decompressed data" } else { "" }
    )]
    Idx {
        /// The file.
        path: PathBuf,
        /// Byte offset of the problem (in the decompressed stream for a `.gz` file).
        offset: u64,
        /// Whether the file is gzip-compressed.
        compressed: bool,
        /// What is wrong.
        reason: String,
    },
    /// A CSV file holds something that is not a number, or a row of the wrong width.
    #[error("{}: line {line}, column {column}: {reason}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// 1-based column number.
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// Examples that cannot be put together (batching, zipping, slicing).
    #[error("shape mismatch in {op}: {reason}")]
    Shape {
        /// The operation (`batch`, `from_tensor_slices`, ...).
        op: &'static str,
        /// What does not fit.
        reason: String,
    },
    /// An argument out of its valid range.
    #[error("invalid argument to {op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A user `map` or `filter` function returned an error.
    #[error("the map function failed on element {index}: {source}")]
    Map {
        /// Index of the element (in the map's input) that failed.
        index: u64,
        /// The function's error.
        #[source]
        source: Box<Error>,
    },
    /// A user function panicked; the pipeline shut down.
    #[error("the {stage} function panicked on element {index}: {message}")]
    Panicked {
        /// `map`, `filter`, ...
        stage: &'static str,
        /// Index of the element (in the stage's input).
        index: u64,
        /// The panic message.
        message: String,
    },
    /// A saved [`Position`](crate::Position) that does not belong to this pipeline.
    #[error(
        "cannot resume: {reason} (the position was saved by a different pipeline or seed; rebuild the pipeline exactly as it was saved)"
    )]
    Position {
        /// What does not match.
        reason: String,
    },
    /// A background thread of the pipeline stopped without sending a result.
    #[error("pipeline stage {stage} stopped unexpectedly: {reason}")]
    Disconnected {
        /// The stage.
        stage: &'static str,
        /// What happened.
        reason: String,
    },
    /// An error shared by several consumers of a [`share`](crate::Dataset::share)d pipeline.
    #[error("{0}")]
    Shared(Arc<Error>),
    /// A tensor operation failed (creating a batch, moving it to a device).
    #[error(transparent)]
    Tensor(#[from] cohort_tensor::Error),
    /// Free-form error from user code (for map functions).
    #[error("{0}")]
    Message(String),
    /// An image file or image record that cannot be used: it does not decode (truncated, corrupt, not an image),
    /// it has another size than its data set's images, or a file of image records (CIFAR batches) is malformed.
    #[error("{}: {reason}", path.display())]
    Image {
        /// The file (or folder).
        path: PathBuf,
        /// What is wrong and what to do about it.
        reason: String,
    },
}

impl Error {
    /// An error from user code, e.g. inside a `map` function.
    pub fn msg(message: impl Into<String>) -> Self {
        Error::Message(message.into())
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
