//! What a unit that ran out of memory does next: a pure plan from what the unit is (its members, batch, device,
//! captured graph) and its members' policy, tested without a model. [`Cohort::recover`](super::Cohort) carries the
//! plan out and says what it did in every member's events.
//!
//! The order is cheapest first, and each rung keeps more of the run than the next: the captured step's graph gives
//! its memory back (steps go on eagerly); a fused group splits in halves (each half needs about half the memory,
//! and a member that fits alone keeps training at full batch); a member on its own shrinks its batch by the policy's
//! factor down to its floor; at the floor it moves to the CPU when allowed; otherwise it stops, alone.

use crate::config::OomPolicy;

/// What the recovery sees of the unit that ran out of memory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Situation {
    pub members: usize,
    pub batch: usize,
    pub on_gpu: bool,
    /// Its steps replay a captured CUDA graph, which holds a step's memory beside what eager steps need.
    pub graph_ready: bool,
    pub policy: OomPolicy,
}

/// The next rung of the recovery.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Recovery {
    /// Release the captured graph; steps run eagerly from here.
    ReleaseGraph,
    /// Split the fused group: its first `first` members in one unit, the others in another.
    Split { first: usize },
    /// The member's batch becomes `to`.
    Shrink { to: usize },
    /// The member moves to the CPU at its floor batch.
    ToCpu,
    /// The member stops; `why` says what was left to try.
    Stop { why: String },
}

/// The plan for `s`.
pub(super) fn plan(s: &Situation) -> Recovery {
    let p = &s.policy;
    if s.graph_ready {
        return Recovery::ReleaseGraph;
    }
    if s.members > 1 {
        return Recovery::Split {
            first: s.members / 2,
        };
    }
    if p.shrink && s.batch > p.min_batch {
        let to =
            ((s.batch as f64 * (1.0 - p.factor)).floor() as usize).clamp(p.min_batch, s.batch - 1);
        return Recovery::Shrink { to };
    }
    if p.cpu_fallback && s.on_gpu {
        return Recovery::ToCpu;
    }
    Recovery::Stop {
        why: if p.shrink {
            format!("batch at its floor ({}) and no CPU fallback left", s.batch)
        } else {
            "oom = \"fail\"".to_string()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHRINK: OomPolicy = OomPolicy {
        shrink: true,
        factor: 0.15,
        min_batch: 8,
        cpu_fallback: true,
    };

    fn at(members: usize, batch: usize, on_gpu: bool, policy: OomPolicy) -> Situation {
        Situation {
            members,
            batch,
            on_gpu,
            graph_ready: false,
            policy,
        }
    }

    #[test]
    fn a_captured_graph_goes_first_then_a_group_splits_in_halves() {
        let s = Situation {
            graph_ready: true,
            ..at(4, 64, true, SHRINK)
        };
        assert_eq!(plan(&s), Recovery::ReleaseGraph);
        assert_eq!(plan(&at(4, 64, true, SHRINK)), Recovery::Split { first: 2 });
        assert_eq!(plan(&at(3, 64, true, SHRINK)), Recovery::Split { first: 1 });
        let fail = OomPolicy {
            shrink: false,
            cpu_fallback: false,
            ..SHRINK
        };
        assert_eq!(
            plan(&at(2, 64, true, fail)),
            Recovery::Split { first: 1 },
            "even under oom = \"fail\" a group splits first: each member may fit alone"
        );
    }

    #[test]
    fn a_member_shrinks_by_its_factor_down_to_its_floor_and_always_by_at_least_one() {
        let batches: Vec<usize> =
            std::iter::successors(Some(64), |&b| match plan(&at(1, b, true, SHRINK)) {
                Recovery::Shrink { to } => Some(to),
                _ => None,
            })
            .collect();
        assert_eq!(batches, [64, 54, 45, 38, 32, 27, 22, 18, 15, 12, 10, 8]);
        let gentle = OomPolicy {
            factor: 0.01,
            ..SHRINK
        };
        assert_eq!(plan(&at(1, 20, true, gentle)), Recovery::Shrink { to: 19 });
        assert_eq!(plan(&at(1, 9, true, SHRINK)), Recovery::Shrink { to: 8 });
    }

    #[test]
    fn at_its_floor_a_member_moves_to_the_cpu_only_from_a_gpu_and_only_if_allowed() {
        assert_eq!(plan(&at(1, 8, true, SHRINK)), Recovery::ToCpu);
        assert!(
            matches!(plan(&at(1, 8, false, SHRINK)), Recovery::Stop { why } if why.contains("floor (8)"))
        );
        let no_cpu = OomPolicy {
            cpu_fallback: false,
            ..SHRINK
        };
        assert!(matches!(
            plan(&at(1, 8, true, no_cpu)),
            Recovery::Stop { .. }
        ));
        let fail = OomPolicy {
            shrink: false,
            cpu_fallback: false,
            ..SHRINK
        };
        assert_eq!(
            plan(&at(1, 64, true, fail)),
            Recovery::Stop {
                why: "oom = \"fail\"".into()
            }
        );
    }
}
