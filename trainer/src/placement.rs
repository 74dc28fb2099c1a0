//! Which card each member trains on: a pure function of the cards (their budgets and relative speeds) and the
//! members' estimates, so that every rule is tested without a GPU.
//!
//! Members are placed by groups: a fused group (same-spec members trained as one model) is one group and lands on
//! one card. Pinned groups go first, then the others largest first, each to the card where it leaves the
//! busiest resource least loaded: memory as a share of the card's budget, compute as a share of the card's part
//! of the total work. A group's *floor* (what it holds at any batch size: parameters, gradients, optimizer state,
//! its guaranteed reserve) is committed on its card; a group that waits for room (a sweep's trial, started as
//! others end) commits nothing and needs only to fit an empty card. Estimates beyond the floor may overbook a
//! card, as they may on one card today: members borrow each other's unused memory and recover from an OOM.

use std::cmp::Reverse;
use std::fmt;

use crate::report::bytes;

/// A card to place members on.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// Its ordinal (`cuda:N`).
    pub ordinal: usize,
    /// The bytes members may hold on it: its limit, else its memory.
    pub budget: u64,
    /// Its speed relative to the others' (1.0 for cards of one kind).
    pub speed: f64,
}

/// Members that train together on one card: a fused group, or one member.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Its members' names, for messages.
    pub members: Vec<String>,
    /// What it is expected to hold while it trains.
    pub bytes: u64,
    /// What it holds at any batch size; never more than `bytes`.
    pub floor: u64,
    /// Its work per round, in any unit common to all groups (e.g. parameters × batch).
    pub compute: f64,
    /// The card it is pinned to.
    pub pin: Option<usize>,
    /// It waits for room before it starts (a sweep's trial): it commits no memory.
    pub waits: bool,
}

/// No card has room for a group.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The group's members.
    pub members: Vec<String>,
    /// The group's floor.
    pub floor: u64,
    /// The card it was pinned to, if it was.
    pub pin: Option<usize>,
    /// The largest room left on a card it may go to, and that card (`None`: no such card).
    pub room: Option<(usize, u64)>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.members.as_slice() {
            [one] => format!("member \"{one}\""),
            many => format!("members \"{}\" (fused)", many.join("\", \"")),
        };
        write!(
            f,
            "{who} needs at least {} (parameters, gradients, optimizer state and reserve), ",
            bytes(self.floor)
        )?;
        match (self.room, self.pin) {
            (None, Some(p)) => write!(f, "but the run has no card cuda:{p} to pin it to"),
            (None, None) => f.write_str("but the run has no card"),
            (Some((card, room)), pin) => write!(
                f,
                "but the largest room left is {} on cuda:{card}{}: raise that card's limit ([memory.cards]), \
                 give the run more cards, or pin a member to \"cpu\"",
                bytes(room),
                if pin.is_some() {
                    ", the card it is pinned to"
                } else {
                    ""
                }
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// The card each group trains on (its ordinal), in the order of `groups`, or its [`Refusal`] where its floor fits
/// the room left on no card it may go to (groups are placed pinned first, then largest first). A refused group
/// takes no room: the others are placed as if it were not there.
pub fn plan(cards: &[Card], groups: &[Group]) -> Vec<Result<usize, Refusal>> {
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&g| (groups[g].pin.is_none(), Reverse(groups[g].bytes), g));
    let total_speed: f64 = cards.iter().map(|c| c.speed).sum();
    let total_work: f64 = groups.iter().map(|g| g.compute).sum();
    // The work each unit of speed does when all is balanced: compute loads are shares of it.
    let fair = if total_work > 0.0 && total_speed > 0.0 {
        total_work / total_speed
    } else {
        1.0
    };
    let mut committed = vec![0u64; cards.len()];
    let mut held = vec![0u64; cards.len()];
    let mut work = vec![0f64; cards.len()];
    let mut placed: Vec<Result<usize, Refusal>> = vec![Ok(0); groups.len()];
    for g in order {
        let group = &groups[g];
        let allowed: Vec<usize> = (0..cards.len())
            .filter(|&c| group.pin.is_none_or(|p| cards[c].ordinal == p))
            .collect();
        let room = |c: usize| {
            if group.waits {
                cards[c].budget
            } else {
                cards[c].budget.saturating_sub(committed[c])
            }
        };
        let load = |c: usize| {
            let memory = (held[c] + group.bytes) as f64 / cards[c].budget.max(1) as f64;
            let compute =
                (work[c] + group.compute) / (cards[c].speed.max(f64::MIN_POSITIVE) * fair);
            memory.max(compute)
        };
        let best = allowed
            .iter()
            .copied()
            .filter(|&c| room(c) >= group.floor)
            .min_by(|&a, &b| load(a).total_cmp(&load(b)));
        let Some(c) = best else {
            let largest = allowed
                .iter()
                .map(|&c| (cards[c].ordinal, room(c)))
                .max_by_key(|&(ordinal, r)| (r, Reverse(ordinal)));
            placed[g] = Err(Refusal {
                members: group.members.clone(),
                floor: group.floor,
                pin: group.pin,
                room: largest,
            });
            continue;
        };
        if !group.waits {
            committed[c] += group.floor;
        }
        held[c] += group.bytes;
        work[c] += group.compute;
        placed[g] = Ok(cards[c].ordinal);
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Every group's card, or the first refusal in the order of the groups.
    fn placed_all(cards: &[Card], groups: &[Group]) -> Result<Vec<usize>, Refusal> {
        plan(cards, groups).into_iter().collect()
    }

    fn cards(budgets_gib: &[u64]) -> Vec<Card> {
        budgets_gib
            .iter()
            .enumerate()
            .map(|(ordinal, &b)| Card {
                ordinal,
                budget: b * GIB,
                speed: 1.0,
            })
            .collect()
    }

    /// A member of `bytes_gib` whose floor is half of it, with `compute` work.
    fn group(name: &str, bytes_gib: u64, compute: f64) -> Group {
        Group {
            members: vec![name.into()],
            bytes: bytes_gib * GIB,
            floor: bytes_gib * GIB / 2,
            compute,
            pin: None,
            waits: false,
        }
    }

    /// What each card holds under `placed`: the members' bytes, by ordinal.
    fn held(cards: &[Card], groups: &[Group], placed: &[usize]) -> Vec<u64> {
        cards
            .iter()
            .map(|c| {
                groups
                    .iter()
                    .zip(placed)
                    .filter(|(_, p)| **p == c.ordinal)
                    .map(|(g, _)| g.bytes)
                    .sum()
            })
            .collect()
    }

    #[test]
    fn one_card_takes_everything_that_fits() {
        let cs = cards(&[80]);
        let gs = [
            group("a", 30, 1.0),
            group("b", 20, 1.0),
            group("c", 10, 1.0),
        ];
        assert_eq!(placed_all(&cs, &gs), Ok(vec![0, 0, 0]));
        // Estimates may overbook a card (members borrow memory and recover from OOM); floors may not.
        let big = [group("a", 60, 1.0), group("b", 60, 1.0)];
        assert_eq!(placed_all(&cs, &big), Ok(vec![0, 0]));
    }

    #[test]
    fn members_are_balanced_by_memory_and_compute() {
        // Equal members on equal cards: two each.
        let cs = cards(&[80, 80]);
        let gs: Vec<Group> = (0..4).map(|i| group(&format!("m{i}"), 10, 1.0)).collect();
        let placed = placed_all(&cs, &gs).unwrap();
        assert_eq!(held(&cs, &gs, &placed), [20 * GIB, 20 * GIB]);
        // Largest first: 40 alone, 30 + 10 beside it.
        let gs = [
            group("s", 10, 0.0),
            group("l", 40, 0.0),
            group("m", 30, 0.0),
        ];
        let placed = placed_all(&cs, &gs).unwrap();
        assert_eq!(held(&cs, &gs, &placed), [40 * GIB, 40 * GIB]);
        assert_ne!(placed[1], placed[2]);
        // Memory by budget: the card of twice the memory holds twice as much.
        let uneven = cards(&[80, 40]);
        let gs: Vec<Group> = (0..6).map(|i| group(&format!("m{i}"), 10, 0.0)).collect();
        let placed = placed_all(&uneven, &gs).unwrap();
        assert_eq!(held(&uneven, &gs, &placed), [40 * GIB, 20 * GIB]);
        // Compute by speed: small models, a card twice as fast does twice the work.
        let mut fast = cards(&[80, 80]);
        fast[0].speed = 2.0;
        let gs: Vec<Group> = (0..3).map(|i| group(&format!("m{i}"), 1, 1.0)).collect();
        let placed = placed_all(&fast, &gs).unwrap();
        assert_eq!(placed.iter().filter(|&&p| p == 0).count(), 2);
        // Compute decides between cards where memory is no constraint: the heavy member has a card to itself.
        let gs = [
            group("heavy", 2, 10.0),
            group("a", 2, 1.0),
            group("b", 2, 1.0),
            group("c", 2, 1.0),
        ];
        let placed = placed_all(&cs, &gs).unwrap();
        assert!(placed[1..].iter().all(|&p| p != placed[0]), "{placed:?}");
    }

    #[test]
    fn a_pin_wins_over_balance() {
        let cs = cards(&[80, 80]);
        let mut gs: Vec<Group> = (0..3).map(|i| group(&format!("m{i}"), 10, 1.0)).collect();
        for g in &mut gs {
            g.pin = Some(1);
        }
        gs.push(group("free", 10, 1.0));
        assert_eq!(placed_all(&cs, &gs), Ok(vec![1, 1, 1, 0]));
        // Pinned groups are placed first: an unpinned one never takes the room a pinned one needs.
        let small = cards(&[16, 16]);
        let mut pinned = group("pinned", 20, 1.0);
        pinned.pin = Some(0);
        let gs = [group("big", 24, 1.0), pinned];
        assert_eq!(placed_all(&small, &gs), Ok(vec![1, 0]));
    }

    #[test]
    fn a_fused_group_lands_on_one_card() {
        let cs = cards(&[40, 40]);
        let fused = Group {
            members: vec!["f0".into(), "f1".into(), "f2".into()],
            bytes: 36 * GIB,
            floor: 30 * GIB,
            compute: 3.0,
            pin: None,
            waits: false,
        };
        let gs = [group("a", 4, 1.0), fused, group("b", 4, 1.0)];
        let placed = placed_all(&cs, &gs).unwrap();
        // The group is one entry: its members share its card; the others go beside it or on the other card.
        assert_eq!(placed.len(), 3);
        assert_eq!(placed[0], placed[2]);
        assert_ne!(placed[1], placed[0]);
        // Split, it would fit the room left on two cards; whole, it fits none: refused, not split.
        let full = [group("x", 40, 1.0), group("y", 40, 1.0)];
        let e = placed_all(&cs, &[full[0].clone(), full[1].clone(), gs[1].clone()]).unwrap_err();
        assert_eq!(e.members, ["f0", "f1", "f2"]);
        assert!(
            e.to_string()
                .starts_with("members \"f0\", \"f1\", \"f2\" (fused)"),
            "{e}"
        );
    }

    #[test]
    fn nothing_fits_is_refused_naming_the_member() {
        let cs = cards(&[10, 10]);
        let gs: Vec<Group> = (0..3).map(|i| group(&format!("m{i}"), 12, 1.0)).collect();
        let each = plan(&cs, &gs);
        assert!(
            each[0].is_ok() && each[1].is_ok(),
            "a refusal ends no other member: {each:?}"
        );
        let e = placed_all(&cs, &gs).unwrap_err();
        assert_eq!(e.members, ["m2"]);
        assert_eq!(e.floor, 6 * GIB);
        assert_eq!(e.room, Some((0, 4 * GIB)));
        let text = e.to_string();
        assert!(
            text.contains("member \"m2\" needs at least 6.0 GiB")
                && text.contains("largest room left is 4.0 GiB on cuda:0"),
            "{text}"
        );
        // A sweep's trials wait for room: each needs only to fit an empty card.
        let trials: Vec<Group> = gs
            .iter()
            .map(|g| Group {
                waits: true,
                ..g.clone()
            })
            .collect();
        assert!(placed_all(&cs, &trials).is_ok());
        // Pinned to a full card, though the other has room.
        let mut pinned = group("p", 12, 1.0);
        pinned.pin = Some(1);
        let mut first = group("q", 12, 1.0);
        first.pin = Some(1);
        let e = placed_all(&cs, &[first, pinned]).unwrap_err();
        assert_eq!(e.room, Some((1, 4 * GIB)));
        assert!(e.to_string().contains("the card it is pinned to"), "{e}");
        // No card at all (a pin to a card the run lacks).
        let mut lost = group("lost", 1, 1.0);
        lost.pin = Some(7);
        let e = placed_all(&cs, &[lost]).unwrap_err();
        assert!(e.to_string().contains("no card cuda:7"), "{e}");
    }
}
