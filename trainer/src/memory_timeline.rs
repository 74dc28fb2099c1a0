//! A run's memory over time, read from its records: per member its live and reserved bytes, its limit, its
//! out-of-memory events and batch changes; on a GPU the process, the pool's reserved bytes and its limit. What
//! `memory.png` draws and `memory-trace.json` holds, as a pure function of the records ([`MemberTimeline::from_records`],
//! [`DeviceTimeline::from_lines`]), so both show the same thing and a test can check it without training.

use std::path::Path;

use serde_json::Value;

use crate::error::Result;
use crate::memory_now::is_oom;
use crate::metrics::MetricRecord;

/// A value over a stretch of time (a limit from one record to the last that had it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// Seconds into the run where it starts.
    pub from: f64,
    /// Where it ends.
    pub to: f64,
    /// Its bytes.
    pub bytes: u64,
}

/// A member's batch size changing (an OOM shrinking it, or the control file).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchChange {
    /// Seconds into the run.
    pub time: f64,
    /// What the member held (live) then.
    pub bytes: u64,
    /// The batch before.
    pub from: usize,
    /// The batch after.
    pub to: usize,
}

/// An event of a member, as its records have it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds into the run.
    pub time: f64,
    /// The member's step.
    pub step: u64,
    /// Its batch.
    pub batch: usize,
    /// What it held (live) then.
    pub bytes: u64,
    /// What happened.
    pub text: String,
}

/// One member's memory over time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemberTimeline {
    /// The member.
    pub name: String,
    /// `(seconds, bytes)` at each logged step: what its tenant held at the height of the step.
    pub live: Vec<(f64, u64)>,
    /// `(seconds, bytes)` at each logged step: what the pool held on its behalf over the interval
    /// ([`MetricRecord::reserved_bytes`]); empty for records of runs before cohort kept it.
    pub reserved: Vec<(f64, u64)>,
    /// Its limit while it had one.
    pub limits: Vec<Span>,
    /// Its batch changes.
    pub batch_changes: Vec<BatchChange>,
    /// All its events (the OOMs and batch changes among them).
    pub events: Vec<Event>,
}

impl MemberTimeline {
    /// Its out-of-memory events.
    pub fn ooms(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(|e| is_oom(&e.text))
    }

    /// The timeline of member `name` from its records. Records that carry no limit (those of runs before cohort
    /// logged it) take `fallback_limit` (the config's) for the whole run.
    pub fn from_records(
        name: &str,
        records: &[MetricRecord],
        fallback_limit: Option<u64>,
    ) -> MemberTimeline {
        let mut t = MemberTimeline {
            name: name.to_string(),
            ..MemberTimeline::default()
        };
        // A first record that is a batch change (an OOM before the first step) has no record before it to compare.
        let mut batch = records
            .first()
            .map(|r| r.event.as_deref().and_then(batch_before).unwrap_or(r.batch));
        let mut open: Option<Span> = None;
        let kept_figures = records.iter().any(|r| r.mem_peak_bytes.is_some());
        let start = records.first().map_or(0.0, |r| r.time);
        for r in records {
            if let Some(before) = batch
                && before != r.batch
            {
                t.batch_changes.push(BatchChange {
                    time: r.time,
                    bytes: r.mem_bytes,
                    from: before,
                    to: r.batch,
                });
            }
            batch = Some(r.batch);
            if let Some(text) = &r.event {
                t.events.push(Event {
                    time: r.time,
                    step: r.step,
                    batch: r.batch,
                    bytes: r.mem_bytes,
                    text: text.clone(),
                });
                continue;
            }
            t.live.push((r.time, r.mem_bytes));
            if let Some(b) = r.reserved_bytes() {
                t.reserved.push((r.time, b));
            }
            if !kept_figures {
                continue;
            }
            // A limit the first logged step had held from the member's first record (its events before it).
            let from = if t.live.len() == 1 { start } else { r.time };
            match (open.as_mut(), r.mem_limit_bytes) {
                (Some(s), Some(b)) if s.bytes == b => s.to = r.time,
                (_, limit) => {
                    t.limits.extend(open.take());
                    open = limit.map(|bytes| Span {
                        from,
                        to: r.time,
                        bytes,
                    });
                }
            }
        }
        if let (Some(first), Some(last)) = (records.first(), records.last()) {
            // A limit that still held at the last logged step holds to the member's last record.
            if let Some(s) = open.as_mut() {
                s.to = s.to.max(last.time);
            }
            if !kept_figures && let Some(bytes) = fallback_limit {
                open = Some(Span {
                    from: first.time,
                    to: last.time,
                    bytes,
                });
            }
        }
        t.limits.extend(open);
        t
    }
}

/// The batch before the change an event tells of (`…; batch 64 -> 54`, `batch 54 -> 32 through the control file`).
fn batch_before(event: &str) -> Option<usize> {
    let (head, _) = event.split_once(" -> ")?;
    head.rsplit_once("batch ")?.1.parse().ok()
}

/// The process's memory over time on a GPU (`memory.jsonl`); empty on the CPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceTimeline {
    /// What the driver saw the process hold (nvidia-smi's figure).
    pub process: Vec<(f64, u64)>,
    /// The allocator's pool: reserved bytes.
    pub pool_reserved: Vec<(f64, u64)>,
    /// The pool's limit.
    pub pool_limit: Vec<(f64, u64)>,
    /// What lies outside the pool (context, kernels, libraries, graphs).
    pub outside_pool: Vec<(f64, u64)>,
}

impl DeviceTimeline {
    /// From the lines of `memory.jsonl` (unreadable lines are skipped: a torn last one after a crash).
    pub fn from_lines(text: &str) -> DeviceTimeline {
        let mut d = DeviceTimeline::default();
        for v in text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        {
            let t = v["time"].as_f64().unwrap_or(0.0);
            for (key, series) in [
                ("process", &mut d.process),
                ("pool_reserved", &mut d.pool_reserved),
                ("pool_limit", &mut d.pool_limit),
                ("outside_pool", &mut d.outside_pool),
            ] {
                if let Some(b) = v[key].as_u64() {
                    series.push((t, b));
                }
            }
        }
        d
    }

    /// Whether there is anything (a GPU run).
    pub fn is_empty(&self) -> bool {
        self.process.is_empty() && self.pool_reserved.is_empty() && self.pool_limit.is_empty()
    }
}

/// A run's memory over time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// Each member, in the run's order.
    pub members: Vec<MemberTimeline>,
    /// The process on a GPU.
    pub device: DeviceTimeline,
}

impl Timeline {
    /// Reads the timeline of the run in `root` for `members` (name and the config's limit, for records without
    /// one) from their `metrics.jsonl` and, on a GPU, `memory.jsonl`.
    ///
    /// # Errors
    /// A record file that cannot be read.
    pub fn read(root: &Path, members: &[(String, Option<u64>)]) -> Result<Timeline> {
        let records = crate::metrics::read_members(root, members.iter().map(|(n, _)| n.as_str()))?;
        Ok(Timeline::of(root, members, &records))
    }

    /// The timeline of `members` (as for [`Timeline::read`]) from their `records`, in the same order, and, on a
    /// GPU, the run's `memory.jsonl`.
    pub fn of(
        root: &Path,
        members: &[(String, Option<u64>)],
        records: &[Vec<MetricRecord>],
    ) -> Timeline {
        let gpu =
            std::fs::read_to_string(root.join(crate::run_dir::MEMORY_LOG_FILE)).unwrap_or_default();
        Timeline {
            members: members
                .iter()
                .zip(records)
                .map(|((name, limit), r)| MemberTimeline::from_records(name, r, *limit))
                .collect(),
            device: DeviceTimeline::from_lines(&gpu),
        }
    }

    /// The first and last time anything was recorded (`(0, 0)` for nothing).
    pub fn time_range(&self) -> (f64, f64) {
        let mut times = Vec::new();
        for m in &self.members {
            times.extend(m.live.iter().map(|p| p.0));
            times.extend(m.reserved.iter().map(|p| p.0));
            times.extend(m.limits.iter().flat_map(|s| [s.from, s.to]));
            times.extend(m.events.iter().map(|e| e.time));
        }
        let d = &self.device;
        for s in [&d.process, &d.pool_reserved, &d.pool_limit, &d.outside_pool] {
            times.extend(s.iter().map(|p| p.0));
        }
        let times = times.into_iter().filter(|t| t.is_finite());
        times
            .fold(None, |r: Option<(f64, f64)>, t| {
                Some(r.map_or((t, t), |(a, b)| (a.min(t), b.max(t))))
            })
            .unwrap_or((0.0, 0.0))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A logged record at `time` holding `live` with a high-water mark `peak`, a `reserve` and a `limit`.
    pub(crate) fn logged(
        time: f64,
        batch: usize,
        live: u64,
        peak: u64,
        reserve: Option<u64>,
        limit: Option<u64>,
    ) -> MetricRecord {
        MetricRecord {
            step: (time * 10.0) as u64,
            epoch: 0,
            time,
            loss: 1.0,
            lr: 1e-3,
            batch,
            steps_per_s: 10.0,
            mem_bytes: live,
            mem_peak_bytes: Some(peak),
            mem_reserve_bytes: reserve,
            mem_limit_bytes: limit,
            test_accuracy: None,
            val: None,
            test: None,
            event: None,
        }
    }

    /// An event record.
    pub(crate) fn event(time: f64, batch: usize, live: u64, text: &str) -> MetricRecord {
        MetricRecord {
            lr: 0.0,
            steps_per_s: 0.0,
            mem_peak_bytes: None,
            mem_reserve_bytes: None,
            mem_limit_bytes: None,
            event: Some(text.into()),
            ..logged(time, batch, live, live, None, None)
        }
    }

    #[test]
    fn a_member_timeline_is_its_records_live_reserved_limits_and_marks() {
        let records = [
            event(
                0.5,
                64,
                0,
                "memory budget through the control file: reserve 0 B -> 0 B",
            ),
            logged(1.0, 64, 100, 150, None, Some(1000)),
            event(
                1.5,
                54,
                100,
                "out of memory at step 15 with batch 64 on cpu: ...; batch 64 -> 54",
            ),
            logged(2.0, 54, 90, 120, Some(200), Some(1000)),
            event(
                2.2,
                54,
                90,
                "memory budget through the control file: limit 1000 B -> 2000 B",
            ),
            logged(3.0, 54, 90, 95, Some(200), Some(2000)),
            event(3.5, 32, 90, "batch 54 -> 32 through the control file"),
            logged(4.0, 32, 60, 70, None, None),
        ];
        let t = MemberTimeline::from_records("hog", &records, Some(5));
        assert_eq!(t.live, [(1.0, 100), (2.0, 90), (3.0, 90), (4.0, 60)]);
        // Reserved: the high-water mark, or the reserve where that is larger.
        assert_eq!(t.reserved, [(1.0, 150), (2.0, 200), (3.0, 200), (4.0, 70)]);
        // The limit as the records had it (the config's fallback is for records that have none), changed by the
        // control file, and gone when the member had none.
        assert_eq!(
            t.limits,
            [
                Span {
                    from: 0.5,
                    to: 2.0,
                    bytes: 1000
                },
                Span {
                    from: 3.0,
                    to: 3.0,
                    bytes: 2000
                },
            ]
        );
        let ooms: Vec<&Event> = t.ooms().collect();
        assert_eq!(ooms.len(), 1);
        assert_eq!((ooms[0].time, ooms[0].bytes), (1.5, 100));
        let changes: Vec<_> = t
            .batch_changes
            .iter()
            .map(|b| (b.time, b.from, b.to))
            .collect();
        assert_eq!(changes, [(1.5, 64, 54), (3.5, 54, 32)]);
        assert_eq!(t.events.len(), 4);
    }

    #[test]
    fn an_oom_before_the_first_step_is_a_batch_change_too() {
        let records = [
            event(
                0.1,
                819,
                0,
                "out of memory at step 0 with batch 1024 on cuda:0 (...): ...; batch 1024 -> 819",
            ),
            logged(1.0, 819, 100, 150, None, Some(1000)),
        ];
        let t = MemberTimeline::from_records("hog", &records, None);
        let changes: Vec<_> = t
            .batch_changes
            .iter()
            .map(|b| (b.time, b.from, b.to))
            .collect();
        assert_eq!(changes, [(0.1, 1024, 819)]);
        assert_eq!(
            batch_before("memory budget through the control file: limit 1.0 KiB -> 2.0 KiB"),
            None
        );
    }

    #[test]
    fn old_records_take_the_configs_limit_and_have_no_reserved_line() {
        let mut old = logged(1.0, 32, 100, 0, None, None);
        old.mem_peak_bytes = None;
        let later = MetricRecord {
            time: 5.0,
            ..old.clone()
        };
        let t = MemberTimeline::from_records("m", &[old, later], Some(4096));
        assert_eq!(t.live.len(), 2);
        assert!(t.reserved.is_empty());
        assert_eq!(
            t.limits,
            [Span {
                from: 1.0,
                to: 5.0,
                bytes: 4096
            }]
        );
    }

    #[test]
    fn the_device_timeline_reads_memory_jsonl() {
        let text = "{\"time\":1.0,\"process\":900,\"pool_reserved\":500,\"pool_limit\":4000,\"outside_pool\":400}\n\
                    {\"time\":2.0,\"process\":null,\"pool_reserved\":600,\"pool_limit\":4000}\n{\"time\":3";
        let d = DeviceTimeline::from_lines(text);
        assert_eq!(d.pool_reserved, [(1.0, 500), (2.0, 600)]);
        assert_eq!(d.pool_limit, [(1.0, 4000), (2.0, 4000)]);
        assert_eq!(d.process, [(1.0, 900)]);
        let t = Timeline {
            members: vec![MemberTimeline::from_records(
                "m",
                &[logged(0.5, 8, 1, 1, None, None)],
                None,
            )],
            device: d,
        };
        assert_eq!(t.time_range(), (0.5, 2.0));
    }
}
