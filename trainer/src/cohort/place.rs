//! Members placed on the run's cards by [`crate::placement::plan`] before their units are built: a member pinned
//! to the CPU trains there, one resumed there (an OOM had moved it) stays, members that may fuse are placed as
//! one, and every other member goes where the plan puts it.

use cohort_tensor::Device;

use super::unit::persistent_bytes;
use super::{Cohort, MemberId, State};
use crate::config::Pin;
use crate::error::Result;
use crate::memory::{device_total_bytes, process_report};
use crate::placement::{Card, Group, plan};
use crate::report::Status;

impl Cohort {
    /// Places the members on `cards` (ordinals; none for a run on the CPU).
    ///
    /// A member that fits no card ([`crate::placement::Refusal`]) fails with the reason; the others train.
    ///
    /// # Errors
    /// A card whose limit is above its memory; writing a failed member's records.
    pub(super) fn place(&mut self, cards: &[usize]) -> Result<()> {
        for i in self.member_ids() {
            if self.members[i].cfg.pin == Some(Pin::Cpu) {
                self.members[i].device = Device::Cpu;
            }
        }
        if cards.is_empty() {
            return Ok(());
        }
        let mut budgets = Vec::new();
        let mut largest = 0;
        for &n in cards {
            let card = Device::Cuda(n);
            let total = match process_report(&card) {
                Some(p) => p.card_total,
                None => device_total_bytes(&card)?,
            };
            largest = largest.max(total);
            budgets.push(Card {
                ordinal: n,
                budget: self.config.check_card_limit(n, total)?,
                speed: 1.0,
            });
        }
        let mut keys: Vec<String> = Vec::new();
        let mut groups: Vec<(Group, Vec<MemberId>)> = Vec::new();
        for i in self.member_ids() {
            let m = &self.members[i];
            if m.state == State::Done || m.device == Device::Cpu {
                continue;
            }
            let waits = m.state == State::Queued;
            // A sweep's trials start one by one as room frees: each is placed on its own.
            let key = if waits {
                format!("queued:{}", i.0)
            } else {
                format!("{}|{:?}", self.fusion_group(i), m.cfg.pin)
            };
            let params = self.param_count(i);
            let reserve = m.cfg.memory.reserve.map_or(0, |r| r.bytes(largest));
            let bytes = self.footprint(i, largest);
            let floor = (persistent_bytes(&m.cfg, params) + reserve).min(bytes.max(reserve));
            let compute = params as f64 * m.batch as f64;
            let pin = match m.cfg.pin {
                Some(Pin::Card(n)) => Some(n),
                _ => None,
            };
            match keys.iter().position(|k| *k == key) {
                Some(g) => {
                    let (group, ids) = &mut groups[g];
                    group.members.push(m.cfg.name.clone());
                    group.bytes += bytes;
                    group.floor += floor;
                    group.compute += compute;
                    ids.push(i);
                }
                None => {
                    keys.push(key);
                    let group = Group {
                        members: vec![m.cfg.name.clone()],
                        bytes,
                        floor,
                        compute,
                        pin,
                        waits,
                    };
                    groups.push((group, vec![i]));
                }
            }
        }
        let planned: Vec<Group> = groups.iter().map(|(g, _)| g.clone()).collect();
        for ((_, ids), placed) in groups.iter().zip(plan(&budgets, &planned)) {
            match placed {
                Ok(ordinal) => {
                    for &i in ids {
                        self.members[i].device = Device::Cuda(ordinal);
                    }
                }
                // Those members cannot train; the others can.
                Err(refusal) => {
                    self.progress.message(&format!("error: {refusal}"));
                    for &i in ids {
                        self.members[i]
                            .end(Status::Failed, Some("no card with room for it".into()));
                        self.finalized(i)?;
                    }
                }
            }
        }
        Ok(())
    }
}
