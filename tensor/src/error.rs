use crate::{DType, Device};

/// Result of a tensor operation.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything a tensor operation can report. Each variant names the op and the shapes, dtypes or
/// devices involved, and says what to do where that is not obvious.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two operands' shapes do not fit together.
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not match")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
    },
    /// A shape is wrong for the op on its own (wrong rank, zero stride, ...).
    #[error("{op}: shape {shape:?} is invalid: {reason}")]
    InvalidShape {
        /// The op.
        op: &'static str,
        /// The offending shape.
        shape: Vec<usize>,
        /// What is expected instead.
        reason: String,
    },
    /// A buffer's element count does not equal the product of its shape.
    #[error("{op}: shape {shape:?} holds {expected} elements but {got} were given")]
    ElementCount {
        /// The op.
        op: &'static str,
        /// The requested shape.
        shape: Vec<usize>,
        /// The product of the shape.
        expected: usize,
        /// The number of elements given.
        got: usize,
    },
    /// A dim index is not below the tensor's rank.
    #[error("{op}: dim {dim} is out of range for a tensor of rank {rank} (shape {shape:?})")]
    DimOutOfRange {
        /// The op.
        op: &'static str,
        /// The requested dim.
        dim: usize,
        /// The tensor's rank.
        rank: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// Two operands have different dtypes.
    #[error("{op}: dtypes {lhs} and {rhs} differ; convert one with to_dtype")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's dtype.
        lhs: DType,
        /// The second operand's dtype.
        rhs: DType,
    },
    /// The op does not support this dtype.
    #[error("{op}: dtype {dtype} is not supported here{hint}")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The operand's dtype.
        dtype: DType,
        /// Extra advice, e.g. " (cast f16 to f32 to compute)".
        hint: &'static str,
    },
    /// Two operands live on different devices.
    #[error("{op}: operands are on {lhs} and {rhs}; move one with to_device")]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// The first operand's device.
        lhs: Device,
        /// The second operand's device.
        rhs: Device,
    },
    /// The op is not implemented on this device.
    #[error("{op} is not supported on {device}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// The device.
        device: Device,
    },
    /// A CUDA device was asked for but this build has no CUDA support.
    #[error(
        "{op} on {device}: cohort was built without the `cuda` feature; rebuild with `--features cuda` or use the cpu"
    )]
    NotCompiledWithCuda {
        /// The op.
        op: &'static str,
        /// The requested device.
        device: Device,
    },
    /// No usable CUDA driver or device.
    #[error("{device} is not available: {reason}")]
    DeviceUnavailable {
        /// The requested device.
        device: Device,
        /// Why (no driver, ordinal out of range, ...).
        reason: String,
    },
    /// A device string could not be parsed.
    #[error("cannot parse device {0:?}: expected \"cpu\", \"cuda\", \"cuda:N\" or \"auto\"")]
    ParseDevice(String),
    /// A dtype string could not be parsed.
    #[error("cannot parse dtype {0:?}: expected f32, f64, f16, bf16, i32 or u8")]
    ParseDType(String),
    /// Any other invalid argument.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The op.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A kernel failed (index out of range, CUDA error).
    #[error(transparent)]
    Kernel(cohort_kernels::Error),
    /// The allocator failed (out of memory, tenant limit).
    #[error(transparent)]
    Alloc(#[from] cohort_alloc::Error),
}

impl From<cohort_kernels::Error> for Error {
    /// The runtime's scratch and workspaces come from the allocator: its out-of-memory error stays one, so that a
    /// member's OOM recovery sees it.
    fn from(e: cohort_kernels::Error) -> Self {
        match e {
            cohort_kernels::Error::DeviceMemory { what, source } => {
                match source.downcast::<cohort_alloc::Error>() {
                    Ok(alloc) => Error::Alloc(*alloc),
                    Err(source) => {
                        Error::Kernel(cohort_kernels::Error::DeviceMemory { what, source })
                    }
                }
            }
            e => Error::Kernel(e),
        }
    }
}
