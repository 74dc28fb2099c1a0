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
pub use mnist::{Mnist, Split, bundled_mnist_dir, load_mnist};
