//! Numeric CSV files: every field a number, an optional header line, one column optionally taken as the label.

use std::path::{Path, PathBuf};

use crate::array::Array;
use crate::error::{Error, Result};

/// How to read a CSV file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvOptions {
    /// The first line names the columns.
    pub has_header: bool,
    /// The field separator (`,`; `\t` for TSV).
    pub delimiter: char,
    /// A column to split off as the integer label (0-based), e.g. the class of each row.
    pub label_column: Option<usize>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            has_header: true,
            delimiter: ',',
            label_column: None,
        }
    }
}

/// A numeric table read from CSV.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvTable {
    /// Names of the feature columns (from the header, or `c0`, `c1`, ...).
    pub columns: Vec<String>,
    /// Features, `f32`, shape `[rows, columns]`.
    pub features: Array,
    /// Labels from the label column, `i32`, shape `[rows]`, when one was asked for.
    pub labels: Option<Array>,
}

impl CsvTable {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.features.shape()[0]
    }
}

/// Read a numeric CSV file. Empty lines are skipped; surrounding spaces and double quotes around a field are
/// ignored.
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::Csv`] naming the line and column of a field that is not a
/// number, a row with another number of fields than the first, or a label that is not an integer.
pub fn read_csv(path: impl AsRef<Path>, options: &CsvOptions) -> Result<CsvTable> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_csv(&text, path, options)
}

/// Parse CSV text (`path` names it in errors).
///
/// # Errors
/// As [`read_csv`].
pub fn parse_csv(text: &str, path: &Path, options: &CsvOptions) -> Result<CsvTable> {
    let err = |line: usize, column: usize, reason: String| Error::Csv {
        path: PathBuf::from(path),
        line,
        column,
        reason,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty());
    let clean = |f: &str| f.trim().trim_matches('"').trim().to_string();
    let mut header: Option<Vec<String>> = None;
    if options.has_header {
        if let Some((_, l)) = lines.next() {
            header = Some(l.split(options.delimiter).map(clean).collect());
        }
    }
    let mut width: Option<usize> = header.as_ref().map(Vec::len);
    let mut features: Vec<f32> = Vec::new();
    let mut labels: Vec<i32> = Vec::new();
    let mut rows = 0usize;
    for (line, l) in lines {
        let fields: Vec<&str> = l.split(options.delimiter).collect();
        match width {
            Some(w) if w != fields.len() => {
                return Err(err(
                    line,
                    fields.len().min(w) + 1,
                    format!("{} fields where the first row has {w}", fields.len()),
                ));
            }
            _ => width = Some(fields.len()),
        }
        for (c, f) in fields.iter().enumerate() {
            let f = clean(f);
            if Some(c) == options.label_column {
                let v: i32 = f
                    .parse()
                    .map_err(|_| err(line, c + 1, format!("label {f:?} is not an integer")))?;
                labels.push(v);
            } else {
                let v: f32 = f
                    .parse()
                    .map_err(|_| err(line, c + 1, format!("{f:?} is not a number")))?;
                features.push(v);
            }
        }
        rows += 1;
    }
    let width = width.unwrap_or(0);
    if let Some(lc) = options.label_column {
        if lc >= width && rows > 0 {
            return Err(err(
                1,
                lc + 1,
                format!("no label column {lc}: rows have {width} fields"),
            ));
        }
    }
    let feature_cols = width - usize::from(options.label_column.is_some_and(|lc| lc < width));
    let names: Vec<String> = match header {
        Some(h) => h
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != options.label_column)
            .map(|(_, n)| n)
            .collect(),
        None => (0..width)
            .filter(|i| Some(*i) != options.label_column)
            .map(|i| format!("c{i}"))
            .collect(),
    };
    Ok(CsvTable {
        columns: names,
        features: Array::from_f32(features, &[rows, feature_cols])?,
        labels: match options.label_column {
            Some(_) => Some(Array::from_i32(labels, &[rows])?),
            None => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_header_features_and_labels() {
        let t = parse_csv(
            "a,b,label\n1,2.5,0\n\n-3,4e1,1\r\n",
            Path::new("t.csv"),
            &CsvOptions {
                label_column: Some(2),
                ..CsvOptions::default()
            },
        )
        .unwrap();
        assert_eq!(t.columns, vec!["a", "b"]);
        assert_eq!(t.rows(), 2);
        assert_eq!(t.features.as_f32().unwrap(), &[1.0, 2.5, -3.0, 40.0]);
        assert_eq!(t.labels.unwrap().as_i32().unwrap(), &[0, 1]);
    }

    #[test]
    fn errors_name_line_and_column() {
        let o = CsvOptions {
            has_header: false,
            ..CsvOptions::default()
        };
        match parse_csv("1,2\n3,x\n", Path::new("f.csv"), &o) {
            Err(Error::Csv {
                line: 2, column: 2, ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let e = parse_csv("1,2\n3\n", Path::new("f.csv"), &o).unwrap_err();
        assert!(e.to_string().contains("f.csv: line 2"), "{e}");
        let lo = CsvOptions {
            has_header: false,
            label_column: Some(0),
            ..CsvOptions::default()
        };
        assert!(parse_csv("1.5,2\n", Path::new("f.csv"), &lo).is_err());
        assert!(read_csv("/missing.csv", &o).is_err());
    }

    #[test]
    fn tsv_without_header() {
        let o = CsvOptions {
            has_header: false,
            delimiter: '\t',
            label_column: None,
        };
        let t = parse_csv("1\t2\n3\t4\n", Path::new("f.tsv"), &o).unwrap();
        assert_eq!(t.features.shape(), &[2, 2]);
        assert_eq!(t.columns, vec!["c0", "c1"]);
    }
}
