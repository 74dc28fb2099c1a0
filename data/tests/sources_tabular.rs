//! The file sources that are not images: CSV tables, NumPy arrays, labelled text, token corpora, and the synthetic
//! sources. Each reads files written here with a pattern a model could learn, and each bad input gives an error
//! that names the file and the line, column or record.

use std::io::Write;
use std::path::{Path, PathBuf};

use cohort_data::source::csv::{CsvSource, open as open_csv, read_csv};
use cohort_data::source::npy::{encode_npy as npy, open_npy, open_npz};
use cohort_data::source::synthetic::{
    SyntheticSource, SyntheticTokens, open as open_blobs, open_tokens,
};
use cohort_data::source::text::open as open_text;
use cohort_data::source::tokens::{Tokenizer, open as open_corpus};
use cohort_data::source::{Examples, Task};
use cohort_data::{Array, Error, Vocabulary};

fn write(dir: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

fn f32s(a: &Array) -> Vec<f32> {
    a.as_f32().expect("f32 features").to_vec()
}

fn class(a: &Array) -> i32 {
    assert_eq!(a.shape(), &[] as &[usize]);
    a.as_i32().expect("i32 class")[0]
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The error's message, asserting that it mentions every one of `parts`.
fn message(e: Error, parts: &[&str]) -> String {
    let m = e.to_string();
    for p in parts {
        assert!(m.contains(p), "{m:?} does not mention {p:?}");
    }
    m
}

// ---------------------------------------------------------------------------------------------------------- csv

/// Rows `a,b,species` where the species is `big` when `a + b > 10`, `small` when below 5, `mid` between.
fn species_csv(rows: usize) -> String {
    let mut s = String::from("a, b ,species\n");
    for i in 0..rows {
        let (a, b) = ((i % 7) as f32 * 1.5, (i % 5) as f32 + 0.25);
        let label = match a + b {
            v if v > 10.0 => "big",
            v if v < 5.0 => "small",
            _ => "mid",
        };
        s.push_str(&format!("{a},{b},{label}\n"));
    }
    s
}

#[test]
fn csv_named_classes_sorted_with_exact_features() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "train.csv", species_csv(35));
    let t = open_csv(&p, &CsvSource::default(), None).unwrap();
    assert_eq!(t.len(), 35);
    assert_eq!(t.shape(), &[2]);
    assert_eq!(t.columns(), strings(&["a", "b"]).as_slice());
    assert_eq!(
        t.task(),
        &Task::Classify {
            classes: strings(&["big", "mid", "small"])
        }
    );
    // row 6: a = 9, b = 1.25: a + b = 10.25 > 10, "big" (id 0)
    let (x, y) = t.example(6).unwrap();
    assert_eq!(f32s(&x), vec![9.0, 1.25]);
    assert_eq!(x.shape(), &[2]);
    assert_eq!(class(&y), 0);
    assert_eq!(class(&t.example(0).unwrap().1), 2, "0 + 0.25 is small");
    let labels = t.labels().unwrap();
    assert_eq!(labels.len(), 35);
    assert_eq!(labels[6], 0);
    assert!(t.example(35).is_err());
    assert!(
        t.describe().contains("35 rows, 2 features, 3 classes"),
        "{}",
        t.describe()
    );
}

#[test]
fn csv_integer_labels_sort_numerically_and_columns_can_be_chosen() {
    let dir = tempfile::tempdir().unwrap();
    // label first, then two features and an id column to leave out; labels 0..=11 out of order
    let mut s = String::from("digit,x,y,id\n");
    for i in 0..24 {
        let d = (i * 5) % 12;
        s.push_str(&format!(
            "{d},{},{},{}\n",
            d as f32 / 2.0,
            -(d as f32),
            1000 + i
        ));
    }
    let p = write(dir.path(), "digits.csv", s);
    let opts = CsvSource {
        label: Some("digit".into()),
        features: Some(strings(&["y", "x"])),
        ..CsvSource::default()
    };
    let t = open_csv(&p, &opts, None).unwrap();
    let want: Vec<String> = (0..12).map(|c| c.to_string()).collect();
    assert_eq!(t.task(), &Task::Classify { classes: want });
    for i in 0..24 {
        let (x, y) = t.example(i).unwrap();
        let d = (i * 5) % 12;
        assert_eq!(class(&y), d as i32, "\"{d}\" keeps id {d}");
        assert_eq!(
            f32s(&x),
            vec![-(d as f32), d as f32 / 2.0],
            "features in the asked order"
        );
    }
    assert_eq!(t.columns(), strings(&["y", "x"]).as_slice());
}

#[test]
fn csv_without_header_by_index_as_tsv() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "t.tsv", "1\t0.5\t\"2\"\n\n0\t-0.5\t3e2\r\n");
    let opts = CsvSource {
        label: Some("0".into()),
        header: false,
        delimiter: b'\t',
        ..CsvSource::default()
    };
    let t = open_csv(&p, &opts, None).unwrap();
    assert_eq!(t.len(), 2, "the blank line is skipped");
    assert_eq!(t.columns(), strings(&["c1", "c2"]).as_slice());
    assert_eq!(f32s(&t.example(0).unwrap().0), vec![0.5, 2.0]);
    assert_eq!(f32s(&t.example(1).unwrap().0), vec![-0.5, 300.0]);
    assert_eq!(t.labels().unwrap(), &[1, 0]);
}

#[test]
fn csv_regression_targets() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = String::from("x1,x2,y\n");
    for i in 0..10 {
        let (a, b) = (i as f32, (i * i) as f32 / 4.0);
        s.push_str(&format!("{a},{b},{}\n", 2.0 * a - b + 0.5));
    }
    let p = write(dir.path(), "reg.csv", s);
    let opts = CsvSource {
        regression: true,
        ..CsvSource::default()
    };
    let t = open_csv(&p, &opts, None).unwrap();
    assert_eq!(t.task(), &Task::Regress { width: 1 });
    assert!(t.labels().is_none());
    let (x, y) = t.example(3).unwrap();
    assert_eq!(f32s(&x), vec![3.0, 2.25]);
    assert_eq!(y.shape(), &[1]);
    assert_eq!(f32s(&y), vec![4.25]);
}

#[test]
fn csv_test_file_takes_the_training_classes() {
    let dir = tempfile::tempdir().unwrap();
    let train = open_csv(
        &write(dir.path(), "train.csv", species_csv(35)),
        &CsvSource::default(),
        None,
    )
    .unwrap();
    let Task::Classify { classes } = train.task().clone() else {
        panic!("classes")
    };
    // a test file holding only two of the classes keeps the training ids
    let test = open_csv(
        &write(dir.path(), "test.csv", "a,b,species\n1,1,small\n9,9,big\n"),
        &CsvSource::default(),
        Some(&classes),
    )
    .unwrap();
    assert_eq!(test.labels().unwrap(), &[2, 0]);
    assert_eq!(test.task(), train.task());
    let bad = write(dir.path(), "bad.csv", "a,b,species\n1,1,small\n2,2,huge\n");
    let e = open_csv(&bad, &CsvSource::default(), Some(&classes)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Csv {
                line: 3,
                column: 3,
                ..
            }
        ),
        "{e:?}"
    );
    message(
        e,
        &[
            "bad.csv",
            "line 3",
            "\"huge\"",
            "\"big\", \"mid\", \"small\"",
        ],
    );
}

#[test]
fn csv_errors_name_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let d = CsvSource::default();
    let open = |name: &str, text: &str, opts: &CsvSource| {
        open_csv(&write(dir.path(), name, text), opts, None).unwrap_err()
    };
    // a ragged row
    let e = open("ragged.csv", "a,b,c\n1,2,0\n1,2\n", &d);
    message(
        e,
        &["ragged.csv", "line 3", "2 fields where the header has 3"],
    );
    // a quoted cell spanning two lines: the bad cell after it is still on the right line
    let e = open("cell.csv", "a,b,label\n1,\"2\n\",0\n4,five,1\n", &d);
    assert!(
        matches!(
            e,
            Error::Csv {
                line: 4,
                column: 2,
                ..
            }
        ),
        "{e:?}"
    );
    message(
        e,
        &["cell.csv", "line 4, column 2", "feature \"b\"", "\"five\""],
    );
    // an empty feature cell
    let e = open("empty_cell.csv", "a,b,label\n1,,0\n", &d);
    message(
        e,
        &["empty_cell.csv", "line 2, column 2", "\"\" is not a number"],
    );
    // unknown label and feature columns list the header
    let opts = CsvSource {
        label: Some("kind".into()),
        ..d.clone()
    };
    let e = open("names.csv", "a,b,label\n1,2,0\n", &opts);
    message(
        e,
        &[
            "names.csv",
            "no label column named \"kind\"",
            "[\"a\", \"b\", \"label\"]",
        ],
    );
    let opts = CsvSource {
        features: Some(strings(&["a", "z"])),
        ..d.clone()
    };
    let e = open("names2.csv", "a,b,label\n1,2,0\n", &opts);
    message(
        e,
        &[
            "names2.csv",
            "no feature column named \"z\"",
            "[\"a\", \"b\", \"label\"]",
        ],
    );
    let opts = CsvSource {
        label: Some("7".into()),
        header: false,
        ..d.clone()
    };
    let e = open("index.csv", "1,2,0\n", &opts);
    message(e, &["index.csv", "label column \"7\"", "below 3"]);
    // empty files
    let e = open("empty.csv", "", &d);
    message(e, &["empty.csv", "line 1", "the file is empty"]);
    let e = open("header_only.csv", "a,b,label\n", &d);
    message(
        e,
        &["header_only.csv", "line 2", "no rows after the header"],
    );
    // a regression target that is not a number
    let opts = CsvSource {
        regression: true,
        ..d.clone()
    };
    let e = open("target.csv", "a,y\n1,2.5\n2,n/a\n", &opts);
    assert!(
        matches!(
            e,
            Error::Csv {
                line: 3,
                column: 2,
                ..
            }
        ),
        "{e:?}"
    );
    message(e, &["target.csv", "regression target \"y\"", "\"n/a\""]);
    // a missing file
    let e = open_csv(&dir.path().join("missing.csv"), &d, None).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    message(e, &["missing.csv"]);
}

/// A file large enough to be parsed in parallel chunks: row `i` is `i, i / 8, -i % 3, class`.
fn large_csv(rows: usize, quoted: bool) -> String {
    let mut s = String::from("id,eighth,mod,class\n");
    for i in 0..rows {
        let class = if quoted {
            format!("\"c{}\"", i % 3)
        } else {
            format!("c{}", i % 3)
        };
        s.push_str(&format!(
            "{i},{},{},{class}\n",
            i as f32 / 8.0,
            -((i % 3) as f32)
        ));
    }
    s
}

#[test]
fn csv_large_files_read_the_same_in_parallel_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 250_000; // about 6 MB: past the size from which chunks are parsed in parallel
    for quoted in [false, true] {
        let text = large_csv(rows, quoted);
        assert!(text.len() > 5 << 20);
        let p = write(dir.path(), "large.csv", &text);
        let t = open_csv(&p, &CsvSource::default(), None).unwrap();
        assert_eq!(t.len(), rows);
        assert_eq!(
            t.task(),
            &Task::Classify {
                classes: strings(&["c0", "c1", "c2"])
            }
        );
        let f = t.features();
        for i in (0..rows).step_by(997).chain([rows - 1]) {
            assert_eq!(
                f[i * 3..i * 3 + 3],
                [i as f32, i as f32 / 8.0, -((i % 3) as f32)],
                "row {i}"
            );
            assert_eq!(t.labels().unwrap()[i], (i % 3) as i32);
        }
        // a bad cell deep in the file is reported on its own line
        let bad = text.replacen("200000,25000,", "200000,x,", 1);
        let e = open_csv(
            &write(dir.path(), "large_bad.csv", bad),
            &CsvSource::default(),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Csv {
                    line: 200_002,
                    column: 2,
                    ..
                }
            ),
            "{e:?}"
        );
        message(e, &["large_bad.csv", "line 200002, column 2", "\"x\""]);
    }
}

#[test]
fn read_csv_reads_a_numeric_table() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "n.csv", "p;q\n1;2\n3;4.5\n");
    let t = read_csv(&p, true, b';').unwrap();
    assert_eq!(t.columns, strings(&["p", "q"]));
    assert_eq!(t.values.shape(), &[2, 2]);
    assert_eq!(t.values.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.5]);
    let e = read_csv(write(dir.path(), "m.csv", "1;2\n3;x\n"), false, b';').unwrap_err();
    message(e, &["m.csv", "line 2, column 2"]);
}

// ---------------------------------------------------------------------------------------------------------- npy

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le_i64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn npy_features_of_any_shape_with_class_labels() {
    let dir = tempfile::tempdir().unwrap();
    // 6 examples of [2, 3]: example i is all i, its label i % 3
    let xs: Vec<f32> = (0..36)
        .map(|k| (k / 6) as f32 + (k % 6) as f32 / 8.0)
        .collect();
    let x = write(
        dir.path(),
        "x.npy",
        npy("<f4", &[6, 2, 3], false, &le_f32(&xs)),
    );
    let y = write(
        dir.path(),
        "y.npy",
        npy("<i8", &[6], false, &le_i64(&[0, 1, 2, 0, 1, 2])),
    );
    let a = open_npy(&x, &y, false).unwrap();
    assert_eq!(a.len(), 6);
    assert_eq!(a.shape(), &[2, 3]);
    assert_eq!(
        a.task(),
        &Task::Classify {
            classes: strings(&["0", "1", "2"])
        }
    );
    assert_eq!(a.labels().unwrap(), &[0, 1, 2, 0, 1, 2]);
    let (f, l) = a.example(4).unwrap();
    assert_eq!(f.shape(), &[2, 3]);
    assert_eq!(f32s(&f), xs[24..30].to_vec());
    assert_eq!(class(&l), 1);
    assert!(a.example(6).is_err());
    assert!(
        a.describe().contains("6 examples of [2, 3] f32"),
        "{}",
        a.describe()
    );
}

#[test]
fn npy_every_dtype_becomes_f32() {
    let dir = tempfile::tempdir().unwrap();
    let y = write(dir.path(), "y.npy", npy("|u1", &[2], false, &[0, 1]));
    let vals = [0.0f32, 1.0, 2.0, 3.0];
    let cases: Vec<(&str, Vec<u8>, Vec<f32>)> = vec![
        ("<f4", le_f32(&vals), vals.to_vec()),
        (
            "<f8",
            vals.iter()
                .flat_map(|&v| f64::from(v).to_le_bytes())
                .collect(),
            vals.to_vec(),
        ),
        (
            ">f8",
            vals.iter()
                .flat_map(|&v| f64::from(v).to_be_bytes())
                .collect(),
            vals.to_vec(),
        ),
        // f16: 0, 1, 2, -0.5
        (
            "<f2",
            vec![0x00, 0x00, 0x00, 0x3c, 0x00, 0x40, 0x00, 0xb8],
            vec![0.0, 1.0, 2.0, -0.5],
        ),
        ("|u1", vec![0, 1, 2, 255], vec![0.0, 1.0, 2.0, 255.0]),
        ("|i1", vec![0, 1, 2, 0xff], vec![0.0, 1.0, 2.0, -1.0]),
        (
            "<u2",
            [0u16, 1, 2, 65535]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, 65535.0],
        ),
        (
            "<i2",
            [0i16, 1, 2, -300]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, -300.0],
        ),
        (
            "<i4",
            [0i32, 1, 2, -7]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, -7.0],
        ),
        (
            ">i4",
            [0i32, 1, 2, -7]
                .iter()
                .flat_map(|v| v.to_be_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, -7.0],
        ),
        (
            "<u4",
            [0u32, 1, 2, 70000]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, 70000.0],
        ),
        ("<i8", le_i64(&[0, 1, 2, -9]), vec![0.0, 1.0, 2.0, -9.0]),
        (
            "<u8",
            [0u64, 1, 2, 1 << 40]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            vec![0.0, 1.0, 2.0, (1u64 << 40) as f32],
        ),
        ("|b1", vec![0, 1, 1, 0], vec![0.0, 1.0, 1.0, 0.0]),
    ];
    for (descr, data, want) in cases {
        let x = write(dir.path(), "x.npy", npy(descr, &[2, 2], false, &data));
        let a = open_npy(&x, &y, false).unwrap_or_else(|e| panic!("{descr}: {e}"));
        let got: Vec<f32> = (0..2)
            .flat_map(|i| f32s(&a.example(i).unwrap().0))
            .collect();
        assert_eq!(got, want, "{descr}");
    }
}

#[test]
fn npy_float_targets_are_a_regression() {
    let dir = tempfile::tempdir().unwrap();
    let x = write(
        dir.path(),
        "x.npy",
        npy("<f4", &[3, 1], false, &le_f32(&[1.0, 2.0, 3.0])),
    );
    // y = (2x, -x)
    let y = write(
        dir.path(),
        "y.npy",
        npy(
            "<f4",
            &[3, 2],
            false,
            &le_f32(&[2.0, -1.0, 4.0, -2.0, 6.0, -3.0]),
        ),
    );
    let a = open_npy(&x, &y, false).unwrap();
    assert_eq!(a.task(), &Task::Regress { width: 2 });
    assert!(a.labels().is_none());
    let (_, t) = a.example(1).unwrap();
    assert_eq!(t.shape(), &[2]);
    assert_eq!(f32s(&t), vec![4.0, -2.0]);
    // integer targets as a regression when asked
    let yi = write(
        dir.path(),
        "yi.npy",
        npy("<i8", &[3], false, &le_i64(&[10, 20, 30])),
    );
    let a = open_npy(&x, &yi, true).unwrap();
    assert_eq!(a.task(), &Task::Regress { width: 1 });
    assert_eq!(f32s(&a.example(2).unwrap().1), vec![30.0]);
}

fn npz(dir: &Path, name: &str, members: &[(&str, Vec<u8>)]) -> PathBuf {
    let p = dir.join(name);
    let mut zip = npyz::zip::ZipWriter::new(std::fs::File::create(&p).unwrap());
    let opts = npyz::zip::write::FileOptions::default()
        .compression_method(npyz::zip::CompressionMethod::Deflated);
    for (k, bytes) in members {
        zip.start_file(format!("{k}.npy"), opts).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
    p
}

#[test]
fn npz_members_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let xs: Vec<f32> = (0..8).map(|v| v as f32 * 0.5).collect();
    let p = npz(
        dir.path(),
        "d.npz",
        &[
            ("features", npy("<f4", &[4, 2], false, &le_f32(&xs))),
            ("labels", npy("<i8", &[4], false, &le_i64(&[1, 0, 1, 3]))),
        ],
    );
    let a = open_npz(&p, "features", "labels", false).unwrap();
    assert_eq!(a.len(), 4);
    assert_eq!(a.shape(), &[2]);
    assert_eq!(
        a.task(),
        &Task::Classify {
            classes: strings(&["0", "1", "2", "3"])
        }
    );
    assert_eq!(f32s(&a.example(3).unwrap().0), vec![3.0, 3.5]);
    assert_eq!(class(&a.example(3).unwrap().1), 3);
    let e = open_npz(&p, "x", "labels", false).unwrap_err();
    message(
        e,
        &[
            "d.npz",
            "array \"x\"",
            "no such array",
            "\"features\"",
            "\"labels\"",
        ],
    );
    let e = open_npz(&write(dir.path(), "z.npz", "not a zip"), "x", "y", false).unwrap_err();
    message(e, &["z.npz", "not an .npz archive"]);
}

#[test]
fn npy_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let y = write(
        dir.path(),
        "y.npy",
        npy("<i8", &[2], false, &le_i64(&[0, 1])),
    );
    let x = |name: &str, bytes: Vec<u8>| write(dir.path(), name, bytes);
    // unsupported dtype
    let e = open_npy(&x("c.npy", npy("<c8", &[2, 1], false, &[0; 16])), &y, false).unwrap_err();
    message(
        e,
        &["c.npy", "dtype <c8 is not supported", "f32, f64, f16, u8"],
    );
    // lengths differ
    let e = open_npy(
        &x("three.npy", npy("<f4", &[3], false, &[0; 12])),
        &y,
        false,
    )
    .unwrap_err();
    message(e, &["three.npy holds 3 examples", "y.npy holds 2 targets"]);
    // truncated
    let e = open_npy(
        &x("short.npy", npy("<f4", &[2, 4], false, &[0; 20])),
        &y,
        false,
    )
    .unwrap_err();
    message(
        e,
        &["short.npy", "truncated", "[2, 4]", "32 bytes", "20 bytes"],
    );
    // not npy
    let e = open_npy(&x("text.npy", b"1,2,3\n".to_vec()), &y, false).unwrap_err();
    message(e, &["text.npy", "not a .npy file"]);
    // Fortran order
    let e = open_npy(&x("f.npy", npy("<f4", &[2, 3], true, &[0; 24])), &y, false).unwrap_err();
    message(e, &["f.npy", "Fortran order", "ascontiguousarray"]);
    // negative label
    let neg = write(
        dir.path(),
        "neg.npy",
        npy("<i8", &[2], false, &le_i64(&[0, -1])),
    );
    let e = open_npy(&x("ok.npy", npy("<f4", &[2], false, &[0; 8])), &neg, false).unwrap_err();
    message(e, &["neg.npy", "label -1 at index 1 is negative"]);
    // missing file
    let e = open_npy(&dir.path().join("none.npy"), &y, false).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
}

// ---------------------------------------------------------------------------------------------------------- text

#[test]
fn text_lines_with_a_vocabulary_become_padded_ids() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "mail.tsv",
        "spam\tBuy cheap pills now\nham\thello friend\n\nspam\tcheap cheap pills\nham\tHello again, friend!\n",
    );
    let t = open_text(&p, None).unwrap();
    assert_eq!(t.len(), 4);
    assert_eq!(
        t.task(),
        &Task::Classify {
            classes: strings(&["ham", "spam"])
        }
    );
    assert_eq!(t.labels().unwrap(), &[1, 0, 1, 0]);
    assert_eq!(t.texts()[1], "hello friend");
    let e = t.example(0).unwrap_err();
    message(e, &["mail.tsv", "no vocabulary"]);
    // the vocabulary of the first three lines only (a training split)
    let vocab = Vocabulary::build(t.texts()[..3].iter().map(String::as_str), 1, 100);
    let cheap = vocab.id("cheap");
    assert_eq!(cheap, 2, "the most frequent token");
    let t = t.with_vocabulary(vocab.clone(), 4);
    assert_eq!(t.shape(), &[4]);
    assert_eq!(t.vocabulary(), Some(&vocab));
    let (x, y) = t.example(2).unwrap();
    let ids = |w: &str| vocab.id(w) as f32;
    assert_eq!(
        f32s(&x),
        vec![ids("cheap"), ids("cheap"), ids("pills"), 0.0]
    );
    assert_eq!(class(&y), 1);
    // cut to 4; "again" is not in the training vocabulary
    let (x, _) = t.example(3).unwrap();
    assert_eq!(
        f32s(&x),
        vec![ids("hello"), Vocabulary::UNK as f32, ids("friend"), 0.0]
    );
    let (x, _) = t.example(0).unwrap();
    assert_eq!(
        f32s(&x),
        vec![ids("buy"), ids("cheap"), ids("pills"), ids("now")]
    );
}

#[test]
fn text_bundled_langid_keeps_integer_label_ids() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("langid");
    let train = open_text(&dir.join("train.tsv"), None).unwrap();
    assert_eq!(train.len(), 2500);
    assert_eq!(
        train.task(),
        &Task::Classify {
            classes: strings(&["0", "1", "2", "3", "4"])
        }
    );
    let content = std::fs::read_to_string(dir.join("train.tsv")).unwrap();
    let first: Vec<i32> = content.lines().map(|l| l[..1].parse().unwrap()).collect();
    assert_eq!(train.labels().unwrap(), first.as_slice());
    let Task::Classify { classes } = train.task() else {
        unreachable!()
    };
    let test = open_text(&dir.join("test.tsv"), Some(classes)).unwrap();
    assert_eq!(test.len(), 750);
}

#[test]
fn text_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_text(
        &write(dir.path(), "t.tsv", "a\tfine\n\nno tab here\n"),
        None,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Csv { line: 3, .. }), "{e:?}");
    message(e, &["t.tsv", "line 3", "no tab", "label<TAB>text"]);
    let e = open_text(&write(dir.path(), "e.tsv", "\tno label\n"), None).unwrap_err();
    message(e, &["e.tsv", "line 1", "empty label"]);
    let known = strings(&["a", "b"]);
    let e = open_text(
        &write(dir.path(), "u.tsv", "a\tx\nb\ty\nc\tz\n"),
        Some(&known),
    )
    .unwrap_err();
    message(e, &["u.tsv", "line 3", "label \"c\"", "[\"a\", \"b\"]"]);
}

// ---------------------------------------------------------------------------------------------------------- tokens

#[test]
fn token_windows_of_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "c.txt", "abcdabcdabcd!");
    let w = open_corpus(&p, Tokenizer::Bytes, 4, None, 1, 100).unwrap();
    assert_eq!(w.task(), &Task::NextToken { vocab: 256 });
    assert!(w.vocabulary().is_none());
    assert_eq!(
        w.len(),
        3,
        "13 tokens: 3 windows of 4 and their next tokens"
    );
    assert_eq!(w.shape(), &[4]);
    let (x, y) = w.example(2).unwrap();
    assert_eq!(f32s(&x), vec![97.0, 98.0, 99.0, 100.0]);
    assert_eq!(y.as_i32().unwrap(), &[98, 99, 100, 33]);
    assert_eq!(y.shape(), &[4]);
    let (x, y) = w.example(0).unwrap();
    assert_eq!(f32s(&x)[1..], [98.0, 99.0, 100.0]);
    assert_eq!(y.as_i32().unwrap()[..3], [98, 99, 100]);
    assert!(w.example(3).is_err());
}

#[test]
fn token_windows_of_chars_and_words_share_a_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let train = write(dir.path(), "train.txt", "aab aab aab é");
    let w = open_corpus(&train, Tokenizer::Chars, 3, None, 1, 10_000).unwrap();
    let vocab = w.vocabulary().unwrap().clone();
    // counts: a 6, ' ' 3, b 3, é 1: ids by decreasing count, ties in order
    assert_eq!(vocab.len(), 6);
    assert_eq!(vocab.id("a"), 2);
    assert_eq!(vocab.id(" "), 3);
    assert_eq!(vocab.id("b"), 4);
    assert_eq!(vocab.id("é"), 5);
    assert_eq!(w.task(), &Task::NextToken { vocab: 6 });
    assert_eq!(w.len(), 4, "13 chars: (13 - 1) / 3 windows");
    let (x, y) = w.example(0).unwrap();
    assert_eq!(f32s(&x), vec![2.0, 2.0, 4.0]);
    assert_eq!(y.as_i32().unwrap(), &[2, 4, 3]);
    assert_eq!(w.example(3).unwrap().1.as_i32().unwrap(), &[4, 3, 5]);
    // a validation corpus under the training vocabulary: unseen chars are unknown
    let val = write(dir.path(), "val.txt", "abzab");
    let v = open_corpus(&val, Tokenizer::Chars, 3, Some(vocab.clone()), 1, 10_000).unwrap();
    assert_eq!(v.ids(), vec![2, 4, 1, 2, 4]);
    assert_eq!(v.vocabulary(), Some(&vocab));
    // words
    let p = write(dir.path(), "w.txt", "The cat sat. The cat ran! the end");
    let w = open_corpus(&p, Tokenizer::Words, 2, None, 2, 100).unwrap();
    let v = w.vocabulary().unwrap();
    assert_eq!(v.len(), 4, "pad, unk, the, cat: the others are seen once");
    assert_eq!(w.ids(), vec![2, 3, 1, 2, 3, 1, 2, 1]);
    assert_eq!(w.len(), 3);
}

#[test]
fn token_errors_name_file_count_and_window() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "short.txt", "hello");
    let e = open_corpus(&p, Tokenizer::Bytes, 5, None, 1, 100).unwrap_err();
    message(e, &["short.txt", "5 tokens", "window of 5", "6 tokens"]);
    let e = open_corpus(&p, Tokenizer::Words, 1, None, 1, 100).unwrap_err();
    message(e, &["short.txt", "1 tokens (words)"]);
    let bad = write(dir.path(), "latin1.txt", b"ok\nok \xe9t\xe9\n");
    let e = open_corpus(&bad, Tokenizer::Chars, 2, None, 1, 100).unwrap_err();
    message(e, &["latin1.txt", "not UTF-8 at byte 6 (line 2)"]);
    assert!(open_corpus(&bad, Tokenizer::Bytes, 2, None, 1, 100).is_ok());
    let e = open_corpus(&p, Tokenizer::Bytes, 0, None, 1, 100).unwrap_err();
    message(e, &["short.txt", "window of 0"]);
}

// ---------------------------------------------------------------------------------------------------------- synthetic

#[test]
fn synthetic_blobs_are_seeded_shaped_and_learnable() {
    let opts = SyntheticSource {
        examples: 400,
        classes: 4,
        shape: vec![2, 4],
        seed: 3,
    };
    let s = open_blobs(&opts).unwrap();
    assert_eq!(s.len(), 400);
    assert_eq!(s.shape(), &[2, 4]);
    assert_eq!(
        s.task(),
        &Task::Classify {
            classes: strings(&["0", "1", "2", "3"])
        }
    );
    assert_eq!(s.labels().unwrap()[..5], [0, 1, 2, 3, 0]);
    let (x, y) = s.example(7).unwrap();
    assert_eq!(x.shape(), &[2, 4]);
    assert_eq!(class(&y), 3);
    assert_eq!(
        open_blobs(&opts).unwrap().example(7).unwrap().0,
        x,
        "the same seed, the same data"
    );
    let other = open_blobs(&SyntheticSource {
        seed: 4,
        ..opts.clone()
    })
    .unwrap();
    assert_ne!(other.example(7).unwrap().0, x);
    // nearest centroid of the first half classifies the second
    let rows: Vec<(Vec<f32>, i32)> = (0..400)
        .map(|i| {
            let (x, y) = s.example(i).unwrap();
            (f32s(&x), class(&y))
        })
        .collect();
    let mut centroids = vec![vec![0.0f32; 8]; 4];
    for (x, c) in &rows[..200] {
        for (m, v) in centroids[*c as usize].iter_mut().zip(x) {
            *m += v / 50.0;
        }
    }
    let right = rows[200..]
        .iter()
        .filter(|(x, c)| {
            let d = |m: &Vec<f32>| m.iter().zip(x).map(|(a, b)| (a - b).powi(2)).sum::<f32>();
            (0..4).min_by(|&a, &b| d(&centroids[a]).total_cmp(&d(&centroids[b])))
                == Some(*c as usize)
        })
        .count();
    assert!(right > 180, "nearest centroid gets {right} of 200");
    assert!(open_blobs(&SyntheticSource { classes: 0, ..opts }).is_err());
}

#[test]
fn synthetic_token_classes_are_learnable_from_a_bag_of_tokens() {
    let opts = SyntheticTokens {
        examples: 400,
        len: 16,
        vocab: 50,
        classes: 5,
        seed: 9,
        next_token: false,
    };
    let s = open_tokens(&opts).unwrap();
    assert_eq!(s.shape(), &[16]);
    assert_eq!(s.task().outputs(), 5);
    let rows: Vec<(Vec<usize>, usize)> = (0..400)
        .map(|i| {
            let (x, y) = s.example(i).unwrap();
            let ids: Vec<usize> = f32s(&x).iter().map(|&v| v as usize).collect();
            assert!(ids.iter().all(|&t| t < 50));
            (ids, class(&y) as usize)
        })
        .collect();
    assert_eq!(
        s.example(5).unwrap(),
        open_tokens(&opts).unwrap().example(5).unwrap()
    );
    // per-class token counts from the first half; the second half by the highest total count
    let mut counts = vec![vec![1.0f64; 50]; 5];
    for (ids, c) in &rows[..200] {
        for &t in ids {
            counts[*c][t] += 1.0;
        }
    }
    let right = rows[200..]
        .iter()
        .filter(|(ids, c)| {
            let score = |k: usize| {
                let total: f64 = counts[k].iter().sum();
                ids.iter()
                    .map(|&t| (counts[k][t] / total).ln())
                    .sum::<f64>()
            };
            (0..5).max_by(|&a, &b| score(a).total_cmp(&score(b))) == Some(*c)
        })
        .count();
    assert!(right > 180, "naive Bayes gets {right} of 200");
}

#[test]
fn synthetic_next_tokens_follow_a_predictable_chain() {
    let opts = SyntheticTokens {
        examples: 200,
        len: 20,
        vocab: 30,
        classes: 0,
        seed: 2,
        next_token: true,
    };
    let s = open_tokens(&opts).unwrap();
    assert_eq!(s.task(), &Task::NextToken { vocab: 30 });
    assert!(s.labels().is_none());
    let mut bigram = vec![vec![0u32; 30]; 30];
    let mut pairs = Vec::new();
    for i in 0..200 {
        let (x, y) = s.example(i).unwrap();
        let x: Vec<usize> = f32s(&x).iter().map(|&v| v as usize).collect();
        let y: Vec<usize> = y.as_i32().unwrap().iter().map(|&v| v as usize).collect();
        assert_eq!(x[1..], y[..19], "y is x shifted by one");
        assert!(y.iter().all(|&t| t < 30));
        for (&a, &b) in x.iter().zip(&y) {
            if i < 100 {
                bigram[a][b] += 1;
            } else {
                pairs.push((a, b));
            }
        }
    }
    let right = pairs
        .iter()
        .filter(|(a, b)| (0..30).max_by_key(|&n| bigram[*a][n]) == Some(*b))
        .count();
    let rate = right as f64 / pairs.len() as f64;
    assert!(
        rate > 0.5,
        "the most frequent successor is right {rate} of the time (chance 1/30)"
    );
}
