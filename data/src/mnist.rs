//! The MNIST handwritten digits: loading the IDX files of one split.
//!
//! `data/mnist/` of this repository holds 8,000 training and 2,000 test digits in the original layout; the full
//! 60,000/10,000 files of the MNIST distribution read unchanged with the same functions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::array::Array;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::idx::read_idx;

/// How a batch of images is shaped.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Layout {
    /// `[B, rows * cols]` (784): for MLPs.
    #[default]
    Flat,
    /// `[B, 1, rows, cols]` (NCHW): for convolutions.
    Image,
}

/// The MNIST input pipeline's settings: shuffle the whole split each epoch (seeded), batch, decode and normalise
/// each batch on `workers` threads, and prefetch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MnistConfig {
    /// Examples per batch.
    pub batch_size: usize,
    /// Shuffle seed (each epoch a new order derived from it).
    pub seed: u64,
    /// Whether to shuffle at all (evaluation: no).
    pub shuffle: bool,
    /// Drop the last, smaller batch.
    pub drop_remainder: bool,
    /// Shape of the image batches.
    pub layout: Layout,
    /// Threads that decode and normalise batches (1: on the producing thread).
    pub workers: usize,
    /// Batches kept ready by a background thread (0: none).
    pub prefetch: usize,
}

impl Default for MnistConfig {
    fn default() -> Self {
        MnistConfig {
            batch_size: 256,
            seed: 0,
            shuffle: true,
            drop_remainder: false,
            layout: Layout::Flat,
            workers: 1,
            prefetch: 2,
        }
    }
}

/// Which half of MNIST.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Split {
    /// `train-images-idx3-ubyte` / `train-labels-idx1-ubyte`.
    Train,
    /// `t10k-images-idx3-ubyte` / `t10k-labels-idx1-ubyte`.
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// One split of MNIST as raw bytes: `len` images of `rows x cols` pixels (0-255) and their labels (0-9).
#[derive(Clone, Debug, PartialEq)]
pub struct Mnist {
    /// Pixels, row-major `[len, rows, cols]`.
    pub pixels: Vec<u8>,
    /// Labels, one per image.
    pub labels: Vec<u8>,
    /// Number of images.
    pub len: usize,
    /// Image height (28).
    pub rows: usize,
    /// Image width (28).
    pub cols: usize,
}

/// The directory of the digits bundled with this repository (`data/mnist`), found at run time (tests run from a
/// copied tree): the first of `$COHORT_DATA_DIR/mnist`, `$COHORT_DATA_DIR`, `$CARGO_MANIFEST_DIR/../data/mnist`,
/// `$CARGO_MANIFEST_DIR/mnist`, `./data/mnist`, `./mnist`, `../data/mnist` that holds the training images; else the
/// folder where this crate was built (loading then names what is missing).
pub fn bundled_mnist_dir() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("COHORT_DATA_DIR") {
        let d = PathBuf::from(d);
        candidates.push(d.join("mnist"));
        candidates.push(d);
    }
    if let Some(d) = std::env::var_os("CARGO_MANIFEST_DIR") {
        let d = PathBuf::from(d);
        candidates.push(d.join("../data/mnist"));
        candidates.push(d.join("mnist"));
    }
    candidates.extend(["data/mnist", "mnist", "../data/mnist"].map(PathBuf::from));
    candidates
        .into_iter()
        .find(|d| find(d, "train-images-idx3-ubyte").exists())
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("mnist"))
}

/// `dir/<name>.gz` when it exists, else `dir/<name>`.
pub(crate) fn find(dir: &Path, name: &str) -> PathBuf {
    let gz = dir.join(format!("{name}.gz"));
    if gz.exists() { gz } else { dir.join(name) }
}

impl Mnist {
    /// Load one split from `dir`, which holds `train-images-idx3-ubyte[.gz]` and the other three files.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing file, [`Error::Idx`] for a corrupt one, [`Error::Shape`] when the images are not
    /// 3-D `u8`, the labels not 1-D `u8`, their counts differ, or a label is above 9.
    pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<Mnist> {
        let dir = dir.as_ref();
        let images_path = find(dir, &format!("{}-images-idx3-ubyte", split.prefix()));
        let labels_path = find(dir, &format!("{}-labels-idx1-ubyte", split.prefix()));
        let images = read_idx(&images_path)?;
        let labels = read_idx(&labels_path)?;
        let shape_err = |reason: String| Error::Shape {
            op: "Mnist::load",
            reason,
        };
        if images.dims.len() != 3 || images.as_u8().is_none() {
            return Err(shape_err(format!(
                "{}: expected 3-D u8 images, found dims {:?} of {:?}",
                images_path.display(),
                images.dims,
                images.dtype()
            )));
        }
        if labels.dims.len() != 1 || labels.as_u8().is_none() {
            return Err(shape_err(format!(
                "{}: expected 1-D u8 labels, found dims {:?} of {:?}",
                labels_path.display(),
                labels.dims,
                labels.dtype()
            )));
        }
        let (len, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
        if labels.dims[0] != len {
            return Err(shape_err(format!(
                "{} holds {len} images but {} holds {} labels",
                images_path.display(),
                labels_path.display(),
                labels.dims[0]
            )));
        }
        let labels = labels.into_u8().unwrap_or_default();
        if let Some(i) = labels.iter().position(|&l| l > 9) {
            return Err(shape_err(format!(
                "{}: label {} of record {i} is not a digit 0-9",
                labels_path.display(),
                labels[i]
            )));
        }
        Ok(Mnist {
            pixels: images.into_u8().unwrap_or_default(),
            labels,
            len,
            rows,
            cols,
        })
    }

    /// Pixels per image (`rows * cols`, 784).
    pub fn image_size(&self) -> usize {
        self.rows * self.cols
    }

    /// All images as `f32` in `[0, 1]` (pixel / 255), row-major `[len, rows * cols]`.
    pub fn images_f32(&self) -> Vec<f32> {
        self.pixels.iter().map(|&p| f32::from(p) / 255.0).collect()
    }

    /// A batch of the examples at `indices`: images `f32` in `[0, 1]` shaped by `layout`, labels `i32 [B]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an index past the end.
    pub fn gather(&self, indices: &[i64], layout: Layout) -> Result<(Array, Array)> {
        let size = self.image_size();
        let mut x = Vec::with_capacity(indices.len() * size);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            let i = usize::try_from(i)
                .ok()
                .filter(|&i| i < self.len)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "Mnist::gather",
                    reason: format!("index {i} of a split of {} images", self.len),
                })?;
            x.extend(
                self.pixels[i * size..(i + 1) * size]
                    .iter()
                    .map(|&p| f32::from(p) * (1.0 / 255.0)),
            );
            y.push(i32::from(self.labels[i]));
        }
        let b = indices.len();
        let x = match layout {
            Layout::Flat => Array::from_f32(x, &[b, size])?,
            Layout::Image => Array::from_f32(x, &[b, 1, self.rows, self.cols])?,
        };
        Ok((x, Array::from_i32(y, &[b])?))
    }

    /// The batches of this split as host arrays `(images, labels)`, per `config`: a shuffled index stream, batched,
    /// then decoded and normalised batch by batch (no per-example copies), then prefetched.
    pub fn batches(self: &Arc<Self>, config: &MnistConfig) -> Dataset<(Array, Array)> {
        let mut idx = Dataset::range(0, self.len as i64);
        if config.shuffle {
            idx = idx.shuffle(self.len.max(1), config.seed);
        }
        let me = Arc::clone(self);
        let layout = config.layout;
        let name = format!(
            "mnist_gather({},{:?},{}x{})",
            self.len, layout, self.rows, self.cols
        );
        let ds = idx
            .batch(config.batch_size, config.drop_remainder)
            .map_named(&name, config.workers, move |ix: Vec<i64>| {
                me.gather(&ix, layout)
            });
        if config.prefetch > 0 {
            ds.prefetch(config.prefetch)
        } else {
            ds
        }
    }

    /// All labels as `i32`.
    pub fn labels_i32(&self) -> Vec<i32> {
        self.labels.iter().map(|&l| i32::from(l)).collect()
    }
}

/// Load one split of MNIST from `dir` as `(images, labels)`: images `f32` in `[0, 1]`, row-major `[n, 784]`;
/// labels `i32` in `0..10`, `n` of them. [`bundled_mnist_dir`] gives the digits shipped with this repository.
///
/// # Errors
/// As [`Mnist::load`].
pub fn load_mnist(dir: impl AsRef<Path>, split: Split) -> Result<(Vec<f32>, Vec<i32>)> {
    let m = Mnist::load(dir, split)?;
    Ok((m.images_f32(), m.labels_i32()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_digits_load() {
        let m = Mnist::load(bundled_mnist_dir(), Split::Train).unwrap();
        assert_eq!((m.len, m.rows, m.cols), (8000, 28, 28));
        assert_eq!(m.pixels.len(), 8000 * 784);
        let (x, y) = load_mnist(bundled_mnist_dir(), Split::Test).unwrap();
        assert_eq!((x.len(), y.len()), (2000 * 784, 2000));
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
        // about 200 of each class in the test split
        for c in 0..10 {
            let n = y.iter().filter(|&&l| l == c).count();
            assert!((150..=250).contains(&n), "class {c}: {n}");
        }
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / x.len() as f64;
        assert!((0.1..0.16).contains(&mean), "mean pixel {mean}");
    }

    #[test]
    fn batches_cover_the_split_once_per_epoch() {
        let m = Arc::new(Mnist::load(bundled_mnist_dir(), Split::Test).unwrap());
        let cfg = MnistConfig {
            batch_size: 300,
            layout: Layout::Image,
            workers: 2,
            ..MnistConfig::default()
        };
        let ds = m.batches(&cfg);
        let mut it = ds.iter();
        let mut label_counts = [0usize; 10];
        let mut n = 0;
        for b in it.by_ref() {
            let (x, y) = b.unwrap();
            assert_eq!(&x.shape()[1..], &[1, 28, 28]);
            n += y.shape()[0];
            for &l in y.as_i32().unwrap() {
                label_counts[l as usize] += 1;
            }
        }
        assert_eq!(n, 2000);
        let want: Vec<usize> = (0..10)
            .map(|c| m.labels.iter().filter(|&&l| l == c).count())
            .collect();
        assert_eq!(label_counts.to_vec(), want);
        let pos = it.pos();
        let first_a = it.next().unwrap().unwrap();
        let first_b = m
            .batches(&cfg)
            .iter_from(&pos)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert!(first_a == first_b, "epoch 1 reproducible from its position");
        assert!(m.gather(&[2000], Layout::Flat).is_err());
    }

    #[test]
    fn missing_dir_names_the_file() {
        let e = Mnist::load("/no/such/dir", Split::Train).unwrap_err();
        assert!(e.to_string().contains("train-images-idx3-ubyte"), "{e}");
    }

    #[test]
    fn label_count_mismatch_is_an_error() {
        use crate::idx::{IdxArray, IdxData, encode_idx};
        let dir = tempfile::tempdir().unwrap();
        let imgs = IdxArray {
            dims: vec![2, 2, 2],
            data: IdxData::U8(vec![0; 8]),
        };
        let labs = IdxArray {
            dims: vec![3],
            data: IdxData::U8(vec![1, 2, 3]),
        };
        std::fs::write(dir.path().join("t10k-images-idx3-ubyte"), encode_idx(&imgs)).unwrap();
        std::fs::write(dir.path().join("t10k-labels-idx1-ubyte"), encode_idx(&labs)).unwrap();
        let e = Mnist::load(dir.path(), Split::Test).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
    }
}
