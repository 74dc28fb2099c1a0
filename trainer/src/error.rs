//! The trainer's error type.

use std::path::PathBuf;

/// A `Result` with the trainer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while configuring, running, checkpointing or reporting a cohort.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config file is not valid: names the file, the key and what is accepted.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),

    /// The run names several cards: one process trains on one card for now.
    #[error(
        "[run] device = {devices} means {} cards ({}), but one cohort trains on one card for now\n  name one card, \
         e.g. device = \"cuda:{}\", or run one cohort per card, each its share of the members: \
         CUDA_VISIBLE_DEVICES=0 cohort train CONFIG --shard 1/{0}, CUDA_VISIBLE_DEVICES=1 ... --shard 2/{0}, ... \
         (examples/cluster/)",
        cards.len(),
        cards.iter().map(|n| format!("cuda:{n}")).collect::<Vec<_>>().join(", "),
        cards[0]
    )]
    SeveralCards {
        /// `[run] device` as written.
        devices: String,
        /// The cards it means.
        cards: Vec<usize>,
    },

    /// Two members would write to the same directory.
    #[error(
        "members \"{first}\" and \"{second}\" would write checkpoints to the same directory {}\n  \
         give each member its own name (the directory is runs/<run>/<member>)",
        dir.display()
    )]
    SharedDirectory {
        /// One member.
        first: String,
        /// The other member.
        second: String,
        /// The directory both would use.
        dir: PathBuf,
    },

    /// Another process (or member) holds the lock of a member directory.
    #[error(
        "member directory {} is in use by another process (pid {pid}, lock file {})\n  \
         two members (or two runs) may never share a directory: stop the other run or use another run name",
        dir.display(),
        lock.display()
    )]
    DirectoryLocked {
        /// The member directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// The process holding it.
        pid: u32,
    },

    /// The disk is full: a member's checkpoint or logs could not be written.
    #[error(
        "{}: the disk is full: free some space (or keep fewer checkpoints: checkpoint = {{ keep = N }}), then \
         `cohort resume` the run",
        path.display()
    )]
    DiskFull {
        /// The file being written.
        path: PathBuf,
    },

    /// An I/O error on a named path.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A checkpoint could not be written or read.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// No usable checkpoint was found where one was expected.
    #[error("no valid checkpoint in {}: {reason}", dir.display())]
    NoCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Why none is usable.
        reason: String,
    },

    /// A resumed run's config differs from the one its checkpoints were written with.
    #[error(
        "cannot resume member \"{member}\": its config differs from the checkpoint's in {}\n  \
         resume with the config the run was started with, or start a new run",
        differences.join("; ")
    )]
    IncompatibleResume {
        /// The member.
        member: String,
        /// Each difference: `key: checkpoint value -> config value`.
        differences: Vec<String>,
    },

    /// A resumed run's config names other members than the run trained (a changed grid, a member added or taken out).
    #[error(
        "cannot resume {}: its members changed since it ran ({}): resume with the config the run was started \
         with, or start a new run",
        run.display(),
        changes.join("; ")
    )]
    ChangedMembers {
        /// The run directory.
        run: PathBuf,
        /// Each change, naming the member.
        changes: Vec<String>,
    },

    /// A run directory is not one cohort wrote.
    #[error("{} is not a cohort run directory: {reason}", dir.display())]
    NotARun {
        /// The directory.
        dir: PathBuf,
        /// What is missing.
        reason: String,
    },

    /// A member ran out of memory and could not recover.
    #[error("member \"{member}\" ran out of memory and could not recover: {message}")]
    OutOfMemory {
        /// The member.
        member: String,
        /// The allocator's explanation and what was tried.
        message: String,
    },

    /// A control-file entry is invalid.
    #[error("{}: {message}", path.display())]
    Control {
        /// The control file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// Writing a PNG plot failed.
    #[error("plot {}: {message}", path.display())]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },

    /// JSON (de)serialization failed.
    #[error("{context}: {source}")]
    Json {
        /// What was being (de)serialized.
        context: String,
        /// The underlying error.
        source: serde_json::Error,
    },

    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] cohort_tensor::Error),

    /// A member's model cannot be built as its config writes it (a layer that does not fit the data, a custom
    /// model nobody registered).
    #[error("member \"{member}\": {reason}")]
    Model {
        /// The member.
        member: String,
        /// What is wrong, naming the layer, and what to do.
        reason: String,
    },

    /// A model or gradient operation failed.
    #[error(transparent)]
    Autograd(#[from] cohort_autograd::Error),

    /// An optimizer failed.
    #[error(transparent)]
    Optim(#[from] cohort_optim::Error),

    /// The input pipeline failed.
    #[error(transparent)]
    Data(#[from] cohort_data::Error),
    /// A data set whose examples, splits or preparation do not fit together.
    #[error("[data.{data}]: {reason}")]
    DataSet {
        /// The data set's name.
        data: String,
        /// What does not fit, and what to do.
        reason: String,
    },

    /// The allocator failed.
    #[error(transparent)]
    Alloc(#[from] cohort_alloc::Error),
}

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::StorageFull {
            return Error::DiskFull { path: path.into() };
        }
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A JSON error while handling `context`.
    pub(crate) fn json(context: impl Into<String>, source: serde_json::Error) -> Self {
        Error::Json {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_cards_say_how_to_share_the_run_out() {
        let e = Error::SeveralCards {
            devices: "cuda".into(),
            cards: vec![0, 1, 2],
        };
        let text = e.to_string();
        assert!(
            text.starts_with("[run] device = cuda means 3 cards (cuda:0, cuda:1, cuda:2)"),
            "{text}"
        );
        assert!(
            text.contains("device = \"cuda:0\"")
                && text.contains("--shard 1/3")
                && text.contains("--shard 2/3"),
            "{text}"
        );
    }
}
