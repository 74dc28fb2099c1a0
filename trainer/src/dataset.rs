//! The data sets of a run: each `[data.NAME]` opened once, split, and made into pipelines.
//!
//! A source opens into [`Examples`] read by index (cohort-data's `source`). The splits are index lists drawn once
//! from the data set's seed: test examples from the source's own test files, or a held-out fraction; validation
//! examples from files, or a stratified fraction of what is left; training gets the rest (the first `limit` of
//! them). The training pipeline shuffles indices and reads, normalises and augments each example in its workers,
//! so an image is decoded there and a memory-mapped array is read only where an example is taken. Every member
//! naming the data set reads that one pipeline ([`crate::feed::Feed`]); evaluation reads the validation and test
//! splits in order, unaugmented.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cohort_data::augment::Augment;
use cohort_data::source::{cifar, csv, idx, images, npy, synthetic, text, tokens};
use cohort_data::split::hold_out;
use cohort_data::{Array, Dataset, Examples, Normalize, Rng, SharedExamples, Task, Vocabulary};

use crate::config::{DataConfig, DataSource, Files};
use crate::error::{Error, Result};
use crate::objective::Objective;

/// Examples measured for normalisation statistics at most.
const NORMALIZE_SAMPLE: usize = 10_000;

/// How an example is prepared before it is batched: normalised, and (in training) augmented.
#[derive(Debug)]
struct Prepare {
    shape: Vec<usize>,
    normalize: Option<Normalize>,
    augment: Augment,
}

impl Prepare {
    fn example(
        &self,
        ex: &dyn Examples,
        i: usize,
        rng: Option<&mut Rng>,
    ) -> cohort_data::Result<(Array, Array)> {
        let (x, y) = ex.example(i)?;
        if self.normalize.is_none() && (rng.is_none() || self.augment.is_identity()) {
            return Ok((x, y));
        }
        let mut v = x.into_f32().unwrap_or_default();
        if let Some(n) = &self.normalize {
            n.apply(&mut v, &self.shape);
        }
        if let Some(rng) = rng {
            self.augment.apply(&mut v, &self.shape, rng);
        }
        Ok((Array::from_f32(v, &self.shape)?, y))
    }
}

/// A validation or test split: examples read in order, prepared but never augmented.
#[derive(Debug)]
pub struct EvalSplit {
    examples: SharedExamples,
    indices: Arc<Vec<usize>>,
    prepare: Arc<Prepare>,
    workers: usize,
}

impl EvalSplit {
    /// Examples in it.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Its examples in order, in batches of up to `b`: features `[n, ..shape]`, targets `[n, ..]`.
    pub fn batches(&self, b: usize) -> Dataset<(Array, Array)> {
        let (ex, prepare) = (self.examples.clone(), self.prepare.clone());
        Dataset::from_vec((*self.indices).clone())
            .map_named("example", self.workers, move |i| {
                prepare.example(ex.as_ref(), i, None)
            })
            .batch(b.max(1), false)
    }
}

/// One loaded data set.
#[derive(Debug)]
pub struct DataSet {
    /// Its name in the config.
    pub name: String,
    /// Shuffled training examples `(x f32 [..shape], target)`.
    pub train: Dataset<(Array, Array)>,
    /// Training examples per epoch.
    pub train_len: u64,
    /// The shape of one example, e.g. `[3, 32, 32]`.
    pub shape: Vec<usize>,
    /// What its members learn: the loss and the scores of its task.
    pub objective: Objective,
    /// The validation split, if there is one.
    pub val: Option<EvalSplit>,
    /// The test split, if there is one.
    pub test: Option<EvalSplit>,
    /// For token ids: the vocabulary they index (`None`: float features, or bytes).
    pub vocabulary: Option<Vocabulary>,
    /// For token ids: the bound below which they lie.
    pub token_ids: Option<usize>,
    /// What was read, for the run's first line.
    pub described: String,
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

/// The index lists of a source's training file: what trains, and what is held out of it.
#[derive(Debug)]
struct Indices {
    train: Vec<usize>,
    val: Option<Vec<usize>>,
    test: Option<Vec<usize>>,
}

/// Salts that keep the test and validation draws apart under one seed.
const TEST_SALT: u64 = 0x7E57;
const VAL_SALT: u64 = 0x0FA1;

/// Holds `fraction` of `from` out, stratified by `labels`: `(kept, held)`, as indices of the examples.
fn hold_out_of(
    from: &[usize],
    labels: Option<&[i32]>,
    fraction: f64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let sub: Option<Vec<i32>> = labels.map(|l| from.iter().map(|&i| l[i]).collect());
    let (kept, held) = hold_out(from.len(), sub.as_deref(), fraction, seed)?;
    Ok((
        kept.into_iter().map(|k| from[k]).collect(),
        held.into_iter().map(|k| from[k]).collect(),
    ))
}

/// Splits the `n` examples of a training file as `cfg` asks.
fn split(n: usize, labels: Option<&[i32]>, cfg: &DataConfig) -> Result<Indices> {
    let mut train: Vec<usize> = (0..n).collect();
    let mut test = None;
    if let Some(f) = cfg.test {
        let (kept, held) = hold_out_of(&train, labels, f, cfg.seed ^ TEST_SALT)?;
        train = kept;
        test = Some(held);
    }
    let mut val = None;
    if let Some(f) = cfg.val {
        // Of what is left after the test examples, so val = 0.1 is a tenth of what would train.
        let (kept, held) = hold_out_of(&train, labels, f, cfg.seed ^ VAL_SALT)?;
        train = kept;
        val = Some(held);
    }
    Ok(Indices { train, val, test })
}

/// A source's examples: its training file's, and its own validation and test files' where it has them.
struct Opened {
    train: SharedExamples,
    val: Option<SharedExamples>,
    test: Option<SharedExamples>,
    indices: Indices,
}

impl Opened {
    /// Training examples from one file, validation and test from theirs, opened with the training file's classes.
    fn files<E: Examples>(
        files: &Files,
        dir: Option<&Path>,
        cfg: &DataConfig,
        open: impl Fn(&Path, Option<&[String]>) -> cohort_data::Result<E>,
    ) -> Result<Opened> {
        let train = open(&find_data(&files.train, dir)?, None)?;
        let classes = class_names(train.task());
        let other = |p: &Option<PathBuf>| -> Result<Option<SharedExamples>> {
            p.as_ref()
                .map(|p| -> Result<SharedExamples> {
                    Ok(Arc::new(open(&find_data(p, dir)?, classes.as_deref())?))
                })
                .transpose()
        };
        let (val, test) = (other(&files.val)?, other(&files.test)?);
        let indices = split(train.len(), train.labels(), cfg)?;
        Ok(Opened {
            train: Arc::new(train),
            val,
            test,
            indices,
        })
    }

    /// A training source and a separate test source (folders holding both splits).
    fn pair(train: impl Examples, test: impl Examples, cfg: &DataConfig) -> Result<Opened> {
        let indices = split(train.len(), train.labels(), cfg)?;
        Ok(Opened {
            train: Arc::new(train),
            val: None,
            test: Some(Arc::new(test)),
            indices,
        })
    }
}

fn class_names(task: &Task) -> Option<Vec<String>> {
    match task {
        Task::Classify { classes } => Some(classes.clone()),
        _ => None,
    }
}

/// Opens `cfg`'s source.
fn open(cfg: &DataConfig, dir: Option<&Path>) -> Result<Opened> {
    Ok(match &cfg.source {
        DataSource::Idx { dir: d, options } => {
            let d = find_data(d, dir)?;
            let (ti, tl) = idx::split_files(&d, true)?;
            let (ei, el) = idx::split_files(&d, false)?;
            Opened::pair(
                idx::open(&ti, &tl, options)?,
                idx::open(&ei, &el, options)?,
                cfg,
            )?
        }
        DataSource::Cifar { dir: d, kind } => {
            let d = find_data(d, dir)?;
            let train = cifar::open(&cifar::split_files(&d, *kind, true)?, *kind)?;
            let test = cifar::open(&cifar::split_files(&d, *kind, false)?, *kind)?;
            Opened::pair(train, test, cfg)?
        }
        DataSource::Images { files, options } => {
            Opened::files(files, dir, cfg, |p, c| images::open(p, options, c))?
        }
        DataSource::Csv { files, options } => {
            Opened::files(files, dir, cfg, |p, c| csv::open(p, options, c))?
        }
        DataSource::Npz {
            files,
            x,
            y,
            regression,
        } => Opened::files(files, dir, cfg, |p, _| npy::open_npz(p, x, y, *regression))?,
        DataSource::Npy { files, regression } => {
            let pair = |f: &crate::config::NpyFiles| -> Result<SharedExamples> {
                Ok(Arc::new(npy::open_npy(
                    &find_data(&f.x, dir)?,
                    &find_data(&f.y, dir)?,
                    *regression,
                )?))
            };
            let train = pair(&files.train)?;
            let indices = split(train.len(), train.labels(), cfg)?;
            Opened {
                val: files.val.as_ref().map(pair).transpose()?,
                test: files.test.as_ref().map(pair).transpose()?,
                train,
                indices,
            }
        }
        DataSource::Text {
            files,
            max_len,
            vocab,
            min_count,
        } => {
            let train = text::open(&find_data(&files.train, dir)?, None)?;
            let classes = class_names(train.task());
            let other = |p: &Option<PathBuf>| -> Result<Option<text::TextExamples>> {
                p.as_ref()
                    .map(|p| Ok(text::open(&find_data(p, dir)?, classes.as_deref())?))
                    .transpose()
            };
            let (val, test) = (other(&files.val)?, other(&files.test)?);
            let indices = split(train.len(), train.labels(), cfg)?;
            // The vocabulary is the training split's alone: held-out texts' other words are unknown.
            let words = Vocabulary::build(
                indices.train.iter().map(|&i| train.texts()[i].as_str()),
                *min_count,
                *vocab,
            );
            let with = |t: text::TextExamples| -> SharedExamples {
                Arc::new(t.with_vocabulary(words.clone(), *max_len))
            };
            Opened {
                train: with(train),
                val: val.map(with),
                test: test.map(with),
                indices,
            }
        }
        DataSource::Tokens {
            files,
            tokenizer,
            window,
            vocab,
            min_count,
        } => {
            let train = tokens::open(
                &find_data(&files.train, dir)?,
                *tokenizer,
                *window,
                None,
                *min_count,
                *vocab,
            )?;
            let words = train.vocabulary().cloned();
            let other = |p: &Option<PathBuf>| -> Result<Option<SharedExamples>> {
                p.as_ref()
                    .map(|p| -> Result<SharedExamples> {
                        Ok(Arc::new(tokens::open(
                            &find_data(p, dir)?,
                            *tokenizer,
                            *window,
                            words.clone(),
                            *min_count,
                            *vocab,
                        )?))
                    })
                    .transpose()
            };
            let (val, test) = (other(&files.val)?, other(&files.test)?);
            let indices = split(train.len(), None, cfg)?;
            Opened {
                train: Arc::new(train),
                val,
                test,
                indices,
            }
        }
        DataSource::Synthetic(s) => {
            let examples = s.train + s.test;
            let seed = cfg.seed.wrapping_add(0x5157);
            let all: SharedExamples = match &s.tokens {
                None => Arc::new(synthetic::open(&synthetic::SyntheticSource {
                    examples,
                    classes: s.classes,
                    shape: s.shape.clone(),
                    seed,
                })?),
                Some(t) => Arc::new(synthetic::open_tokens(&synthetic::SyntheticTokens {
                    examples,
                    len: t.len,
                    vocab: t.vocab,
                    classes: s.classes,
                    seed,
                    next_token: t.next_token,
                })?),
            };
            // The first `train` examples train (less any held out), the last `test` test.
            let mut indices = split(s.train, all.labels().map(|l| &l[..s.train]), cfg)?;
            indices.test = Some((s.train..examples).collect());
            Opened {
                train: all,
                val: None,
                test: None,
                indices,
            }
        }
    })
}

impl DataSet {
    /// Opens, splits and prepares a `[data.NAME]`.
    ///
    /// # Errors
    /// When the files cannot be found or read, hold bad records, or a split, normalisation or augmentation does
    /// not fit them.
    pub fn load(cfg: &DataConfig, config_dir: Option<&Path>) -> Result<DataSet> {
        let bad = |reason: String| Error::DataSet {
            data: cfg.name.clone(),
            reason,
        };
        let Opened {
            train,
            val,
            test,
            mut indices,
        } = open(cfg, config_dir)?;
        if let Some(l) = cfg.limit {
            indices.train.truncate(l);
        }
        if indices.train.is_empty() {
            return Err(bad("no training examples".into()));
        }
        // Every file is readable before any member trains (an image folder decodes each image once).
        for e in [Some(&train), val.as_ref(), test.as_ref()]
            .into_iter()
            .flatten()
        {
            e.verify()?;
        }
        let shape = train.shape().to_vec();
        let task = train.task().clone();
        for (what, other) in [("validation", &val), ("test", &test)] {
            if let Some(o) = other
                && (o.shape() != shape.as_slice() || o.task() != &task)
            {
                return Err(bad(format!(
                    "its {what} examples ({}) do not match its training examples ({}): shape {:?} against {shape:?}",
                    o.describe(),
                    train.describe(),
                    o.shape()
                )));
            }
        }
        let token_ids = train.token_ids();
        let normalize = match &cfg.normalize {
            None => None,
            Some(_) if token_ids.is_some() => {
                return Err(bad(
                    "normalize: its examples are token ids, which are not normalised".into(),
                ));
            }
            Some(Some(given)) => Some(given.clone()),
            Some(None) => Some(Normalize::measure(
                train.as_ref(),
                &indices.train,
                NORMALIZE_SAMPLE,
            )?),
        };
        if let Some(n) = &normalize {
            n.check(&shape).map_err(|e| bad(e.to_string()))?;
        }
        if !cfg.augment.is_identity() && shape.len() != 3 {
            return Err(bad(format!(
                "augment: random crops and flips are for images [channels, height, width], and its examples \
                 have the shape {shape:?}"
            )));
        }
        let workers = match cfg.workers {
            0 if matches!(cfg.source, DataSource::Images { .. }) => {
                std::thread::available_parallelism().map_or(2, |n| n.get().min(8))
            }
            0 => 1,
            w => w,
        };
        let prepare = Arc::new(Prepare {
            shape: shape.clone(),
            normalize,
            augment: cfg.augment,
        });
        let eval = |examples: SharedExamples, indices: Vec<usize>| EvalSplit {
            examples,
            indices: Arc::new(indices),
            prepare: prepare.clone(),
            workers,
        };
        let all = |e: &SharedExamples| (0..e.len()).collect::<Vec<usize>>();
        let val = match (val, indices.val) {
            (Some(v), _) => Some(eval(v.clone(), all(&v))),
            (None, Some(i)) => Some(eval(train.clone(), i)),
            (None, None) => None,
        };
        let mut test = match (test, indices.test) {
            (Some(t), _) => Some(eval(t.clone(), all(&t))),
            (None, Some(i)) => Some(eval(train.clone(), i)),
            (None, None) => None,
        };
        if let (Some(t), Some(l)) = (&mut test, cfg.test_limit) {
            Arc::make_mut(&mut t.indices).truncate(l);
        }
        let train_len = indices.train.len() as u64;
        let mut pipeline = Dataset::from_vec(indices.train);
        if cfg.shuffle > 0 {
            pipeline = pipeline.shuffle(cfg.shuffle, cfg.seed);
        }
        let (ex, prep) = (train.clone(), prepare.clone());
        let pipeline = if cfg.augment.is_identity() {
            pipeline.map_named("example", workers, move |i| {
                prep.example(ex.as_ref(), i, None)
            })
        } else {
            pipeline.map_seeded("augmented", workers, cfg.seed, move |i, rng| {
                prep.example(ex.as_ref(), i, Some(rng))
            })
        };
        let described = format!(
            "{} train / {} val / {} test, from {}",
            train_len,
            val.as_ref().map_or(0, EvalSplit::len),
            test.as_ref().map_or(0, EvalSplit::len),
            train.describe(),
        );
        Ok(DataSet {
            name: cfg.name.clone(),
            train: pipeline,
            train_len,
            shape,
            objective: Objective::new(task, cfg.top_k),
            val,
            test,
            vocabulary: train.vocabulary().cloned(),
            token_ids,
            described,
        })
    }

    /// Batches per epoch at batch size `b` (the last one may be partial).
    pub fn batches_per_epoch(&self, b: usize) -> u64 {
        self.train_len.div_ceil(b.max(1) as u64)
    }

    /// Epochs completed at a feed position.
    pub fn epochs_done(&self, pos: &cohort_data::Position) -> u64 {
        if pos.index >= self.train_len {
            pos.epoch + 1
        } else {
            pos.epoch
        }
    }
}
