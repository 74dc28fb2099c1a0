//! NumPy arrays: features `x` of shape `[n, ...]` and targets `y` of shape `[n]` (or `[n, k]`), from a pair of
//! `.npy` files or two members of one `.npz` archive.
//!
//! A `.npy` feature file is memory-mapped and each example is converted to f32 when it is asked for, so an array
//! larger than memory trains without being read whole. Labels are small and read whole when the source is opened.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::ops::Deref;
use std::path::Path;

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::grouped;
use crate::source::{Examples, Task};

/// Examples from NumPy arrays: features of any shape `[n, ...]` converted to f32 per example, and class ids or
/// real-valued targets.
pub struct ArrayExamples {
    source: String,
    x: NpyArray,
    shape: Vec<usize>,
    task: Task,
    labels: Option<Vec<i32>>,
    targets: Vec<f32>,
}

impl fmt::Debug for ArrayExamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrayExamples")
            .field("source", &self.source)
            .field("len", &self.len())
            .field("shape", &self.shape)
            .field("dtype", &self.x.elem.name())
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl Examples for ArrayExamples {
    fn len(&self) -> usize {
        self.x.rows()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn task(&self) -> &Task {
        &self.task
    }

    fn labels(&self) -> Option<&[i32]> {
        self.labels.as_deref()
    }

    fn example(&self, i: usize) -> Result<(Array, Array)> {
        if i >= self.len() {
            return Err(Error::InvalidArgument {
                op: "ArrayExamples::example",
                reason: format!("example {i} of {} which has {}", self.source, self.len()),
            });
        }
        let x = Array::from_f32(self.x.row_f32(i), &self.shape)?;
        let y = match (&self.labels, &self.task) {
            (Some(l), _) => Array::scalar_i32(l[i]),
            (None, Task::Regress { width }) => {
                Array::from_f32(self.targets[i * width..(i + 1) * width].to_vec(), &[*width])?
            }
            (None, _) => unreachable!("array examples are classes or regression targets"),
        };
        Ok((x, y))
    }

    fn describe(&self) -> String {
        let target = match &self.task {
            Task::Classify { classes } => format!("{} classes", classes.len()),
            Task::Regress { width } => format!("regression of width {width}"),
            Task::NextToken { vocab } => format!("next token of {vocab}"),
        };
        format!(
            "npy {} ({} examples of {:?} {}, {target})",
            self.source,
            grouped(self.len()),
            self.shape,
            self.x.elem.name()
        )
    }
}

/// An `.npy` file (format 1.0) of `descr` (`<f4`, `<i8`, `|u1`, ..) and `shape` holding `data`, raw elements in
/// that type's byte order: what NumPy's `np.save` writes, for tests and for exporting arrays.
pub fn encode_npy(descr: &str, shape: &[usize], fortran: bool, data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Open features `x` and targets `y` saved with `numpy.save`. `x` is memory-mapped and read per example; `y` is
/// read whole.
///
/// Features: C order, any of f32, f64, f16, u8, i8, u16, i16, i32, i64, u32, u64, bool (converted to f32; no
/// scaling, so u8 pixels stay in `0..=255`); `shape()` is `x`'s shape after its first dimension. Targets: an integer
/// (or bool) array `[n]` gives [`Task::Classify`] with classes `"0"` ..= the largest label; a float array, or any
/// array with `regression`, gives [`Task::Regress`] (`[n]` width 1, `[n, k]` width k).
///
/// # Errors
/// [`Error::Io`] when a file cannot be read; [`Error::InvalidArgument`], naming the file, for a file that is not
/// `.npy`, a truncated one, an unsupported dtype (the message lists the supported ones), Fortran order, `x` and `y`
/// of different lengths, or a negative class label (naming its index).
pub fn open_npy(x: &Path, y: &Path, regression: bool) -> Result<ArrayExamples> {
    let file = File::open(x).map_err(|e| Error::io(x, e))?;
    // SAFETY: the map is read-only and lives as long as the examples; like every reader of a memory-mapped file we
    // rely on the file not being truncated or rewritten while it is open (a training set is not).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(x, e))?;
    let xs = NpyArray::parse(x.display().to_string(), Bytes::Mapped(map), "open_npy")?;
    let ys = NpyArray::parse(
        y.display().to_string(),
        Bytes::Owned(std::fs::read(y).map_err(|e| Error::io(y, e))?),
        "open_npy",
    )?;
    build(
        format!("{} + {}", x.display(), y.display()),
        xs,
        ys,
        regression,
        "open_npy",
    )
}

/// Open features and targets from two arrays of an `.npz` archive (`numpy.savez` or `savez_compressed`), named
/// `x_key` and `y_key` (`"x"` for the member `x.npy`). Otherwise as [`open_npy`].
///
/// Both members are decompressed into memory when the archive is opened: a zip member may be deflated, and a
/// deflated stream cannot be read at an example's offset, so an array too large for memory belongs in a `.npy` file.
///
/// # Errors
/// As [`open_npy`]; also [`Error::InvalidArgument`] for a file that is not a zip archive, or a key that it does not
/// hold (the message lists the keys it does).
pub fn open_npz(path: &Path, x_key: &str, y_key: &str, regression: bool) -> Result<ArrayExamples> {
    const OP: &str = "open_npz";
    let mut archive = npyz::npz::NpzArchive::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "{}: not an .npz archive ({e}); write it with numpy.savez",
                    path.display()
                ),
            }
        } else {
            Error::io(path, e)
        }
    })?;
    let keys: Vec<String> = archive.array_names().map(String::from).collect();
    let mut member = |key: &str| -> Result<NpyArray> {
        let key = key.strip_suffix(".npy").unwrap_or(key);
        let name = npyz::npz::file_name_from_array_name(key);
        let zip_err = |reason: String| Error::InvalidArgument {
            op: OP,
            reason: format!("{}: array {key:?}: {reason}", path.display()),
        };
        let mut file = match archive.zip_archive().by_name(&name) {
            Ok(f) => f,
            Err(npyz::zip::result::ZipError::FileNotFound) => {
                return Err(zip_err(format!(
                    "no such array; the archive holds {}",
                    crate::source::list(&keys)
                )));
            }
            Err(npyz::zip::result::ZipError::Io(e)) => return Err(Error::io(path, e)),
            Err(e) => return Err(zip_err(format!("cannot be read ({e})"))),
        };
        let mut bytes = Vec::with_capacity(usize::try_from(file.size()).unwrap_or(0));
        file.read_to_end(&mut bytes)
            .map_err(|e| zip_err(format!("cannot be decompressed ({e})")))?;
        NpyArray::parse(
            format!("{} (array {key:?})", path.display()),
            Bytes::Owned(bytes),
            OP,
        )
    };
    let xs = member(x_key)?;
    let ys = member(y_key)?;
    build(
        format!("{} [{x_key}, {y_key}]", path.display()),
        xs,
        ys,
        regression,
        OP,
    )
}

fn build(
    source: String,
    x: NpyArray,
    y: NpyArray,
    regression: bool,
    op: &'static str,
) -> Result<ArrayExamples> {
    let err = |reason: String| Error::InvalidArgument { op, reason };
    if x.shape.is_empty() {
        return Err(err(format!(
            "{}: a scalar array; features must have one row per example, shape [n, ...]",
            x.name
        )));
    }
    if x.rows() != y.rows() || y.shape.is_empty() {
        return Err(err(format!(
            "{} holds {} examples but {} holds {} targets (shape {:?}); they must have the same first dimension",
            x.name,
            x.rows(),
            y.name,
            if y.shape.is_empty() { 0 } else { y.rows() },
            y.shape
        )));
    }
    let (task, labels, targets) = if y.elem.is_integer() && !regression {
        if y.shape.len() > 2 || (y.shape.len() == 2 && y.shape[1] != 1) {
            return Err(err(format!(
                "{}: class labels of shape {:?}; they must be one per example, [n] (for several real-valued \
                 targets per example open it as a regression)",
                y.name, y.shape
            )));
        }
        let values = y.values_i64();
        let mut max = 0i64;
        for (i, &v) in values.iter().enumerate() {
            if v < 0 {
                return Err(err(format!(
                    "{}: label {v} at index {i} is negative; class labels are 0, 1, 2, .. (for real-valued targets \
                     open it as a regression)",
                    y.name
                )));
            }
            if v >= 1 << 24 {
                return Err(err(format!(
                    "{}: label {v} at index {i} is too large for a class id (at most {}); for real-valued targets \
                     open it as a regression",
                    y.name,
                    (1 << 24) - 1
                )));
            }
            max = max.max(v);
        }
        let classes = if values.is_empty() {
            Vec::new()
        } else {
            (0..=max).map(|c| c.to_string()).collect()
        };
        let ids = values.into_iter().map(|v| v as i32).collect();
        (Task::Classify { classes }, Some(ids), Vec::new())
    } else {
        let width = match y.shape.len() {
            1 => 1,
            2 => y.shape[1],
            _ => {
                return Err(err(format!(
                    "{}: targets of shape {:?}; a regression needs [n] or [n, k]",
                    y.name, y.shape
                )));
            }
        };
        (Task::Regress { width }, None, y.values_f32())
    };
    tracing::debug!(%source, rows = x.rows(), "opened numpy arrays");
    Ok(ArrayExamples {
        source,
        shape: x.shape[1..].to_vec(),
        x,
        task,
        labels,
        targets,
    })
}

/// The bytes of an `.npy` file: mapped from disk, or in memory (a decompressed `.npz` member, a label file).
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// The element types read (as NumPy's type strings name them: `b1`, `u1`, .. `f8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
}

const SUPPORTED: &str = "f32, f64, f16, u8, i8, u16, i16, i32, i64, u32, u64, bool";

impl Elem {
    fn of(t: &npyz::TypeStr) -> Option<Elem> {
        use npyz::TypeChar::{Bool, Float, Int, Uint};
        Some(match (t.type_char(), t.size_field()) {
            (Bool, 1) => Elem::Bool,
            (Uint, 1) => Elem::U8,
            (Int, 1) => Elem::I8,
            (Uint, 2) => Elem::U16,
            (Int, 2) => Elem::I16,
            (Uint, 4) => Elem::U32,
            (Int, 4) => Elem::I32,
            (Uint, 8) => Elem::U64,
            (Int, 8) => Elem::I64,
            (Float, 2) => Elem::F16,
            (Float, 4) => Elem::F32,
            (Float, 8) => Elem::F64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            Elem::Bool | Elem::U8 | Elem::I8 => 1,
            Elem::U16 | Elem::I16 | Elem::F16 => 2,
            Elem::U32 | Elem::I32 | Elem::F32 => 4,
            Elem::U64 | Elem::I64 | Elem::F64 => 8,
        }
    }

    fn is_integer(self) -> bool {
        !matches!(self, Elem::F16 | Elem::F32 | Elem::F64)
    }

    fn name(self) -> &'static str {
        match self {
            Elem::Bool => "bool",
            Elem::U8 => "u8",
            Elem::I8 => "i8",
            Elem::U16 => "u16",
            Elem::I16 => "i16",
            Elem::U32 => "u32",
            Elem::I32 => "i32",
            Elem::U64 => "u64",
            Elem::I64 => "i64",
            Elem::F16 => "f16",
            Elem::F32 => "f32",
            Elem::F64 => "f64",
        }
    }
}

/// One array of an `.npy` file: its header read, its data left as bytes.
struct NpyArray {
    /// The file (and member) for messages.
    name: String,
    bytes: Bytes,
    offset: usize,
    elem: Elem,
    big_endian: bool,
    shape: Vec<usize>,
}

impl NpyArray {
    fn parse(name: String, bytes: Bytes, op: &'static str) -> Result<NpyArray> {
        let err = |reason: String| Error::InvalidArgument {
            op,
            reason: format!("{name}: {reason}"),
        };
        if !bytes.starts_with(b"\x93NUMPY") {
            return Err(err(
                "not a .npy file (it does not start with the NumPy magic \\x93NUMPY); write it with numpy.save"
                    .into(),
            ));
        }
        let mut rest: &[u8] = &bytes;
        let header = npyz::NpyHeader::from_reader(&mut rest).map_err(|e| {
            err(format!(
                "unreadable .npy header ({e}); write it again with numpy.save"
            ))
        })?;
        let offset = bytes.len() - rest.len();
        let (elem, big_endian) = match header.dtype() {
            npyz::DType::Plain(t) => match Elem::of(&t) {
                Some(e) => (e, t.endianness() == npyz::Endianness::Big),
                None => {
                    return Err(err(format!(
                        "dtype {t} is not supported; supported: {SUPPORTED} (convert it with x.astype(np.float32))"
                    )));
                }
            },
            other => {
                return Err(err(format!(
                    "structured dtype {} is not supported; supported: {SUPPORTED}",
                    other.descr()
                )));
            }
        };
        let shape: Vec<usize> = header
            .shape()
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect();
        if header.order() == npyz::Order::Fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(err(format!(
                "shape {shape:?} is stored in Fortran order; save it in C order: \
                 numpy.save(path, numpy.ascontiguousarray(x))"
            )));
        }
        let need = shape
            .iter()
            .try_fold(elem.size(), |acc, &d| acc.checked_mul(d));
        let have = bytes.len() - offset;
        match need {
            Some(need) if need <= have => {}
            _ => {
                return Err(err(format!(
                    "truncated: the header says shape {shape:?} of {} ({} bytes) but {have} bytes follow it \
                     (copy or write the file again)",
                    elem.name(),
                    need.map_or_else(|| "too many".to_string(), |n| n.to_string())
                )));
            }
        }
        Ok(NpyArray {
            name,
            bytes,
            offset,
            elem,
            big_endian,
            shape,
        })
    }

    fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    fn row_elems(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    fn data(&self, first: usize, count: usize) -> &[u8] {
        let size = self.elem.size();
        let start = self.offset + first * size;
        &self.bytes[start..start + count * size]
    }

    /// Row `i`'s elements as f32.
    fn row_f32(&self, i: usize) -> Vec<f32> {
        let n = self.row_elems();
        let mut out = Vec::with_capacity(n);
        to_f32(self.data(i * n, n), self.elem, self.big_endian, &mut out);
        out
    }

    /// Every element as f32.
    fn values_f32(&self) -> Vec<f32> {
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n);
        to_f32(self.data(0, n), self.elem, self.big_endian, &mut out);
        out
    }

    /// Every element as i64, for an integer or bool array (u64 above `i64::MAX` saturates).
    fn values_i64(&self) -> Vec<i64> {
        let n: usize = self.shape.iter().product();
        let b = self.data(0, n);
        let be = self.big_endian;
        let mut out = Vec::with_capacity(n);
        match self.elem {
            Elem::Bool | Elem::U8 => out.extend(b.iter().map(|&v| i64::from(v))),
            Elem::I8 => out.extend(b.iter().map(|&v| i64::from(v as i8))),
            Elem::U16 => decode(
                b,
                be,
                u16::from_le_bytes,
                u16::from_be_bytes,
                i64::from,
                &mut out,
            ),
            Elem::I16 => decode(
                b,
                be,
                i16::from_le_bytes,
                i16::from_be_bytes,
                i64::from,
                &mut out,
            ),
            Elem::U32 => decode(
                b,
                be,
                u32::from_le_bytes,
                u32::from_be_bytes,
                i64::from,
                &mut out,
            ),
            Elem::I32 => decode(
                b,
                be,
                i32::from_le_bytes,
                i32::from_be_bytes,
                i64::from,
                &mut out,
            ),
            Elem::U64 => decode(
                b,
                be,
                u64::from_le_bytes,
                u64::from_be_bytes,
                |v| i64::try_from(v).unwrap_or(i64::MAX),
                &mut out,
            ),
            Elem::I64 => decode(
                b,
                be,
                i64::from_le_bytes,
                i64::from_be_bytes,
                |v| v,
                &mut out,
            ),
            Elem::F16 | Elem::F32 | Elem::F64 => {
                out.extend(self.values_f32().into_iter().map(|v| v as i64));
            }
        }
        out
    }
}

/// Decode fixed-size elements of either byte order, convert each and append them to `out`.
fn decode<const N: usize, T, U>(
    bytes: &[u8],
    big_endian: bool,
    le: fn([u8; N]) -> T,
    be: fn([u8; N]) -> T,
    convert: impl Fn(T) -> U,
    out: &mut Vec<U>,
) {
    let from = if big_endian { be } else { le };
    out.extend(
        bytes
            .chunks_exact(N)
            .map(|c| convert(from(c.try_into().unwrap_or([0; N])))),
    );
}

fn to_f32(b: &[u8], elem: Elem, be: bool, out: &mut Vec<f32>) {
    match elem {
        Elem::Bool | Elem::U8 => out.extend(b.iter().map(|&v| f32::from(v))),
        Elem::I8 => out.extend(b.iter().map(|&v| f32::from(v as i8))),
        Elem::U16 => decode(
            b,
            be,
            u16::from_le_bytes,
            u16::from_be_bytes,
            f32::from,
            out,
        ),
        Elem::I16 => decode(
            b,
            be,
            i16::from_le_bytes,
            i16::from_be_bytes,
            f32::from,
            out,
        ),
        Elem::U32 => decode(
            b,
            be,
            u32::from_le_bytes,
            u32::from_be_bytes,
            |v| v as f32,
            out,
        ),
        Elem::I32 => decode(
            b,
            be,
            i32::from_le_bytes,
            i32::from_be_bytes,
            |v| v as f32,
            out,
        ),
        Elem::U64 => decode(
            b,
            be,
            u64::from_le_bytes,
            u64::from_be_bytes,
            |v| v as f32,
            out,
        ),
        Elem::I64 => decode(
            b,
            be,
            i64::from_le_bytes,
            i64::from_be_bytes,
            |v| v as f32,
            out,
        ),
        Elem::F16 => decode(
            b,
            be,
            half::f16::from_le_bytes,
            half::f16::from_be_bytes,
            f32::from,
            out,
        ),
        Elem::F32 => decode(b, be, f32::from_le_bytes, f32::from_be_bytes, |v| v, out),
        Elem::F64 => decode(
            b,
            be,
            f64::from_le_bytes,
            f64::from_be_bytes,
            |v| v as f32,
            out,
        ),
    }
}
