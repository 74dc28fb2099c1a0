//! The stitched layout's page table: which virtual pages own a physical page, how many live blocks touch each, the
//! idle pages (owning one, touched by no live block), and the retired ones (still mapped to a physical page that a
//! move gave to another virtual page, until the stream has passed their last use).
//!
//! A page becomes idle when its last block is freed, in stream order: work queued before the free may still use it.
//! It is stamped with the next point to be recorded on the stream ([`PagedMemory::record_point`]): *ready* once the
//! stream has passed that point, *pending* until then. Moving an idle page's physical page needs no wait either
//! way: the block it backs next is used by work queued later, so after the old work in stream order. Only the old
//! mapping must outlive that old work; so a moved page keeps it, *retired*, until the stream passes its point, and is
//! unmapped then (at once for a ready page). A block that lands on a retired page before that waits for the stream.
//!
//! Moves take ready pages before pending ones (fewer retired mappings, none that can be waited for), the highest
//! address first: best fit fills the bottom of each arena, so the top pages are the ones least likely to be wanted
//! again soon. On the shared traces this moved 31-47 % fewer pages per pass than taking the page idle longest (crate
//! docs).
//!
//! [`PagedMemory::record_point`]: crate::PagedMemory::record_point

use crate::source::Region;

mod set;

use set::PageSet;

#[derive(Clone, Copy, Debug, Default)]
struct Page {
    live: u32,
    /// Owns a physical page.
    mapped: bool,
    /// Mapped to a physical page that now belongs to another virtual page.
    retired: bool,
    /// Idle, and the stream has passed its last use.
    ready: bool,
    /// Idle or retired: the point the stream must pass before the page may be unmapped.
    last_use: u64,
}

/// What a block over a span of pages asks of the table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Demand {
    /// Pages to back.
    pub need: u64,
    /// Idle pages inside the span (they are not there to be moved).
    pub idle_in: u64,
    /// Retired pages inside the span whose last use the stream has not passed: backing them means waiting.
    pub retired_waiting_in: u64,
}

/// Per-page state of one virtual range.
#[derive(Debug)]
pub(crate) struct PageTable {
    pub range: Region,
    pub size: u64,
    shift: u32,
    pages: Vec<Page>,
    ready_set: PageSet,
    pending_set: PageSet,
    retired_set: PageSet,
    pub idle: u64,
    /// Idle pages whose last use the stream has passed.
    pub ready: u64,
    /// Pages owning a physical page.
    pub mapped: u64,
    /// Pages still mapped to a physical page that another page owns.
    pub retired: u64,
    /// Pages touched by at least one live block.
    pub touched: u64,
    /// The number the next recorded point gets: a page idle from now is ready once it is passed.
    pub next_point: u64,
    /// The highest point the stream is known to have passed.
    pub passed: u64,
    /// The pages owning a physical page, to bound the search for backed places.
    mapped_set: PageSet,
}

impl PageTable {
    pub fn new(range: Region, size: u64) -> Self {
        let n = (range.size / size) as usize;
        Self {
            range,
            size,
            shift: size.trailing_zeros(),
            pages: vec![Page::default(); n],
            ready_set: PageSet::new(n),
            pending_set: PageSet::new(n),
            retired_set: PageSet::new(n),
            idle: 0,
            ready: 0,
            mapped: 0,
            retired: 0,
            touched: 0,
            next_point: 1,
            passed: 0,
            mapped_set: PageSet::new(n),
        }
    }

    /// First and last page index that `[ptr, ptr + len)` touches.
    #[inline]
    pub fn span(&self, ptr: u64, len: u64) -> (u32, u32) {
        let a = (ptr - self.range.base) >> self.shift;
        let b = (ptr + len - 1 - self.range.base) >> self.shift;
        (a as u32, b as u32)
    }

    pub fn va(&self, p: u32) -> u64 {
        self.range.base + (u64::from(p) << self.shift)
    }

    pub fn is_mapped(&self, p: u32) -> bool {
        self.pages[p as usize].mapped
    }

    pub fn live(&self, p: u32) -> u32 {
        self.pages[p as usize].live
    }

    /// Whether page `p` is retired, whether it is ready, and the point it waited or waits for (for the invariant
    /// check).
    pub fn state(&self, p: u32) -> (bool, bool, u64) {
        let pg = &self.pages[p as usize];
        (pg.retired, pg.ready, pg.last_use)
    }

    /// Idle pages whose last use the stream has not been seen to pass.
    pub fn pending(&self) -> u64 {
        self.idle - self.ready
    }

    /// Whether every page of `a..=b` is backed.
    #[inline]
    pub fn backed(&self, a: u32, b: u32) -> bool {
        self.pages[a as usize..=b as usize]
            .iter()
            .all(|pg| pg.mapped)
    }

    /// Among the windows of `n` pages starting at `first..=last`, the one with the fewest unbacked pages that
    /// holds no retired page the stream has not passed: its first page and that count, the lowest on a tie.
    pub fn fewest_unbacked(&self, first: u32, last: u32, n: u32) -> Option<(u32, u64)> {
        // Windows past the last backed or retired page they could reach are all unbacked and clear of retired
        // pages: the first of them does as well as any.
        let reach = (last as usize + n as usize - 1).min(self.pages.len() - 1) as u32;
        let highest = self
            .mapped_set
            .highest_at_most(reach)
            .max(self.retired_set.highest_at_most(reach));
        let bound = highest.map_or(first, |h| first.max(h + 1));
        let last = last.min(bound) as usize;
        let first = first as usize;
        let n = n as usize;
        let cost = |p: usize| -> (u64, u64) {
            match self.pages.get(p) {
                Some(pg) if !pg.mapped => (1, u64::from(pg.retired && pg.last_use > self.passed)),
                Some(_) => (0, 0),
                None => (1, 0),
            }
        };
        let (mut need, mut waiting) = (0, 0);
        for p in first..first + n {
            let (u, w) = cost(p);
            need += u;
            waiting += w;
        }
        let mut best: Option<(u32, u64)> = None;
        for s in first..=last {
            if s > first {
                let (u0, w0) = cost(s - 1);
                let (u1, w1) = cost(s + n - 1);
                need = need + u1 - u0;
                waiting = waiting + w1 - w0;
            }
            if waiting == 0 && best.is_none_or(|(_, b)| need < b) {
                best = Some((s as u32, need));
                if need == 0 {
                    break;
                }
            }
        }
        best
    }

    /// What a block over pages `a..=b` needs.
    #[inline]
    pub fn demand(&self, a: u32, b: u32) -> Demand {
        let mut d = Demand {
            need: 0,
            idle_in: 0,
            retired_waiting_in: 0,
        };
        for pg in &self.pages[a as usize..=b as usize] {
            if !pg.mapped {
                d.need += 1;
                d.retired_waiting_in += u64::from(pg.retired && pg.last_use > self.passed);
            } else if pg.live == 0 {
                d.idle_in += 1;
            }
        }
        d
    }

    #[inline]
    fn unlink(&mut self, p: u32) {
        let pg = &mut self.pages[p as usize];
        if pg.ready {
            pg.ready = false;
            self.ready_set.remove(p);
            self.ready -= 1;
        } else {
            self.pending_set.remove(p);
        }
        self.idle -= 1;
    }

    #[inline]
    fn push_ready(&mut self, p: u32) {
        self.pages[p as usize].ready = true;
        self.ready_set.insert(p);
        self.ready += 1;
        self.idle += 1;
    }

    /// A live block now touches pages `a..=b` (mapped or not).
    #[inline]
    pub fn acquire(&mut self, a: u32, b: u32) {
        for p in a as usize..b as usize + 1 {
            let pg = self.pages[p];
            if pg.live == 0 {
                if pg.mapped {
                    self.unlink(p as u32);
                }
                self.touched += 1;
            }
            self.pages[p].live += 1;
        }
    }

    /// [`acquire`](Self::acquire) when every page of `a..=b` is backed (the cached case); `false`, and nothing
    /// changed, when one is not.
    #[inline]
    pub fn acquire_backed(&mut self, a: u32, b: u32) -> bool {
        if !self.pages[a as usize..b as usize + 1]
            .iter()
            .all(|pg| pg.mapped)
        {
            return false;
        }
        self.acquire(a, b);
        true
    }

    /// A live block over pages `a..=b` went away; mapped pages no longer touched become idle, pending until the
    /// stream passes the next point recorded.
    #[inline]
    pub fn release(&mut self, a: u32, b: u32) {
        for p in a as usize..b as usize + 1 {
            let pg = &mut self.pages[p];
            pg.live -= 1;
            if pg.live == 0 {
                self.touched -= 1;
                if pg.mapped {
                    pg.last_use = self.next_point;
                    self.pending_set.insert(p as u32);
                    self.idle += 1;
                }
            }
        }
    }

    /// Whether a pending or retired page waits for a point not recorded yet.
    pub fn wants_point(&self) -> bool {
        let mut wants = false;
        let mut check = |p: u32| wants |= self.pages[p as usize].last_use >= self.next_point;
        self.pending_set.for_each(&mut check);
        self.retired_set.for_each(&mut check);
        wants
    }

    /// Point `n` was recorded: pages idle from now wait for the next one.
    pub fn recorded(&mut self, n: u64) {
        self.next_point = self.next_point.max(n + 1);
    }

    /// The stream has passed point `n`: pending pages whose last use it covers become ready.
    pub fn pass(&mut self, n: u64) {
        if n <= self.passed {
            return;
        }
        self.passed = n;
        let mut i = 0;
        while let Some(i0) = self.pending_set.next_word(i) {
            // A copy of the word, so that its members can leave the set as they are visited.
            let mut w = self.pending_set.l0[i0];
            while w != 0 {
                let p = (i0 * 64 + w.trailing_zeros() as usize) as u32;
                w &= w - 1;
                if self.pages[p as usize].last_use <= n {
                    self.pending_set.remove(p);
                    self.idle -= 1;
                    self.push_ready(p);
                }
            }
            i = i0 + 1;
        }
    }

    /// The newest point a pending or retired page waits for (0: none): once the stream passes it, every idle page
    /// can be released and every retired one unmapped.
    pub fn newest_point(&self) -> u64 {
        let mut newest = 0;
        let mut check = |p: u32| newest = newest.max(self.pages[p as usize].last_use);
        self.pending_set.for_each(&mut check);
        self.retired_set.for_each(&mut check);
        newest
    }

    /// The newest point a retired page of `a..=b` waits for (0: none).
    pub fn newest_retired_point(&self, a: u32, b: u32) -> u64 {
        self.pages[a as usize..=b as usize]
            .iter()
            .filter(|pg| pg.retired)
            .map(|pg| pg.last_use)
            .max()
            .unwrap_or(0)
    }

    /// Takes an idle page to move its physical page elsewhere, ready ones first, the highest address first; it is
    /// retired (still mapped) until [`unretire`](Self::unretire). Returns its index.
    pub fn take_idle(&mut self) -> Option<u32> {
        let p = self
            .ready_set
            .highest()
            .or_else(|| self.pending_set.highest())?;
        self.unlink(p);
        let pg = &mut self.pages[p as usize];
        pg.mapped = false;
        pg.retired = true;
        self.mapped -= 1;
        self.mapped_set.remove(p);
        self.retired += 1;
        self.retired_set.insert(p);
        Some(p)
    }

    /// Gives a page taken by [`take_idle`](Self::take_idle) back (a failed map).
    pub fn restore_idle(&mut self, p: u32) {
        self.unretire(p);
        let pg = &mut self.pages[p as usize];
        pg.mapped = true;
        self.mapped += 1;
        self.mapped_set.insert(p);
        if pg.last_use <= self.passed {
            self.push_ready(p);
        } else {
            self.pending_set.insert(p);
            self.idle += 1;
        }
    }

    /// Retired pages the stream has passed (free to unmap; all of them when not `only_passed`), ascending, into
    /// `out`.
    pub fn retired_passed(&self, only_passed: bool, out: &mut Vec<u32>) {
        out.clear();
        self.retired_set.for_each(|p| {
            if !only_passed || self.pages[p as usize].last_use <= self.passed {
                out.push(p);
            }
        });
    }

    /// Retired page `p` was unmapped.
    pub fn unretire(&mut self, p: u32) {
        let pg = &mut self.pages[p as usize];
        debug_assert!(pg.retired);
        pg.retired = false;
        self.retired -= 1;
        self.retired_set.remove(p);
    }

    /// Pages `a..a+n` now own physical pages; those no block touches (a preallocation) were never used, so are
    /// ready.
    pub fn set_mapped(&mut self, a: u32, n: u32) {
        for p in a..a + n {
            let pg = &mut self.pages[p as usize];
            debug_assert!(!pg.mapped && !pg.retired);
            pg.mapped = true;
            self.mapped += 1;
            self.mapped_set.insert(p);
            if pg.live == 0 {
                self.push_ready(p);
            }
        }
    }

    /// Unbacks ready idle page `p` (trim).
    pub fn unmap_idle(&mut self, p: u32) {
        self.unlink(p);
        self.pages[p as usize].mapped = false;
        self.mapped -= 1;
        self.mapped_set.remove(p);
    }

    /// Indices of the ready idle pages, ascending.
    pub fn ready_pages(&self, out: &mut Vec<u32>) {
        out.clear();
        self.ready_set.for_each(|p| out.push(p));
    }

    pub fn len(&self) -> u32 {
        self.pages.len() as u32
    }
}
