//! Data sources: a data set's examples, read by index from any thread.
//!
//! Every format (CSV tables, NumPy arrays, image folders, CIFAR batches, IDX files, labelled text, token corpora,
//! synthetic data) opens into an [`Examples`]: how many examples there are, the shape of one, what its target is
//! ([`Task`]), and `example(i)`. Reading by index is what lets a split be a list of indices ([`crate::split`]),
//! a pipeline decode in its parallel workers (an image file is decoded when its example is asked for, not when the
//! folder is opened), and a memory-mapped array stay on disk.

use std::fmt;
use std::sync::Arc;

use crate::array::Array;
use crate::error::Result;
use crate::text::Vocabulary;

pub mod cifar;
pub mod csv;
pub mod idx;
pub mod images;
mod labels;
pub mod npy;
pub mod synthetic;
pub mod text;
pub mod tokens;

/// What a data set's examples are to be predicted as.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// One class per example: `y` is i32 `[]`, a class id indexing `classes` (the class names, in id order).
    Classify {
        /// The class names in id order (`"0"`, `"1"`, .. where the labels are numbers).
        classes: Vec<String>,
    },
    /// `width` real values per example: `y` is f32 `[width]`.
    Regress {
        /// Targets per example.
        width: usize,
    },
    /// The next token at every position of a window: `y` is i32 `[T]` (language modelling).
    NextToken {
        /// Token ids are below this.
        vocab: usize,
    },
}

impl Task {
    /// The number of classes (or token ids) a model's last layer must give scores for; a regression's width.
    pub fn outputs(&self) -> usize {
        match self {
            Task::Classify { classes } => classes.len(),
            Task::Regress { width } => *width,
            Task::NextToken { vocab } => *vocab,
        }
    }
}

/// A data set's examples, read by index.
pub trait Examples: Send + Sync + fmt::Debug + 'static {
    /// Number of examples.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape of one example's features, e.g. `[3, 32, 32]` (channels first) or `[T]` for token ids.
    fn shape(&self) -> &[usize];

    /// What the targets are.
    fn task(&self) -> &Task;

    /// The class id of every example, for stratified splits (`Some` exactly when the task is [`Task::Classify`]).
    fn labels(&self) -> Option<&[i32]>;

    /// When the features are token ids (exact f32 values below this size), the vocabulary they index.
    fn vocabulary(&self) -> Option<&Vocabulary> {
        None
    }

    /// When the features are token ids, the bound below which they lie (a model's embedding needs at least
    /// that many rows): the vocabulary's size, or 256 for bytes.
    fn token_ids(&self) -> Option<usize> {
        self.vocabulary().map(Vocabulary::len)
    }

    /// Example `i` (`i < len()`): features f32 of shape [`shape`](Examples::shape) (images in `[0, 1]`, channels
    /// first; token ids as exact values), and its target as [`task`](Examples::task) says.
    ///
    /// # Errors
    /// When the example cannot be read or decoded (the error names the file and the record or image).
    fn example(&self, i: usize) -> Result<(Array, Array)>;

    /// Checks that every example can be read, so that nothing trains on half a data set: sources that parse
    /// their files when they are opened have nothing left to check; those that decode lazily (image folders)
    /// decode everything once.
    ///
    /// # Errors
    /// The first example (by index) that cannot be read.
    fn verify(&self) -> Result<()> {
        Ok(())
    }

    /// What was read, for messages: `"images photos/ (3 classes, 1,200 files)"`.
    fn describe(&self) -> String;
}

pub(crate) use labels::LabelCells;

/// Names for a message: `"a", "b", "c"`, the first 20 of a long list.
pub(crate) fn list(names: &[String]) -> String {
    let shown: Vec<String> = names.iter().take(20).map(|n| format!("{n:?}")).collect();
    let more = names.len().saturating_sub(20);
    if more > 0 {
        format!("[{}, and {more} more]", shown.join(", "))
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// `1234567` as `1,234,567`, for descriptions.
pub(crate) fn grouped(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Examples shared by the pipelines and splits that read them.
pub type SharedExamples = Arc<dyn Examples>;
