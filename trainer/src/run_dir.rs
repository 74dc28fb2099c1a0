//! The run directory layout and the one-directory-per-member rule.
//!
//! ```text
//! runs/<run>/
//!   config.toml                 the config the run was started with (what `cohort resume` reads)
//!   config-dir                  the folder that config was read from: its relative data paths resolve there
//!   control.toml                optional: pause / resume / batch changes while running (see crate::control)
//!   summary.json  loss.png  memory.png  memory-trace.json
//!   memory.jsonl                on a GPU: the process's memory once a second
//!   memory-now.json             the run's memory now, rewritten once a second while it trains (`cohort memory RUN`)
//!   <member>/
//!     .lock                     the pid of the process training this member
//!     events.out.tfevents.<time>.<host>   metrics.jsonl
//!     checkpoints/ckpt-<step>.safetensors  ckpt-<step>.json
//! ```

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::{Error, Result};

/// The config file inside a run directory.
pub const CONFIG_FILE: &str = "config.toml";

/// The file naming the folder the config was read from (absent for a config that came from no file).
const CONFIG_DIR_FILE: &str = "config-dir";
/// The control file inside a run directory.
pub const CONTROL_FILE: &str = "control.toml";
/// The summary inside a run directory.
pub const SUMMARY_FILE: &str = "summary.json";
/// The process's device memory once a second while a run trains (JSON lines: the pool and what lies outside it).
pub const MEMORY_LOG_FILE: &str = "memory.jsonl";
/// The run's memory now, rewritten once a second while it trains (see `crate::memory_now`).
pub const MEMORY_NOW_FILE: &str = "memory-now.json";
/// The memory plot.
pub const MEMORY_PLOT_FILE: &str = "memory.png";
/// A member directory's lock: the pid of the process training it.
pub const LOCK_FILE: &str = ".lock";

/// A run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

/// A UTC timestamp `YYYY-MM-DDTHH-MM-SS` (safe in file names).
pub fn timestamp(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Refuses members that would write to the same directory (equal names, or names equal but for case, which
/// collide on case-insensitive file systems).
///
/// # Errors
/// [`Error::SharedDirectory`] naming both members and the directory.
pub fn check_distinct_dirs<'a>(
    root: &Path,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for n in names {
        if let Some(first) = seen.insert(n.to_lowercase(), n) {
            return Err(Error::SharedDirectory {
                first: first.to_string(),
                second: n.to_string(),
                dir: root.join(n),
            });
        }
    }
    Ok(())
}

impl RunDir {
    /// Creates a new run directory under `config.run.dir` (named `config.run.name` or a timestamp, with a shard's
    /// suffix for a share of a sweep: `sweep-shard2of4`), checks the members' directories are distinct and saves
    /// the config text.
    ///
    /// # Errors
    /// [`Error::SharedDirectory`], or I/O errors naming the path.
    pub fn create(config: &Config) -> Result<RunDir> {
        let base = &config.run.dir;
        let mut name = match &config.run.name {
            Some(n) => n.clone(),
            None => timestamp(crate::tensorboard::now() as u64),
        };
        if let Some(shard) = config.run.shard {
            name = format!("{name}-{}", shard.dir_suffix());
        }
        let mut root = base.join(&name);
        let mut n = 2;
        while root.join(CONFIG_FILE).exists() {
            root = base.join(format!("{name}-{n}"));
            n += 1;
        }
        check_distinct_dirs(&root, config.members.iter().map(|m| m.name.as_str()))?;
        fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        crate::checkpoint::write_atomic(&root.join(CONFIG_FILE), config.text.as_bytes())?;
        let from = Path::new(&config.file);
        if from.is_file()
            && let Some(dir) = from
                .parent()
                .and_then(|d| fs::canonicalize(d.join(".")).ok())
        {
            let text = dir.to_string_lossy();
            crate::checkpoint::write_atomic(&root.join(CONFIG_DIR_FILE), text.as_bytes())?;
        }
        Ok(RunDir { root })
    }

    /// The folder the run's config was read from, against which its relative data paths resolve: recorded when
    /// the run was created, so that `cohort resume` finds the same files from anywhere.
    pub fn config_dir(&self) -> Option<PathBuf> {
        fs::read_to_string(self.root.join(CONFIG_DIR_FILE))
            .ok()
            .map(PathBuf::from)
    }

    /// Opens an existing run directory for `cohort resume`.
    ///
    /// # Errors
    /// [`Error::NotARun`] when it holds no `config.toml`.
    pub fn open(root: &Path) -> Result<RunDir> {
        if !root.join(CONFIG_FILE).is_file() {
            return Err(Error::NotARun {
                dir: root.to_path_buf(),
                reason: format!("no {CONFIG_FILE} in it (cohort writes one when a run starts)"),
            });
        }
        Ok(RunDir {
            root: root.to_path_buf(),
        })
    }

    /// The run's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The saved config.
    pub fn config_path(&self) -> PathBuf {
        self.root.join(CONFIG_FILE)
    }

    /// Writes the vocabulary of the text data set `data` as `vocab-<data>.json`: what its token ids mean.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_vocabulary(&self, data: &str, words: &cohort_data::Vocabulary) -> Result<()> {
        let path = self.root.join(format!("vocab-{data}.json"));
        let text = serde_json::to_string(words).map_err(|e| Error::json("vocabulary", e))?;
        std::fs::write(&path, text).map_err(|source| Error::Io { path, source })
    }

    /// The control file.
    pub fn control_path(&self) -> PathBuf {
        self.root.join(CONTROL_FILE)
    }

    /// A member's directory.
    pub fn member_dir(&self, member: &str) -> PathBuf {
        self.root.join(member)
    }

    /// A member's checkpoint directory.
    pub fn checkpoint_dir(&self, member: &str) -> PathBuf {
        self.root.join(member).join("checkpoints")
    }
}

/// Exclusive ownership of a member directory for as long as it lives: a `.lock` file holding the owner's pid.
#[derive(Debug)]
pub struct MemberLock {
    path: PathBuf,
}

/// Whether process `pid` exists (without `/proc` there is no telling: assumed alive, so a live run is never
/// clobbered).
pub fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        // Without /proc we cannot tell; assume alive so a live run is never clobbered.
        true
    }
}

impl MemberLock {
    /// Takes the lock of `dir` (creating it). A lock left by a dead process is taken over.
    ///
    /// # Errors
    /// [`Error::DirectoryLocked`] when a live process (this one included: another member) holds it.
    pub fn acquire(dir: &Path) -> Result<MemberLock> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(LOCK_FILE);
        let me = std::process::id();
        for _ in 0..3 {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write;
                    write!(f, "{me}").map_err(|e| Error::io(&path, e))?;
                    return Ok(MemberLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let pid = fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match pid {
                        Some(pid) if pid == me || process_alive(pid) => {
                            return Err(Error::DirectoryLocked {
                                dir: dir.to_path_buf(),
                                lock: path,
                                pid,
                            });
                        }
                        // Stale (or half-written by a process that died): take it over.
                        _ => {
                            let _ = fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(Error::io(&path, e)),
            }
        }
        Err(Error::DirectoryLocked {
            dir: dir.to_path_buf(),
            lock: path,
            pid: 0,
        })
    }
}

/// The pids that hold the locks of the member directories in `root` (alive or not), each once.
pub fn lock_holders(root: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path().join(LOCK_FILE)).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

impl Drop for MemberLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(0), "1970-01-01T00-00-00");
        assert_eq!(timestamp(1_764_436_804), "2025-11-29T17-20-04");
        assert_eq!(timestamp(951_782_400), "2000-02-29T00-00-00");
    }

    #[test]
    fn a_member_lock_is_exclusive() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        let a = MemberLock::acquire(&dir).unwrap();
        let err = MemberLock::acquire(&dir).unwrap_err();
        assert!(matches!(err, Error::DirectoryLocked { .. }), "{err}");
        drop(a);
        MemberLock::acquire(&dir).unwrap();
        // A lock of a process that no longer exists is taken over.
        fs::write(dir.join(".lock"), "4294967294").unwrap();
        assert_eq!(lock_holders(tmp.path()), [4_294_967_294]);
        let held = MemberLock::acquire(&dir).unwrap();
        assert_eq!(lock_holders(tmp.path()), [std::process::id()]);
        drop(held);
        assert!(lock_holders(tmp.path()).is_empty());
    }
}
