//! Cutting free chunks for blocks and joining freed ones with their free neighbours.
//!
//! The common case is a block cut from the front of a large free chunk and later given back to it: the free chunk
//! keeps its slot and, where its (size, address) order among the other free chunks of its bin allows, its place in
//! the bin's treap, so that neither costs a treap insertion or removal.

use super::Inner;
use crate::bin::{Chunk, GRANULE, Links, NIL, State};
use crate::source::MemorySource;
use crate::tenant::TenantId;

impl<S: MemorySource> Inner<S> {
    /// Cuts a used block of `rounded` bytes from the front of free chunk `i`; returns the block's chunk.
    pub(super) fn carve(&mut self, i: u32, rounded: u64, tenant: TenantId) -> u32 {
        let c = self.chunks.v[i as usize];
        if c.size - rounded < GRANULE {
            self.bin_remove(i);
            return self.mark_used(i, tenant);
        }
        let u = self
            .chunks
            .add(piece_of(&c, c.ptr, rounded, (c.prev, i), tenant));
        self.link_before(i, u);
        self.resize_free(i, c.ptr + rounded, c.size - rounded);
        u
    }

    /// Splits free chunk `i` after its first `pad` bytes; returns the (free, binned) second part.
    pub(super) fn split_front(&mut self, i: u32, pad: u64) -> u32 {
        let c = self.chunks.v[i as usize];
        let j = self.chunks.add(Chunk {
            ptr: c.ptr + pad,
            size: c.size - pad,
            prev: i,
            next: c.next,
            tree: Links::NONE,
            region: c.region,
            tenant: 0,
            arena: c.arena,
            state: State::Free,
        });
        if c.next != NIL {
            self.chunks.v[c.next as usize].prev = j;
        }
        self.chunks.v[i as usize].next = j;
        self.resize_free(i, c.ptr, pad);
        self.bin_insert(j);
        j
    }

    /// Gives used chunk `i` back: merged with its free neighbours into one free chunk, which is returned binned.
    pub(super) fn coalesce(&mut self, i: u32) -> u32 {
        let c = self.chunks.v[i as usize];
        let prev_free = c.prev != NIL && self.chunks.v[c.prev as usize].state == State::Free;
        let next_free = c.next != NIL && self.chunks.v[c.next as usize].state == State::Free;
        match (prev_free, next_free) {
            (false, false) => {
                self.chunks.v[i as usize].state = State::Free;
                self.bin_insert(i);
                i
            }
            (true, false) => {
                let p = self.chunks.v[c.prev as usize];
                self.unlink(i);
                self.resize_free(c.prev, p.ptr, p.size + c.size);
                c.prev
            }
            (false, true) => {
                let n = self.chunks.v[c.next as usize];
                self.unlink(i);
                self.resize_free(c.next, c.ptr, n.size + c.size);
                c.next
            }
            (true, true) => {
                let (p, n) = (self.chunks.v[c.prev as usize], c.next);
                let n_size = self.chunks.v[n as usize].size;
                self.bin_remove(n);
                self.unlink(n);
                self.unlink(i);
                self.resize_free(c.prev, p.ptr, p.size + c.size + n_size);
                c.prev
            }
        }
    }

    fn mark_used(&mut self, i: u32, tenant: TenantId) -> u32 {
        let ci = &mut self.chunks.v[i as usize];
        ci.state = State::Used;
        ci.tenant = tenant.0;
        i
    }

    /// Changes free, binned chunk `i` to span `[ptr, ptr + size)`, keeping its bin place where the order allows.
    fn resize_free(&mut self, i: u32, ptr: u64, size: u64) {
        let a = usize::from(self.chunks.v[i as usize].arena);
        self.bins[a].resize(&mut self.chunks.v, i, ptr, size);
    }

    /// Links chunk `u` (already naming `i` as its next and `i`'s old prev as its prev) in front of chunk `i`.
    fn link_before(&mut self, i: u32, u: u32) {
        let prev = self.chunks.v[i as usize].prev;
        if prev == NIL {
            let region = self.chunks.v[i as usize].region;
            self.regions[region as usize].first = u;
        } else {
            self.chunks.v[prev as usize].next = u;
        }
        self.chunks.v[i as usize].prev = u;
    }

    /// Takes chunk `i` out of its address list and vacates its slot (its bytes now belong to a neighbour).
    fn unlink(&mut self, i: u32) {
        let c = self.chunks.v[i as usize];
        if c.prev == NIL {
            self.regions[c.region as usize].first = c.next;
        } else {
            self.chunks.v[c.prev as usize].next = c.next;
        }
        if c.next != NIL {
            self.chunks.v[c.next as usize].prev = c.prev;
        }
        self.chunks.vacate(i);
    }
}

/// A used chunk of `size` bytes at `ptr`, cut from free chunk `c`, between address neighbours `(prev, next)`.
fn piece_of(c: &Chunk, ptr: u64, size: u64, (prev, next): (u32, u32), tenant: TenantId) -> Chunk {
    Chunk {
        ptr,
        size,
        prev,
        next,
        tree: Links::NONE,
        region: c.region,
        tenant: tenant.0,
        arena: c.arena,
        state: State::Used,
    }
}
