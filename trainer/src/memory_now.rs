//! `memory-now.json`: a training run's memory now. The process that trains the run rewrites it at every memory tick
//! (once a second; a new file renamed over the old, so a reader never sees half of one): each member's live,
//! reserved and peak bytes, its limit, reserve, batch, device and state, and on a GPU the allocator's tenants and
//! the process's figures. `cohort memory RUN` shows it while the run trains ([`run_state`] tells a live run from
//! one that ended) and otherwise what the records last said ([`from_records`]).

use std::fmt;
use std::path::Path;

use cohort_alloc::MemoryReport;
use cohort_tensor::memory::ProcessMemory;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::report::{Summary, bytes};
use crate::run_dir::{MEMORY_NOW_FILE, lock_holders, process_alive};

/// One member's line of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberNow {
    /// The member.
    pub name: String,
    /// `training`, `paused`, `done`, or why it stopped.
    pub state: String,
    /// The device it trains on.
    pub device: String,
    /// Its batch size.
    pub batch: usize,
    /// Optimizer steps taken.
    pub step: u64,
    /// What its allocator tenant holds ("live"), at the height of its latest step (its share, in a fused group).
    pub live_bytes: u64,
    /// What the pool holds on its behalf: its high-water mark since its latest record, or its guaranteed reserve,
    /// whichever is larger (`crate::memory::MemberUsage::reserved`).
    pub reserved_bytes: u64,
    /// The most it held in the run.
    pub peak_bytes: u64,
    /// Its limit, if any.
    pub limit_bytes: Option<u64>,
    /// Its guaranteed reserve (0: none).
    pub reserve_bytes: u64,
    /// Out-of-memory events so far.
    pub oom_events: u64,
}

/// The run's memory at one moment, as the process training it measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The process training the run.
    pub pid: u32,
    /// When that process started (Linux: clock ticks since boot, `/proc/<pid>/stat`), so that another process
    /// given the same pid later is not taken for it.
    pub process_start: Option<u64>,
    /// When the snapshot was taken: seconds since 1970 (its age for a reader).
    pub unix_time: f64,
    /// When the snapshot was taken: seconds into the run (the records' `time`).
    pub time: f64,
    /// The run's device.
    pub device: String,
    /// Every member, in the config's order.
    pub members: Vec<MemberNow>,
    /// On a GPU: the allocator's report, every tenant's line in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<MemoryReport>,
    /// On a GPU: what the process holds, in the pool and outside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessMemory>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When process `pid` started, in clock ticks since boot (field 22 of `/proc/<pid>/stat`); `None` without `/proc`.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after its closing one.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// When this process started ([`process_start`]): read once, it never changes.
fn own_start() -> Option<u64> {
    static START: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| process_start(std::process::id()))
}

impl Snapshot {
    /// A snapshot of this process now, `time` seconds into the run.
    pub fn now(
        time: f64,
        device: String,
        members: Vec<MemberNow>,
        allocator: Option<MemoryReport>,
        process: Option<ProcessMemory>,
    ) -> Snapshot {
        let pid = std::process::id();
        Snapshot {
            pid,
            process_start: own_start(),
            unix_time: unix_now(),
            time,
            device,
            members,
            allocator,
            process,
        }
    }

    /// Seconds since the snapshot was taken.
    pub fn age(&self) -> f64 {
        (unix_now() - self.unix_time).max(0.0)
    }

    /// Writes `root/memory-now.json` through a temporary file renamed over it: a reader sees the old snapshot or
    /// the new one, never part of one. Not synced: it is replaced a second later.
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn write(&self, root: &Path) -> Result<()> {
        let text = serde_json::to_vec(self).map_err(|e| Error::json("memory snapshot", e))?;
        crate::checkpoint::replace_file(&root.join(MEMORY_NOW_FILE), &text, false)
    }

    /// Reads `root/memory-now.json`; `None` when there is none.
    ///
    /// # Errors
    /// A file that cannot be read or parsed, naming it.
    pub fn read(root: &Path) -> Result<Option<Snapshot>> {
        let path = root.join(MEMORY_NOW_FILE);
        match std::fs::read(&path) {
            Ok(text) => serde_json::from_slice(&text)
                .map(Some)
                .map_err(|e| Error::json(path.display().to_string(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// Whether the process that took the snapshot still runs: its pid exists and, where `/proc` tells, started
    /// when the snapshot's did.
    fn process_alive(&self) -> bool {
        process_alive(self.pid)
            && match (self.process_start, process_start(self.pid)) {
                (Some(then), Some(now)) => then == now,
                _ => true,
            }
    }
}

/// Whether a run trains now.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// Process `pid` trains it (it holds the members' locks); `snapshot` is that process's latest, `None` until it
    /// wrote one (it is loading data or building its models).
    Running {
        /// The process.
        pid: u32,
        /// Its latest snapshot.
        snapshot: Option<Box<Snapshot>>,
    },
    /// No process trains it (it finished, was interrupted or died); `last` is the last snapshot it left.
    NotRunning {
        /// The last snapshot of the run's last process, if it wrote one.
        last: Option<Box<Snapshot>>,
    },
}

/// Whether the run in `root` trains now: a live process holds one of its members' locks (a run releases them as
/// it ends, so a finished run is not running even while its process prints the summary), and the snapshot is that
/// process's (a snapshot left by an earlier process, or by a dead one whose pid was given to another, is not).
///
/// # Errors
/// A snapshot that cannot be read or parsed.
pub fn run_state(root: &Path) -> Result<RunState> {
    let snapshot = Snapshot::read(root)?.map(Box::new);
    let holders = lock_holders(root);
    if let Some(s) = snapshot
        .as_ref()
        .filter(|s| holders.contains(&s.pid) && s.process_alive())
    {
        return Ok(RunState::Running {
            pid: s.pid,
            snapshot: Some(s.clone()),
        });
    }
    Ok(match holders.into_iter().find(|&p| process_alive(p)) {
        Some(pid) => RunState::Running {
            pid,
            snapshot: None,
        },
        None => RunState::NotRunning { last: snapshot },
    })
}

/// What the records say of each of `members` (names) of the run in `root`: the latest logged record's memory, the
/// run's peak, OOM events, and, where `summary` is the run's, its device and how it ended (else the device of
/// `snapshot`, the run's last).
///
/// # Errors
/// A member's `metrics.jsonl` that cannot be read.
pub fn from_records(
    root: &Path,
    members: &[String],
    summary: Option<&Summary>,
    snapshot: Option<&Snapshot>,
) -> Result<Vec<MemberNow>> {
    let mut out = Vec::new();
    for name in members {
        let records = crate::metrics::read(&root.join(name).join("metrics.jsonl"))?;
        let ended = summary.and_then(|s| s.members.iter().find(|m| &m.name == name));
        let last = records.iter().rev().find(|r| r.event.is_none());
        let seen = records
            .iter()
            .map(|r| r.mem_peak_bytes.unwrap_or(0).max(r.mem_bytes))
            .max()
            .unwrap_or(0);
        let ooms = records
            .iter()
            .filter(|r| r.event.as_deref().is_some_and(is_oom))
            .count() as u64;
        out.push(MemberNow {
            name: name.clone(),
            state: match ended {
                Some(m) => m.stopped.clone().unwrap_or_else(|| "done".into()),
                None if records.is_empty() => "not started".into(),
                None => "unfinished".into(),
            },
            device: match (
                ended,
                snapshot.and_then(|s| s.members.iter().find(|m| &m.name == name)),
            ) {
                (Some(m), _) => m.device.clone(),
                (None, Some(m)) => m.device.clone(),
                (None, None) => "-".into(),
            },
            batch: records.last().map_or(0, |r| r.batch),
            step: records.last().map_or(0, |r| r.step),
            live_bytes: last.map_or(0, |r| r.mem_bytes),
            reserved_bytes: last.map_or(0, |r| r.reserved_bytes().unwrap_or(r.mem_bytes)),
            peak_bytes: ended.map_or(seen, |m| m.peak_memory_bytes.max(seen)),
            limit_bytes: last.and_then(|r| r.mem_limit_bytes),
            reserve_bytes: last.and_then(|r| r.mem_reserve_bytes).unwrap_or(0),
            oom_events: ended.map_or(ooms, |m| m.oom_events),
        });
    }
    Ok(out)
}

/// Whether a member's event is an out-of-memory one.
pub fn is_oom(event: &str) -> bool {
    event.contains("out of memory")
}

/// The members as a table: one line each, a header first.
pub fn table(members: &[MemberNow]) -> String {
    let w = members
        .iter()
        .map(|m| m.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let mut out = format!(
        "{:<w$}  {:<10} {:<7} {:>6} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5}\n",
        "member",
        "state",
        "device",
        "batch",
        "step",
        "live",
        "reserved",
        "peak",
        "limit",
        "reserve",
        "OOMs"
    );
    for m in members {
        out.push_str(&format!(
            "{:<w$}  {:<10} {:<7} {:>6} {:>8} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5}\n",
            m.name,
            m.state,
            m.device,
            m.batch,
            m.step,
            bytes(m.live_bytes),
            bytes(m.reserved_bytes),
            bytes(m.peak_bytes),
            m.limit_bytes.map_or_else(|| "none".into(), bytes),
            if m.reserve_bytes > 0 {
                bytes(m.reserve_bytes)
            } else {
                "none".into()
            },
            m.oom_events
        ));
    }
    out
}

impl fmt::Display for Snapshot {
    /// The members' table, then on a GPU the process's figures and the allocator's tenants.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", table(&self.members))?;
        if let Some(p) = &self.process {
            write!(f, "\n{p}")?;
        }
        if let Some(r) = &self.allocator {
            // A member's tenant peak starts afresh at each of its steps (the records keep the intervals' peaks).
            write!(f, "\n{r}")?;
            writeln!(f, "  (a tenant's peak: since its latest step)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, live: u64) -> MemberNow {
        MemberNow {
            name: name.into(),
            state: "training".into(),
            device: "cpu".into(),
            batch: 32,
            step: 40,
            live_bytes: live,
            reserved_bytes: live * 2,
            peak_bytes: live * 2,
            limit_bytes: Some(1 << 20),
            reserve_bytes: 0,
            oom_events: 0,
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_says_how_old_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(Snapshot::read(tmp.path()).unwrap(), None);
        let s = Snapshot::now(12.5, "cpu".into(), vec![member("a", 4096)], None, None);
        s.write(tmp.path()).unwrap();
        let back = Snapshot::read(tmp.path()).unwrap().unwrap();
        assert_eq!(back, s);
        assert!(back.age() < 60.0);
        // Nothing but the snapshot is left behind: the temporary file was renamed.
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [MEMORY_NOW_FILE]);
        let text = back.to_string();
        assert!(
            text.contains("member") && text.contains("4.0 KiB") && text.contains("1.0 MiB"),
            "{text}"
        );
    }

    #[test]
    fn a_run_is_running_while_a_live_process_holds_its_locks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // No snapshot, no lock: not running.
        assert_eq!(
            run_state(root).unwrap(),
            RunState::NotRunning { last: None }
        );
        // A snapshot of this (live) process, which holds a member's lock: running, with it.
        let lock = crate::run_dir::MemberLock::acquire(&root.join("a")).unwrap();
        let s = Snapshot::now(1.0, "cpu".into(), vec![member("a", 1)], None, None);
        s.write(root).unwrap();
        assert_eq!(
            run_state(root).unwrap(),
            RunState::Running {
                pid: std::process::id(),
                snapshot: Some(Box::new(s.clone()))
            }
        );
        // A process with this pid that started at another time is not the one that wrote it.
        if s.process_start.is_some() {
            let other = Snapshot {
                process_start: s.process_start.map(|t| t + 1),
                ..s.clone()
            };
            other.write(root).unwrap();
            assert!(!matches!(
                run_state(root).unwrap(),
                RunState::Running {
                    snapshot: Some(_),
                    ..
                }
            ));
            s.write(root).unwrap();
        }
        // The locks released (the run ended): not running, whatever the snapshot says.
        drop(lock);
        let gone = RunState::NotRunning {
            last: Some(Box::new(s.clone())),
        };
        assert_eq!(run_state(root).unwrap(), gone);
        // A lock left by a process that died (killed): not running.
        std::fs::write(root.join("a").join(crate::run_dir::LOCK_FILE), "4294967294").unwrap();
        assert_eq!(run_state(root).unwrap(), gone);
    }

    #[test]
    fn without_a_summary_the_records_say_what_they_last_logged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let lines = [
            r#"{"step":20,"epoch":0,"time":1.0,"loss":1.0,"lr":0.1,"batch":64,"steps_per_s":10.0,"mem_bytes":5000,"mem_peak_bytes":7000,"mem_limit_bytes":9000}"#,
            r#"{"step":21,"epoch":0,"time":1.1,"loss":1.0,"lr":0.0,"batch":54,"steps_per_s":0.0,"mem_bytes":5000,"event":"out of memory at step 21 with batch 64 on cpu; batch 64 -> 54"}"#,
            r#"{"step":40,"epoch":0,"time":2.0,"loss":0.9,"lr":0.1,"batch":54,"steps_per_s":10.0,"mem_bytes":4000,"mem_peak_bytes":4500,"mem_reserve_bytes":6000,"mem_limit_bytes":9000}"#,
        ];
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        let rows = from_records(tmp.path(), &["a".into(), "b".into()], None, None).unwrap();
        let a = &rows[0];
        assert_eq!(
            (
                a.live_bytes,
                a.reserved_bytes,
                a.peak_bytes,
                a.limit_bytes,
                a.reserve_bytes
            ),
            (4000, 6000, 7000, Some(9000), 6000)
        );
        assert_eq!((a.batch, a.step, a.oom_events), (54, 40, 1));
        assert_eq!(a.state, "unfinished");
        assert_eq!(rows[1].state, "not started");
    }
}
