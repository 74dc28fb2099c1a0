//! cohort-data: a tf.data-style input pipeline: sources, map, shuffle, batch, prefetch, shared iterators.
//!
//! ```
//! use cohort_data::{Split, bundled_mnist_dir, load_mnist};
//! let (images, labels) = load_mnist(bundled_mnist_dir(), Split::Test)?;
//! assert_eq!(images.len(), labels.len() * 784);
//! # Ok::<(), cohort_data::Error>(())
//! ```

pub mod error;
pub mod idx;
pub mod mnist;

pub use error::{Error, Result};
pub use idx::{IdxArray, IdxData, IdxType, read_idx};
pub use mnist::{Layout, Mnist, MnistConfig, Split, bundled_mnist_dir, load_mnist};
pub mod array;
pub mod dataset;
pub mod map;
pub mod prefetch;
pub mod rng;
pub mod share;

pub use array::{Array, ArrayData, Slices, Stack};
pub use dataset::{Cardinality, Dataset, Iter, Position};
pub use rng::Rng;
pub use share::{ShareOptions, SharedIter};
pub mod csv;
pub mod synthetic;
pub mod text;

pub use csv::{CsvOptions, CsvTable, read_csv};
pub use text::{LabeledText, Vocabulary, text_lines, tokenize};
