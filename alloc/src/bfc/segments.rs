//! The segment layouts: regions reserved from the source (on demand or up front), given back when wholly free.

use super::{Inner, PlaceError, RegionEntry, source_error};
use crate::bin::{Chunk, GRANULE, Links, NIL, State};
use crate::config::Policy;
use crate::error::{OomCause, Result};
use crate::events::EventKind;
use crate::fault::Fault;
use crate::source::{MemorySource, SourceError};
use crate::tenant::TenantId;

const MIB: u64 = 1 << 20;

/// Region size for a segment-policy growth step of `rounded` bytes: small requests share 2 MiB regions, medium
/// ones 20 MiB regions, large ones get their own size rounded to 2 MiB (PyTorch's classes, which waste little on
/// real traces; the BFC mixes all sizes in every region).
fn growth_size(rounded: u64) -> u64 {
    if rounded <= MIB {
        2 * MIB
    } else if rounded <= 10 * MIB {
        20 * MIB
    } else {
        rounded.next_multiple_of(2 * MIB)
    }
}

impl<S: MemorySource> Inner<S> {
    pub(super) fn place_segments(
        &mut self,
        rounded: u64,
        tenant: TenantId,
    ) -> std::result::Result<u32, PlaceError> {
        let fit = self.bins[0].best_fit(&self.chunks.v, rounded);
        let fit = fit.filter(|_| !(self.faulty(Fault::GrowBeforeFit) && self.grow_room(rounded)));
        let i = match fit {
            Some(i) => i,
            None => {
                let may_grow = !self.caches() || self.config.policy == Policy::Growth;
                if !may_grow {
                    return Err(PlaceError::Oom(self.shortage_cause(rounded)));
                }
                self.grow(rounded)?
            }
        };
        Ok(self.carve(i, rounded, tenant))
    }

    /// Whether the pool may grow by a region for `rounded` bytes.
    fn grow_room(&self, rounded: u64) -> bool {
        self.config.policy == Policy::Growth
            && self.limit.saturating_sub(self.c.reserved) >= rounded
    }

    pub(super) fn shortage_cause(&self, rounded: u64) -> OomCause {
        let may_grow = !self.caches() || self.config.policy == Policy::Growth;
        let room = if may_grow {
            self.limit.saturating_sub(self.c.reserved)
        } else {
            0
        };
        if self.free_bytes() + room >= rounded {
            OomCause::Fragmentation
        } else {
            OomCause::DeviceFull
        }
    }

    /// Reserves a new region for a request of `rounded` bytes; returns its one free chunk.
    pub(super) fn grow(&mut self, rounded: u64) -> std::result::Result<u32, PlaceError> {
        let room = self.limit.saturating_sub(self.c.reserved);
        if rounded > room {
            return Err(PlaceError::Oom(self.shortage_cause(rounded)));
        }
        let want = if self.caches() {
            growth_size(rounded)
                .min(room / GRANULE * GRANULE)
                .max(rounded)
        } else {
            rounded
        };
        match self.add_region(want) {
            Ok(i) => Ok(i),
            Err(PlaceError::Oom(_)) if want > rounded => self.add_region(rounded),
            Err(e) => Err(e),
        }
    }

    pub(super) fn add_region(&mut self, bytes: u64) -> std::result::Result<u32, PlaceError> {
        let region = match self.source.reserve(bytes) {
            Ok(r) => r,
            Err(SourceError::OutOfMemory { .. }) => {
                return Err(PlaceError::Oom(OomCause::DeviceFull));
            }
            Err(SourceError::Failed(e)) => return Err(PlaceError::Fatal(e)),
        };
        let slot = match self.regions.iter().position(|r| !r.live) {
            Some(s) => s,
            None => {
                self.regions.push(RegionEntry {
                    region,
                    first: NIL,
                    live: false,
                });
                self.regions.len() - 1
            }
        };
        let idx = self.chunks.add(Chunk {
            ptr: region.base,
            size: region.size,
            prev: NIL,
            next: NIL,
            tree: Links::NONE,
            region: slot as u32,
            tenant: 0,
            arena: 0,
            state: State::Free,
        });
        self.regions[slot] = RegionEntry {
            region,
            first: idx,
            live: true,
        };
        self.bin_insert(idx);
        self.c.reserved += region.size;
        self.c.peak_reserved = self.c.peak_reserved.max(self.c.reserved);
        self.c.source_reserves += 1;
        self.record(
            EventKind::Reserve,
            TenantId::DEFAULT,
            region.size,
            region.base,
        );
        Ok(idx)
    }

    /// Releases region `slot`, whose one chunk is free.
    pub(super) fn release_region(&mut self, slot: u32) -> Result<()> {
        let entry = self.regions[slot as usize];
        let first = entry.first;
        self.source
            .release(entry.region)
            .map_err(|e| source_error(e, "release"))?;
        self.bin_remove(first);
        self.chunks.vacate(first);
        self.regions[slot as usize].live = false;
        self.c.reserved -= entry.region.size;
        self.c.source_releases += 1;
        self.record(
            EventKind::Release,
            TenantId::DEFAULT,
            entry.region.size,
            entry.region.base,
        );
        Ok(())
    }

    /// Releases every region that is one free chunk.
    pub(super) fn trim_regions(&mut self) {
        let mut keep = usize::from(self.faulty(Fault::TrimKeepsOne));
        for slot in 0..self.regions.len() {
            let r = self.regions[slot];
            if !r.live {
                continue;
            }
            let c = self.chunks.v[r.first as usize];
            if c.state == State::Free && c.next == NIL {
                if keep > 0 {
                    keep -= 1;
                    continue;
                }
                if let Err(e) = self.release_region(slot as u32) {
                    tracing::error!("trim: {e}");
                }
            }
        }
    }
}
