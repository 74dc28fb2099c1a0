//! The stitched layout's page table: which virtual pages are backed by physical pages, how many live blocks touch
//! each, and the list of idle pages (mapped, touched by no live block) in the order they became idle.

use crate::bin::NIL;
use crate::source::Region;

#[derive(Clone, Copy, Debug)]
struct Page {
    live: u32,
    mapped: bool,
    /// Idle list links.
    prev: u32,
    next: u32,
}

/// Per-page state of one virtual range.
#[derive(Debug)]
pub(crate) struct PageTable {
    pub range: Region,
    pub size: u64,
    shift: u32,
    pages: Vec<Page>,
    idle_head: u32,
    idle_tail: u32,
    pub idle: u64,
    pub mapped: u64,
    /// Pages touched by at least one live block.
    pub touched: u64,
}

impl PageTable {
    pub fn new(range: Region, size: u64) -> Self {
        let n = (range.size / size) as usize;
        Self {
            range,
            size,
            shift: size.trailing_zeros(),
            pages: vec![
                Page {
                    live: 0,
                    mapped: false,
                    prev: NIL,
                    next: NIL,
                };
                n
            ],
            idle_head: NIL,
            idle_tail: NIL,
            idle: 0,
            mapped: 0,
            touched: 0,
        }
    }

    /// First and last page index that `[ptr, ptr + len)` touches.
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

    /// (pages to map, idle pages inside the span) for a block over pages `a..=b`.
    pub fn demand(&self, a: u32, b: u32) -> (u64, u64) {
        let mut need = 0;
        let mut idle_in = 0;
        for pg in &self.pages[a as usize..=b as usize] {
            if !pg.mapped {
                need += 1;
            } else if pg.live == 0 {
                idle_in += 1;
            }
        }
        (need, idle_in)
    }

    fn unlink(&mut self, p: u32) {
        let Page { prev, next, .. } = self.pages[p as usize];
        if prev == NIL {
            self.idle_head = next;
        } else {
            self.pages[prev as usize].next = next;
        }
        if next == NIL {
            self.idle_tail = prev;
        } else {
            self.pages[next as usize].prev = prev;
        }
        self.pages[p as usize].prev = NIL;
        self.pages[p as usize].next = NIL;
        self.idle -= 1;
    }

    fn push_idle(&mut self, p: u32) {
        self.pages[p as usize].prev = self.idle_tail;
        self.pages[p as usize].next = NIL;
        if self.idle_tail == NIL {
            self.idle_head = p;
        } else {
            self.pages[self.idle_tail as usize].next = p;
        }
        self.idle_tail = p;
        self.idle += 1;
    }

    /// A live block now touches pages `a..=b` (mapped or not).
    pub fn acquire(&mut self, a: u32, b: u32) {
        for p in a..=b {
            let pg = self.pages[p as usize];
            if pg.live == 0 {
                if pg.mapped {
                    self.unlink(p);
                }
                self.touched += 1;
            }
            self.pages[p as usize].live += 1;
        }
    }

    /// A live block over pages `a..=b` went away; mapped pages no longer touched become idle.
    pub fn release(&mut self, a: u32, b: u32) {
        for p in a..=b {
            let pg = &mut self.pages[p as usize];
            pg.live -= 1;
            if pg.live == 0 {
                self.touched -= 1;
                if pg.mapped {
                    self.push_idle(p);
                }
            }
        }
    }

    /// Takes the page that has been idle longest, unbacking it; returns its index.
    pub fn take_idle(&mut self) -> Option<u32> {
        let p = self.idle_head;
        if p == NIL {
            return None;
        }
        self.unlink(p);
        self.pages[p as usize].mapped = false;
        self.mapped -= 1;
        Some(p)
    }

    /// Gives a page taken by [`take_idle`](Self::take_idle) back (a failed map).
    pub fn restore_idle(&mut self, p: u32) {
        self.pages[p as usize].mapped = true;
        self.mapped += 1;
        self.push_idle(p);
    }

    /// Pages `a..a+n` are now backed.
    pub fn set_mapped(&mut self, a: u32, n: u32) {
        for p in a..a + n {
            let pg = &mut self.pages[p as usize];
            debug_assert!(!pg.mapped);
            pg.mapped = true;
            self.mapped += 1;
            if pg.live == 0 {
                self.push_idle(p);
            }
        }
    }

    /// Unbacks idle page `p` (trim).
    pub fn unmap_idle(&mut self, p: u32) {
        self.unlink(p);
        self.pages[p as usize].mapped = false;
        self.mapped -= 1;
    }

    /// Indices of all idle pages, in list order.
    pub fn idle_pages(&self, out: &mut Vec<u32>) {
        out.clear();
        let mut p = self.idle_head;
        while p != NIL {
            out.push(p);
            p = self.pages[p as usize].next;
        }
    }

    pub fn len(&self) -> u32 {
        self.pages.len() as u32
    }
}
