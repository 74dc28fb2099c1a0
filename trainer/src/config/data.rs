//! `[data.NAME]`: where a data set's examples come from, how it is split, and how examples are prepared.
//!
//! ```toml
//! [data.photos]
//! source = { images = "photos/", size = [64, 64] }   # the kind's key, what it reads, and its options beside it
//! val = 0.1                                          # a stratified, seeded validation fraction of training
//! test = 0.2                                         # a test fraction, where the source has no test files
//! normalize = true                                   # per channel, measured on the training split
//! augment = { crop_padding = 4, flip = true }        # random crops and flips, in the parallel workers
//! ```
//!
//! A source is one kind's key with what it reads: a path (the training file or folder), or a table of `train`,
//! `val` and `test` paths. Its options sit beside the key or inside that table; `examples/README.md` lists each
//! kind's.

use std::path::PathBuf;

use cohort_data::Normalize;
use cohort_data::augment::Augment;
use cohort_data::source::cifar::CifarKind;
use cohort_data::source::csv::CsvSource;
use cohort_data::source::idx::{IdxLayout, IdxSource};
use cohort_data::source::images::{ImageFolderSource, Resize};
use cohort_data::source::tokens::Tokenizer;
use serde::Serialize;
use toml::{Table, Value};

use super::{CResult, Section, describe};

/// The kinds of source, as config keys.
const KINDS: &str = "csv, npy, npz, images, cifar, idx, text, tokens, synthetic";

/// The training file of a source, and where its validation and test examples are, when they are in files.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Files<P = PathBuf> {
    /// Training examples (a validation or test fraction may be held out of them).
    pub train: P,
    /// Validation examples.
    pub val: Option<P>,
    /// Test examples.
    pub test: Option<P>,
}

/// A NumPy feature array and its label array.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NpyFiles {
    /// Features `[n, ..]`.
    pub x: PathBuf,
    /// Labels `[n]` (classes) or targets `[n]`, `[n, k]` (regression).
    pub y: PathBuf,
}

/// Synthetic token sequences instead of float features.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenData {
    /// Tokens per example.
    pub len: usize,
    /// Token ids are below this.
    pub vocab: usize,
    /// Predict each next token (language modelling) rather than a class.
    pub next_token: bool,
}

/// Deterministic random examples, for tests and benchmarks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyntheticData {
    /// Training examples.
    pub train: usize,
    /// Test examples.
    pub test: usize,
    /// Classes.
    pub classes: usize,
    /// Shape of one example, e.g. `[1, 28, 28]`.
    pub shape: Vec<usize>,
    /// Token sequences instead, when set.
    pub tokens: Option<TokenData>,
}

/// Where a data set's examples come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataSource {
    /// A folder of IDX files with MNIST's names (`train-images-idx3-ubyte[.gz]`, `t10k-…`), any shape.
    Idx {
        /// The folder.
        dir: PathBuf,
        /// How a 4-D array's dimensions are laid out.
        options: IdxSource,
    },
    /// CIFAR-10 or CIFAR-100 binary batches in a folder.
    Cifar {
        /// The folder.
        dir: PathBuf,
        /// Which of the two.
        kind: CifarKind,
    },
    /// A folder with one subfolder of PNG or JPEG images per class.
    Images {
        /// The folders.
        files: Files,
        /// Size, resizing, channels.
        options: ImageFolderSource,
    },
    /// A CSV table: feature columns and a target column.
    Csv {
        /// The files.
        files: Files,
        /// Columns, header, delimiter, task.
        options: CsvSource,
    },
    /// NumPy `.npy` feature and label arrays.
    Npy {
        /// The arrays.
        files: Files<NpyFiles>,
        /// Real-valued targets (regression) even where the labels are integers.
        regression: bool,
    },
    /// NumPy `.npz` archives holding a feature and a label array.
    Npz {
        /// The archives.
        files: Files,
        /// The feature array's name.
        x: String,
        /// The label array's name.
        y: String,
        /// Real-valued targets even where the labels are integers.
        regression: bool,
    },
    /// `label<TAB>text` files: each text tokenized, its tokens' ids (a vocabulary built on the training split
    /// only) cut or padded to `max_len`.
    Text {
        /// The files.
        files: Files,
        /// Tokens per example; longer texts are cut, shorter ones padded with id 0.
        max_len: usize,
        /// Ids in the vocabulary at most, `<pad>` (0) and `<unk>` (1) included.
        vocab: usize,
        /// A token is in the vocabulary when the training text holds it at least this often.
        min_count: usize,
    },
    /// A plain-text corpus for language modelling, cut into windows of `window` tokens.
    Tokens {
        /// The corpora.
        files: Files,
        /// Bytes, characters or words.
        tokenizer: Tokenizer,
        /// Tokens per example.
        window: usize,
        /// Ids in the vocabulary at most (characters and words).
        vocab: usize,
        /// A token is in the vocabulary when the training corpus holds it at least this often.
        min_count: usize,
    },
    /// Deterministic random examples.
    Synthetic(SyntheticData),
}

impl DataSource {
    /// Whether it has validation and test examples of its own (files, or a folder's test split).
    pub fn split_files(&self) -> (bool, bool) {
        fn of<P>(f: &Files<P>) -> (bool, bool) {
            (f.val.is_some(), f.test.is_some())
        }
        match self {
            DataSource::Images { files, .. }
            | DataSource::Csv { files, .. }
            | DataSource::Npz { files, .. }
            | DataSource::Text { files, .. }
            | DataSource::Tokens { files, .. } => of(files),
            DataSource::Npy { files, .. } => of(files),
            DataSource::Idx { .. } | DataSource::Cifar { .. } | DataSource::Synthetic(_) => {
                (false, true)
            }
        }
    }
}

/// `[data.NAME]`: one input pipeline, shared by every member naming it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataConfig {
    /// The name members refer to.
    pub name: String,
    /// Where examples come from.
    pub source: DataSource,
    /// The fraction of the training examples held out for validation (stratified by class, seeded).
    pub val: Option<f64>,
    /// The fraction held out for testing, where the source has no test files.
    pub test: Option<f64>,
    /// Per-channel normalisation: `None`, given, or measured on the training split (`Some(None)`).
    pub normalize: Option<Option<Normalize>>,
    /// Random crops and flips of training images.
    pub augment: Augment,
    /// Threads that read, decode and augment examples (0: as many as suit the source).
    pub workers: usize,
    /// Shuffle buffer size (0: no shuffling).
    pub shuffle: usize,
    /// Batches prepared ahead by background threads.
    pub prefetch: usize,
    /// Seed of the shuffle, the splits and the augmentation.
    pub seed: u64,
    /// Use only the first this many training examples.
    pub limit: Option<usize>,
    /// Use only the first this many test examples.
    pub test_limit: Option<usize>,
    /// The `k` of top-k accuracy (scored where there are more classes than `k`).
    pub top_k: usize,
}

impl DataConfig {
    /// What decides the batches a member sees, which a checkpoint records and a resume compares: everything but
    /// the worker and prefetch counts (how fast batches come, not which) and `top_k` (a score, not the data).
    pub fn identity(&self) -> serde_json::Value {
        serde_json::json!({
            "source": self.source,
            "val": self.val,
            "test": self.test,
            "normalize": self.normalize,
            "augment": self.augment,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "limit": self.limit,
            "test_limit": self.test_limit,
        })
    }
}

/// The bundled digits, which `data = "mnist"` names without a `[data.mnist]` table.
pub(super) fn default_mnist() -> DataConfig {
    DataConfig {
        name: "mnist".into(),
        source: DataSource::Idx {
            dir: PathBuf::from("data/mnist"),
            options: IdxSource::default(),
        },
        val: None,
        test: None,
        normalize: None,
        augment: Augment::default(),
        workers: 0,
        shuffle: 8000,
        prefetch: 4,
        seed: 0,
        limit: None,
        test_limit: None,
        top_k: 5,
    }
}

/// Reads a `[data.NAME]` table.
pub(super) fn parse(name: &str, s: &Section<'_>) -> CResult<DataConfig> {
    let source = match s.take("source") {
        None if name == "mnist" => default_mnist().source,
        None => {
            return Err(s.error(
                "source",
                format!(
                    "missing; expected a table with one of {KINDS}, e.g. {{ csv = \"train.csv\" }}"
                ),
            ));
        }
        Some(Value::Table(t)) => parse_source(s, t)?,
        Some(v) => {
            return Err(s.error(
                "source",
                format!(
                    "expected a table with one of {KINDS}, found {}",
                    describe(v)
                ),
            ));
        }
    };
    let val = s.f64_in("val", 0.0, 1.0, "a fraction of the training examples")?;
    let test = s.f64_in("test", 0.0, 1.0, "a fraction of the training examples")?;
    for (k, f) in [("val", val), ("test", test)] {
        if f.is_some_and(|f| f <= 0.0 || f >= 1.0) {
            return Err(s.error(
                k,
                format!(
                    "{} is not a fraction strictly between 0 and 1, e.g. 0.1",
                    f.unwrap_or(0.0)
                ),
            ));
        }
    }
    if let (Some(v), Some(t)) = (val, test)
        && v + t >= 1.0
    {
        return Err(s.error(
            "val",
            format!("val = {v} and test = {t} leave nothing to train on"),
        ));
    }
    let (val_files, test_files) = source.split_files();
    if test.is_some() && test_files {
        return Err(s.error(
            "test",
            "the source has its own test examples: give test files or a test fraction, not both"
                .into(),
        ));
    }
    if val.is_some() && val_files {
        return Err(s.error(
            "val",
            "the source has validation files: give them or a val fraction, not both".into(),
        ));
    }
    let normalize = match s.take("normalize") {
        None | Some(Value::Boolean(false)) => None,
        Some(Value::Boolean(true)) => Some(None),
        Some(Value::Table(t)) => {
            let sub = s.sub("normalize", t);
            let mean = f32_list(&sub, "mean")?;
            let std = f32_list(&sub, "std")?;
            sub.finish()?;
            Some(Some(Normalize { mean, std }))
        }
        Some(v) => {
            return Err(s.error(
                "normalize",
                format!(
                    "expected true (measured on the training split) or {{ mean = [..], std = [..] }}, found {}",
                    describe(v)
                ),
            ));
        }
    };
    let augment = match s.table("augment")? {
        None => Augment::default(),
        Some(t) => {
            let sub = s.sub("augment", t);
            let a = Augment {
                crop_padding: sub.u64("crop_padding", 0)?.unwrap_or(0) as usize,
                flip: sub.bool("flip")?.unwrap_or(false),
            };
            sub.finish()?;
            a
        }
    };
    let workers = s.u64("workers", 0)?.unwrap_or(0) as usize;
    let shuffle = s.u64("shuffle", 0)?.unwrap_or(8000) as usize;
    let prefetch = s.u64("prefetch", 0)?.unwrap_or(4) as usize;
    let seed = s.u64("seed", 0)?.unwrap_or(0);
    let limit = s.u64("limit", 1)?.map(|v| v as usize);
    let test_limit = s.u64("test_limit", 1)?.map(|v| v as usize);
    let top_k = s.u64("top_k", 1)?.unwrap_or(5) as usize;
    s.finish()?;
    Ok(DataConfig {
        name: name.to_string(),
        source,
        val,
        test,
        normalize,
        augment,
        workers,
        shuffle,
        prefetch,
        seed,
        limit,
        test_limit,
        top_k,
    })
}

/// A `source` table: one kind's key, with its options beside it or in its table (merged, each key once).
fn parse_source(s: &Section<'_>, t: &Table) -> CResult<DataSource> {
    let kinds: Vec<&str> = KINDS.split(", ").collect();
    let found: Vec<&String> = t.keys().filter(|k| kinds.contains(&k.as_str())).collect();
    let kind = match found.as_slice() {
        [k] => k.as_str(),
        [] => {
            return Err(s.error(
                "source",
                format!(
                    "no kind of source among its keys ({}): name one of {KINDS}",
                    t.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        many => {
            return Err(s.error(
                "source",
                format!(
                    "{} kinds of source in one table ({}): a data set reads one",
                    many.len(),
                    many.iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    };
    let mut merged = Table::new();
    let at = match &t[kind] {
        Value::String(p) => {
            let key = if matches!(kind, "idx" | "cifar") {
                "dir"
            } else {
                "train"
            };
            merged.insert(key.into(), Value::String(p.clone()));
            None
        }
        Value::Table(inner) => {
            merged.extend(inner.iter().map(|(k, v)| (k.clone(), v.clone())));
            Some(format!("source.{kind}"))
        }
        v => {
            return Err(s.error(
                &format!("source.{kind}"),
                format!("expected a path or a table of files, found {}", describe(v)),
            ));
        }
    };
    for (k, v) in t.iter().filter(|(k, _)| k.as_str() != kind) {
        if merged.insert(k.clone(), v.clone()).is_some() {
            return Err(s.error(
                &format!("source.{k}"),
                format!(
                    "given twice: beside {kind} and inside {}",
                    at.as_deref().unwrap_or(kind)
                ),
            ));
        }
    }
    let o = s.sub("source", &merged);
    let path = |k: &str| -> CResult<Option<PathBuf>> {
        Ok(o.str(k, "a file or folder path")?.map(PathBuf::from))
    };
    let required = |k: &str, what: &str| -> CResult<PathBuf> {
        path(k)?.ok_or_else(|| o.error(k, format!("missing: {what}")))
    };
    let files = |what: &str| -> CResult<Files> {
        Ok(Files {
            train: required("train", what)?,
            val: path("val")?,
            test: path("test")?,
        })
    };
    let vocab_options = || -> CResult<(usize, usize)> {
        Ok((
            o.u64("vocab", 3)?.unwrap_or(20_000) as usize,
            o.u64("min_count", 1)?.unwrap_or(1) as usize,
        ))
    };
    let regression = || -> CResult<bool> {
        match o.str("task", "\"classify\" or \"regress\"")? {
            None | Some("classify") => Ok(false),
            Some("regress") => Ok(true),
            Some(other) => Err(o.error(
                "task",
                format!("expected \"classify\" or \"regress\", found \"{other}\""),
            )),
        }
    };
    let source = match kind {
        "idx" => {
            let layout = match o.str("layout", "\"chw\" or \"hwc\"")? {
                None | Some("chw") => IdxLayout::Chw,
                Some("hwc") => IdxLayout::Hwc,
                Some(other) => {
                    return Err(o.error(
                        "layout",
                        format!("expected \"chw\" or \"hwc\", found \"{other}\""),
                    ));
                }
            };
            DataSource::Idx {
                dir: required("dir", "the folder of IDX files")?,
                options: IdxSource { layout },
            }
        }
        "cifar" => DataSource::Cifar {
            dir: required("dir", "the folder of CIFAR binary batches")?,
            kind: match o.u64("classes", 10)? {
                None | Some(10) => CifarKind::Cifar10,
                Some(100) => CifarKind::Cifar100,
                Some(n) => {
                    return Err(o.error("classes", format!("CIFAR has 10 or 100 classes, not {n}")));
                }
            },
        },
        "images" => {
            let size = match usize_list(&o, "size")? {
                None => None,
                Some(v) if v.len() == 2 => Some([v[0], v[1]]),
                Some(v) => {
                    return Err(o.error(
                        "size",
                        format!("expected [height, width], found {} numbers", v.len()),
                    ));
                }
            };
            let resize = match o.str("resize", "\"stretch\" or \"crop\"")? {
                None | Some("stretch") => Resize::Stretch,
                Some("crop") => Resize::Crop,
                Some(other) => {
                    return Err(o.error(
                        "resize",
                        format!("expected \"stretch\" or \"crop\", found \"{other}\""),
                    ));
                }
            };
            let channels = match o.u64("channels", 1)? {
                None | Some(3) => 3,
                Some(1) => 1,
                Some(n) => {
                    return Err(o.error(
                        "channels",
                        format!("expected 1 (grey) or 3 (RGB), found {n}"),
                    ));
                }
            };
            DataSource::Images {
                files: files("the folder of class folders")?,
                options: ImageFolderSource {
                    size,
                    resize,
                    channels,
                },
            }
        }
        "csv" => {
            let delimiter = match o.str("delimiter", "one character such as \",\" or \"\\t\"")? {
                None => b',',
                Some(d) if d.len() == 1 => d.as_bytes()[0],
                Some(d) => {
                    return Err(o.error(
                        "delimiter",
                        format!(
                            "expected one ASCII character such as \",\" or \"\\t\", found \"{d}\""
                        ),
                    ));
                }
            };
            let features = match o.take("features") {
                None => None,
                Some(Value::Array(a)) => Some(
                    a.iter()
                        .map(|v| match v {
                            Value::String(s) => Ok(s.clone()),
                            Value::Integer(i) if *i >= 0 => Ok(i.to_string()),
                            other => Err(o.error(
                                "features",
                                format!(
                                    "expected column names or numbers, found {}",
                                    describe(other)
                                ),
                            )),
                        })
                        .collect::<CResult<Vec<String>>>()?,
                ),
                Some(v) => {
                    return Err(o.error(
                        "features",
                        format!("expected a list of column names, found {}", describe(v)),
                    ));
                }
            };
            let label = match o.take("label") {
                None => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Integer(i)) if *i >= 0 => Some(i.to_string()),
                Some(v) => {
                    return Err(o.error(
                        "label",
                        format!("expected a column name or number, found {}", describe(v)),
                    ));
                }
            };
            DataSource::Csv {
                files: files("the CSV file")?,
                options: CsvSource {
                    label,
                    features,
                    header: o.bool("header")?.unwrap_or(true),
                    delimiter,
                    regression: regression()?,
                },
            }
        }
        "npy" => {
            let pair = |k: &str, sub: &Section<'_>| -> CResult<NpyFiles> {
                let get = |p: &str| -> CResult<PathBuf> {
                    sub.str(p, "a .npy file")?
                        .map(PathBuf::from)
                        .ok_or_else(|| sub.error(p, format!("missing: the {k} .npy array")))
                };
                Ok(NpyFiles {
                    x: get("x")?,
                    y: get("y")?,
                })
            };
            let split = |k: &str| -> CResult<Option<NpyFiles>> {
                match o.take(k) {
                    None => Ok(None),
                    Some(Value::Table(t)) => {
                        let sub = o.sub(k, t);
                        let p = pair(k, &sub)?;
                        sub.finish()?;
                        Ok(Some(p))
                    }
                    Some(v) => Err(o.error(
                        k,
                        format!(
                            "expected {{ x = \"x.npy\", y = \"y.npy\" }}, found {}",
                            describe(v)
                        ),
                    )),
                }
            };
            if o.take("train").is_some() {
                return Err(o.error(
                    "train",
                    "give the training arrays as { npy = { x = \"x.npy\", y = \"y.npy\" } }".into(),
                ));
            }
            DataSource::Npy {
                files: Files {
                    train: pair("training", &o)?,
                    val: split("val")?,
                    test: split("test")?,
                },
                regression: regression()?,
            }
        }
        "npz" => DataSource::Npz {
            files: files("the .npz archive")?,
            x: o.str("x", "an array name")?.unwrap_or("x").to_string(),
            y: o.str("y", "an array name")?.unwrap_or("y").to_string(),
            regression: regression()?,
        },
        "text" => {
            let (vocab, min_count) = vocab_options()?;
            DataSource::Text {
                files: files("a file of label<TAB>text lines")?,
                max_len: o.u64("max_len", 1)?.unwrap_or(64) as usize,
                vocab,
                min_count,
            }
        }
        "tokens" => {
            let tokenizer = match o.str("tokenizer", "\"bytes\", \"chars\" or \"words\"")? {
                None | Some("chars") => Tokenizer::Chars,
                Some("bytes") => Tokenizer::Bytes,
                Some("words") => Tokenizer::Words,
                Some(other) => {
                    return Err(o.error(
                        "tokenizer",
                        format!("expected \"bytes\", \"chars\" or \"words\", found \"{other}\""),
                    ));
                }
            };
            let (vocab, min_count) = vocab_options()?;
            DataSource::Tokens {
                files: files("a plain-text corpus")?,
                tokenizer,
                window: o.u64("window", 1)?.unwrap_or(64) as usize,
                vocab,
                min_count,
            }
        }
        _ => {
            let train = o.u64("train", 1)?.unwrap_or(1024) as usize;
            let test = o.u64("test", 1)?.unwrap_or(256) as usize;
            let classes = o.u64("classes", 2)?.unwrap_or(10) as usize;
            let len = o.u64("len", 1)?;
            let shape = usize_list(&o, "shape")?;
            let tokens = match len {
                None => None,
                Some(len) => Some(TokenData {
                    len: len as usize,
                    vocab: o.u64("vocab", 2)?.unwrap_or(64) as usize,
                    next_token: o.bool("next_token")?.unwrap_or(false),
                }),
            };
            if tokens.is_some() && shape.is_some() {
                return Err(o.error(
                    "shape",
                    "token sequences have the shape [len]: give len or shape, not both".into(),
                ));
            }
            DataSource::Synthetic(SyntheticData {
                train,
                test,
                classes,
                shape: shape.unwrap_or_else(|| vec![1, 28, 28]),
                tokens,
            })
        }
    };
    o.finish()?;
    Ok(source)
}

/// A list of positive integers.
fn usize_list(s: &Section<'_>, k: &str) -> CResult<Option<Vec<usize>>> {
    let bad = |v: &Value| {
        s.error(
            k,
            format!(
                "expected a list of positive integers, found {}",
                describe(v)
            ),
        )
    };
    match s.take(k) {
        None => Ok(None),
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|x| match x {
                Value::Integer(i) if *i > 0 => Ok(*i as usize),
                other => Err(bad(other)),
            })
            .collect::<CResult<Vec<usize>>>()
            .map(Some),
        Some(v) => Err(bad(v)),
    }
}

/// A list of numbers, one per channel.
fn f32_list(s: &Section<'_>, k: &str) -> CResult<Vec<f32>> {
    let bad = |v: &Value| {
        s.error(
            k,
            format!(
                "expected a list of numbers, one per channel, found {}",
                describe(v)
            ),
        )
    };
    match s.take(k) {
        None => Err(s.error(k, "missing: a list of numbers, one per channel".into())),
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|x| match x {
                Value::Float(f) => Ok(*f as f32),
                Value::Integer(i) => Ok(*i as f32),
                other => Err(bad(other)),
            })
            .collect(),
        Some(v) => Err(bad(v)),
    }
}
