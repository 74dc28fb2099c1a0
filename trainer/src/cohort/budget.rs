//! Memory of a running cohort: the `[memory]` settings handed to the allocator, OOM recovery, budgets resized
//! through the control file, memory handed back to the device, and the process-wide limit kept as what lies
//! outside the pool changes.

use std::io::Write;
use std::time::Instant;

use cohort_alloc::TenantLimits;
use cohort_tensor::Device;

use super::oom::{self, Recovery};
use super::{Cohort, MemberId, State};
use crate::config::{Config, MemberMemory};
use crate::error::{Error, Result};
use crate::graph::Graphs;
use crate::memory::device_total_bytes;
use crate::report::{Status, bytes};

/// How often the process's memory is measured (and a process-wide limit re-applied) while a run trains.
const MEMORY_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// Passes `[memory]` to the GPU allocator through its environment variables, unless the user set them: the limit
/// is `card`'s own where `[memory.cards]` gives it one.
pub(super) fn apply_memory_env(config: &Config, card: Option<usize>) {
    let mut vars: Vec<(&str, String)> = vec![
        ("COHORT_MEMORY_GROWTH", config.memory.growth.to_string()),
        ("COHORT_MEMORY_SCOPE", config.memory.scope.to_string()),
    ];
    if let Some(l) = card.map_or(config.memory.limit, |n| config.card_limit(n)) {
        vars.push((
            "COHORT_MEMORY_LIMIT",
            match l {
                cohort_alloc::Limit::Bytes(b) => b.to_string(),
                cohort_alloc::Limit::Percent(p) => format!("{p}%"),
            },
        ));
    }
    for (k, v) in vars {
        if std::env::var_os(k).is_none() {
            // SAFETY: called before the trainer starts any thread of its own (data pipelines open later); the
            // allocator reads these variables when the device is first used, which happens after this.
            unsafe { std::env::set_var(k, v) };
        }
    }
}

impl Cohort {
    /// OOM recovery for unit `ui`: the cache trimmed, then the next rung of [`oom::plan`] carried out and told
    /// in every member's events.
    pub(super) fn recover(&mut self, ui: usize, oom: &cohort_alloc::Error) -> Result<()> {
        let u = &self.units[ui];
        let members = u.members.clone();
        let (batch, device) = (u.batch, u.device);
        let plan = oom::plan(&oom::Situation {
            members: members.len(),
            batch,
            on_gpu: device.is_cuda(),
            graph_ready: matches!(u.graphs, Graphs::Ready(_)),
            policy: self.members[members[0]].cfg.oom,
        });
        let trimmed = u.tenant.trim();
        for &i in &members {
            self.members[i].c.oom_events += 1;
        }
        let detail = oom.to_string();
        let headline = detail.lines().next().unwrap_or("");
        let at = format!(
            "out of memory at step {} with batch {batch} on {device}",
            self.members[members[0]].step
        );
        let head = format!(
            "{at} (cache trimmed: {} released): {headline}",
            bytes(trimmed)
        );
        let i = members[0];
        match plan {
            Recovery::ReleaseGraph => {
                self.units[ui].graphs = Graphs::Off;
                let text = format!(
                    "{at}: the captured step's CUDA graph is released and steps run eagerly ({headline})"
                );
                for &i in &members {
                    self.event(i, text.clone())?;
                }
                Ok(())
            }
            Recovery::Split { first } => {
                let text = format!(
                    "{head}; the fused group of {} splits in halves",
                    members.len()
                );
                for &i in &members {
                    self.event(i, text.clone())?;
                }
                self.split_unit(ui, &members[..first], device)
            }
            Recovery::Shrink { to } => {
                self.units[ui].batch = to;
                self.members[i].batch = to;
                self.event(i, format!("{head}; batch {batch} -> {to}"))
            }
            Recovery::ToCpu => {
                self.event(
                    i,
                    format!("{head}; batch at its floor {batch}: moving the member to the CPU"),
                )?;
                self.members[i].device = Device::Cpu;
                self.split_unit(ui, &[i], Device::Cpu)?;
                self.note_cpu_precision(i)?;
                self.handed_back(&[i], device)
            }
            Recovery::Stop { why } => {
                self.event(i, format!("{head}; {why}: the member stops"))?;
                self.members[i].end(Status::Failed, Some("out of memory".into()));
                Err(Error::OutOfMemory {
                    member: self.members[i].cfg.name.clone(),
                    message: format!("{detail}\n  {why}"),
                })
            }
        }
    }

    /// Applies a budget from the control file to member `i`: its own tenant (out of a fused group) gets the new
    /// limit and reserve. A limit below what the member holds between steps (its parameters, gradients and
    /// optimizer state) is refused with what it needs; a lower limit trims the cache, and a working set that no
    /// longer fits meets the member's OOM policy at its next step.
    ///
    /// # Errors
    /// Splitting the member out of its fused group failed.
    pub(super) fn resize_member(
        &mut self,
        i: MemberId,
        limit: Option<cohort_alloc::Limit>,
        reserve: Option<cohort_alloc::Limit>,
    ) -> Result<()> {
        let old = self.members[i].cfg.memory;
        let new = MemberMemory {
            limit: limit.or(old.limit),
            reserve: reserve.or(old.reserve),
        };
        if new == old {
            return Ok(());
        }
        let name = self.members[i].cfg.name.clone();
        let Some(ui) = self.isolate(i)? else {
            return Ok(());
        };
        let u = &self.units[ui];
        let total = device_total_bytes(&u.device)?;
        let limits = TenantLimits {
            limit: new.limit.map(|l| l.bytes(total)),
            reserve: new.reserve.map_or(0, |r| r.bytes(total)),
        };
        let (held, _) = u.tenant.usage();
        if let Some(l) = limits.limit
            && l < held
        {
            return self.event(
                i,
                format!(
                    "memory budget through the control file refused: limit {} is below the {} that {name}'s parameters, \
                     gradients and optimizer state hold; it would need at least that",
                    bytes(l),
                    bytes(held)
                ),
            );
        }
        if let Err(e) = u.tenant.set_limits(limits) {
            return self.event(
                i,
                format!("memory budget through the control file refused: {e}"),
            );
        }
        let lowered = limits
            .limit
            .is_some_and(|l| old.limit.is_none_or(|o| l < o.bytes(total)));
        let trimmed = if lowered { u.tenant.trim() } else { 0 };
        self.members[i].cfg.memory = new;
        let show = |l: Option<u64>| l.map_or("none".to_string(), bytes);
        self.event(
            i,
            format!(
                "memory budget through the control file: limit {} -> {}, reserve {} -> {} (holds {}{})",
                show(old.limit.map(|l| l.bytes(total))),
                show(limits.limit),
                bytes(old.reserve.map_or(0, |r| r.bytes(total))),
                bytes(limits.reserve),
                bytes(held),
                if trimmed > 0 {
                    format!("; {} of idle cache handed back", bytes(trimmed))
                } else {
                    String::new()
                }
            ),
        )
    }

    /// Members that finished, stopped or left `device` for the CPU give its cache back (what TensorFlow cannot do
    /// short of ending the process), and say how much.
    pub(super) fn handed_back(&mut self, members: &[MemberId], device: Device) -> Result<()> {
        let t0 = Instant::now();
        let released = crate::memory::hand_back(&device);
        // On the CPU the figure is host accounting's, not memory the process gives back: no event.
        if released == 0 || !device.is_cuda() {
            return Ok(());
        }
        let text = format!(
            "{} of cached memory handed back to {device} in {:.0} ms",
            bytes(released),
            t0.elapsed().as_secs_f64() * 1e3
        );
        for &i in members {
            self.event(i, text.clone())?;
        }
        Ok(())
    }

    /// Gives the device's idle cache back now (`trim = true` in the control file), logged as an event of every
    /// member still training: the cache is theirs together.
    pub(super) fn trim_all(&mut self) -> Result<()> {
        let released = crate::memory::hand_back(&self.device);
        let text = format!(
            "trim through the control file: {} of idle cache handed back to {}",
            bytes(released),
            self.device
        );
        for i in self.member_ids() {
            if self.members[i].state != State::Done {
                self.event(i, text.clone())?;
            }
        }
        Ok(())
    }

    /// Once a second: re-applies a process-wide limit (what lies outside the pool grows as kernels load and graphs
    /// are made), appends the process's memory to `memory.jsonl` (on a GPU) and rewrites `memory-now.json`, the
    /// snapshot `cohort memory RUN` shows while the run trains.
    pub(super) fn memory_tick(&mut self) -> Result<()> {
        if self
            .last_memory_tick
            .is_some_and(|t| t.elapsed() < MEMORY_TICK)
        {
            return Ok(());
        }
        self.last_memory_tick = Some(Instant::now());
        // One measurement (an NVML query) serves the limit, the record and the snapshot.
        if self.device.is_cuda()
            && let Some(p) = crate::memory::process_report(&self.device)
        {
            if let Err(e) = crate::memory::apply_process_limit(&self.device, &p) {
                self.progress.message(&format!("warning: {e}"));
            }
            self.peak_process = self.peak_process.max(p.process.unwrap_or(0));
            let mut record =
                serde_json::to_value(&p).map_err(|e| Error::json("process memory", e))?;
            record["time"] = serde_json::json!(self.elapsed());
            let path = self.run.root().join(crate::run_dir::MEMORY_LOG_FILE);
            let line = format!("{record}\n");
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .map_err(|e| Error::io(&path, e))?;
            self.last_process = Some(p);
        }
        // The snapshot is a window on the run, not one of its records: failing to write it only warns.
        if let Err(e) = self.memory_now().write(self.run.root()) {
            tracing::warn!("{e}");
        }
        Ok(())
    }

    /// The live snapshot: every member's memory now, and on a GPU the allocator's tenants and the process's figures.
    fn memory_now(&self) -> crate::memory_now::Snapshot {
        let members = self
            .member_ids()
            .map(|i| {
                let (m, mem) = (&self.members[i], self.member_memory(i));
                crate::memory_now::MemberNow {
                    name: m.cfg.name.clone(),
                    state: match m.state {
                        State::Queued => "queued".into(),
                        State::Running => "training".into(),
                        State::Paused => "paused".into(),
                        State::Done => m.c.stopped.clone().unwrap_or_else(|| "done".into()),
                    },
                    device: m.device.to_string(),
                    batch: m.batch,
                    step: m.step,
                    live_bytes: mem.live,
                    reserved_bytes: mem.reserved(),
                    peak_bytes: m.c.peak_mem,
                    limit_bytes: mem.limit,
                    reserve_bytes: mem.reserve,
                    oom_events: m.c.oom_events,
                }
            })
            .collect();
        let allocator = self
            .device
            .is_cuda()
            .then(|| crate::memory::device_report(&self.device))
            .flatten();
        crate::memory_now::Snapshot::now(
            self.elapsed(),
            self.device.to_string(),
            members,
            allocator,
            self.last_process.clone(),
        )
    }

    /// Member `i`'s memory: live at the height of its latest step, its high-water mark since its last record, its
    /// share of its unit's limit and reserve. Nothing once no unit trains it (finished, stopped, failed): its memory
    /// went back.
    pub(super) fn member_memory(&self, i: MemberId) -> crate::memory::MemberUsage {
        let Some(u) = self.unit_of(i) else {
            return crate::memory::MemberUsage::default();
        };
        let m = &self.members[i];
        let share = u.tenant.share(u.members.len());
        crate::memory::MemberUsage {
            live: m.mem_now,
            high_water: share.high_water.max(m.c.mem_high),
            ..share
        }
    }
}
