//! Per-member checkpoints: weights and optimizer state as safetensors plus a JSON manifest.
//!
//! A checkpoint at step `s` is two files in `runs/<run>/<member>/checkpoints/`: `ckpt-<s>.safetensors` (every tensor,
//! readable by Python's `safetensors` and PyTorch) and `ckpt-<s>.json` (the [`Manifest`]: step, epoch, data
//! position, RNG state, config hash, the tensors file's size and CRC32C). Each file is written to a temporary name,
//! fsynced, renamed into place, and the directory is fsynced; the manifest is written last, so a checkpoint exists
//! exactly when its manifest does and a crash at any moment leaves the previous checkpoints intact. Loading verifies
//! the size, the checksum and the safetensors header; a corrupt latest checkpoint is reported and the previous one
//! used.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, View};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The manifest format version.
pub const FORMAT: u32 = 1;

/// One tensor of a checkpoint, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorData {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian element bytes, row-major.
    pub data: Vec<u8>,
}

impl TensorData {
    /// An f32 tensor.
    pub fn f32(shape: &[usize], values: &[f32]) -> TensorData {
        TensorData {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data: bytemuck::cast_slice(values).to_vec(),
        }
    }

    /// The values of an f32 tensor.
    ///
    /// # Errors
    /// When the tensor is not f32.
    pub fn to_f32(&self) -> std::result::Result<Vec<f32>, String> {
        if self.dtype != Dtype::F32 {
            return Err(format!("expected an f32 tensor, found {:?}", self.dtype));
        }
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl View for &TensorData {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// A checkpoint's JSON manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The member it belongs to.
    pub member: String,
    /// Optimizer steps taken.
    pub step: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// The member's current batch size (it may have shrunk after an OOM).
    pub batch: usize,
    /// The device the member trained on.
    pub device: String,
    /// The input pipeline's position (its own serialized form).
    pub data_position: serde_json::Value,
    /// The member's RNG state (dropout, warm-up).
    pub rng: serde_json::Value,
    /// Hash of the member's config identity ([`crate::config::MemberConfig::config_hash`]).
    pub config_hash: String,
    /// The member's config identity, to say what differs on an incompatible resume.
    pub config: serde_json::Value,
    /// For a member trained on text: the vocabulary its token ids mean, so that the checkpoint alone can encode
    /// new text, and a resume can refuse a changed training file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<cohort_data::Vocabulary>,
    /// The trainer's own state: counters, loss history for the summary, OOM events.
    pub trainer_state: serde_json::Value,
    /// The tensors file's name.
    pub tensors_file: String,
    /// Its size in bytes.
    pub tensors_bytes: u64,
    /// Its checksum, `crc32c:xxxxxxxx`.
    pub checksum: String,
    /// Seconds since the Unix epoch when written.
    pub wall_time: f64,
    /// The member's data settings (its `[data.NAME]` table as it ran), so that a resume can refuse a changed one
    /// with what differs. Null in manifests of earlier versions.
    #[serde(default)]
    pub data_settings: serde_json::Value,
    /// `crc32c:xxxxxxxx` of the manifest file's own bytes with this field's value empty: an edited or damaged
    /// manifest is refused like a corrupt checkpoint. Empty in manifests of earlier versions.
    #[serde(default)]
    pub manifest_checksum: String,
    /// Under `precision = "f16"`: the loss scaler's scale and counts, so that a resumed member goes on with the
    /// scale it had reached. Absent for other policies and in manifests of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<cohort_optim::LossScale>,
}

/// The manifest's checksum over its file's bytes, with the checksum field's own value taken out. Over the bytes as
/// written, not a re-serialization: the random states hold 128-bit integers that a JSON value does not keep exact.
fn manifest_sum(json: &str, checksum: &str) -> String {
    let bare = json.replacen(
        &format!("\"manifest_checksum\": \"{checksum}\""),
        "\"manifest_checksum\": \"\"",
        1,
    );
    format!("crc32c:{:08x}", crc32c::crc32c(bare.as_bytes()))
}

/// A loaded (or to-be-saved) checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The manifest.
    pub manifest: Manifest,
    /// Tensors by name: `model.<param>` for weights, `optim.<param>.<slot>` for optimizer state.
    pub tensors: BTreeMap<String, TensorData>,
}

/// A member's checkpoint directory with a `max_to_keep` rotation.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    dir: PathBuf,
    keep: usize,
}

/// What [`CheckpointDir::load_latest`] found.
#[derive(Debug)]
pub struct Latest {
    /// The newest valid checkpoint.
    pub checkpoint: Checkpoint,
    /// One line per newer checkpoint that was corrupt and skipped.
    pub skipped: Vec<String>,
}

fn sync_dir(dir: &Path) -> Result<()> {
    // Directory fsync makes the rename durable; not supported on every platform, so only Unix.
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Writes `bytes` to `path` atomically: temporary file, fsync, rename, directory fsync.
///
/// # Errors
/// I/O errors naming the path.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace_file(path, bytes, true)
}

/// Writes `bytes` to `path` through a temporary file renamed over it, so that a reader sees the old file or the
/// new one, never part of one. `durable` also fsyncs the file and its directory, which a file rewritten every
/// second (the live memory snapshot) does not need.
///
/// # Errors
/// I/O errors naming the path.
pub fn replace_file(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)
                .and_then(|()| if durable { f.sync_all() } else { Ok(()) })
        })
        .map_err(|e| Error::io(&tmp, e))
        .and_then(|()| fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        // A full disk (or any failure) leaves nothing half-written behind.
        let _ = fs::remove_file(&tmp);
    }
    written?;
    if durable { sync_dir(dir) } else { Ok(()) }
}

impl CheckpointDir {
    /// Opens (creating) a checkpoint directory that keeps the newest `keep` checkpoints.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>, keep: usize) -> Result<CheckpointDir> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // A writer killed midway leaves garbage, never part of a checkpoint: its temporary files, and a tensors
        // file whose manifest was never written (killed while saving) or already removed (killed while rotating).
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let path = e.path();
                let name = e.file_name();
                let name = name.to_string_lossy();
                let orphan = name.starts_with("ckpt-")
                    && name.ends_with(".safetensors")
                    && !path.with_extension("json").exists();
                if orphan || (name.starts_with(".ckpt-") && name.contains(".tmp-")) {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        Ok(CheckpointDir {
            dir,
            keep: keep.max(1),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest path of step `step`.
    pub fn manifest_path(&self, step: u64) -> PathBuf {
        self.dir.join(format!("ckpt-{step:06}.json"))
    }

    /// The tensors path of step `step`.
    pub fn tensors_path(&self, step: u64) -> PathBuf {
        self.dir.join(format!("ckpt-{step:06}.safetensors"))
    }

    /// Saves a checkpoint; fills in the manifest's file name, size and checksum; rotates old ones. Returns the
    /// manifest path.
    ///
    /// # Errors
    /// Serialization or I/O errors naming the file.
    pub fn save(&self, checkpoint: &mut Checkpoint) -> Result<PathBuf> {
        let step = checkpoint.manifest.step;
        let tensors_path = self.tensors_path(step);
        let mut info = HashMap::new();
        info.insert("format".to_string(), "cohort".to_string());
        info.insert("member".to_string(), checkpoint.manifest.member.clone());
        info.insert("step".to_string(), step.to_string());
        let bytes = safetensors::tensor::serialize(
            checkpoint.tensors.iter().map(|(k, v)| (k.as_str(), v)),
            Some(info),
        )
        .map_err(|e| Error::Checkpoint {
            path: tensors_path.clone(),
            message: format!("cannot serialize the tensors: {e}"),
        })?;
        write_atomic(&tensors_path, &bytes)?;
        let m = &mut checkpoint.manifest;
        m.format = FORMAT;
        m.tensors_file = tensors_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        m.tensors_bytes = bytes.len() as u64;
        m.checksum = format!("crc32c:{:08x}", crc32c::crc32c(&bytes));
        m.manifest_checksum.clear();
        let bare =
            serde_json::to_string_pretty(m).map_err(|e| Error::json("checkpoint manifest", e))?;
        m.manifest_checksum = manifest_sum(&bare, "");
        let manifest_path = self.manifest_path(step);
        // The checksum goes into the very bytes it was taken of (its field's value was left empty).
        let json = bare.replacen(
            "\"manifest_checksum\": \"\"",
            &format!("\"manifest_checksum\": \"{}\"", m.manifest_checksum),
            1,
        );
        write_atomic(&manifest_path, json.as_bytes())?;
        self.rotate()?;
        Ok(manifest_path)
    }

    /// Steps that have a manifest, ascending (validity is checked on load).
    ///
    /// # Errors
    /// When the directory cannot be listed.
    pub fn steps(&self) -> Result<Vec<u64>> {
        let mut steps = Vec::new();
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(steps),
            Err(e) => return Err(Error::io(&self.dir, e)),
        };
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(s) = name
                .strip_prefix("ckpt-")
                .and_then(|r| r.strip_suffix(".json"))
                .and_then(|s| s.parse::<u64>().ok())
            {
                steps.push(s);
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }

    fn rotate(&self) -> Result<()> {
        let steps = self.steps()?;
        if steps.len() <= self.keep {
            return Ok(());
        }
        for &s in &steps[..steps.len() - self.keep] {
            // The manifest goes first: without it the tensors file is no checkpoint.
            for p in [self.manifest_path(s), self.tensors_path(s)] {
                match fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&p, e)),
                }
            }
        }
        sync_dir(&self.dir)
    }

    /// Loads and verifies the checkpoint of `step`.
    ///
    /// # Errors
    /// [`Error::Checkpoint`] saying what is wrong: a missing file, a bad manifest, a size or checksum mismatch, or an
    /// unreadable safetensors header.
    pub fn load(&self, step: u64) -> Result<Checkpoint> {
        let mpath = self.manifest_path(step);
        let bad = |path: &Path, message: String| Error::Checkpoint {
            path: path.to_path_buf(),
            message,
        };
        let text =
            fs::read(&mpath).map_err(|e| bad(&mpath, format!("cannot read the manifest: {e}")))?;
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| bad(&mpath, format!("the manifest is not valid: {e}")))?;
        if manifest.format != FORMAT {
            return Err(bad(
                &mpath,
                format!(
                    "manifest format {} (this cohort reads {FORMAT})",
                    manifest.format
                ),
            ));
        }
        if !manifest.manifest_checksum.is_empty() {
            let sum = manifest_sum(&String::from_utf8_lossy(&text), &manifest.manifest_checksum);
            if sum != manifest.manifest_checksum {
                return Err(bad(
                    &mpath,
                    format!(
                        "manifest checksum {sum}, it says {} (the manifest was edited or is corrupt)",
                        manifest.manifest_checksum
                    ),
                ));
            }
        }
        let tpath = self.dir.join(&manifest.tensors_file);
        let bytes =
            fs::read(&tpath).map_err(|e| bad(&tpath, format!("cannot read the tensors: {e}")))?;
        if bytes.len() as u64 != manifest.tensors_bytes {
            return Err(bad(
                &tpath,
                format!(
                    "{} bytes, the manifest says {} (a torn write)",
                    bytes.len(),
                    manifest.tensors_bytes
                ),
            ));
        }
        let sum = format!("crc32c:{:08x}", crc32c::crc32c(&bytes));
        if sum != manifest.checksum {
            return Err(bad(
                &tpath,
                format!(
                    "checksum {sum}, the manifest says {} (the file is corrupt)",
                    manifest.checksum
                ),
            ));
        }
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| bad(&tpath, format!("not a valid safetensors file: {e}")))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            tensors.insert(
                name,
                TensorData {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            );
        }
        Ok(Checkpoint { manifest, tensors })
    }

    /// The newest checkpoint that verifies, with a line for each newer one that did not.
    ///
    /// # Errors
    /// I/O errors listing the directory; `Ok(None)` when there is no checkpoint at all, and
    /// [`Error::NoCheckpoint`] when every one is corrupt.
    pub fn load_latest(&self) -> Result<Option<Latest>> {
        let steps = self.steps()?;
        if steps.is_empty() {
            return Ok(None);
        }
        let mut skipped = Vec::new();
        for &s in steps.iter().rev() {
            match self.load(s) {
                Ok(checkpoint) => {
                    return Ok(Some(Latest {
                        checkpoint,
                        skipped,
                    }));
                }
                Err(e) => skipped.push(e.to_string()),
            }
        }
        Err(Error::NoCheckpoint {
            dir: self.dir.clone(),
            reason: format!("every checkpoint is corrupt: {}", skipped.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(member: &str, step: u64) -> Checkpoint {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "model.layers.0.weight".to_string(),
            TensorData::f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, step as f32]),
        );
        tensors.insert(
            "optim.layers.0.weight.exp_avg".to_string(),
            TensorData::f32(&[2, 3], &[0.5; 6]),
        );
        Checkpoint {
            manifest: Manifest {
                format: FORMAT,
                member: member.to_string(),
                vocabulary: None,
                step,
                epoch: 0,
                batch: 32,
                device: "cpu".into(),
                data_position: serde_json::json!({"epoch": 0, "index": step}),
                rng: serde_json::json!([1, 2]),
                config_hash: "abc".into(),
                config: serde_json::json!({}),
                trainer_state: serde_json::json!({}),
                tensors_file: String::new(),
                tensors_bytes: 0,
                checksum: String::new(),
                wall_time: 0.0,
                data_settings: serde_json::Value::Null,
                manifest_checksum: String::new(),
                loss_scaler: None,
            },
            tensors,
        }
    }

    #[test]
    fn save_load_rotate_and_fall_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join("ck"), 2).unwrap();
        for s in [10, 20, 30] {
            let mut c = sample("m", s);
            dir.save(&mut c).unwrap();
        }
        assert_eq!(dir.steps().unwrap(), vec![20, 30]);
        assert!(!dir.tensors_path(10).exists());
        let latest = dir.load_latest().unwrap().unwrap();
        assert_eq!(latest.checkpoint.manifest.step, 30);
        assert!(latest.skipped.is_empty());
        assert_eq!(
            latest.checkpoint.tensors["model.layers.0.weight"]
                .to_f32()
                .unwrap()[5],
            30.0
        );
        // Flip one byte of the newest: it is reported and the previous one used.
        let p = dir.tensors_path(30);
        let mut b = fs::read(&p).unwrap();
        let n = b.len();
        b[n - 1] ^= 0xff;
        fs::write(&p, b).unwrap();
        let latest = dir.load_latest().unwrap().unwrap();
        assert_eq!(latest.checkpoint.manifest.step, 20);
        assert_eq!(latest.skipped.len(), 1);
        assert!(
            latest.skipped[0].contains("checksum"),
            "{}",
            latest.skipped[0]
        );
    }

    #[test]
    fn leftovers_of_a_killed_save_or_rotation_are_removed_and_a_failed_write_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), 3).unwrap();
        dir.save(&mut sample("m", 10)).unwrap();
        // Killed after writing step 20's tensors and before its manifest; killed while rotating step 5 out (its
        // manifest gone first); and a writer's temporary file.
        fs::write(dir.tensors_path(20), b"half").unwrap();
        fs::write(dir.tensors_path(5), b"old").unwrap();
        fs::write(tmp.path().join(".ckpt-000030.json.tmp-1"), b"{").unwrap();
        let dir = CheckpointDir::new(tmp.path(), 3).unwrap();
        let mut left: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["ckpt-000010.json", "ckpt-000010.safetensors"]);
        assert_eq!(
            dir.load_latest().unwrap().unwrap().checkpoint.manifest.step,
            10
        );

        // A write that fails (here the rename, onto a folder) removes its temporary file.
        let target = tmp.path().join("taken");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"x").unwrap();
        assert!(write_atomic(&target, b"bytes").is_err());
        let temps = fs::read_dir(tmp.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count();
        assert_eq!(temps, 0);
    }

    #[test]
    fn a_full_disk_says_so_and_what_to_do() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = Error::io("runs/r/m/checkpoints/ckpt-000010.safetensors", full).to_string();
        assert!(
            e.contains("the disk is full") && e.contains("keep = N") && e.contains("cohort resume"),
            "{e}"
        );
    }
}
