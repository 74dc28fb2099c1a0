//! TensorBoard event files: TFRecord framing with masked CRC32C around hand-encoded `Event` protobufs.
//!
//! A record is `u64 length (LE) | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)`, with
//! `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8` (tensorflow/core/lib/io/record_writer.cc). The first event
//! carries `file_version = "brain.Event:2"`; the others a `Summary` of `simple_value` scalars. Only the few protobuf
//! fields TensorBoard needs are encoded, as proto3 does: field tag varint, then a fixed64 double, a varint, or a
//! length-delimited string or message.
//!
//! Every event reaches the file as it is written (one `write` per record, no buffer), so a TensorBoard watching a
//! live run sees it at its next reload and a crash loses nothing written. A resumed run's new file begins with a
//! `SessionLog { status: START }` at the resume step: TensorBoard then purges what the older files hold past that
//! step (the interrupted run's records after its last checkpoint), as `tf.summary` writers do on restart.
//!
//! [`hparams`] adds what TensorBoard's HParams dashboard reads: the experiment in the run directory's own file and
//! one session per member in the member's file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub mod hparams;

pub use hparams::{Domain, HParamInfo, SessionStatus, write_experiment};

/// The mask TFRecord applies to CRC32C values so that CRCs of data containing CRCs stay well distributed.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Frames `data` as one TFRecord.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes_field(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn double_field(out: &mut Vec<u8>, field: u32, v: f64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn event_head(wall_time: f64, step: i64) -> Vec<u8> {
    let mut e = Vec::new();
    double_field(&mut e, 1, wall_time); // Event.wall_time
    if step != 0 {
        key(&mut e, 2, 0); // step: int64
        varint(&mut e, step as u64);
    }
    e
}

/// The encoded `Event { wall_time, file_version }`.
pub fn file_version_event(wall_time: f64) -> Vec<u8> {
    let mut e = event_head(wall_time, 0);
    bytes_field(&mut e, 3, b"brain.Event:2");
    e
}

/// The encoded `Event { wall_time, step, summary { value { tag, simple_value } … } }`.
pub fn scalars_event(wall_time: f64, step: i64, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, v) in scalars {
        let mut value = Vec::new();
        bytes_field(&mut value, 1, tag.as_bytes()); // Summary.Value.tag
        key(&mut value, 2, 5); // simple_value: float
        value.extend_from_slice(&v.to_le_bytes());
        bytes_field(&mut summary, 1, &value); // Summary.value
    }
    let mut e = event_head(wall_time, step);
    bytes_field(&mut e, 5, &summary); // Event.summary
    e
}

/// The encoded `Event { wall_time, step, session_log { status: START } }`: at `step`, TensorBoard drops the
/// events of earlier files past it.
pub fn session_start_event(wall_time: f64, step: i64) -> Vec<u8> {
    let mut log = Vec::new();
    key(&mut log, 1, 0); // SessionLog.status
    varint(&mut log, 1); // START
    let mut e = event_head(wall_time, step);
    bytes_field(&mut e, 7, &log); // Event.session_log (field 6 is the deprecated log_message)
    e
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Writes one member's `events.out.tfevents.<time>.<host>` file.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: File,
}

impl EventWriter {
    /// Creates a new event file in `dir` and writes its version record; for a run resumed at step `resumed_at`, a
    /// session start there too (TensorBoard's purge of what older files hold past it).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(dir: &Path, resumed_at: Option<u64>) -> Result<EventWriter> {
        let (mut w, t) = EventWriter::create_named(dir, "")?;
        if let Some(step) = resumed_at {
            w.write_event(&session_start_event(t, step as i64))?;
        }
        Ok(w)
    }

    /// A new `events.out.tfevents.<time>.<host>[.<n>]<suffix>` file in `dir` with its version record, and the
    /// time it was stamped with. TensorBoard reads any file whose name holds `tfevents`, so a suffix may tell
    /// files apart without hiding them.
    fn create_named(dir: &Path, suffix: &str) -> Result<(EventWriter, f64)> {
        let t = now();
        let stem = format!("events.out.tfevents.{}.{}", t as u64, hostname());
        let mut path = dir.join(format!("{stem}{suffix}"));
        // A resumed run may start within the same second: never append to another writer's file.
        let mut n = 1;
        while path.exists() {
            path = dir.join(format!("{stem}.{n}{suffix}"));
            n += 1;
        }
        let f = File::create(&path).map_err(|e| Error::io(&path, e))?;
        let mut w = EventWriter { path, out: f };
        w.write_event(&file_version_event(t))?;
        Ok((w, t))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_event(&mut self, event: &[u8]) -> Result<()> {
        self.out
            .write_all(&record(event))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Appends scalar summaries at `step`.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn scalars(&mut self, step: u64, scalars: &[(&str, f32)]) -> Result<()> {
        self.write_event(&scalars_event(now(), step as i64, scalars))
    }

    /// Makes what was written durable (`fsync`): a checkpoint's logs survive a power cut with it.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn sync(&mut self) -> Result<()> {
        self.out.sync_data().map_err(|e| Error::io(&self.path, e))
    }
}
