//! cohort-data: a tf.data-style input pipeline: sources, map, shuffle, batch, prefetch, shared iterators.
//!
//! A [`Dataset`] describes a pipeline; iterators opened from it run it. Sources: [`Dataset::range`],
//! [`Dataset::from_tensor_slices`] (host [`Array`]s, `Vec`s, tuples), and the formats of [`source`], each read by
//! index as [`Examples`]: CSV tables, NumPy arrays, image folders, CIFAR batches, IDX files of any shape,
//! labelled text and token corpora with a [`Vocabulary`], seeded synthetic data. [`split`] holds out stratified
//! fractions, [`Normalize`] and [`augment`] prepare examples.
//!
//! Adapters: `map`/`map_parallel` (order kept), `map_seeded` (random augmentation, resumable), `filter`,
//! `shuffle(buffer, seed)`, `batch`, `padded_batch`, `repeat`, `take`, `skip`, `zip`, `cache`, `prefetch(n)`;
//! [`Dataset::share`] lets several members read one run.
//!
//! Everything is deterministic under its seeds, and an iterator's [`Position`] (serde) resumes it exactly:
//!
//! ```
//! use cohort_data::{Dataset, Mnist, MnistConfig, Position, Split, bundled_mnist_dir};
//! use std::sync::Arc;
//!
//! let mnist = Arc::new(Mnist::load(bundled_mnist_dir(), Split::Test)?);
//! let ds = mnist.batches(&MnistConfig { batch_size: 256, seed: 7, ..MnistConfig::default() });
//!
//! // two members share one pipeline: each sees every batch, decoded once
//! let mut members = ds.share(2)?;
//! let a = members[0].next().unwrap()?;
//! let b = members[1].next().unwrap()?;
//! assert!(Arc::ptr_eq(&a, &b));
//! assert_eq!(a.0.shape(), &[256, 784]);
//!
//! // save the position with the checkpoint; a resumed run continues with the very same batches
//! let saved: String = serde_json::to_string(&members[0].pos()).unwrap();
//! let next = members[0].next().unwrap()?;
//! let resumed: Position = serde_json::from_str(&saved).unwrap();
//! let mut again = ds.share_from(1, &resumed)?;
//! assert!(*again[0].next().unwrap()? == *next);
//! # Ok::<(), cohort_data::Error>(())
//! ```

pub mod array;
pub mod augment;
pub mod dataset;
pub mod device;
pub mod error;
pub mod idx;
pub mod map;
pub mod mnist;
pub mod normalize;
pub mod prefetch;
pub mod rng;
pub mod share;
pub mod source;
pub mod split;
pub mod synthetic;
pub mod text;

pub use array::{Array, ArrayData, Slices, Stack};
pub use dataset::{Cardinality, Dataset, Iter, Position};
pub use device::{DeviceTransfer, PinnedTransfer, Staged, TensorCopy, ToDevice, TrainBatch};
pub use error::{Error, Result};
pub use idx::{IdxArray, IdxData, IdxType, read_idx};
pub use mnist::{Layout, Mnist, MnistConfig, Split, bundled_mnist_dir, load_mnist};
pub use normalize::Normalize;
pub use rng::Rng;
pub use share::{ShareOptions, SharedIter};
pub use source::csv::{CsvTable, read_csv};
pub use source::{Examples, SharedExamples, Task};
pub use text::{Vocabulary, text_lines, tokenize};
