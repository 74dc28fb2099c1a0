//! The last block freed, parked for the next allocation.
//!
//! A training step frees a temporary and at once allocates another of the same size, over and over. Giving the
//! block back to its free neighbour and cutting the same block out again is most of the cost of such a pair. So a
//! freed block is parked instead: its free is accounted (tenant, counters, events), but its chunk and pages stay as
//! they are, and the next allocation takes it back when it has the block's size and best fit would place it exactly
//! there. Any other call first finishes the free. The allocator's choices are the ones it makes without parking
//! (`tests/fragmentation.rs` checks that against the allocator with parking turned off).

use super::Inner;
use crate::bin::{NIL, State};
use crate::fault::Fault;
use crate::source::MemorySource;
use crate::tenant::TenantId;

impl<S: MemorySource> Inner<S> {
    /// Parks used chunk `i`, whose free has been accounted, after finishing the free of the block parked before;
    /// `false` (nothing done) where parking is off (no cache).
    pub(super) fn park(&mut self, i: u32) -> bool {
        if !self.caches() || self.faulty(Fault::NoParking) {
            return false;
        }
        self.unpark();
        self.chunks.v[i as usize].state = State::Parked;
        self.parked = i;
        true
    }

    /// Finishes the free of the parked block, if there is one: its pages released, its chunk coalesced.
    pub(super) fn unpark(&mut self) {
        let i = std::mem::replace(&mut self.parked, NIL);
        if i == NIL {
            return;
        }
        let c = self.chunks.v[i as usize];
        if let Some(pt) = &mut self.pages {
            let (a, b) = pt.span(c.ptr, c.size);
            pt.release(a, b);
        }
        self.coalesce(i);
    }

    /// The parked chunk, handed to `tenant`, when best fit would place an allocation of `rounded` bytes exactly on
    /// it; otherwise `None`, and the parked block is left for [`unpark`](Self::unpark).
    #[inline]
    pub(super) fn take_parked(&mut self, rounded: u64, tenant: TenantId) -> Option<u32> {
        let i = self.parked;
        if i == NIL || self.chunks.v[i as usize].size != rounded || !self.placed_on_parked(i) {
            return None;
        }
        self.parked = NIL;
        let c = &mut self.chunks.v[i as usize];
        c.state = State::Used;
        c.tenant = tenant.0;
        Some(i)
    }

    /// Whether, were parked chunk `i` coalesced, best fit for its size would cut the block from its address.
    fn placed_on_parked(&self, i: u32) -> bool {
        let ch = &self.chunks.v;
        let c = ch[i as usize];
        // A free chunk before it would absorb it, and the block would start there.
        if c.prev != NIL && ch[c.prev as usize].state == State::Free {
            return false;
        }
        let next_free = c.next != NIL && ch[c.next as usize].state == State::Free;
        let merged = c.size
            + if next_free {
                ch[c.next as usize].size
            } else {
                0
            };
        let bins = &self.bins[usize::from(c.arena)];
        let mut fit = bins.best_fit(ch, c.size);
        if next_free && fit == Some(c.next) {
            fit = bins.successor(ch, c.next);
        }
        if fit.is_some_and(|f| (ch[f as usize].size, ch[f as usize].ptr) < (merged, c.ptr)) {
            return false;
        }
        // The stitched layout's large arena starts a block on a page boundary where its chunk has room.
        match &self.pages {
            Some(pt) if c.arena == 1 => {
                let pad = c.ptr.next_multiple_of(pt.size) - c.ptr;
                pad == 0 || pad + c.size > merged
            }
            _ => true,
        }
    }
}
