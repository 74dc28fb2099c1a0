//! CIFAR-10 and CIFAR-100 in their binary versions (`cifar-10-binary.tar.gz`, `cifar-100-binary.tar.gz`).
//!
//! A batch file is a run of fixed-size records: the label byte(s), then 3,072 pixel bytes, the 32x32 red plane,
//! then green, then blue, each row-major. CIFAR-10 records have one label byte (0-9); CIFAR-100 records two,
//! the coarse (0-19) and the fine label (0-99), of which the fine one is the class. The files are read whole
//! into memory (CIFAR-10 is 180 MB in all) and each example is converted when it is asked for.

use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::{Examples, Task};

/// Pixels per image: 3 planes of 32x32.
const PIXELS: usize = 3 * 32 * 32;

/// Which of the two CIFAR data sets.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CifarKind {
    /// 10 classes, one label byte per record.
    #[default]
    Cifar10,
    /// 100 classes (the fine labels; the coarse ones are kept too), two label bytes per record.
    Cifar100,
}

impl CifarKind {
    /// Label bytes before each record's pixels.
    fn label_bytes(self) -> usize {
        match self {
            CifarKind::Cifar10 => 1,
            CifarKind::Cifar100 => 2,
        }
    }

    /// Bytes per record: the label bytes and 3,072 pixels.
    pub fn record_size(self) -> usize {
        self.label_bytes() + PIXELS
    }

    /// Number of classes.
    pub fn classes(self) -> usize {
        match self {
            CifarKind::Cifar10 => 10,
            CifarKind::Cifar100 => 100,
        }
    }

    fn name(self) -> &'static str {
        match self {
            CifarKind::Cifar10 => "CIFAR-10",
            CifarKind::Cifar100 => "CIFAR-100",
        }
    }

    /// The class-name file of the binary distribution, one name a line.
    fn names_file(self) -> &'static str {
        match self {
            CifarKind::Cifar10 => "batches.meta.txt",
            CifarKind::Cifar100 => "fine_label_names.txt",
        }
    }

    /// The folder the archive extracts to.
    fn folder(self) -> &'static str {
        match self {
            CifarKind::Cifar10 => "cifar-10-batches-bin",
            CifarKind::Cifar100 => "cifar-100-binary",
        }
    }

    fn other(self) -> CifarKind {
        match self {
            CifarKind::Cifar10 => CifarKind::Cifar100,
            CifarKind::Cifar100 => CifarKind::Cifar10,
        }
    }
}

/// CIFAR images held in memory as their records.
pub struct Cifar {
    kind: CifarKind,
    files: Vec<PathBuf>,
    /// The records of all files, one after another.
    records: Vec<u8>,
    labels: Vec<i32>,
    coarse: Vec<i32>,
    task: Task,
    shape: [usize; 3],
}

impl std::fmt::Debug for Cifar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cifar")
            .field("kind", &self.kind)
            .field("files", &self.files)
            .field("len", &self.labels.len())
            .finish()
    }
}

/// The batch files of one split in `dir`, or in the folder the archive extracts to inside it
/// (`cifar-10-batches-bin/`, `cifar-100-binary/`): CIFAR-10 `data_batch_1.bin` .. `data_batch_5.bin` for
/// training and `test_batch.bin` for testing; CIFAR-100 `train.bin` and `test.bin`.
///
/// # Errors
/// [`Error::Io`] (not found) naming every file looked for, when neither folder holds all of them.
pub fn split_files(dir: &Path, kind: CifarKind, train: bool) -> Result<Vec<PathBuf>> {
    let names: Vec<String> = match (kind, train) {
        (CifarKind::Cifar10, true) => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
        (CifarKind::Cifar10, false) => vec!["test_batch.bin".into()],
        (CifarKind::Cifar100, true) => vec!["train.bin".into()],
        (CifarKind::Cifar100, false) => vec!["test.bin".into()],
    };
    let folders = [dir.to_path_buf(), dir.join(kind.folder())];
    for folder in &folders {
        let files: Vec<PathBuf> = names.iter().map(|n| folder.join(n)).collect();
        if files.iter().all(|f| f.is_file()) {
            return Ok(files);
        }
    }
    let looked: Vec<String> = folders
        .iter()
        .flat_map(|f| names.iter().map(move |n| f.join(n).display().to_string()))
        .filter(|p| !Path::new(p).is_file())
        .collect();
    Err(Error::io(
        dir,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no {} {} batches: missing {} (extract the binary version of {}, e.g. cifar-{}-binary.tar.gz, here)",
                kind.name(),
                if train { "training" } else { "test" },
                looked.join(", "),
                kind.name(),
                kind.classes()
            ),
        ),
    ))
}

/// Why a file's length does not fit the records, in words, for the error message.
fn length_hint(bytes: &[u8], kind: CifarKind) -> String {
    if bytes.first() == Some(&0x80) || bytes.starts_with(b"(d") || bytes.starts_with(b"}q") {
        "it looks like the Python (pickle) version: download the binary version instead".into()
    } else if bytes.starts_with(b"MATLAB") {
        "it looks like the MATLAB version: download the binary version instead".into()
    } else if !bytes.is_empty() && bytes.len() % kind.other().record_size() == 0 {
        format!(
            "its length fits {} records: is it a {} file?",
            kind.other().name(),
            kind.other().name()
        )
    } else {
        "the file is truncated, or not a batch of the binary version: download or extract it again"
            .into()
    }
}

/// Class names from the names file beside `first`, when it is there and has one name per class.
fn class_names(first: &Path, kind: CifarKind) -> Vec<String> {
    let numbers = || (0..kind.classes()).map(|i| i.to_string()).collect();
    let Some(dir) = first.parent() else {
        return numbers();
    };
    let path = dir.join(kind.names_file());
    let Ok(text) = std::fs::read_to_string(&path) else {
        return numbers();
    };
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if names.len() == kind.classes() {
        names
    } else {
        tracing::warn!(
            "{}: {} names for {} classes; using the class numbers",
            path.display(),
            names.len(),
            kind.classes()
        );
        numbers()
    }
}

/// Read the CIFAR batch `files` (one split, e.g. from [`split_files`]) whole, in order. The class names come from
/// `batches.meta.txt` (CIFAR-10) or `fine_label_names.txt` (CIFAR-100) beside the first file, else they are the
/// numbers `"0"`, `"1"`, ...
///
/// # Errors
/// [`Error::InvalidArgument`] for no files; [`Error::Io`] for a file that cannot be read; [`Error::Image`] for a
/// file whose length is not a whole number of records (with the likely cause) or a record whose label is out of
/// range (naming its number).
pub fn open(files: &[PathBuf], kind: CifarKind) -> Result<Cifar> {
    if files.is_empty() {
        return Err(Error::InvalidArgument {
            op: "cifar",
            reason: format!("no {} files given (see cifar::split_files)", kind.name()),
        });
    }
    let rec = kind.record_size();
    let mut records = Vec::new();
    let mut labels = Vec::new();
    let mut coarse = Vec::new();
    for path in files {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        if bytes.is_empty() || bytes.len() % rec != 0 {
            return Err(Error::Image {
                path: path.clone(),
                reason: format!(
                    "{} bytes is not a whole number of {} records of {rec} bytes ({} label byte{} and {PIXELS} \
                     pixels): {}",
                    bytes.len(),
                    kind.name(),
                    kind.label_bytes(),
                    if kind.label_bytes() == 1 { "" } else { "s" },
                    length_hint(&bytes, kind)
                ),
            });
        }
        for (r, record) in bytes.chunks_exact(rec).enumerate() {
            let (label, limit) = match kind {
                CifarKind::Cifar10 => (record[0], 10),
                CifarKind::Cifar100 => (record[1], 100),
            };
            let bad = |what: &str, value: u8, limit: u8| Error::Image {
                path: path.clone(),
                reason: format!(
                    "record {r} (byte {}) has {what} {value}, but {} {what}s are below {limit}: the file is \
                     corrupt or not {}",
                    r * rec,
                    kind.name(),
                    kind.name()
                ),
            };
            if label >= limit {
                return Err(bad("label", label, limit));
            }
            if kind == CifarKind::Cifar100 {
                if record[0] >= 20 {
                    return Err(bad("coarse label", record[0], 20));
                }
                coarse.push(i32::from(record[0]));
            }
            labels.push(i32::from(label));
        }
        records.extend_from_slice(&bytes);
    }
    Ok(Cifar {
        kind,
        files: files.to_vec(),
        records,
        labels,
        coarse,
        task: Task::Classify {
            classes: class_names(&files[0], kind),
        },
        shape: [3, 32, 32],
    })
}

impl Cifar {
    /// Which data set.
    pub fn kind(&self) -> CifarKind {
        self.kind
    }

    /// CIFAR-100's coarse labels (0-19), one per example; `None` for CIFAR-10.
    pub fn coarse_labels(&self) -> Option<&[i32]> {
        (self.kind == CifarKind::Cifar100).then_some(self.coarse.as_slice())
    }

    /// The raw pixels of example `i` (R, G, B planes of 32x32), or `None` past the end.
    pub fn pixels(&self, i: usize) -> Option<&[u8]> {
        let rec = self.kind.record_size();
        let at = i.checked_mul(rec)? + self.kind.label_bytes();
        self.records.get(at..at + PIXELS)
    }
}

impl Examples for Cifar {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        Some(&self.labels)
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        let px = self.pixels(i).ok_or_else(|| Error::InvalidArgument {
            op: "cifar",
            reason: format!("example {i} of {} ({})", self.len(), self.describe()),
        })?;
        let x = px.iter().map(|&p| f32::from(p) / 255.0).collect();
        Ok((
            Array::from_f32(x, &self.shape)?,
            Array::scalar_i32(self.labels[i]),
        ))
    }

    fn describe(&self) -> String {
        let first = self.files[0].display();
        let files = if self.files.len() == 1 {
            format!("{first}")
        } else {
            format!("{first} and {} more files", self.files.len() - 1)
        };
        format!(
            "{} {files} ({} images of [3, 32, 32], {} classes)",
            self.kind.name(),
            self.len(),
            self.kind.classes()
        )
    }
}
