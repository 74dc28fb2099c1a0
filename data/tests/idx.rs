//! Corrupt and truncated copies of the bundled MNIST files: every one is an error naming the file and a byte offset,
//! never a panic; the intact files read.

use std::path::PathBuf;

use cohort_data::{Error, Mnist, Split, bundled_mnist_dir, read_idx};

fn bundled(name: &str) -> Vec<u8> {
    std::fs::read(bundled_mnist_dir().join(name)).expect("bundled MNIST file")
}

fn decompress(gz: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn intact_files_read_gz_and_raw() {
    let dir = tempfile::tempdir().unwrap();
    let raw = decompress(&bundled("t10k-labels-idx1-ubyte.gz"));
    let p = write(&dir, "t10k-labels-idx1-ubyte", &raw);
    let a = read_idx(&p).unwrap();
    let b = read_idx(bundled_mnist_dir().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.dims, vec![2000]);
    // a directory with raw (not gzipped) files loads the same
    let imgs = decompress(&bundled("t10k-images-idx3-ubyte.gz"));
    write(&dir, "t10k-images-idx3-ubyte", &imgs);
    let m = Mnist::load(dir.path(), Split::Test).unwrap();
    assert_eq!(m, Mnist::load(bundled_mnist_dir(), Split::Test).unwrap());
}

#[test]
fn truncated_raw_images_name_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let raw = decompress(&bundled("t10k-images-idx3-ubyte.gz"));
    for cut in [0, 3, 9, 15, 16, 1000, raw.len() - 1] {
        let p = write(&dir, "cut-images", &raw[..cut]);
        match read_idx(&p) {
            Err(Error::Idx {
                path,
                offset,
                compressed: false,
                ..
            }) => {
                assert_eq!(path, p);
                assert_eq!(offset, cut as u64, "cut at {cut}");
            }
            other => panic!(
                "cut at {cut}: expected an IDX error, got {:?}",
                other.map(|a| a.dims)
            ),
        }
    }
}

#[test]
fn corrupt_gz_names_file() {
    let dir = tempfile::tempdir().unwrap();
    let gz = bundled("t10k-images-idx3-ubyte.gz");
    // cut in the middle of the compressed stream
    let p = write(&dir, "half.gz", &gz[..gz.len() / 2]);
    let e = read_idx(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Idx {
                compressed: true,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("half.gz") && e.to_string().contains("byte"),
        "{e}"
    );
    // flipped bytes inside the deflate data
    let mut bad = gz.clone();
    for b in &mut bad[100..140] {
        *b ^= 0x5a;
    }
    let p = write(&dir, "flipped.gz", &bad);
    assert!(read_idx(&p).is_err());
}

#[test]
fn wrong_magic_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let mut raw = decompress(&bundled("t10k-labels-idx1-ubyte.gz"));
    raw[2] = 0x07;
    let p = write(&dir, "badtype", &raw);
    assert!(matches!(read_idx(&p), Err(Error::Idx { offset: 2, .. })));
    raw[0] = 0x12;
    let p = write(&dir, "badmagic", &raw);
    let e = read_idx(&p).unwrap_err();
    assert!(matches!(e, Error::Idx { offset: 0, .. }));
    assert!(e.to_string().contains("badmagic"));
    // a labels file in place of images: a shape error naming it
    let d2 = tempfile::tempdir().unwrap();
    let labels = decompress(&bundled("t10k-labels-idx1-ubyte.gz"));
    write(&d2, "t10k-images-idx3-ubyte", &labels);
    write(&d2, "t10k-labels-idx1-ubyte", &labels);
    let e = Mnist::load(d2.path(), Split::Test).unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("t10k-images-idx3-ubyte"),
        "{e}"
    );
}
