//! The invariants, recounted from the chunk lists and the page table.

use super::Inner;
use crate::bin::{GRANULE, NIL, State, bin_of};
use crate::source::MemorySource;
use crate::tenant::Tenant;

impl<S: MemorySource> Inner<S> {
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        let ch = &self.chunks.v;
        let mut in_use = 0u64;
        let mut live = 0u64;
        let mut free_bytes = 0u64;
        let mut free_count = 0u64;
        let mut reserved = 0u64;
        let mut per_tenant = vec![0u64; self.tenants.len()];
        let mut seen = 0usize;
        for (slot, r) in self.regions.iter().enumerate() {
            if !r.live {
                continue;
            }
            reserved += r.region.size;
            let mut i = r.first;
            let mut addr = r.region.base;
            let mut prev = NIL;
            while i != NIL {
                let c = &ch[i as usize];
                seen += 1;
                if c.ptr != addr {
                    return Err(format!(
                        "chunk {i} at {:#x}, expected {addr:#x} (gap or overlap)",
                        c.ptr
                    ));
                }
                if c.ptr % GRANULE != 0 || c.size % GRANULE != 0 || c.size == 0 {
                    return Err(format!(
                        "chunk {i} {:#x}+{} is not aligned to {GRANULE}",
                        c.ptr, c.size
                    ));
                }
                if c.prev != prev {
                    return Err(format!("chunk {i}: prev link {} != {prev}", c.prev));
                }
                if c.region != slot as u32 {
                    return Err(format!(
                        "chunk {i} names region {} but lies in {slot}",
                        c.region
                    ));
                }
                match c.state {
                    State::Used => {
                        in_use += c.size;
                        live += 1;
                        per_tenant[usize::from(c.tenant)] += c.size;
                    }
                    State::Free => {
                        free_bytes += c.size;
                        free_count += 1;
                        if prev != NIL && ch[prev as usize].state == State::Free {
                            return Err(format!(
                                "free chunks {prev} and {i} are neighbours (not coalesced)"
                            ));
                        }
                    }
                    State::Vacant => {
                        return Err(format!("vacant chunk {i} is linked into region {slot}"));
                    }
                    // Every caller finishes a parked free first.
                    State::Parked => {
                        return Err(format!("chunk {i} is still parked during a check"));
                    }
                }
                addr += c.size;
                prev = i;
                i = c.next;
            }
            if addr != r.region.end() {
                return Err(format!(
                    "region {slot} chunks end at {addr:#x}, region at {:#x}",
                    r.region.end()
                ));
            }
        }
        if seen + self.chunks.vacant_count as usize != ch.len() {
            return Err(format!(
                "{seen} linked + {} vacant chunks != slab of {}",
                self.chunks.vacant_count,
                ch.len()
            ));
        }
        let mut binned = 0u64;
        let mut bad = None;
        for (arena, bins) in self.bins.iter().enumerate() {
            bins.for_each(ch, |b, i| {
                binned += 1;
                let c = &ch[i as usize];
                if c.state != State::Free || bin_of(c.size) != b || usize::from(c.arena) != arena {
                    bad = Some(format!(
                        "chunk {i} ({:?}, {} B, arena {}) in bin {b} of arena {arena}",
                        c.state, c.size, c.arena
                    ));
                }
            });
        }
        if let Some(e) = bad {
            return Err(e);
        }
        for bins in &self.bins {
            bins.check_threads(ch)?;
        }
        let (count, bytes) = (self.bins[0].count + self.bins[1].count, self.free_bytes());
        if binned != free_count || count != free_count || bytes != free_bytes {
            return Err(format!(
                "bins hold {binned} chunks ({count} counted, {bytes} B), regions {free_count} free chunks ({free_bytes} B)"
            ));
        }
        if in_use != self.c.in_use || live != self.c.live_blocks {
            return Err(format!(
                "recount: {in_use} B in {live} blocks, stats say {} B in {}",
                self.c.in_use, self.c.live_blocks
            ));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if per_tenant[i] != t.in_use {
                return Err(format!(
                    "tenant {}: recount {} B, stats {} B",
                    t.name, per_tenant[i], t.in_use
                ));
            }
            if let Some(l) = t.limits.limit {
                if t.in_use > l {
                    return Err(format!(
                        "tenant {} uses {} B over its limit {l}",
                        t.name, t.in_use
                    ));
                }
            }
        }
        let unmet: u64 = self.tenants.iter().map(Tenant::unmet_reserve).sum();
        if unmet != self.unmet_total {
            return Err(format!(
                "unmet reserves {unmet} != tracked {}",
                self.unmet_total
            ));
        }
        if in_use + unmet > self.limit {
            return Err(format!(
                "in use {in_use} + unmet reserves {unmet} exceed the limit {}",
                self.limit
            ));
        }
        match &self.pages {
            None => {
                if in_use + free_bytes != reserved || reserved != self.c.reserved {
                    return Err(format!(
                        "in use {in_use} + free {free_bytes} != reserved {reserved} (stats {})",
                        self.c.reserved
                    ));
                }
                if self.caches() && reserved > self.limit {
                    return Err(format!("reserved {reserved} over the limit {}", self.limit));
                }
            }
            Some(pt) => {
                let mut counts = vec![0u32; pt.len() as usize];
                for r in self.regions.iter().filter(|r| r.live) {
                    let mut i = r.first;
                    while i != NIL {
                        let c = &ch[i as usize];
                        if c.state == State::Used {
                            let (a, b) = pt.span(c.ptr, c.size);
                            for p in a..=b {
                                counts[p as usize] += 1;
                                if !pt.is_mapped(p) {
                                    return Err(format!("live chunk {i} on unmapped page {p}"));
                                }
                            }
                        }
                        i = c.next;
                    }
                }
                let mut mapped = 0;
                let mut idle = 0;
                let mut ready = 0;
                let mut retired = 0;
                let mut touched = 0;
                for (p, &n) in counts.iter().enumerate() {
                    if pt.live(p as u32) != n {
                        return Err(format!(
                            "page {p}: {} live recorded, {n} recounted",
                            pt.live(p as u32)
                        ));
                    }
                    let (is_retired, _, retired_use) = pt.state(p as u32);
                    if is_retired {
                        retired += 1;
                        if n > 0 || pt.is_mapped(p as u32) {
                            return Err(format!(
                                "retired page {p} (last use at point {retired_use}) is live or owns a page"
                            ));
                        }
                    }
                    if pt.is_mapped(p as u32) {
                        mapped += 1;
                        if n == 0 {
                            idle += 1;
                            let (_, is_ready, last_use) = pt.state(p as u32);
                            ready += u64::from(is_ready);
                            if is_ready != (last_use <= pt.passed) {
                                return Err(format!(
                                    "idle page {p}: ready {is_ready}, last use at point {last_use}, the stream \
                                     passed point {}",
                                    pt.passed
                                ));
                            }
                        }
                    }
                    if n > 0 {
                        touched += 1;
                    }
                }
                if mapped != pt.mapped || idle != pt.idle || touched != pt.touched {
                    return Err(format!(
                        "pages: {mapped} mapped / {idle} idle / {touched} touched, tracked {} / {} / {}",
                        pt.mapped, pt.idle, pt.touched
                    ));
                }
                if ready != pt.ready || retired != pt.retired {
                    return Err(format!(
                        "{ready} idle pages ready and {retired} retired, tracked {} and {}",
                        pt.ready, pt.retired
                    ));
                }
                if mapped * pt.size != self.c.reserved {
                    return Err(format!("reserved {} != {mapped} pages", self.c.reserved));
                }
                if mapped > self.page_limit.max(1) {
                    return Err(format!(
                        "{mapped} pages mapped over the page limit {}",
                        self.page_limit
                    ));
                }
            }
        }
        Ok(())
    }
}
