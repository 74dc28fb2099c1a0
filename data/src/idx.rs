//! IDX files, the format of the MNIST database: a magic number (two zero bytes, a type code, the number of
//! dimensions), big-endian `u32` sizes, then the data, row-major. gzip-compressed files are detected by their
//! magic bytes and decompressed on the fly, so the original `train-images-idx3-ubyte.gz` files read unchanged.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use crate::error::{Error, Result};

/// The element type of an IDX file (the third byte of its magic number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdxType {
    /// `0x08`: unsigned byte (MNIST pixels and labels).
    U8,
    /// `0x09`: signed byte.
    I8,
    /// `0x0B`: big-endian 16-bit integer.
    I16,
    /// `0x0C`: big-endian 32-bit integer.
    I32,
    /// `0x0D`: big-endian 32-bit float.
    F32,
    /// `0x0E`: big-endian 64-bit float.
    F64,
}

impl IdxType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }
}

/// The decoded elements of an IDX file, converted to native endianness.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxData {
    /// Unsigned bytes.
    U8(Vec<u8>),
    /// Signed bytes.
    I8(Vec<i8>),
    /// 16-bit integers.
    I16(Vec<i16>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
}

/// A whole IDX file: its dimensions and its elements.
#[derive(Clone, Debug, PartialEq)]
pub struct IdxArray {
    /// Sizes, outermost first (MNIST images: `[n, 28, 28]`; labels: `[n]`).
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: IdxData,
}

impl IdxArray {
    /// The element type.
    pub fn dtype(&self) -> IdxType {
        match self.data {
            IdxData::U8(_) => IdxType::U8,
            IdxData::I8(_) => IdxType::I8,
            IdxData::I16(_) => IdxType::I16,
            IdxData::I32(_) => IdxType::I32,
            IdxData::F32(_) => IdxType::F32,
            IdxData::F64(_) => IdxType::F64,
        }
    }

    /// Number of elements (the product of the dimensions).
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as bytes, or `None` when the file is not of type `u8`.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match &self.data {
            IdxData::U8(v) => Some(v),
            _ => None,
        }
    }

    /// Take the `u8` elements, or `None` when the file is not of type `u8`.
    pub fn into_u8(self) -> Option<Vec<u8>> {
        match self.data {
            IdxData::U8(v) => Some(v),
            _ => None,
        }
    }
}

/// Read an IDX file, gzip-compressed or raw (detected from the first two bytes, not the name).
///
/// # Errors
/// [`Error::Io`] when the file cannot be read; [`Error::Idx`] naming the file and byte offset when it is truncated,
/// has a wrong magic number, an unknown type code, trailing bytes, or (for `.gz`) a corrupt compressed stream.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    read_idx_gz(path.as_ref()).map(|(a, _)| a)
}

/// [`read_idx`], and whether the file was gzip-compressed (for errors that name a byte offset in it).
pub(crate) fn read_idx_gz(path: &Path) -> Result<(IdxArray, bool)> {
    let (bytes, compressed) = read_maybe_gz(path)?;
    Ok((parse_idx(&bytes, path, compressed)?, compressed))
}

/// Read a whole file, decompressing it when it starts with the gzip magic bytes.
fn read_maybe_gz(path: &Path) -> Result<(Vec<u8>, bool)> {
    let mut raw = Vec::new();
    File::open(path)
        .and_then(|f| BufReader::new(f).read_to_end(&mut raw))
        .map_err(|e| Error::io(path, e))?;
    if raw.len() < 2 || raw[0] != 0x1f || raw[1] != 0x8b {
        return Ok((raw, false));
    }
    let mut out = Vec::with_capacity(raw.len() * 4);
    let mut decoder = MultiGzDecoder::new(raw.as_slice());
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match decoder.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::Idx {
                    path: path.to_path_buf(),
                    offset: out.len() as u64,
                    compressed: true,
                    reason: format!("the gzip stream is truncated or corrupt ({e})"),
                });
            }
        }
    }
    Ok((out, true))
}

/// Parse IDX bytes that came from `path` (used only in error messages).
///
/// # Errors
/// [`Error::Idx`] as for [`read_idx`].
pub fn parse_idx(bytes: &[u8], path: &Path, compressed: bool) -> Result<IdxArray> {
    let err = |offset: usize, reason: String| Error::Idx {
        path: PathBuf::from(path),
        offset: offset as u64,
        compressed,
        reason,
    };
    if bytes.len() < 4 {
        return Err(err(
            bytes.len(),
            format!(
                "file ends after {} bytes, inside the 4-byte magic number",
                bytes.len()
            ),
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(err(
            0,
            format!(
                "wrong magic number {:02x} {:02x} {:02x} {:02x}: an IDX file starts with two zero bytes",
                bytes[0], bytes[1], bytes[2], bytes[3]
            ),
        ));
    }
    let dtype = IdxType::from_code(bytes[2]).ok_or_else(|| {
        err(
            2,
            format!(
                "unknown element type code 0x{:02x} (expected 0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e)",
                bytes[2]
            ),
        )
    })?;
    let ndims = bytes[3] as usize;
    if ndims == 0 {
        return Err(err(3, "zero dimensions".into()));
    }
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(err(
            bytes.len(),
            format!(
                "file ends after {} bytes, inside the header of {ndims} dimension sizes ({header} bytes)",
                bytes.len()
            ),
        ));
    }
    let mut dims = Vec::with_capacity(ndims);
    let mut count: usize = 1;
    for d in 0..ndims {
        let at = 4 + 4 * d;
        let size =
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        count = count
            .checked_mul(size)
            .ok_or_else(|| err(at, format!("dimension sizes {dims:?} x {size} overflow")))?;
        dims.push(size);
    }
    let data_len = count
        .checked_mul(dtype.size())
        .ok_or_else(|| err(4, format!("dimensions {dims:?} overflow")))?;
    let body = &bytes[header..];
    if body.len() < data_len {
        return Err(err(
            bytes.len(),
            format!(
                "truncated: dimensions {dims:?} need {data_len} data bytes after the {header}-byte header, \
                 but the file ends after {} of them",
                body.len()
            ),
        ));
    }
    if body.len() > data_len {
        return Err(err(
            header + data_len,
            format!(
                "{} unexpected bytes after the data of dimensions {dims:?}",
                body.len() - data_len
            ),
        ));
    }
    let data = match dtype {
        IdxType::U8 => IdxData::U8(body.to_vec()),
        IdxType::I8 => IdxData::I8(body.iter().map(|&b| b as i8).collect()),
        IdxType::I16 => IdxData::I16(
            body.chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        IdxType::I32 => IdxData::I32(
            body.chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        IdxType::F32 => IdxData::F32(
            body.chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        IdxType::F64 => IdxData::F64(
            body.chunks_exact(8)
                .map(|c| f64::from_be_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        ),
    };
    Ok(IdxArray { dims, data })
}

/// Encode an array as IDX bytes (uncompressed): the inverse of [`parse_idx`]. Used to write test fixtures and
/// small derived datasets.
pub fn encode_idx(array: &IdxArray) -> Vec<u8> {
    let code = match array.dtype() {
        IdxType::U8 => 0x08,
        IdxType::I8 => 0x09,
        IdxType::I16 => 0x0B,
        IdxType::I32 => 0x0C,
        IdxType::F32 => 0x0D,
        IdxType::F64 => 0x0E,
    };
    let mut out = vec![0, 0, code, array.dims.len() as u8];
    for &d in &array.dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    match &array.data {
        IdxData::U8(v) => out.extend_from_slice(v),
        IdxData::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        IdxData::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample() -> IdxArray {
        IdxArray {
            dims: vec![3, 2, 2],
            data: IdxData::U8((0..12).collect()),
        }
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn round_trip_raw_and_gz_every_type() {
        let dir = tempfile::tempdir().unwrap();
        let arrays = [
            sample(),
            IdxArray {
                dims: vec![2],
                data: IdxData::I8(vec![-1, 7]),
            },
            IdxArray {
                dims: vec![2],
                data: IdxData::I16(vec![-300, 300]),
            },
            IdxArray {
                dims: vec![1, 2],
                data: IdxData::I32(vec![-70000, 5]),
            },
            IdxArray {
                dims: vec![2],
                data: IdxData::F32(vec![1.5, -0.25]),
            },
            IdxArray {
                dims: vec![2],
                data: IdxData::F64(vec![1e300, -2.0]),
            },
        ];
        for (i, a) in arrays.iter().enumerate() {
            let raw = encode_idx(a);
            let p = write(dir.path(), &format!("a{i}"), &raw);
            assert_eq!(&read_idx(&p).unwrap(), a);
            let p = write(dir.path(), &format!("a{i}.gz"), &gz(&raw));
            assert_eq!(&read_idx(&p).unwrap(), a);
        }
    }

    fn idx_err(bytes: &[u8]) -> (u64, String) {
        match parse_idx(bytes, Path::new("x.idx"), false) {
            Err(Error::Idx { offset, reason, .. }) => (offset, reason),
            other => panic!("expected an IDX error, got {other:?}"),
        }
    }

    #[test]
    fn corrupt_headers_name_the_offset() {
        let good = encode_idx(&sample());
        assert_eq!(idx_err(&good[..3]).0, 3);
        let mut bad_magic = good.clone();
        bad_magic[0] = 1;
        assert_eq!(idx_err(&bad_magic).0, 0);
        let mut bad_type = good.clone();
        bad_type[2] = 0x42;
        assert_eq!(idx_err(&bad_type).0, 2);
        assert_eq!(idx_err(&good[..10]).0, 10);
        let (off, reason) = idx_err(&good[..20]);
        assert_eq!(off, 20);
        assert!(reason.contains("truncated"), "{reason}");
        let mut long = good.clone();
        long.push(9);
        assert_eq!(idx_err(&long).0, good.len() as u64);
        let huge = [0, 0, 8, 2, 255, 255, 255, 255, 255, 255, 255, 255];
        assert!(parse_idx(&huge, Path::new("h"), false).is_err());
    }

    #[test]
    fn truncated_gzip_is_an_error_with_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let compressed = gz(&encode_idx(&sample()));
        let p = write(dir.path(), "cut.gz", &compressed[..compressed.len() - 12]);
        let e = read_idx(&p).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                Error::Idx {
                    compressed: true,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(text.contains("cut.gz") && text.contains("byte"), "{text}");
    }

    #[test]
    fn missing_file_is_io_error() {
        let e = read_idx("/nonexistent/file.idx").unwrap_err();
        assert!(matches!(e, Error::Io { .. }));
        assert!(e.to_string().contains("/nonexistent/file.idx"));
    }
}
