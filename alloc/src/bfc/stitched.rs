//! The stitched layout: one virtual range, two arenas, physical pages mapped under live blocks and moved from
//! idle ones.

use super::{Inner, PlaceError, RegionEntry, source_error};
use crate::bin::{Chunk, Links, NIL, State};
use crate::config::Backend;
use crate::error::{OomCause, Result};
use crate::events::EventKind;
use crate::fault::Fault;
use crate::pages::PageTable;
use crate::source::{MemorySource, Region, SourceError};
use crate::tenant::TenantId;

impl<S: MemorySource> Inner<S> {
    /// Lays out the virtual range when the source offers pages and the backend caches.
    pub(super) fn stitch(&mut self) -> Result<()> {
        if self.config.backend != Backend::Bfc {
            return Ok(());
        }
        let Some(paged) = self.source.paged() else {
            return Ok(());
        };
        let page = paged.page_size();
        let range = paged
            .virtual_range()
            .map_err(|e| source_error(e, "virtual range"))?;
        let pt = PageTable::new(range, page);
        // Two arenas: small blocks from the lower half, large ones from the upper half, so that the churn
        // of small blocks never splits the holes large blocks come back to.
        let half = (range.size / 2).next_multiple_of(page).min(range.size);
        let arenas = [
            Region {
                base: range.base,
                size: half,
            },
            Region {
                base: range.base + half,
                size: range.size - half,
            },
        ];
        for (arena, r) in arenas.into_iter().enumerate() {
            if r.size == 0 {
                continue;
            }
            let idx = self.chunks.add(Chunk {
                ptr: r.base,
                size: r.size,
                prev: NIL,
                next: NIL,
                tree: Links::NONE,
                region: self.regions.len() as u32,
                tenant: 0,
                arena: arena as u8,
                state: State::Free,
            });
            self.regions.push(RegionEntry {
                region: r,
                first: idx,
                live: true,
            });
            self.bin_insert(idx);
        }
        self.large = self.config.large_block;
        self.page_limit = self.limit / page;
        self.pages = Some(pt);
        Ok(())
    }

    /// Best fit in the arena of the request's size class, moved onto backed pages where it would need new ones,
    /// then the block's pages backed.
    pub(super) fn place_stitched(
        &mut self,
        rounded: u64,
        tenant: TenantId,
    ) -> std::result::Result<u32, PlaceError> {
        let arena = self.arena_for(rounded);
        let Some(first) = self.bins[arena].best_fit(&self.chunks.v, rounded) else {
            return Err(PlaceError::Oom(OomCause::Fragmentation));
        };
        let natural = self.natural_start(first, arena, rounded);
        let pt = self
            .pages
            .as_ref()
            .expect("stitched layout has a page table");
        let (a, b) = pt.span(natural, rounded);
        if pt.backed(a, b) {
            return self.finish_stitched(first, natural, rounded, tenant);
        }
        let (i, start) = self.on_backed_pages(first, natural, arena, rounded)?;
        self.finish_stitched(i, start, rounded, tenant)
    }

    /// Where a block whose best fit (chunk `first` at `natural`) lands on unbacked pages goes instead: among the
    /// free chunks that fit, from the best fit on ([`Config::placement_candidates`](crate::Config) of them and the
    /// arena's largest), the place with the fewest pages to back, clear of retired pages the stream has not passed
    /// (backing one waits for it); the best fit's chunk and place on a tie.
    ///
    /// Why: in a training step the pages touched over the step outnumber those touched at its peak, since blocks
    /// land where best fit puts them, not where physical pages are. Each page a block lands on beyond the backed
    /// ones is a move (driver calls on the host), and the page it came from is wanted back later in the step: on
    /// transformer-lm plain best fit moved about 300 pages a step in steady state (crate docs).
    fn on_backed_pages(
        &mut self,
        first: u32,
        natural: u64,
        arena: usize,
        rounded: u64,
    ) -> std::result::Result<(u32, u64), PlaceError> {
        if self.pages.as_ref().expect("page table").retired > 0 {
            // The stream may have passed them by now.
            self.refresh_points(!self.no_sync)?;
            self.unmap_retired();
        }
        let pt = self.pages.as_ref().expect("page table");
        let (a, b) = pt.span(natural, rounded);
        let d = pt.demand(a, b);
        let mut best = (d.retired_waiting_in == 0).then_some((first, natural, d.need));
        if best.is_some() && self.config.placement_candidates <= 1 {
            // Plain best fit: only a wait for the stream is worth a place elsewhere.
            return Ok((first, natural));
        }
        let largest = self.bins[arena].largest_chunk(&self.chunks.v);
        let mut cand = Some(first);
        let mut seen = 0;
        while let Some(i) = cand {
            if best.is_some_and(|(_, _, need)| need == 0) {
                break;
            }
            if let Some((start, need)) = self.fewest_unbacked(i, rounded)
                && best.is_none_or(|(_, _, n)| need < n)
            {
                best = Some((i, start, need));
            }
            seen += 1;
            cand = if seen < self.config.placement_candidates {
                self.bins[arena].successor(&self.chunks.v, i)
            } else if seen == self.config.placement_candidates && largest != Some(i) {
                largest
            } else {
                None
            };
        }
        // None clear of waiting retired pages: the best fit waits for the stream.
        Ok(best.map_or((first, natural), |(i, start, _)| (i, start)))
    }

    /// The page-aligned place in free chunk `i` for a block of `rounded` bytes with the fewest pages to back and
    /// no retired page the stream has not passed, and that count; `None` when the chunk has no such place.
    fn fewest_unbacked(&self, i: u32, rounded: u64) -> Option<(u64, u64)> {
        let c = self.chunks.v[i as usize];
        let pt = self.pages.as_ref().expect("page table");
        let start = c.ptr.next_multiple_of(pt.size);
        if start + rounded > c.ptr + c.size {
            return None;
        }
        let n = rounded.div_ceil(pt.size) as u32;
        let (first, _) = pt.span(start, rounded);
        // The page of the last place the block fits: its boundary is at or before that place.
        let (last, _) = pt.span(c.ptr + c.size - rounded, rounded);
        let (p, need) = pt.fewest_unbacked(first, last, n)?;
        Some((pt.va(p), need))
    }

    /// Where a block of `rounded` bytes cut from the front of free chunk `i` starts: on a page boundary in the large
    /// arena where the chunk has room (it then touches no page more than its size needs: 0.30 % instead of 1.39 %
    /// on transformer-lm), else at the chunk's start.
    fn natural_start(&self, i: u32, arena: usize, rounded: u64) -> u64 {
        let c = self.chunks.v[i as usize];
        let aligned = c
            .ptr
            .next_multiple_of(self.pages.as_ref().expect("page table").size);
        if arena == 1 && aligned - c.ptr + rounded <= c.size {
            aligned
        } else {
            c.ptr
        }
    }

    /// Cuts the block from free chunk `i` at `start` and backs its pages.
    fn finish_stitched(
        &mut self,
        mut i: u32,
        start: u64,
        rounded: u64,
        tenant: TenantId,
    ) -> std::result::Result<u32, PlaceError> {
        // The padding in front of the block stays a free chunk.
        let pad = start - self.chunks.v[i as usize].ptr;
        if pad > 0 {
            i = self.split_front(i, pad);
        }
        let i = self.carve(i, rounded, tenant);
        let ptr = self.chunks.v[i as usize].ptr;
        match self.back_pages(ptr, rounded) {
            Ok(()) => Ok(i),
            Err(e) => {
                self.coalesce(i);
                Err(e)
            }
        }
    }

    /// Makes every page under `[ptr, ptr + len)` backed and counts the block on them.
    ///
    /// Pages come from idle pages beyond the slack (moved: no wait, see [`crate::pages`]), then new ones while under
    /// the page limit, then the slack's idle pages. Only a retired page the block lands on before the stream has
    /// passed its last use is waited for (counted: [`Counters::synchronising_moves`](crate::Counters)).
    pub(super) fn back_pages(&mut self, ptr: u64, len: u64) -> std::result::Result<(), PlaceError> {
        let page_limit = self.page_limit;
        let no_reuse = self.faulty(Fault::NoPageReuse);
        let create_first = no_reuse || self.faulty(Fault::CreateOverMove);
        let pt = self
            .pages
            .as_mut()
            .expect("stitched layout has a page table");
        let (a, b) = pt.span(ptr, len);
        if pt.acquire_backed(a, b) {
            return Ok(());
        }
        // A stream that may be capturing a graph gets no point recorded on it.
        self.refresh_points(!self.no_sync)?;
        self.unmap_retired();
        let pt = self.pages.as_ref().expect("page table");
        let d = pt.demand(a, b);
        if d.retired_waiting_in > 0 {
            if self.no_sync {
                return Err(PlaceError::Oom(OomCause::DeviceFull));
            }
            let point = pt.newest_retired_point(a, b);
            self.wait_point(point)?;
            self.unmap_retired();
            self.c.synchronising_moves += d.retired_waiting_in;
        }
        let pt = self.pages.as_mut().expect("page table");
        let slack = self.config.idle_page_slack;
        let idle_avail = pt.idle - d.idle_in;
        let mut create = if create_first {
            d.need
        } else if idle_avail > slack {
            d.need.saturating_sub(idle_avail - slack)
        } else {
            d.need
        };
        create = create.min(page_limit.saturating_sub(pt.mapped));
        let moves = d.need - create;
        if moves > idle_avail || (no_reuse && moves > 0) {
            return Err(PlaceError::Oom(OomCause::DeviceFull));
        }
        pt.acquire(a, b);
        let mut moves_left = moves;
        let mut p = a;
        while p <= b {
            let pt = self.pages.as_ref().expect("page table");
            if pt.is_mapped(p) {
                p += 1;
                continue;
            }
            let start = p;
            while p <= b && !pt.is_mapped(p) {
                p += 1;
            }
            let run = p - start;
            let m = u64::from(run).min(moves_left);
            if let Err(e) = self.map_run(start, run, m) {
                let pt = self.pages.as_mut().expect("page table");
                pt.release(a, b);
                return Err(e);
            }
            moves_left -= m;
        }
        // Ready pages moved away keep no mapping they do not need.
        self.unmap_retired();
        Ok(())
    }

    /// Backs pages `start..start+run`, moving `moves` idle pages and creating the rest, in one source call.
    pub(super) fn map_run(
        &mut self,
        start: u32,
        run: u32,
        moves: u64,
    ) -> std::result::Result<(), PlaceError> {
        let pt = self.pages.as_mut().expect("page table");
        self.scratch.clear();
        self.scratch_pages.clear();
        for _ in 0..moves {
            match pt.take_idle() {
                Some(q) => {
                    self.scratch_pages.push(q);
                    self.scratch.push(pt.va(q));
                }
                None => break,
            }
        }
        let va = pt.va(start);
        let page = pt.size;
        let paged = self
            .source
            .paged()
            .expect("stitched layout has a paged source");
        match paged.map(va, u64::from(run), &self.scratch) {
            Ok(()) => {
                let pt = self.pages.as_mut().expect("page table");
                pt.set_mapped(start, run);
                let moved = self.scratch.len() as u64;
                self.c.map_calls += 1;
                self.c.page_moves += moved;
                self.c.page_creates += u64::from(run) - moved;
                self.c.reserved = pt.mapped * page;
                self.c.peak_reserved = self.c.peak_reserved.max(self.c.reserved);
                self.record(EventKind::Map, TenantId::DEFAULT, u64::from(run) * page, va);
                Ok(())
            }
            Err(e) => {
                let pt = self.pages.as_mut().expect("page table");
                for &q in self.scratch_pages.iter().rev() {
                    pt.restore_idle(q);
                }
                match e {
                    SourceError::OutOfMemory { .. } => Err(PlaceError::Oom(OomCause::DeviceFull)),
                    SourceError::Failed(e) => Err(PlaceError::Fatal(e)),
                }
            }
        }
    }

    /// Unmaps every idle and retired page, in runs, once the stream has passed their last use (waited for when
    /// it has not).
    pub(super) fn trim_pages(&mut self) {
        if let Err(e) = self.settle_points() {
            tracing::error!(
                "trim: waiting for the stream: {}",
                super::describe_place(&e)
            );
        }
        // Retired mappings first: a physical page is released with its last mapping.
        self.unmap_retired();
        let pt = self
            .pages
            .as_ref()
            .expect("stitched layout has a page table");
        let mut idle = std::mem::take(&mut self.scratch_pages);
        pt.ready_pages(&mut idle);
        if self.faulty(Fault::TrimKeepsOne) {
            idle.pop();
        }
        let mut k = 0;
        while k < idle.len() {
            let start = idle[k];
            let mut n = 1;
            while k + (n as usize) < idle.len() && idle[k + n as usize] == start + n {
                n += 1;
            }
            k += n as usize;
            let pt = self.pages.as_mut().expect("page table");
            let va = pt.va(start);
            let page = pt.size;
            let paged = self.source.paged().expect("paged source");
            match paged.unmap(va, u64::from(n)) {
                Ok(()) => {
                    let pt = self.pages.as_mut().expect("page table");
                    for p in start..start + n {
                        pt.unmap_idle(p);
                    }
                    self.c.page_releases += u64::from(n);
                    self.c.reserved = pt.mapped * page;
                    self.record(EventKind::Unmap, TenantId::DEFAULT, u64::from(n) * page, va);
                }
                Err(e) => {
                    tracing::error!("trim: unmapping {n} pages: {}", source_error(e, "unmap"))
                }
            }
        }
        self.scratch_pages = idle;
    }
}
