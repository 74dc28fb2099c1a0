//! Which units step next: the run's `schedule` behind one trait. A schedule sees only what it needs of the units
//! (their ids, members, whether they can step, their weights) and answers with a [`Turn`], so each is a pure
//! function tested without a model; the run loop carries the turn out, finding every unit by its id, so a unit
//! split or finished during the turn shifts nothing.

use super::{MemberId, UnitId};
use crate::config::ScheduleKind;

/// What a schedule sees of one unit.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub id: UnitId,
    pub members: Vec<MemberId>,
    /// Every member of it is running (none paused or done).
    pub runnable: bool,
    /// Its first member's `weight` (the weighted schedule's steps per round).
    pub weight: u32,
}

/// How far a unit steps in its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Steps {
    Count(u32),
    /// Until its epoch ends.
    EpochEnd,
}

/// One round of the run loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Turn {
    /// These units take one step each at the same time (separate CPU models on separate cores, as JAX's
    /// asynchronous dispatch overlaps them).
    Together(Vec<UnitId>),
    /// These units step one after the other, each as far as its [`Steps`].
    InTurn(Vec<(UnitId, Steps)>),
}

/// A way for members to take turns.
pub(super) trait Schedule: std::fmt::Debug + Send {
    /// The next round over `units` (in the cohort's order); `concurrent` when their steps may run at the same time
    /// (no unit is on a GPU, whose one stream would serialise them anyway).
    fn turn(&mut self, units: &[Seen], concurrent: bool) -> Turn;
}

/// The schedule `kind` names.
pub(super) fn new(kind: ScheduleKind) -> Box<dyn Schedule> {
    match kind {
        ScheduleKind::Lockstep => Box::new(Lockstep),
        ScheduleKind::Weighted => Box::new(Weighted),
        ScheduleKind::EpochSliced => Box::new(EpochSliced::default()),
    }
}

fn runnable(units: &[Seen]) -> impl Iterator<Item = &Seen> {
    units.iter().filter(|u| u.runnable)
}

/// Every round, each unit takes one step (members sharing data see the same batch).
#[derive(Debug)]
struct Lockstep;

impl Schedule for Lockstep {
    fn turn(&mut self, units: &[Seen], concurrent: bool) -> Turn {
        let ids = runnable(units).map(|u| u.id);
        if concurrent {
            Turn::Together(ids.collect())
        } else {
            Turn::InTurn(ids.map(|id| (id, Steps::Count(1))).collect())
        }
    }
}

/// Every round, each unit takes its `weight` in steps.
#[derive(Debug)]
struct Weighted;

impl Schedule for Weighted {
    fn turn(&mut self, units: &[Seen], _: bool) -> Turn {
        Turn::InTurn(
            runnable(units)
                .map(|u| (u.id, Steps::Count(u.weight)))
                .collect(),
        )
    }
}

/// One unit trains a whole epoch, then the next one. It remembers the member it last served rather than a unit or a
/// position: that member's unit may have been split or rebuilt since, and the next slice goes to the unit after the
/// one that holds it now.
#[derive(Debug, Default)]
struct EpochSliced {
    last: Option<MemberId>,
}

impl Schedule for EpochSliced {
    fn turn(&mut self, units: &[Seen], _: bool) -> Turn {
        let n = units.len();
        let start = self
            .last
            .and_then(|m| units.iter().position(|u| u.members.contains(&m)))
            .map_or(0, |p| p + 1);
        let pick = (0..n).map(|k| &units[(start + k) % n]).find(|u| u.runnable);
        match pick {
            Some(u) => {
                self.last = u.members.first().copied();
                Turn::InTurn(vec![(u.id, Steps::EpochEnd)])
            }
            None => Turn::InTurn(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(id: u64, members: &[usize], runnable: bool, weight: u32) -> Seen {
        Seen {
            id: UnitId(id),
            members: members.iter().map(|&m| MemberId(m)).collect(),
            runnable,
            weight,
        }
    }

    fn ids(t: &Turn) -> Vec<u64> {
        match t {
            Turn::Together(v) => v.iter().map(|u| u.0).collect(),
            Turn::InTurn(v) => v.iter().map(|(u, _)| u.0).collect(),
        }
    }

    #[test]
    fn lockstep_steps_every_runnable_unit_once_together_on_the_cpu_and_in_turn_otherwise() {
        let units = [
            unit(0, &[0, 1], true, 1),
            unit(1, &[2], false, 1),
            unit(2, &[3], true, 1),
        ];
        let mut s = new(ScheduleKind::Lockstep);
        assert_eq!(
            s.turn(&units, true),
            Turn::Together(vec![UnitId(0), UnitId(2)])
        );
        assert_eq!(
            s.turn(&units, false),
            Turn::InTurn(vec![
                (UnitId(0), Steps::Count(1)),
                (UnitId(2), Steps::Count(1))
            ])
        );
    }

    #[test]
    fn weighted_gives_each_unit_its_weight_in_steps() {
        let units = [
            unit(4, &[0], true, 3),
            unit(5, &[1], true, 1),
            unit(6, &[2], false, 9),
        ];
        let mut s = new(ScheduleKind::Weighted);
        assert_eq!(
            s.turn(&units, true),
            Turn::InTurn(vec![
                (UnitId(4), Steps::Count(3)),
                (UnitId(5), Steps::Count(1))
            ])
        );
    }

    #[test]
    fn epoch_slices_go_round_the_units_skipping_the_paused() {
        let mut units = vec![
            unit(0, &[0], true, 1),
            unit(1, &[1], false, 1),
            unit(2, &[2], true, 1),
        ];
        let mut s = new(ScheduleKind::EpochSliced);
        let order: Vec<Vec<u64>> = (0..4).map(|_| ids(&s.turn(&units, true))).collect();
        assert_eq!(order, [[0], [2], [0], [2]]);
        units[1].runnable = true;
        assert_eq!(ids(&s.turn(&units, true)), [0]);
        assert_eq!(
            ids(&s.turn(&units, true)),
            [1],
            "after unit 0 comes unit 1 once it runs"
        );
        assert_eq!(
            s.turn(&units, true),
            Turn::InTurn(vec![(UnitId(2), Steps::EpochEnd)])
        );
    }

    #[test]
    fn an_epoch_slice_follows_its_member_into_the_unit_it_was_rebuilt_as() {
        let mut s = new(ScheduleKind::EpochSliced);
        let units = [
            unit(0, &[0], true, 1),
            unit(1, &[1], true, 1),
            unit(2, &[2], true, 1),
        ];
        assert_eq!(ids(&s.turn(&units, true)), [0]);
        assert_eq!(ids(&s.turn(&units, true)), [1]);
        // Member 1's unit was rebuilt (a move to the CPU) and now sits last, under a new id: the slice after it
        // goes round to the first unit, not to the one that took its old place.
        let rebuilt = [
            unit(0, &[0], true, 1),
            unit(2, &[2], true, 1),
            unit(7, &[1], true, 1),
        ];
        assert_eq!(ids(&s.turn(&rebuilt, true)), [0]);
        assert!(matches!(s.turn(&[], true), Turn::InTurn(v) if v.is_empty()));
    }
}
