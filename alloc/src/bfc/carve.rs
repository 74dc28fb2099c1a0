//! Cutting free chunks for blocks and joining freed ones with their free neighbours.

use super::Inner;
use crate::bin::{Chunk, GRANULE, NIL, State};
use crate::source::MemorySource;
use crate::tenant::TenantId;

impl<S: MemorySource> Inner<S> {
    /// Takes free chunk `i` out of its bin, splits off what is beyond `rounded`, marks it used.
    pub(super) fn carve(&mut self, i: u32, rounded: u64, tenant: TenantId) -> u32 {
        self.bin_remove(i);
        if self.chunks.v[i as usize].size - rounded >= GRANULE {
            let r = self.split_off(i, rounded);
            self.bin_insert(r);
        }
        let ci = &mut self.chunks.v[i as usize];
        ci.state = State::Used;
        ci.tenant = tenant.0;
        i
    }

    /// Marks used chunk `i` free and merges it with free neighbours; returns the merged chunk (not yet in a bin).
    pub(super) fn coalesce(&mut self, mut i: u32) -> u32 {
        self.chunks.v[i as usize].state = State::Free;
        let prev = self.chunks.v[i as usize].prev;
        if prev != NIL && self.chunks.v[prev as usize].state == State::Free {
            self.bin_remove(prev);
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.chunks.v[i as usize].next;
        if next != NIL && self.chunks.v[next as usize].state == State::Free {
            self.bin_remove(next);
            self.absorb_next(i);
        }
        i
    }

    /// Chunk `i` swallows its next neighbour.
    pub(super) fn absorb_next(&mut self, i: u32) {
        let n = self.chunks.v[i as usize].next;
        let nc = self.chunks.v[n as usize];
        let ci = &mut self.chunks.v[i as usize];
        ci.size += nc.size;
        ci.next = nc.next;
        if nc.next != NIL {
            self.chunks.v[nc.next as usize].prev = i;
        }
        self.chunks.vacate(n);
    }

    /// Splits free chunk `i` after its first `pad` bytes; returns the (free) second part.
    pub(super) fn split_front(&mut self, i: u32, pad: u64) -> u32 {
        self.bin_remove(i);
        let j = self.split_off(i, pad);
        self.bin_insert(i);
        self.bin_insert(j);
        j
    }

    /// Cuts chunk `i` (in no bin) at byte `at`; the second part becomes a free chunk linked after it (in no bin).
    pub(super) fn split_off(&mut self, i: u32, at: u64) -> u32 {
        let c = self.chunks.v[i as usize];
        let j = self.chunks.add(Chunk {
            ptr: c.ptr + at,
            size: c.size - at,
            prev: i,
            next: c.next,
            left: NIL,
            right: NIL,
            region: c.region,
            tenant: 0,
            arena: c.arena,
            state: State::Free,
        });
        if c.next != NIL {
            self.chunks.v[c.next as usize].prev = j;
        }
        let ci = &mut self.chunks.v[i as usize];
        ci.next = j;
        ci.size = at;
        j
    }

    /// Like [`carve`](Self::carve), but the block takes the end of free chunk `i`.
    pub(super) fn carve_end(&mut self, i: u32, rounded: u64, tenant: TenantId) -> u32 {
        let c = self.chunks.v[i as usize];
        if c.size - rounded < GRANULE {
            return self.carve(i, rounded, tenant);
        }
        self.bin_remove(i);
        let u = self.chunks.add(Chunk {
            ptr: c.ptr + c.size - rounded,
            size: rounded,
            prev: i,
            next: c.next,
            left: NIL,
            right: NIL,
            region: c.region,
            tenant: tenant.0,
            arena: c.arena,
            state: State::Used,
        });
        if c.next != NIL {
            self.chunks.v[c.next as usize].prev = u;
        }
        let ci = &mut self.chunks.v[i as usize];
        ci.next = u;
        ci.size -= rounded;
        self.bin_insert(i);
        u
    }
}
