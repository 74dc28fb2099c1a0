//! Data sets of a run and the per-member feeds that batch them.
//!
//! A `[data.NAME]` is loaded once into a [`DataSet`]: the training examples as one shuffled
//! [`cohort_data::Dataset`] pipeline (shared by every member naming it: the arrays are loaded once and every
//! iterator reads the same copy) and the test split in memory. Each member (or fused group) reads the pipeline
//! through its own [`Feed`], which stacks examples into batches of whatever size the member has now: a batch that
//! shrinks after an OOM, or changes through the control file, continues from the very next example. The feed's
//! [`Position`] (epoch, examples taken) goes into checkpoints, so a resumed member sees exactly the batches it would
//! have seen.
//!
//! On a GPU the feed prefetches to the device: taking a batch starts the next one's copy on the copy stream
//! (through pinned staging buffers), so that it overlaps the step that uses this one. The prefetched batch is not
//! consumed until it is taken: the feed's position, saved in checkpoints and restored after an OOM, stays the one
//! of the next batch to be used.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cohort_data::{
    Array, Dataset, Iter, LabeledText, Position, Split, Staged, ToDevice, TrainBatch, Vocabulary,
};
use cohort_tensor::cuda::Uploader;
use cohort_tensor::{Device, Tensor};

use crate::config::{DataConfig, DataSource};
use crate::error::{Error, Result};

/// One loaded data set.
#[derive(Debug)]
pub struct DataSet {
    /// Its name in the config.
    pub name: String,
    /// Shuffled training examples `(x f32 [..shape], y i32 [])`, prefetched.
    pub train: Dataset<(Array, Array)>,
    /// Training examples per epoch.
    pub train_len: u64,
    /// The shape of one example, e.g. `[1, 28, 28]`.
    pub shape: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
    /// Test features, row-major `[test_len, prod(shape)]`.
    pub test_x: Vec<f32>,
    /// Test labels.
    pub test_y: Vec<i32>,
    /// For text: the vocabulary its examples' token ids come from (`None`: float features).
    pub vocabulary: Option<Vocabulary>,
}

/// Finds a data file or directory: as given (relative to the working directory), then relative to the config
/// file's directory, then under `COHORT_DATA_DIR`, then in this repository (the bundled data).
fn find_data(path: &Path, config_dir: Option<&Path>) -> Result<PathBuf> {
    if path.is_absolute() || path.exists() {
        return Ok(path.to_path_buf());
    }
    let mut tried = vec![path.to_path_buf()];
    if let Some(c) = config_dir {
        tried.push(c.join(path));
    }
    if let Ok(d) = std::env::var("COHORT_DATA_DIR") {
        let base = PathBuf::from(d);
        tried.push(base.join(path));
        tried.push(base.join(path.file_name().unwrap_or_default()));
    }
    if path.ends_with("data/mnist") || path == Path::new("mnist") {
        tried.push(cohort_data::bundled_mnist_dir());
    }
    tried.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path));
    if let Some(found) = tried[1..].iter().find(|p| p.exists()) {
        return Ok(found.clone());
    }
    Err(Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no such data file or directory (tried {}); set COHORT_DATA_DIR or give an absolute path",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    })
}

impl DataSet {
    /// Loads a `[data.NAME]`.
    ///
    /// # Errors
    /// When the files cannot be found or read.
    pub fn load(cfg: &DataConfig, config_dir: Option<&Path>) -> Result<DataSet> {
        let mut tokens = None;
        let (train_x, train_y, test_x, test_y, shape, classes) = match &cfg.source {
            DataSource::Idx(dir) => {
                let dir = find_data(dir, config_dir)?;
                let train = cohort_data::Mnist::load(&dir, Split::Train)?;
                let test = cohort_data::Mnist::load(&dir, Split::Test)?;
                let shape = vec![1, train.rows, train.cols];
                let classes = train
                    .labels
                    .iter()
                    .map(|&l| l as usize + 1)
                    .max()
                    .unwrap_or(10)
                    .max(10);
                (
                    train.images_f32(),
                    train.labels_i32(),
                    test.images_f32(),
                    test.labels_i32(),
                    shape,
                    classes,
                )
            }
            DataSource::Text {
                train,
                test,
                max_len,
                vocab,
                min_count,
            } => {
                let train = LabeledText::read(find_data(train, config_dir)?)?;
                let test = LabeledText::read(find_data(test, config_dir)?)?;
                // The vocabulary is the training file's alone: the test texts' other words are unknown.
                let words = train.vocabulary(*min_count, *vocab);
                let encode = |t: &LabeledText| -> Vec<f32> {
                    t.texts
                        .iter()
                        .flat_map(|text| {
                            let ids = words.encode(text, *max_len);
                            let ids = ids.as_i32().unwrap_or_default().to_vec();
                            let pad = max_len - ids.len();
                            // Token ids travel as exact f32 values (below 2^24) beside the images' pixels.
                            ids.into_iter()
                                .chain(std::iter::repeat_n(Vocabulary::PAD, pad))
                                .map(|i| i as f32)
                        })
                        .collect()
                };
                let labels = || train.labels.iter().chain(&test.labels);
                if let Some(bad) = labels().find(|&&l| l < 0) {
                    return Err(Error::Io {
                        path: PathBuf::from(format!("[data.{}]", cfg.name)),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("label {bad} is negative: labels are class numbers 0, 1, .."),
                        ),
                    });
                }
                let classes = labels().map(|&l| l as usize + 1).max().unwrap_or(2);
                let (train_x, test_x) = (encode(&train), encode(&test));
                tokens = Some(words);
                (
                    train_x,
                    train.labels,
                    test_x,
                    test.labels,
                    vec![*max_len],
                    classes,
                )
            }
            DataSource::Synthetic {
                train,
                test,
                classes,
                shape,
            } => {
                let features: usize = shape.iter().product();
                let (x, y) = cohort_data::synthetic::classification(
                    train + test,
                    features,
                    *classes,
                    2.0,
                    cfg.seed.wrapping_add(0x5157),
                )?;
                let x = x.into_f32().unwrap_or_default();
                let y = y.into_i32().unwrap_or_default();
                let (trx, tex) = x.split_at(train * features);
                let (try_, tey) = y.split_at(*train);
                (
                    trx.to_vec(),
                    try_.to_vec(),
                    tex.to_vec(),
                    tey.to_vec(),
                    shape.clone(),
                    *classes,
                )
            }
        };
        let per: usize = shape.iter().product();
        let mut n = train_y.len();
        let (mut train_x, mut train_y) = (train_x, train_y);
        if let Some(l) = cfg.limit
            && l < n
        {
            n = l;
            train_x.truncate(n * per);
            train_y.truncate(n);
        }
        let (mut test_x, mut test_y) = (test_x, test_y);
        if let Some(l) = cfg.test_limit
            && l < test_y.len()
        {
            test_x.truncate(l * per);
            test_y.truncate(l);
        }
        if n == 0 {
            return Err(Error::Io {
                path: PathBuf::from(format!("[data.{}]", cfg.name)),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "no training examples",
                ),
            });
        }
        let mut xshape = vec![n];
        xshape.extend_from_slice(&shape);
        let xs = Array::from_f32(train_x, &xshape)?;
        let ys = Array::from_i32(train_y, &[n])?;
        let mut train = Dataset::from_tensor_slices((xs, ys));
        if cfg.shuffle > 0 {
            train = train.shuffle(cfg.shuffle, cfg.seed);
        }
        Ok(DataSet {
            name: cfg.name.clone(),
            train,
            train_len: n as u64,
            shape,
            classes,
            test_x,
            test_y,
            vocabulary: tokens,
        })
    }

    /// Batches per epoch at batch size `b` (the last one may be partial).
    pub fn batches_per_epoch(&self, b: usize) -> u64 {
        self.train_len.div_ceil(b.max(1) as u64)
    }

    /// Epochs completed at a feed position.
    pub fn epochs_done(&self, pos: &Position) -> u64 {
        if pos.index >= self.train_len {
            pos.epoch + 1
        } else {
            pos.epoch
        }
    }
}

/// One member's (or fused group's) reader of a [`DataSet`].
#[derive(Debug)]
pub struct Feed {
    data: Arc<DataSet>,
    iter: Iter<(Array, Array)>,
    prefetch: usize,
    /// Device prefetch: the uploader, and the next batch on its way to the device.
    uploader: Option<Uploader>,
    staged: Option<Ahead>,
}

/// A batch whose copy to the device was started before it is taken (dropped untaken, it still
/// orders the compute stream after its copy: see [`Staged`]).
#[derive(Debug)]
struct Ahead {
    batch: Staged<TrainBatch>,
    /// The batch size it was read for.
    size: usize,
    /// The position before it.
    from: Position,
}

/// A batch on the host.
#[derive(Debug)]
pub struct Batch {
    /// Features `[n, prod(shape)]`.
    pub x: Vec<f32>,
    /// Labels `[n]`.
    pub y: Vec<i32>,
    /// Examples in it.
    pub n: usize,
}

impl Feed {
    /// A feed at `pos` (the start: `Position::default()`); `prefetch` examples are prepared ahead.
    ///
    /// # Errors
    /// When `pos` belongs to another pipeline.
    pub fn open(data: Arc<DataSet>, pos: &Position, prefetch: usize) -> Result<Feed> {
        let ds = if prefetch > 0 {
            data.train.prefetch(prefetch)
        } else {
            data.train.clone()
        };
        let iter = if *pos == Position::default() {
            ds.iter()
        } else {
            ds.iter_from(&Position::new(pos.epoch, pos.index))?
        };
        Ok(Feed {
            data,
            iter,
            prefetch,
            uploader: None,
            staged: None,
        })
    }

    /// With prefetch to `device` when it is a GPU (see the module docs); unchanged on the CPU.
    ///
    /// # Errors
    /// No such GPU.
    pub fn with_device_prefetch(mut self, device: &Device) -> Result<Feed> {
        if device.is_cuda() {
            // Two copies in flight at most (the one being taken, the next), and one slot to fill.
            self.uploader = Some(Uploader::new(device, 3)?);
        }
        Ok(self)
    }

    /// The data set.
    pub fn data(&self) -> &Arc<DataSet> {
        &self.data
    }

    /// Where the next example to be used comes from (a prefetched batch is not used yet).
    pub fn position(&self) -> Position {
        match &self.staged {
            Some(s) => s.from,
            None => self.read_position(),
        }
    }

    fn read_position(&self) -> Position {
        let p = self.iter.pos();
        Position::new(p.epoch, p.index)
    }

    /// Goes back (or forward) to `pos`: after an OOM, the failed batch is taken again, smaller.
    ///
    /// # Errors
    /// As [`Feed::open`].
    pub fn seek(&mut self, pos: &Position) -> Result<()> {
        let uploader = self.uploader.take();
        *self = Feed::open(self.data.clone(), pos, self.prefetch)?;
        self.uploader = uploader;
        Ok(())
    }

    /// The next batch of up to `b` examples as tensors on `device`: features `[n, prod(shape)]` and labels `[n]`.
    /// With device prefetch it is the batch staged by the previous call (read again if the size asked for
    /// changed), and the following batch starts its copy now; the compute stream waits for this one's copy.
    /// Call it in the tenant scope that should hold the batches.
    ///
    /// # Errors
    /// A pipeline error, or the device's (out of memory, a failed copy).
    pub fn next_tensors(&mut self, b: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let Some(mut uploader) = self.uploader.take() else {
            let batch = self.batch_on(b, device)?;
            return Ok((batch.inputs, batch.labels));
        };
        let r = self.take_ahead(b, &mut uploader);
        self.uploader = Some(uploader);
        let batch = r?;
        Ok((batch.inputs, batch.labels))
    }

    /// The batch staged ahead (read again if its size is not `b`), with the next one staged.
    fn take_ahead(&mut self, b: usize, uploader: &mut Uploader) -> Result<TrainBatch> {
        let now = match self.staged.take() {
            Some(s) if s.size == b => s,
            other => {
                if let Some(s) = other {
                    self.seek(&s.from)?;
                }
                self.stage(b, uploader)?
            }
        };
        self.staged = Some(self.stage(b, uploader)?);
        Ok(now.batch.finish()?)
    }

    /// Reads the next batch and starts its copy to the device.
    fn stage(&mut self, b: usize, uploader: &mut Uploader) -> Result<Ahead> {
        let from = self.read_position();
        let (batch, ready) = self.batch_on(b, &Device::Cpu)?.upload(uploader)?;
        Ok(Ahead {
            batch: Staged::in_flight(batch, ready),
            size: b,
            from,
        })
    }

    /// The next batch of up to `b` examples as tensors on `device`.
    fn batch_on(&mut self, b: usize, device: &Device) -> Result<TrainBatch> {
        let batch = self.next_batch(b)?;
        let per: usize = self.data.shape.iter().product();
        Ok(TrainBatch {
            inputs: Tensor::from_vec(batch.x, &[batch.n, per], device)?,
            labels: Tensor::from_vec(batch.y, &[batch.n], device)?,
        })
    }

    /// The next batch of up to `b` examples; it ends early at the end of an epoch (the last batch is partial).
    ///
    /// # Errors
    /// A pipeline error.
    pub fn next_batch(&mut self, b: usize) -> Result<Batch> {
        let per: usize = self.data.shape.iter().product();
        let mut x = Vec::with_capacity(b * per);
        let mut y = Vec::with_capacity(b);
        // An epoch that ended exactly on the previous batch: step into the next one.
        if self.iter.pos().index >= self.data.train_len {
            let _ = self.iter.next().transpose()?;
            debug_assert_eq!(self.iter.pos().index, 0);
        }
        while y.len() < b {
            match self.iter.next() {
                Some(item) => {
                    let (xa, ya) = item?;
                    x.extend_from_slice(xa.as_f32().unwrap_or(&[]));
                    y.push(ya.as_i32().and_then(|v| v.first().copied()).unwrap_or(0));
                }
                None => {
                    if y.is_empty() {
                        continue;
                    }
                    break;
                }
            }
            if self.iter.pos().index >= self.data.train_len {
                break;
            }
        }
        let n = y.len();
        Ok(Batch { x, y, n })
    }
}
