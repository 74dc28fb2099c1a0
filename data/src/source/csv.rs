//! CSV tables: one example per row, numeric feature columns and a target column (class labels, or real values for
//! a regression), parsed into memory in one pass.
//!
//! The label column may hold any text (`cat`, `dog`; `0` .. `9`): the classes are its distinct values, sorted
//! (numerically when all are integers, so digit labels keep their ids), or the training file's classes when a
//! validation or test file is opened with them. Every feature cell must be a number.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};
use crate::source::{Examples, LabelCells, Task, grouped, list};

/// How to read a CSV file as examples.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CsvSource {
    /// The target column: a header name, or a 0-based index when there is no header; `None` is the last column.
    pub label: Option<String>,
    /// The feature columns (names, or 0-based indices without a header); `None` is every column but the label.
    pub features: Option<Vec<String>>,
    /// The first line names the columns.
    pub header: bool,
    /// The field separator (`b','`; `b'\t'` for TSV).
    pub delimiter: u8,
    /// The target is a real value ([`Task::Regress`] of width 1) rather than a class.
    pub regression: bool,
}

impl Default for CsvSource {
    fn default() -> Self {
        CsvSource {
            label: None,
            features: None,
            header: true,
            delimiter: b',',
            regression: false,
        }
    }
}

/// A table read from CSV: features f32 `[rows, features]` in memory, and each row's target.
pub struct TableExamples {
    path: PathBuf,
    rows: usize,
    columns: Vec<String>,
    features: Vec<f32>,
    shape: Vec<usize>,
    task: Task,
    labels: Option<Vec<i32>>,
    targets: Vec<f32>,
}

impl fmt::Debug for TableExamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableExamples")
            .field("path", &self.path)
            .field("rows", &self.len())
            .field("columns", &self.columns)
            .field("task", &self.task)
            .finish_non_exhaustive()
    }
}

impl TableExamples {
    /// The names of the feature columns, in feature order (from the header, or `c0`, `c1`, .. by column index).
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Every row's features, row-major `[rows, features]`.
    pub fn features(&self) -> &[f32] {
        &self.features
    }
}

impl Examples for TableExamples {
    fn len(&self) -> usize {
        self.rows
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
        let w = self.shape[0];
        if i >= self.len() {
            return Err(Error::InvalidArgument {
                op: "TableExamples::example",
                reason: format!(
                    "row {i} of {} which has {} rows",
                    self.path.display(),
                    self.len()
                ),
            });
        }
        let x = Array::from_f32(self.features[i * w..(i + 1) * w].to_vec(), &self.shape)?;
        let y = match &self.labels {
            Some(l) => Array::scalar_i32(l[i]),
            None => Array::from_f32(vec![self.targets[i]], &[1])?,
        };
        Ok((x, y))
    }

    fn describe(&self) -> String {
        let target = match &self.task {
            Task::Classify { classes } => format!("{} classes", classes.len()),
            _ => "regression".to_string(),
        };
        format!(
            "csv {} ({} rows, {} features, {target})",
            self.path.display(),
            grouped(self.len()),
            self.shape[0]
        )
    }
}

/// Read a CSV file as examples: every row one example, its features f32 `[features]`, its target a class id
/// (`Task::Classify`) or, with `opts.regression`, a real value f32 `[1]` (`Task::Regress { width: 1 }`).
///
/// `classes` fixes the class list (pass the training file's classes when opening its validation or test file, so
/// the ids agree); without it the classes are the sorted distinct labels, numerically sorted when all are integers.
/// Surrounding spaces of a cell are ignored; fields may be quoted. Blank lines are skipped.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read. [`Error::Csv`], naming the line and column, for a row with another
/// number of fields than the header (or first row), a feature cell that is not a number, a regression target that
/// is not a number, a label outside `classes`, an empty file or a header without rows.
/// [`Error::InvalidArgument`] for a label or feature column that the file does not have (the message lists the
/// header), or no feature column left.
pub fn open(path: &Path, opts: &CsvSource, classes: Option<&[String]>) -> Result<TableExamples> {
    let t = read_table(path, opts, true)?;
    let width = t.columns.len();
    let (task, labels, targets) = match t.target {
        Target::Classes(cells) => {
            let (classes, ids) = cells.finish(path, classes)?;
            (Task::Classify { classes }, Some(ids), Vec::new())
        }
        Target::Values(v) => (Task::Regress { width: 1 }, None, v),
        Target::None => unreachable!("read_table with a label always gives a target"),
    };
    tracing::debug!(path = %path.display(), rows = t.rows, width, "read csv");
    Ok(TableExamples {
        path: path.to_path_buf(),
        rows: t.rows,
        columns: t.columns,
        features: t.features,
        shape: vec![width],
        task,
        labels,
        targets,
    })
}

/// A numeric table read from CSV, every column a feature.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvTable {
    /// Names of the columns (from the header, or `c0`, `c1`, ...).
    pub columns: Vec<String>,
    /// The cells, `f32`, shape `[rows, columns]`.
    pub values: Array,
}

/// Read a CSV file whose every cell is a number (features to predict on, a table without targets) into memory.
///
/// # Errors
/// As [`open`]: [`Error::Io`] when the file cannot be read, [`Error::Csv`] naming the line and column of a cell
/// that is not a number, a ragged row, or an empty file.
pub fn read_csv(path: impl AsRef<Path>, header: bool, delimiter: u8) -> Result<CsvTable> {
    let path = path.as_ref();
    let opts = CsvSource {
        header,
        delimiter,
        ..CsvSource::default()
    };
    let t = read_table(path, &opts, false)?;
    let shape = [t.rows, t.columns.len()];
    Ok(CsvTable {
        columns: t.columns,
        values: Array::from_f32(t.features, &shape)?,
    })
}

/// What the label column holds, as it is read.
enum Target {
    None,
    Classes(LabelCells),
    Values(Vec<f32>),
}

struct Table {
    columns: Vec<String>,
    features: Vec<f32>,
    rows: usize,
    target: Target,
}

/// Files from this size on are mapped and, when they hold no quote, split by hand in parallel chunks.
const PARALLEL_FROM: u64 = 4 << 20;

fn read_table(path: &Path, opts: &CsvSource, with_label: bool) -> Result<Table> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if size >= PARALLEL_FROM {
        // SAFETY: the map is read-only and dropped before this function returns; like every reader of a mapped
        // file we rely on it not being truncated while it is read (a data set being trained on is not).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        return read_mapped(path, opts, with_label, &map);
    }
    let mut reader = builder(opts).buffer_capacity(1 << 20).from_reader(file);
    let mut rec = csv::ByteRecord::new();
    let first = next_record(path, &mut reader, &mut rec, 1)?;
    let plan = Plan::new(path, opts, with_label, &rec, first)?;
    plan.read_rest(&mut reader, &mut rec)
}

/// Parse a whole file in memory. Without quotes a record never spans a line break, so the file splits at line
/// breaks into chunks that parse independently, one per worker; with quotes it is read in one pass.
fn read_mapped(path: &Path, opts: &CsvSource, with_label: bool, bytes: &[u8]) -> Result<Table> {
    use rayon::prelude::*;
    let mut reader = builder(opts).from_reader(bytes);
    let mut rec = csv::ByteRecord::new();
    let first = next_record(path, &mut reader, &mut rec, 1)?;
    let plan = Plan::new(path, opts, with_label, &rec, first)?;
    let start = if opts.header {
        reader.position().byte() as usize
    } else {
        0
    };
    let data = &bytes[start..];
    // Chunk bounds at line breaks.
    let pieces = rayon::current_num_threads() * 4;
    let mut bounds = vec![0usize];
    for k in 1..pieces {
        let at = (data.len() * k / pieces).max(*bounds.last().unwrap_or(&0));
        let end = data[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |p| at + p + 1);
        if end > *bounds.last().unwrap_or(&0) && end < data.len() {
            bounds.push(end);
        }
    }
    bounds.push(data.len());
    let parts: Vec<Result<Option<Part>>> = bounds
        .par_windows(2)
        .map(|w| {
            plan.unquoted(&data[w[0]..w[1]], opts.delimiter)
                .map_err(|e| match e {
                    // The chunk's lines were counted from 1: the lines before it are counted only now.
                    Error::Csv {
                        path,
                        line,
                        column,
                        reason,
                    } => Error::Csv {
                        path,
                        line: line
                            + bytes[..start + w[0]]
                                .iter()
                                .filter(|&&b| b == b'\n')
                                .count(),
                        column,
                        reason,
                    },
                    other => other,
                })
        })
        .collect();
    let parts: Option<Vec<Part>> = parts.into_iter().collect::<Result<_>>()?;
    match parts {
        Some(parts) => plan.finish(parts),
        // A quote somewhere: the csv crate's reader handles quoted fields, in one pass.
        None => plan.read_rest(&mut reader, &mut rec),
    }
}

fn builder(opts: &CsvSource) -> csv::ReaderBuilder {
    let mut b = csv::ReaderBuilder::new();
    b.has_headers(false)
        .flexible(true)
        .delimiter(opts.delimiter);
    b
}

/// Read the next record into `rec`; `first_line` is the file's line on which the reader's input starts.
fn next_record<R: std::io::Read>(
    path: &Path,
    reader: &mut csv::Reader<R>,
    rec: &mut csv::ByteRecord,
    first_line: usize,
) -> Result<bool> {
    reader.read_byte_record(rec).map_err(|e| {
        let line = e
            .position()
            .map_or(first_line, |p| first_line + p.line() as usize - 1);
        match e.into_kind() {
            csv::ErrorKind::Io(io) => Error::io(path, io),
            kind => Error::Csv {
                path: path.to_path_buf(),
                line,
                column: 1,
                reason: format!("{kind:?}"),
            },
        }
    })
}

/// Which columns are read as what, decided from the header (or the first row).
struct Plan<'a> {
    path: &'a Path,
    header: bool,
    regression: bool,
    width: usize,
    names: Vec<String>,
    features: Vec<usize>,
    label: Option<usize>,
    /// The line of the header (or the first row).
    first_line: usize,
    /// What each column is read as.
    roles: Vec<Role>,
}

/// What a column is read as.
#[derive(Clone, Copy)]
enum Role {
    /// The `k`-th feature of a row.
    Feature(usize),
    Label,
    Unused,
}

/// The rows of one chunk of the file.
struct Part {
    features: Vec<f32>,
    target: Target,
    rows: usize,
}

impl<'a> Plan<'a> {
    /// The plan for a file whose first record (`has_first` when there is one) is `first`.
    fn new(
        path: &'a Path,
        opts: &CsvSource,
        with_label: bool,
        first: &csv::ByteRecord,
        has_first: bool,
    ) -> Result<Plan<'a>> {
        if !has_first {
            return Err(Error::Csv {
                path: path.to_path_buf(),
                line: 1,
                column: 1,
                reason: if opts.header {
                    "the file is empty (expected a header line naming the columns, then one row per example)"
                } else {
                    "the file is empty (expected one row per example)"
                }
                .into(),
            });
        }
        let width = first.len();
        let header: Option<Vec<String>> = opts.header.then(|| {
            first
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let f = if i == 0 {
                        f.strip_prefix("\u{feff}".as_bytes()).unwrap_or(f)
                    } else {
                        f
                    };
                    String::from_utf8_lossy(f.trim_ascii()).into_owned()
                })
                .collect()
        });
        let names: Vec<String> = match &header {
            Some(h) => h.clone(),
            None => (0..width).map(|i| format!("c{i}")).collect(),
        };
        let find = |name: &str, role: &str| -> Result<usize> {
            let found = match &header {
                Some(h) => h.iter().position(|c| c == name),
                None => name.trim().parse::<usize>().ok().filter(|&i| i < width),
            };
            found.ok_or_else(|| Error::InvalidArgument {
                op: "csv::open",
                reason: match &header {
                    Some(h) => format!(
                        "{}: no {role} column named {name:?}; the header names {}",
                        path.display(),
                        list(h)
                    ),
                    None => format!(
                        "{}: {role} column {name:?} is not a column index below {width} (the file has no \
                         header, so columns are named by 0-based index)",
                        path.display()
                    ),
                },
            })
        };
        let label = match (&opts.label, with_label) {
            (_, false) => None,
            (Some(name), true) => Some(find(name, "label")?),
            (None, true) => Some(width - 1),
        };
        let features: Vec<usize> = match &opts.features {
            Some(fs) => fs
                .iter()
                .map(|f| find(f, "feature"))
                .collect::<Result<_>>()?,
            None => (0..width).filter(|&c| Some(c) != label).collect(),
        };
        if let Some(l) = label.filter(|l| features.contains(l)) {
            return Err(Error::InvalidArgument {
                op: "csv::open",
                reason: format!(
                    "{}: column {:?} is both the label and a feature; leave it out of `features`",
                    path.display(),
                    names[l]
                ),
            });
        }
        if features.is_empty() {
            return Err(Error::InvalidArgument {
                op: "csv::open",
                reason: format!(
                    "{}: no feature columns: the file's only column is the label {:?}",
                    path.display(),
                    label.map_or("", |l| names[l].as_str())
                ),
            });
        }
        let mut roles = vec![Role::Unused; width];
        for (slot, &c) in features.iter().enumerate() {
            roles[c] = Role::Feature(slot);
        }
        if let Some(l) = label {
            roles[l] = Role::Label;
        }
        Ok(Plan {
            roles,
            path,
            header: opts.header,
            regression: opts.regression,
            width,
            names,
            features,
            label,
            first_line: line_of(first),
        })
    }

    /// Read the file from the record after `first` (the header, or the first row, which is read here) on.
    fn read_rest<R: std::io::Read>(
        &self,
        reader: &mut csv::Reader<R>,
        first: &mut csv::ByteRecord,
    ) -> Result<Table> {
        let mut part = self.part();
        if !self.header {
            self.row(&mut part, first, line_of(first))?;
        }
        while next_record(self.path, reader, first, 1)? {
            self.row(&mut part, first, line_of(first))?;
        }
        self.finish(vec![part])
    }

    /// The rows of a chunk, its lines counted from 1: a record is a line (found by `memchr`), split at
    /// `delimiter` by hand, its cells converted as they are split (the csv crate's general state machine costs
    /// twice as much here). Empty lines are skipped, as the csv crate skips them. `None` when a quote turns up
    /// where it matters (a cell that is not a number, a label, a row of the wrong width): only the csv crate's
    /// reader handles quoted fields.
    fn unquoted(&self, chunk: &[u8], delimiter: u8) -> Result<Option<Part>> {
        let mut part = self.part();
        let nf = self.features.len();
        part.features.reserve(chunk.len() / 8);
        let quoted = |l: &[u8]| l.contains(&b'"');
        let unterminated = (chunk.last().is_some_and(|&b| b != b'\n')).then_some(chunk.len());
        let (mut start, mut line) = (0, 0);
        for end in memchr::memchr_iter(b'\n', chunk).chain(unterminated) {
            let raw = &chunk[start..end];
            let l = raw.strip_suffix(b"\r").unwrap_or(raw);
            (start, line) = (end + 1, line + 1);
            if l.is_empty() {
                continue;
            }
            let row = part.features.len();
            part.features.resize(row + nf, 0.0);
            let mut col = 0;
            for cell in l.split(|&b| b == delimiter) {
                match self.roles.get(col) {
                    Some(Role::Feature(slot)) => match parse_f32(cell) {
                        Some(v) => part.features[row + slot] = v,
                        None if quoted(cell) => return Ok(None),
                        None => return self.feature(col, cell, line).map(|_| None),
                    },
                    Some(Role::Label) if quoted(cell) => return Ok(None),
                    Some(Role::Label) => self.target(&mut part, col, cell, line)?,
                    Some(Role::Unused) => {}
                    None if quoted(l) => return Ok(None),
                    None => {
                        return Err(self.ragged(l.split(|&b| b == delimiter).count(), line));
                    }
                }
                col += 1;
            }
            if col != self.width {
                return if quoted(l) {
                    Ok(None)
                } else {
                    Err(self.ragged(col, line))
                };
            }
            part.rows += 1;
        }
        Ok(Some(part))
    }

    fn part(&self) -> Part {
        Part {
            features: Vec::new(),
            target: match self.label {
                None => Target::None,
                Some(_) if self.regression => Target::Values(Vec::new()),
                Some(l) => Target::Classes(LabelCells::new(l + 1)),
            },
            rows: 0,
        }
    }

    /// Read one row, on the file's `line`, into `part`.
    fn row(&self, part: &mut Part, rec: &csv::ByteRecord, line: usize) -> Result<()> {
        if rec.len() != self.width {
            return Err(self.ragged(rec.len(), line));
        }
        let row = part.features.len();
        part.features.resize(row + self.features.len(), 0.0);
        for (col, cell) in rec.iter().enumerate() {
            match self.roles[col] {
                Role::Feature(slot) => part.features[row + slot] = self.feature(col, cell, line)?,
                Role::Label => self.target(part, col, cell, line)?,
                Role::Unused => {}
            }
        }
        part.rows += 1;
        Ok(())
    }

    /// A row of `fields` fields where the header (or first row) has another number.
    fn ragged(&self, fields: usize, line: usize) -> Error {
        let width = self.width;
        Error::Csv {
            path: self.path.to_path_buf(),
            line,
            column: fields.min(width) + 1,
            reason: format!(
                "{fields} fields where the {} has {width}: every row needs {width} fields (check the delimiter and \
                 quoting of this row)",
                if self.header { "header" } else { "first row" }
            ),
        }
    }

    /// The feature cell of column `col`, as a number.
    fn feature(&self, col: usize, cell: &[u8], line: usize) -> Result<f32> {
        parse_f32(cell).ok_or_else(|| Error::Csv {
            path: self.path.to_path_buf(),
            line,
            column: col + 1,
            reason: format!(
                "feature {:?}: {:?} is not a number (fill or drop this cell, or leave the column out of `features`)",
                self.names[col],
                String::from_utf8_lossy(cell)
            ),
        })
    }

    /// The target cell of column `col`, into `part`.
    fn target(&self, part: &mut Part, col: usize, cell: &[u8], line: usize) -> Result<()> {
        let bad = |reason: String| Error::Csv {
            path: self.path.to_path_buf(),
            line,
            column: col + 1,
            reason,
        };
        match &mut part.target {
            Target::Values(v) => v.push(parse_f32(cell).ok_or_else(|| {
                bad(format!(
                    "regression target {:?}: {:?} is not a number (a regression needs a numeric target; for class \
                     labels leave `regression` off)",
                    self.names[col],
                    String::from_utf8_lossy(cell)
                ))
            })?),
            Target::Classes(cells) => {
                let cell = cell.trim_ascii();
                if cell.is_empty() {
                    return Err(bad(format!(
                        "label {:?} is empty (give every row a label)",
                        self.names[col]
                    )));
                }
                cells.push(cell, line);
            }
            Target::None => {}
        }
        Ok(())
    }

    /// The table of the parts, in file order.
    fn finish(&self, parts: Vec<Part>) -> Result<Table> {
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        if rows == 0 {
            return Err(Error::Csv {
                path: self.path.to_path_buf(),
                line: self.first_line + 1,
                column: 1,
                reason: "no rows after the header (expected one row per example)".into(),
            });
        }
        let mut features = Vec::with_capacity(rows * self.features.len());
        let mut target = self.part().target;
        for p in parts {
            features.extend_from_slice(&p.features);
            match (&mut target, p.target) {
                (Target::Values(all), Target::Values(v)) => all.extend_from_slice(&v),
                (Target::Classes(all), Target::Classes(c)) => all.append(c),
                _ => {}
            }
        }
        Ok(Table {
            columns: self
                .features
                .iter()
                .map(|&c| self.names[c].clone())
                .collect(),
            features,
            rows,
            target,
        })
    }
}

fn line_of(rec: &csv::ByteRecord) -> usize {
    rec.position().map_or(0, |p| p.line() as usize)
}

/// Parse a number cell (surrounding ASCII spaces ignored), correctly rounded to f32. A plain decimal of at most 7
/// significant digits and 10 after the point (what data files mostly hold) is one exact integer and one exact
/// power of ten, whose f32 quotient IEEE division rounds correctly (Clinger's fast path); anything else goes to
/// `fast-float2` (the Eisel-Lemire algorithm).
pub(crate) fn parse_f32(cell: &[u8]) -> Option<f32> {
    let s = cell.trim_ascii();
    short_decimal(s).or_else(|| fast_float2::parse(s).ok())
}

/// Clinger's fast path for f32: `[-+]digits[.digits]` of at most 7 significant digits (an integer below 2^24) and
/// at most 10 decimals.
fn short_decimal(s: &[u8]) -> Option<f32> {
    const POW10: [f32; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];
    let (neg, digits) = match s.first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 12 {
        return None;
    }
    // At most 12 bytes: the integer cannot overflow, and is checked once at the end.
    let (mut sig, mut point) = (0u64, None);
    for (i, &b) in digits.iter().enumerate() {
        let d = b.wrapping_sub(b'0');
        if d < 10 {
            sig = sig * 10 + u64::from(d);
        } else if b == b'.' && point.is_none() {
            point = Some(i);
        } else {
            return None;
        }
    }
    let decimals = point.map_or(0, |p| digits.len() - p - 1);
    if sig >= 1 << 24 || decimals >= POW10.len() || digits.len() == usize::from(point.is_some()) {
        return None;
    }
    let v = sig as f32 / POW10[decimals];
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn cells_parse_as_the_standard_library_rounds_them() {
        let mut rng = Rng::new(5);
        let n = 200_000;
        for k in 0..n {
            let s = if k % 4 == 3 {
                // the decimal nearest a point halfway between two f32 (the double-rounding trap)
                let x = f32::from_bits(rng.next_u32() & 0x7fff_ffff);
                if !x.is_finite() || x == f32::MAX {
                    continue;
                }
                let next = f32::from_bits(x.to_bits() + 1);
                format!("{:e}", (f64::from(x) + f64::from(next)) / 2.0)
            } else {
                let digits = 1 + rng.below(if k % 4 == 0 { 25 } else { 9 }) as usize;
                let mut s = String::new();
                if rng.below(2) == 0 {
                    s.push('-');
                }
                let dot = rng.below(digits as u64 + 1) as usize;
                for d in 0..digits {
                    if d == dot {
                        s.push('.');
                    }
                    s.push(char::from(b'0' + rng.below(10) as u8));
                }
                if k % 4 == 1 {
                    s.push_str(&format!("e{}", rng.below(61) as i64 - 30));
                }
                s
            };
            let want: f32 = s.parse().unwrap();
            assert_eq!(
                parse_f32(s.as_bytes()).map(f32::to_bits),
                Some(want.to_bits()),
                "{s}"
            );
        }
        assert_eq!(
            parse_f32(b"16777217"),
            Some(16_777_216.0),
            "exactly halfway: to even"
        );
        assert_eq!(parse_f32(b" 1e3 "), Some(1000.0));
        assert_eq!(
            parse_f32(b"-0.0").map(f32::to_bits),
            Some((-0.0f32).to_bits())
        );
        assert_eq!(
            parse_f32(b"0.000123456789012345678901"),
            Some(0.000_123_456_79)
        );
        assert!(parse_f32(b"inf").unwrap().is_infinite());
        assert!(parse_f32(b"1e400").unwrap().is_infinite());
        for bad in [
            &b""[..],
            b".",
            b"e5",
            b"1e",
            b"1.2.3",
            b"--1",
            b"1,5",
            b"0x10",
        ] {
            assert_eq!(parse_f32(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn grouped_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1200), "1,200");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }
}
