//! The control file applied to a running cohort: pause, stop, batch, budgets and trim.

use crate::error::Result;
use crate::report::Status;

use super::{Cohort, State};

impl Cohort {
    /// Applies a changed control file.
    pub(super) fn poll_control(&mut self) -> Result<()> {
        let wanted = match self.control.poll() {
            Ok(Some(w)) => w,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.progress
                    .message(&format!("warning: control file ignored: {e}"));
                return Ok(());
            }
        };
        if wanted.trim {
            self.trim_all()?;
        }
        // The file is the wanted state: a paused member the file no longer names runs again.
        for i in self.member_ids() {
            if self.members[i].state == State::Paused
                && !wanted.members.contains_key(&self.members[i].cfg.name)
            {
                self.members[i].state = State::Running;
                self.said_all_paused = false;
                self.event(i, "resumed: the control file no longer pauses it".into())?;
            }
        }
        for (name, c) in wanted.members {
            let Some(i) = self
                .member_ids()
                .find(|&i| self.members[i].cfg.name == name)
            else {
                let known: Vec<&str> = self.members.iter().map(|m| m.cfg.name.as_str()).collect();
                self.progress.message(&format!(
                    "warning: {}: no member \"{name}\" (members: {})",
                    self.control.path().display(),
                    known.join(", ")
                ));
                continue;
            };
            if matches!(self.members[i].state, State::Done | State::Queued) {
                continue;
            }
            if c.stop {
                self.isolate(i)?;
                self.members[i].end(Status::Completed, Some("stopped".into()));
                self.event(i, "stopped through the control file".into())?;
                continue;
            }
            if c.limit.is_some() || c.reserve.is_some() {
                self.resize_member(i, c.limit, c.reserve)?;
            }
            if let Some(b) = c.batch
                && b != self.members[i].batch
            {
                if let Some(ui) = self.isolate(i)? {
                    let old = self.units[ui].batch;
                    self.units[ui].batch = b;
                    self.members[i].batch = b;
                    self.event(i, format!("batch {old} -> {b} through the control file"))?;
                }
            }
            match (c.paused, &self.members[i].state) {
                (Some(true), State::Running) => {
                    self.isolate(i)?;
                    self.members[i].state = State::Paused;
                    self.event(i, "paused through the control file".into())?;
                }
                // The file is the wanted state: without `paused = true` a paused member runs again.
                (Some(false) | None, State::Paused) => {
                    self.members[i].state = State::Running;
                    self.said_all_paused = false;
                    self.event(i, "resumed through the control file".into())?;
                }
                _ => {}
            }
            self.show(i);
        }
        Ok(())
    }
}
