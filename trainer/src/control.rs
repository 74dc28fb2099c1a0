//! The control file: steer members of a running cohort by editing `runs/<run>/control.toml`.
//!
//! The file is declarative: one table per member, the state you want it in. cohort re-reads it whenever it changes
//! (it checks a few times a second) and applies what differs; a malformed file is reported and ignored until fixed,
//! it never stops the run.
//!
//! ```toml
//! trim = true          # give every idle cached page back to the device now (each time the file changes)
//!
//! [mlp-lr1e-3]
//! paused = true        # stop taking steps (memory and place in the schedule are kept); false resumes
//!
//! [cnn]
//! batch = 32           # train on with this batch size from the next step (the data pipeline re-batches)
//! limit = "1GiB"       # the member's memory budget from now on: lower trims, and a working set that no longer
//! reserve = "256MiB"   # fits meets the member's OOM policy at its next step; higher lets it grow
//!
//! [mlp-lr3e-3]
//! stop = true          # finish this member now: final checkpoint, evaluation, summary; the others go on
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use cohort_alloc::Limit;
use toml::{Table, Value};

use crate::error::{Error, Result};

/// The wanted state of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemberControl {
    /// Paused (true) or running (false); unset: leave as is.
    pub paused: Option<bool>,
    /// A new batch size.
    pub batch: Option<usize>,
    /// Stop the member for good.
    pub stop: bool,
    /// A new memory limit.
    pub limit: Option<Limit>,
    /// A new memory reserve.
    pub reserve: Option<Limit>,
}

/// The wanted state of a run: its members', and whether to give idle memory back now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Control {
    /// Give every idle cached page back to the device.
    pub trim: bool,
    /// By member name.
    pub members: BTreeMap<String, MemberControl>,
}

const MEMBER_KEYS: &str = "paused, batch, stop, limit, reserve";

/// Parses control-file text.
///
/// # Errors
/// [`Error::Control`] naming the file, the member and the key.
pub fn parse(text: &str, path: &Path) -> Result<Control> {
    let bad = |message: String| Error::Control {
        path: path.to_path_buf(),
        message,
    };
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(format!("not valid TOML: {}", e.to_string().trim())))?;
    let mut out = Control::default();
    for (member, v) in root {
        let t = match (member.as_str(), v) {
            ("trim", Value::Boolean(b)) => {
                out.trim = b;
                continue;
            }
            ("trim", v) => {
                return Err(bad(format!(
                    "key \"trim\": expected true or false, found {v}"
                )));
            }
            (_, Value::Table(t)) => t,
            (_, _) => {
                return Err(bad(format!(
                    "expected a table [{member}] with {MEMBER_KEYS}, or trim = true at the top"
                )));
            }
        };
        let mut c = MemberControl::default();
        for (k, v) in t {
            match (k.as_str(), v) {
                ("paused", Value::Boolean(b)) => c.paused = Some(b),
                ("stop", Value::Boolean(b)) => c.stop = b,
                ("batch", Value::Integer(n)) if n >= 1 => c.batch = Some(n as usize),
                (k @ ("paused" | "stop"), v) => {
                    return Err(bad(format!(
                        "[{member}] key \"{k}\": expected true or false, found {v}"
                    )));
                }
                ("batch", v) => {
                    return Err(bad(format!(
                        "[{member}] key \"batch\": expected an integer ≥ 1, found {v}"
                    )));
                }
                (k @ ("limit" | "reserve"), v) => {
                    let Some(amount) = crate::config::memory_amount(&v) else {
                        return Err(bad(format!(
                            "[{member}] key \"{k}\": expected {}, found {v}",
                            crate::config::MEMORY_AMOUNT
                        )));
                    };
                    if k == "limit" {
                        c.limit = Some(amount);
                    } else {
                        c.reserve = Some(amount);
                    }
                }
                (k, _) => {
                    return Err(bad(format!(
                        "[{member}] key \"{k}\": unknown; accepted: {MEMBER_KEYS}"
                    )));
                }
            }
        }
        out.members.insert(member, c);
    }
    Ok(out)
}

/// Watches a control file for changes.
#[derive(Debug)]
pub struct ControlFile {
    path: PathBuf,
    last_check: Option<Instant>,
    last_seen: Option<(SystemTime, u64)>,
    interval: Duration,
}

impl ControlFile {
    /// Watches `path` (which need not exist yet).
    pub fn new(path: PathBuf) -> ControlFile {
        ControlFile {
            path,
            last_check: None,
            last_seen: None,
            interval: Duration::from_millis(200),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks every call (tests); by default at most every 200 ms.
    pub fn check_every_call(&mut self) {
        self.interval = Duration::ZERO;
    }

    /// The new wanted state when the file changed since the last call, `None` otherwise.
    ///
    /// # Errors
    /// [`Error::Control`] when the changed file is malformed (the caller reports it and goes on).
    pub fn poll(&mut self) -> Result<Option<Control>> {
        let now = Instant::now();
        if let Some(t) = self.last_check
            && now.duration_since(t) < self.interval
        {
            return Ok(None);
        }
        self.last_check = Some(now);
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return Ok(None);
        };
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if self.last_seen == Some(stamp) {
            return Ok(None);
        }
        self.last_seen = Some(stamp);
        let text = std::fs::read_to_string(&self.path).map_err(|e| Error::io(&self.path, e))?;
        parse(&text, &self.path).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let p = Path::new("control.toml");
        let c = parse("[a]\npaused = true\n[b]\nbatch = 32\nstop = true\n", p).unwrap();
        let m = &c.members;
        assert_eq!(m["a"].paused, Some(true));
        assert_eq!(m["b"].batch, Some(32));
        assert!(m["b"].stop);
        assert!(!c.trim);
        let c = parse("trim = true\n[a]\nlimit = \"64MiB\"\nreserve = 4096\n", p).unwrap();
        assert!(c.trim);
        assert_eq!(c.members["a"].limit, Some(Limit::Bytes(64 << 20)));
        assert_eq!(c.members["a"].reserve, Some(Limit::Bytes(4096)));
        let e = parse("[a]\nlimit = \"lots\"\n", p).unwrap_err().to_string();
        assert!(e.contains("\"limit\"") && e.contains("512MiB"), "{e}");
        let e = parse("trim = 3\n", p).unwrap_err().to_string();
        assert!(e.contains("trim") && e.contains("true or false"), "{e}");
        let e = parse("[a]\nbatch = 0\n", p).unwrap_err().to_string();
        assert!(
            e.contains("control.toml") && e.contains("batch") && e.contains("≥ 1"),
            "{e}"
        );
        let e = parse("[a]\nspeed = 3\n", p).unwrap_err().to_string();
        assert!(
            e.contains("accepted: paused, batch, stop, limit, reserve"),
            "{e}"
        );
    }
}
