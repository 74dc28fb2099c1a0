//! IDX arrays of any shape and element type as examples: MNIST and Fashion-MNIST (`[n, 28, 28]` bytes), EMNIST,
//! KMNIST, or a 4-D `[n, h, w, c]` array of colour images written by a converter, with a 1-D array of class ids.
//!
//! Each example is row `i` of the image array: bytes are scaled by 1/255 (pixels into `[0, 1]`, as the MNIST
//! pipeline does), other types are taken as values. `[n, h, w]` examples become `[1, h, w]` (one channel, ready
//! for a convolution); `[n, a, b, c]` examples stay `[a, b, c]` ([`IdxLayout::Chw`]) or are transposed from
//! `[h, w, c]` to `[c, h, w]` ([`IdxLayout::Hwc`]); any other `[n, ...]` keeps its shape (`[n]`: `[1]`).

use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::idx::{IdxArray, IdxData, read_idx_gz};
use crate::mnist::find;
use crate::source::{Examples, Task};

/// How the three sizes after `n` of a 4-D image array are ordered.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum IdxLayout {
    /// `[n, c, h, w]`: taken as it is.
    #[default]
    Chw,
    /// `[n, h, w, c]`: each example transposed to `[c, h, w]`.
    Hwc,
}

/// How IDX files become examples.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(default, deny_unknown_fields)]
pub struct IdxSource {
    /// The order of a 4-D image array's sizes (others ignore it).
    pub layout: IdxLayout,
}

/// An IDX image (or feature) array and its labels, in memory.
#[derive(Debug)]
pub struct IdxExamples {
    images: PathBuf,
    data: IdxData,
    /// Elements per example.
    per: usize,
    /// `[h, w, c]` of an example stored channels last, to be transposed.
    hwc: Option<[usize; 3]>,
    shape: Vec<usize>,
    labels: Vec<i32>,
    task: Task,
}

/// The MNIST-style files of one split in `dir`: `train-` (or `t10k-` for the test split) `images-idx3-ubyte`, or
/// `images-idx4-ubyte` for a 4-D array, and `labels-idx1-ubyte`; each also as `.gz` (preferred when both exist).
///
/// # Errors
/// [`Error::Io`] (not found) naming the files looked for.
pub fn split_files(dir: &Path, train: bool) -> Result<(PathBuf, PathBuf)> {
    let prefix = if train { "train" } else { "t10k" };
    let images = ["idx3", "idx4"]
        .iter()
        .map(|d| find(dir, &format!("{prefix}-images-{d}-ubyte")))
        .find(|p| p.is_file());
    let labels = find(dir, &format!("{prefix}-labels-idx1-ubyte"));
    match images {
        Some(images) if labels.is_file() => Ok((images, labels)),
        images => {
            let mut missing = Vec::new();
            if images.is_none() {
                missing.push(format!(
                    "{prefix}-images-idx3-ubyte[.gz] or {prefix}-images-idx4-ubyte[.gz]"
                ));
            }
            if !labels.is_file() {
                missing.push(format!("{prefix}-labels-idx1-ubyte[.gz]"));
            }
            Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no IDX {} split: missing {} (the MNIST file names; extract or rename the files)",
                        if train { "training" } else { "test" },
                        missing.join(" and ")
                    ),
                ),
            ))
        }
    }
}

/// Class ids from a 1-D integer IDX array; the error names the file and, for a negative id, the record and byte.
fn class_ids(array: IdxArray, path: &Path, compressed: bool) -> Result<Vec<i32>> {
    if array.dims.len() != 1 {
        return Err(Error::Shape {
            op: "idx labels",
            reason: format!(
                "{}: labels must be a 1-D array of class ids, found dims {:?} (are the image and label files swapped?)",
                path.display(),
                array.dims
            ),
        });
    }
    let size = array.dtype().size();
    let ids: Vec<i32> = match array.data {
        IdxData::U8(v) => v.into_iter().map(i32::from).collect(),
        IdxData::I8(v) => v.into_iter().map(i32::from).collect(),
        IdxData::I16(v) => v.into_iter().map(i32::from).collect(),
        IdxData::I32(v) => v,
        IdxData::F32(_) | IdxData::F64(_) => {
            return Err(Error::Shape {
                op: "idx labels",
                reason: format!(
                    "{}: labels must be integer class ids, found {:?} elements",
                    path.display(),
                    array.dtype()
                ),
            });
        }
    };
    if let Some(r) = ids.iter().position(|&l| l < 0) {
        return Err(Error::Idx {
            path: path.to_path_buf(),
            offset: (8 + r * size) as u64,
            compressed,
            reason: format!(
                "label {} of record {r} is negative: class ids are 0, 1, ..",
                ids[r]
            ),
        });
    }
    Ok(ids)
}

/// Read the IDX array `images` (`[n, ...]`, any element type) and the class ids `labels` (`[n]`, integers 0 or
/// more) whole. The classes are `"0"` ..= the largest label.
///
/// # Errors
/// [`Error::Io`] or [`Error::Idx`] for a file that cannot be read or is corrupt; [`Error::Shape`] when the labels
/// are not 1-D integers or the counts differ (naming both files and counts); [`Error::Idx`] naming the record of a
/// negative label.
pub fn open(images: &Path, labels: &Path, opts: &IdxSource) -> Result<IdxExamples> {
    let (array, _) = read_idx_gz(images)?;
    let (label_array, compressed) = read_idx_gz(labels)?;
    let ids = class_ids(label_array, labels, compressed)?;
    let n = array.dims[0];
    if ids.len() != n {
        return Err(Error::Shape {
            op: "idx",
            reason: format!(
                "{} holds {n} examples but {} holds {} labels: use the label file of the same split",
                images.display(),
                labels.display(),
                ids.len()
            ),
        });
    }
    let rest = &array.dims[1..];
    let (shape, hwc) = match (rest, opts.layout) {
        ([], _) => (vec![1], None),
        (&[h, w], _) => (vec![1, h, w], None),
        (&[h, w, c], IdxLayout::Hwc) => (vec![c, h, w], Some([h, w, c])),
        (rest, _) => (rest.to_vec(), None),
    };
    let classes = ids.iter().max().map_or(0, |&m| m as usize + 1);
    Ok(IdxExamples {
        images: images.to_path_buf(),
        per: rest.iter().product(),
        data: array.data,
        hwc,
        shape,
        labels: ids,
        task: Task::Classify {
            classes: (0..classes).map(|c| c.to_string()).collect(),
        },
    })
}

/// Elements `range` of `data` as f32: bytes scaled by 1/255, other types as values.
fn to_f32(data: &IdxData, range: std::ops::Range<usize>) -> Vec<f32> {
    match data {
        IdxData::U8(v) => v[range].iter().map(|&p| f32::from(p) / 255.0).collect(),
        IdxData::I8(v) => v[range].iter().map(|&p| f32::from(p)).collect(),
        IdxData::I16(v) => v[range].iter().map(|&p| f32::from(p)).collect(),
        IdxData::I32(v) => v[range].iter().map(|&p| p as f32).collect(),
        IdxData::F32(v) => v[range].to_vec(),
        IdxData::F64(v) => v[range].iter().map(|&p| p as f32).collect(),
    }
}

impl Examples for IdxExamples {
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
        if i >= self.len() {
            return Err(Error::InvalidArgument {
                op: "idx",
                reason: format!("example {i} of {}", self.describe()),
            });
        }
        let x = to_f32(&self.data, i * self.per..(i + 1) * self.per);
        let x = match self.hwc {
            Some([h, w, c]) if !x.is_empty() => {
                let mut t = vec![0.0; x.len()];
                for (p, px) in x.chunks_exact(c).enumerate() {
                    for (ch, &v) in px.iter().enumerate() {
                        t[ch * h * w + p] = v;
                    }
                }
                t
            }
            _ => x,
        };
        Ok((
            Array::from_f32(x, &self.shape)?,
            Array::scalar_i32(self.labels[i]),
        ))
    }

    fn describe(&self) -> String {
        format!(
            "IDX {} ({} examples of {:?}, {} classes)",
            self.images.display(),
            self.len(),
            self.shape,
            self.task.outputs()
        )
    }
}
