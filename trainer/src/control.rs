//! The control file: steer members of a running cohort by editing `runs/<run>/control.toml`.
//!
//! The file is declarative: one table per member, the state you want it in. cohort re-reads it whenever it changes
//! (it checks a few times a second) and applies what differs; a malformed file is reported and ignored until fixed,
//! it never stops the run.
//!
//! ```toml
//! [mlp-lr1e-3]
//! paused = true        # stop taking steps (memory and place in the schedule are kept); false resumes
//!
//! [cnn]
//! batch = 32           # train on with this batch size from the next step (the data pipeline re-batches)
//!
//! [mlp-lr3e-3]
//! stop = true          # finish this member now: final checkpoint, evaluation, summary; the others go on
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use toml::{Table, Value};

use crate::error::{Error, Result};

/// The wanted state of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemberControl {
    /// Paused (true) or running (false); unset: leave as is.
    pub paused: Option<bool>,
    /// A new batch size.
    pub batch: Option<usize>,
    /// Stop the member for good.
    pub stop: bool,
}

/// Parses control-file text.
///
/// # Errors
/// [`Error::Control`] naming the file, the member and the key.
pub fn parse(text: &str, path: &Path) -> Result<BTreeMap<String, MemberControl>> {
    let bad = |message: String| Error::Control {
        path: path.to_path_buf(),
        message,
    };
    let root: Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(format!("not valid TOML: {}", e.to_string().trim())))?;
    let mut out = BTreeMap::new();
    for (member, v) in root {
        let Value::Table(t) = v else {
            return Err(bad(format!(
                "expected a table [{member}] with paused, batch or stop"
            )));
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
                (k, _) => {
                    return Err(bad(format!(
                        "[{member}] key \"{k}\": unknown; accepted: paused, batch, stop"
                    )));
                }
            }
        }
        out.insert(member, c);
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
    pub fn poll(&mut self) -> Result<Option<BTreeMap<String, MemberControl>>> {
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
        let m = parse("[a]\npaused = true\n[b]\nbatch = 32\nstop = true\n", p).unwrap();
        assert_eq!(m["a"].paused, Some(true));
        assert_eq!(m["b"].batch, Some(32));
        assert!(m["b"].stop);
        let e = parse("[a]\nbatch = 0\n", p).unwrap_err().to_string();
        assert!(
            e.contains("control.toml") && e.contains("batch") && e.contains("≥ 1"),
            "{e}"
        );
        let e = parse("[a]\nspeed = 3\n", p).unwrap_err().to_string();
        assert!(e.contains("accepted: paused, batch, stop"), "{e}");
    }
}
