//! `SimMemory`: a fake address space with a capacity, touching no real memory, and a simulated stream.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::error::Error;
use crate::source::{MemorySource, PagedMemory, Region, SourceError};

mod stream;

pub use stream::SimStream;

/// First address handed out: far from zero so that a stray null never looks valid.
const BASE: u64 = 1 << 40;

/// Counts of what a [`SimMemory`] was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SimCounters {
    /// `reserve` calls that succeeded.
    pub reserves: u64,
    /// `release` calls.
    pub releases: u64,
    /// `map` calls (one per contiguous run).
    pub map_calls: u64,
    /// Physical pages created.
    pub page_creates: u64,
    /// Physical pages moved from one virtual page to another.
    pub page_moves: u64,
    /// Physical pages released by `unmap`.
    pub page_releases: u64,
    /// Points recorded on the stream.
    pub points_recorded: u64,
    /// Waits for the stream to pass a point it had not passed.
    pub stream_waits: u64,
}

/// A simulated device: addresses and a capacity, no memory behind them.
///
/// In the segment layout ([`SimMemory::new`]) every `reserve` is a new, separate region. In the stitched layout
/// ([`SimMemory::stitched`]) it models CUDA's virtual memory API: one virtual range, physical pages of
/// `page_size` bytes mapped into it on demand, moves counted (a moved physical page stays mapped at its old virtual
/// page too until that is unmapped, and is released with its last mapping). It checks every call (no double mapping, no release of
/// an unknown region), so tests and replays catch allocator bugs.
///
/// Its [`SimStream`] models the device's progress through queued work, so that the points the allocator records
/// (a page's last use) pass only when the simulated device gets there.
#[derive(Debug)]
pub struct SimMemory {
    capacity: u64,
    used: u64,
    next: u64,
    regions: BTreeMap<u64, u64>,
    paged: Option<SimPages>,
    counters: SimCounters,
    stream: SimStream,
    /// The tick each point not yet seen passed was recorded at; they are numbered `passed + 1 ..= recorded`.
    points: VecDeque<u64>,
    recorded: u64,
    passed: u64,
}

#[derive(Debug)]
struct SimPages {
    page: u64,
    range: Option<Region>,
    /// Virtual page → the physical page mapped there.
    mapped: HashMap<u64, u64>,
    /// Physical page → how many virtual pages map it (a move maps it at its new page before the old one goes).
    mappings: HashMap<u64, u32>,
    next_physical: u64,
}

impl SimMemory {
    /// A segment source of `capacity` bytes: each `reserve` is one separate region.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: 0,
            next: BASE,
            regions: BTreeMap::new(),
            paged: None,
            counters: SimCounters::default(),
            stream: SimStream::default(),
            points: VecDeque::new(),
            recorded: 0,
            passed: 0,
        }
    }

    /// A stitched source of `capacity` bytes of physical memory in 2 MiB pages.
    pub fn stitched(capacity: u64) -> Self {
        Self::stitched_with_page(capacity, 2 << 20)
    }

    /// A stitched source with the given page size (a power of two, at least 256).
    pub fn stitched_with_page(capacity: u64, page_size: u64) -> Self {
        let page = page_size.next_power_of_two().max(256);
        let mut s = Self::new(capacity);
        s.paged = Some(SimPages {
            page,
            range: None,
            mapped: HashMap::new(),
            mappings: HashMap::new(),
            next_physical: 0,
        });
        s
    }

    /// What the source was asked to do so far.
    pub fn counters(&self) -> SimCounters {
        self.counters
    }

    /// Bytes of (simulated) physical memory in use.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// A handle on the simulated stream (clones share it), to make the device lag behind or catch up.
    pub fn stream(&self) -> SimStream {
        self.stream.clone()
    }

    /// Whether the virtual page at `va` is backed by a physical page (stitched sources).
    pub fn is_mapped(&self, va: u64) -> bool {
        self.paged
            .as_ref()
            .is_some_and(|p| p.mapped.contains_key(&va))
    }

    fn failed(detail: String, call: &'static str) -> SourceError {
        SourceError::Failed(Error::Source {
            source_name: "sim".into(),
            call,
            detail,
        })
    }
}

impl MemorySource for SimMemory {
    fn name(&self) -> String {
        match &self.paged {
            Some(_) => "sim (stitched)".into(),
            None => "sim".into(),
        }
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn device_free(&self) -> u64 {
        self.capacity - self.used
    }

    fn reserve(&mut self, bytes: u64) -> Result<Region, SourceError> {
        if bytes == 0 || bytes % 256 != 0 {
            return Err(Self::failed(
                format!("size {bytes} is not a positive multiple of 256"),
                "reserve",
            ));
        }
        if self.used + bytes > self.capacity {
            return Err(SourceError::OutOfMemory { requested: bytes });
        }
        let base = self.next;
        // Leave a gap so that two regions are never adjacent: the allocator must not merge across them.
        self.next = (base + bytes + 4096).next_multiple_of(4096);
        self.used += bytes;
        self.regions.insert(base, bytes);
        self.counters.reserves += 1;
        Ok(Region { base, size: bytes })
    }

    fn release(&mut self, region: Region) -> Result<(), SourceError> {
        match self.regions.get(&region.base) {
            Some(&size) if size == region.size => {
                self.regions.remove(&region.base);
                self.used -= size;
                self.counters.releases += 1;
                Ok(())
            }
            _ => Err(Self::failed(
                format!(
                    "region {:#x}+{} was never reserved",
                    region.base, region.size
                ),
                "release",
            )),
        }
    }

    fn paged(&mut self) -> Option<&mut dyn PagedMemory> {
        if self.paged.is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl SimMemory {
    fn pages_mut(&mut self) -> &mut SimPages {
        self.paged
            .as_mut()
            .expect("SimMemory::paged returns Some only for stitched sources")
    }
}

impl PagedMemory for SimMemory {
    fn page_size(&self) -> u64 {
        self.paged.as_ref().map_or(2 << 20, |p| p.page)
    }

    fn virtual_range(&mut self) -> Result<Region, SourceError> {
        let cap = self.capacity;
        let base = self.next;
        let page = self.page_size();
        let p = self.pages_mut();
        if let Some(r) = p.range {
            return Ok(r);
        }
        // Twice the device, as CUDA allows reserving far more virtual than physical memory.
        let size = (cap.max(p.page) * 2).next_multiple_of(p.page);
        let base = base.next_multiple_of(p.page);
        let r = Region { base, size };
        p.range = Some(r);
        self.next = base + size + page;
        Ok(r)
    }

    fn map(&mut self, va: u64, pages: u64, moved_from: &[u64]) -> Result<(), SourceError> {
        let page = self.page_size();
        let created = pages - moved_from.len() as u64;
        if self.used + created * page > self.capacity {
            return Err(SourceError::OutOfMemory {
                requested: created * page,
            });
        }
        let p = self.pages_mut();
        let Some(range) = p.range else {
            return Err(Self::failed(
                "map before the virtual range was reserved".into(),
                "map",
            ));
        };
        if va % page != 0
            || va < range.base
            || va + pages * page > range.end()
            || moved_from.len() as u64 > pages
        {
            return Err(Self::failed(
                format!("bad run {va:#x} x {pages} pages"),
                "map",
            ));
        }
        if let Some(i) = (0..pages).find(|i| p.mapped.contains_key(&(va + i * page))) {
            return Err(Self::failed(
                format!("page {:#x} is already mapped", va + i * page),
                "map",
            ));
        }
        let mut physical = Vec::with_capacity(pages as usize);
        for &from in moved_from {
            let Some(&ph) = p.mapped.get(&from) else {
                return Err(Self::failed(
                    format!("moving page {from:#x}, which is not mapped"),
                    "map",
                ));
            };
            physical.push(ph);
        }
        for _ in moved_from.len() as u64..pages {
            physical.push(p.next_physical);
            p.next_physical += 1;
        }
        for (i, ph) in physical.into_iter().enumerate() {
            p.mapped.insert(va + i as u64 * page, ph);
            *p.mappings.entry(ph).or_insert(0) += 1;
        }
        self.used += created * page;
        self.counters.map_calls += 1;
        self.counters.page_creates += created;
        self.counters.page_moves += moved_from.len() as u64;
        Ok(())
    }

    fn unmap(&mut self, va: u64, pages: u64) -> Result<(), SourceError> {
        let page = self.page_size();
        let p = self.pages_mut();
        let mut released = 0;
        for i in 0..pages {
            let Some(ph) = p.mapped.remove(&(va + i * page)) else {
                return Err(Self::failed(
                    format!("unmapping page {:#x}, which is not mapped", va + i * page),
                    "unmap",
                ));
            };
            let n = p
                .mappings
                .get_mut(&ph)
                .expect("a mapped page counts its mappings");
            *n -= 1;
            if *n == 0 {
                p.mappings.remove(&ph);
                released += 1;
            }
        }
        self.used -= released * page;
        self.counters.page_releases += released;
        Ok(())
    }

    fn record_point(&mut self) -> Result<u64, SourceError> {
        self.recorded += 1;
        self.points.push_back(self.stream.now());
        self.counters.points_recorded += 1;
        Ok(self.recorded)
    }

    fn passed_point(&mut self) -> u64 {
        while let Some(&tick) = self.points.front() {
            if !self.stream.passed(tick) {
                break;
            }
            self.points.pop_front();
            self.passed += 1;
        }
        self.passed
    }

    fn wait_point(&mut self, point: u64) -> Result<(), SourceError> {
        if point > self.recorded {
            return Err(Self::failed(
                format!(
                    "waiting for point {point}, of which only {} were recorded",
                    self.recorded
                ),
                "wait_point",
            ));
        }
        if point <= self.passed_point() {
            return Ok(());
        }
        let tick = self.points[(point - self.passed - 1) as usize];
        self.stream.finish(tick);
        self.counters.stream_waits += 1;
        self.passed_point();
        Ok(())
    }
}
