//! The best-fit-with-coalescing allocator.

use std::fmt;
use std::panic::Location;
use std::sync::{Mutex, MutexGuard};

use crate::bin::{Bins, Chunk, Chunks, GRANULE, NIL, State, bin_of};
use crate::config::{Backend, Config, Limit, Policy};
use crate::error::{Error, OomCause, OutOfMemory, Result};
use crate::events::{Event, EventKind, EventLog, chrome_trace};
use crate::pages::PageTable;
use crate::source::{MemorySource, Region, SourceError};
use crate::stats::{Counters, MemoryReport, TenantReport};
use crate::tenant::{Tenant, TenantId, TenantLimits};

const MIB: u64 = 1 << 20;

/// A block handed out by [`Bfc::alloc`]: `ptr` is a device (or host) address, `size` the usable bytes (the
/// request rounded up to 256). Give it back with [`Bfc::free`]; it is not `Clone`, so it is freed once.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Address of the first byte (a multiple of 256).
    pub ptr: u64,
    /// Usable bytes.
    pub size: u64,
    pub(crate) chunk: u32,
    pub(crate) tenant: TenantId,
}

impl Block {
    /// The tenant it is charged to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }
}

#[derive(Clone, Copy, Debug)]
struct RegionEntry {
    region: Region,
    first: u32,
    live: bool,
}

/// Why placing a chunk failed.
enum PlaceError {
    Oom(OomCause),
    Fatal(Error),
}

/// The allocator: best fit with immediate coalescing over regions (or one stitched virtual range) from a
/// [`MemorySource`], with tenants, limits, stats and event recording. `Send + Sync`; one short lock per call.
pub struct Bfc<S: MemorySource> {
    inner: Mutex<Inner<S>>,
}

impl<S: MemorySource> fmt::Debug for Bfc<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.lock();
        f.debug_struct("Bfc")
            .field("source", &g.source)
            .field("config", &g.config)
            .field("counters", &g.c)
            .finish_non_exhaustive()
    }
}

struct Inner<S> {
    source: S,
    name: String,
    config: Config,
    limit: u64,
    chunks: Chunks,
    bins: [Bins; 2],
    /// Stitched layout: requests of at least this many bytes are placed in the large arena.
    large: u64,
    regions: Vec<RegionEntry>,
    pages: Option<PageTable>,
    /// Stitched layout: the most pages that may be mapped.
    page_limit: u64,
    /// Stitched layout: idle pages kept beyond the configured slack, learnt from moves that were undone.
    grown_slack: u64,
    /// The call in progress may not synchronize the device ([`Bfc::alloc_without_sync`]).
    no_sync: bool,
    tenants: Vec<Tenant>,
    unmet_total: u64,
    c: Counters,
    events: Option<EventLog>,
    first_use: Option<&'static Location<'static>>,
    scratch: Vec<u64>,
    scratch_pages: Vec<u32>,
    started: bool,
}

impl<S: MemorySource> Bfc<S> {
    /// An allocator over `source`. The stitched layout is used when the source offers pages
    /// ([`MemorySource::paged`]) and the backend is [`Backend::Bfc`]; segments otherwise.
    ///
    /// # Errors
    /// When the stitched source cannot reserve its virtual range.
    pub fn new(source: S, config: Config) -> Result<Self> {
        let name = source.name();
        let capacity = source.capacity();
        let limit = config.limit_bytes(capacity).max(GRANULE);
        let mut inner = Inner {
            name,
            limit,
            chunks: Chunks::new(),
            bins: [Bins::new(), Bins::new()],
            large: u64::MAX,
            regions: Vec::new(),
            pages: None,
            page_limit: 0,
            grown_slack: 0,
            no_sync: false,
            tenants: vec![Tenant::new("default".into(), TenantLimits::unlimited())],
            unmet_total: 0,
            c: Counters::default(),
            events: (config.record_events > 0).then(|| EventLog::new(config.record_events)),
            first_use: None,
            scratch: Vec::new(),
            scratch_pages: Vec::new(),
            started: false,
            config,
            source,
        };
        if inner.config.backend == Backend::Bfc {
            if let Some(paged) = inner.source.paged() {
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
                    let idx = inner.chunks.add(Chunk {
                        ptr: r.base,
                        size: r.size,
                        prev: NIL,
                        next: NIL,
                        left: NIL,
                        right: NIL,
                        region: inner.regions.len() as u32,
                        tenant: 0,
                        arena: arena as u8,
                        state: State::Free,
                    });
                    inner.regions.push(RegionEntry {
                        region: r,
                        first: idx,
                        live: true,
                    });
                    inner.bin_insert(idx);
                }
                inner.large = inner.config.large_block;
                inner.page_limit = limit / page;
                inner.pages = Some(pt);
            }
        }
        Ok(Self {
            inner: Mutex::new(inner),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        // A panic while the lock was held cannot leave the chunk lists half-linked in a way that matters more than
        // failing every later call would, so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates `bytes` (rounded up to 256) charged to `tenant`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] with the cause and advice (after one trim and retry), [`Error::UnknownTenant`],
    /// or a source failure.
    #[track_caller]
    pub fn alloc(&self, bytes: usize, tenant: TenantId) -> Result<Block> {
        self.alloc_at(bytes, tenant, Location::caller(), false)
    }

    /// As [`alloc`](Self::alloc), but never synchronizes the device: pages are created, never moved
    /// from idle blocks (a move unmaps them, which waits for the device), and an out-of-memory is
    /// reported without the trim and retry. For callers that may not synchronize, such as a CUDA
    /// graph's private pool growing during its capture.
    ///
    /// # Errors
    /// As [`alloc`](Self::alloc).
    #[track_caller]
    pub fn alloc_without_sync(&self, bytes: usize, tenant: TenantId) -> Result<Block> {
        self.alloc_at(bytes, tenant, Location::caller(), true)
    }

    fn alloc_at(
        &self,
        bytes: usize,
        tenant: TenantId,
        caller: &'static Location<'static>,
        no_sync: bool,
    ) -> Result<Block> {
        let mut g = self.lock();
        if g.first_use.is_none() {
            g.first_use = Some(caller);
        }
        g.no_sync = no_sync;
        let r = g.alloc(bytes as u64, tenant);
        g.no_sync = false;
        r
    }

    /// Gives a block back. A block from another allocator is reported through `tracing` and otherwise ignored
    /// (use [`try_free`](Self::try_free) to see the error).
    pub fn free(&self, block: Block) {
        if let Err(e) = self.try_free(block) {
            tracing::error!("{e}");
        }
    }

    /// Gives a block back.
    ///
    /// # Errors
    /// [`Error::ForeignBlock`] when the block was not handed out by this allocator.
    pub fn try_free(&self, block: Block) -> Result<()> {
        self.lock().free(block)
    }

    /// Adds a tenant.
    ///
    /// # Errors
    /// [`Error::InvalidTenant`] when its reserve is above its limit, or all reserves together exceed the
    /// allocator's limit.
    pub fn add_tenant(&self, name: impl Into<String>, limits: TenantLimits) -> Result<TenantId> {
        let name = name.into();
        let mut g = self.lock();
        g.check_limits(&name, limits, None)?;
        if g.tenants.len() > usize::from(u16::MAX) {
            return Err(Error::InvalidTenant {
                name,
                detail: "too many tenants (65,535 at most)".into(),
            });
        }
        let id = TenantId(g.tenants.len() as u16);
        g.unmet_total += limits.reserve;
        g.tenants.push(Tenant::new(name, limits));
        Ok(id)
    }

    /// Changes a tenant's limit and reserve. A limit below what it already uses only stops further growth.
    ///
    /// # Errors
    /// [`Error::UnknownTenant`], or [`Error::InvalidTenant`] as for [`add_tenant`](Self::add_tenant).
    pub fn set_tenant_limits(&self, id: TenantId, limits: TenantLimits) -> Result<()> {
        let mut g = self.lock();
        let name = g
            .tenants
            .get(id.index())
            .ok_or(Error::UnknownTenant(id))?
            .name
            .clone();
        g.check_limits(&name, limits, Some(id))?;
        let t = &mut g.tenants[id.index()];
        let before = t.unmet_reserve();
        t.limits = limits;
        let after = t.unmet_reserve();
        g.unmet_total = g.unmet_total - before + after;
        Ok(())
    }

    /// The id of the tenant named `name`.
    pub fn tenant(&self, name: &str) -> Option<TenantId> {
        self.lock()
            .tenants
            .iter()
            .position(|t| t.name == name)
            .map(|i| TenantId(i as u16))
    }

    /// Returns wholly free regions (segments) or idle pages (stitched) to the source; the bytes given back.
    /// A source failure is logged through `tracing`.
    pub fn trim(&self) -> u64 {
        self.lock().trim()
    }

    /// The counters (cheap: no walk over chunks).
    pub fn counters(&self) -> Counters {
        self.lock().c
    }

    /// The full report: counters, largest free block, fragmentation, per-tenant lines.
    pub fn stats(&self) -> MemoryReport {
        self.lock().report()
    }

    /// One tenant's line of the report.
    pub fn tenant_stats(&self, id: TenantId) -> Option<TenantReport> {
        let g = self.lock();
        g.tenants.get(id.index()).map(|t| tenant_report(id, t))
    }

    /// Starts tenant `id`'s peak afresh from what it holds now (a program measuring one phase's peak, as
    /// `torch.cuda.reset_peak_memory_stats`); `false` for an unknown tenant.
    pub fn reset_tenant_peak(&self, id: TenantId) -> bool {
        let mut g = self.lock();
        match g.tenants.get_mut(id.index()) {
            Some(t) => {
                t.peak_in_use = t.in_use;
                true
            }
            None => false,
        }
    }

    /// The recorded events (empty unless [`Config::record_events`] is set).
    pub fn events(&self) -> Vec<Event> {
        self.lock()
            .events
            .as_ref()
            .map(EventLog::events)
            .unwrap_or_default()
    }

    /// The recorded events as Chrome trace JSON: counter tracks `reserved` and `in use` per tenant, OOMs as
    /// instant events. Open it in Perfetto (ui.perfetto.dev) or chrome://tracing.
    pub fn chrome_trace(&self) -> String {
        let g = self.lock();
        let names: Vec<String> = g.tenants.iter().map(|t| t.name.clone()).collect();
        let events = g.events.as_ref().map(EventLog::events).unwrap_or_default();
        chrome_trace(&events, &names, &g.name)
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.lock().config.clone()
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.lock().limit
    }

    /// Where the first allocation was made (`file:line:column`), once there was one.
    pub fn first_use(&self) -> Option<String> {
        self.lock().first_use.map(|l| l.to_string())
    }

    /// Replaces the configuration; only before the first allocation.
    ///
    /// # Errors
    /// [`Error::ConfigFrozen`] naming where the first allocation was made.
    pub fn reconfigure(&self, config: Config) -> Result<()> {
        let mut g = self.lock();
        g.frozen("configuration")?;
        let stitched = g.pages.is_some();
        if (config.backend == Backend::Bfc) != (g.config.backend == Backend::Bfc) && stitched {
            return Err(Error::InvalidConfig {
                setting: "backend",
                value: config.backend.to_string(),
                expected: "the backend the allocator was made with (make a new allocator to change it)",
            });
        }
        let limit = config.limit_bytes(g.source.capacity()).max(GRANULE);
        g.limit = limit;
        if let Some(pt) = &g.pages {
            g.page_limit = limit / pt.size;
        }
        g.events = (config.record_events > 0).then(|| EventLog::new(config.record_events));
        if g.pages.is_some() {
            g.large = config.large_block;
        }
        g.config = config;
        Ok(())
    }

    /// Applies the `COHORT_*` environment variables as they are now: nothing to do when they match the
    /// configuration in force; a change before the first allocation reconfigures the allocator.
    ///
    /// # Errors
    /// [`Error::InvalidEnv`] for a bad value; [`Error::ConfigFrozen`] when a variable changed after the first
    /// allocation, naming where that allocation was made.
    pub fn apply_env(&self) -> Result<()> {
        let current = self.config();
        let wanted = Config::builder_from(current.clone()).env()?.build()?;
        if wanted == current {
            return Ok(());
        }
        self.lock().frozen("COHORT_* environment variables")?;
        self.reconfigure(wanted)
    }

    /// Sets the hard limit; only before the first allocation.
    ///
    /// # Errors
    /// [`Error::ConfigFrozen`] naming where the first allocation was made.
    pub fn set_limit(&self, limit: Option<Limit>) -> Result<()> {
        let mut c = self.config();
        {
            let g = self.lock();
            g.frozen("limit")?;
        }
        c.limit = limit;
        self.reconfigure(c)
    }

    /// Runs `f` on the source (for its own counters, or a device query).
    pub fn with_source<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.lock().source)
    }

    /// Checks every invariant by walking all chunks and recounting (tests use it after every step).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.lock().check()
    }
}

pub(crate) fn source_error(e: SourceError, call: &'static str) -> Error {
    match e {
        SourceError::Failed(e) => e,
        SourceError::OutOfMemory { requested } => Error::Source {
            source_name: "source".into(),
            call,
            detail: format!("out of memory ({requested} bytes)"),
        },
    }
}

fn tenant_report(id: TenantId, t: &Tenant) -> TenantReport {
    TenantReport {
        id,
        name: t.name.clone(),
        in_use: t.in_use,
        peak_in_use: t.peak_in_use,
        limit: t.limits.limit,
        reserve: t.limits.reserve,
        allocs: t.allocs,
        frees: t.frees,
        ooms: t.ooms,
    }
}

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
    fn bin_insert(&mut self, i: u32) {
        let a = usize::from(self.chunks.v[i as usize].arena);
        self.bins[a].insert(&mut self.chunks.v, i);
    }

    fn bin_remove(&mut self, i: u32) {
        let a = usize::from(self.chunks.v[i as usize].arena);
        self.bins[a].remove(&mut self.chunks.v, i);
    }

    fn arena_for(&self, rounded: u64) -> usize {
        usize::from(rounded >= self.large)
    }

    fn free_bytes(&self) -> u64 {
        self.bins[0].bytes + self.bins[1].bytes
    }

    fn largest_free_chunk(&self) -> u64 {
        self.bins[0]
            .largest(&self.chunks.v)
            .max(self.bins[1].largest(&self.chunks.v))
    }

    fn frozen(&self, setting: &'static str) -> Result<()> {
        match self.first_use {
            Some(loc) => Err(Error::ConfigFrozen {
                device: self.name.clone(),
                setting,
                first_use: loc.to_string(),
            }),
            None => Ok(()),
        }
    }

    fn check_limits(
        &self,
        name: &str,
        limits: TenantLimits,
        replacing: Option<TenantId>,
    ) -> Result<()> {
        if let Some(l) = limits.limit {
            if limits.reserve > l {
                return Err(Error::InvalidTenant {
                    name: name.into(),
                    detail: format!("reserve {} is above its limit {}", limits.reserve, l),
                });
            }
        }
        let others: u64 = self
            .tenants
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(TenantId(*i as u16)) != replacing)
            .map(|(_, t)| t.limits.reserve)
            .sum();
        if others.saturating_add(limits.reserve) > self.limit {
            return Err(Error::InvalidTenant {
                name: name.into(),
                detail: format!(
                    "reserve {} plus the other tenants' reserves {} exceeds the allocator's limit {}",
                    limits.reserve, others, self.limit
                ),
            });
        }
        Ok(())
    }

    fn stitched(&self) -> bool {
        self.pages.is_some()
    }

    fn caches(&self) -> bool {
        self.config.backend == Backend::Bfc
    }

    fn record(&mut self, kind: EventKind, tenant: TenantId, bytes: u64, ptr: u64) {
        if let Some(log) = &mut self.events {
            let tenant_in_use = self.tenants.get(tenant.index()).map_or(0, |t| t.in_use);
            let e = Event {
                t_ns: log.now_ns(),
                kind,
                tenant,
                bytes,
                ptr,
                in_use: self.c.in_use,
                reserved: self.c.reserved,
                tenant_in_use,
            };
            log.push(e);
        }
    }

    fn alloc(&mut self, bytes: u64, tenant: TenantId) -> Result<Block> {
        let Some(t) = self.tenants.get(tenant.index()) else {
            return Err(Error::UnknownTenant(tenant));
        };
        let (t_limit, t_in_use, t_reserve, own_unmet) = (
            t.limits.limit,
            t.in_use,
            t.limits.reserve,
            t.unmet_reserve(),
        );
        let rounded = bytes
            .max(1)
            .checked_next_multiple_of(GRANULE)
            .unwrap_or(u64::MAX);
        if rounded > self.limit {
            return Err(self.oom(bytes, rounded, tenant, OomCause::TooLarge));
        }
        if let Some(l) = t_limit {
            if t_in_use + rounded > l {
                return Err(self.oom(bytes, rounded, tenant, OomCause::TenantLimit));
            }
        }
        let others = self.unmet_total - own_unmet;
        let own_after = t_reserve.saturating_sub(t_in_use + rounded);
        if self.c.in_use + rounded + others + own_after > self.limit {
            let cause = if others > 0 && self.c.in_use + rounded <= self.limit {
                OomCause::ReservedByOthers
            } else {
                OomCause::DeviceFull
            };
            return Err(self.oom(bytes, rounded, tenant, cause));
        }
        if !self.started {
            self.started = true;
            self.preallocate();
        }
        let idx = match self.place(rounded, tenant) {
            Ok(i) => i,
            Err(PlaceError::Fatal(e)) => return Err(e),
            Err(PlaceError::Oom(cause)) if self.no_sync => {
                return Err(self.oom(bytes, rounded, tenant, cause));
            }
            Err(PlaceError::Oom(_)) => {
                self.trim();
                match self.place(rounded, tenant) {
                    Ok(i) => i,
                    Err(PlaceError::Fatal(e)) => return Err(e),
                    Err(PlaceError::Oom(cause)) => {
                        return Err(self.oom(bytes, rounded, tenant, cause));
                    }
                }
            }
        };
        let c = self.chunks.v[idx as usize];
        let t = &mut self.tenants[tenant.index()];
        let before = t.unmet_reserve();
        t.in_use += rounded;
        t.peak_in_use = t.peak_in_use.max(t.in_use);
        t.allocs += 1;
        let after = t.unmet_reserve();
        self.unmet_total = self.unmet_total - before + after;
        self.c.in_use += rounded;
        self.c.peak_in_use = self.c.peak_in_use.max(self.c.in_use);
        self.c.allocs += 1;
        self.c.live_blocks += 1;
        self.c.largest_alloc = self.c.largest_alloc.max(bytes);
        self.record(EventKind::Alloc, tenant, rounded, c.ptr);
        Ok(Block {
            ptr: c.ptr,
            size: rounded,
            chunk: idx,
            tenant,
        })
    }

    /// The preallocation of [`Policy::Preallocate`], at the first allocation.
    fn preallocate(&mut self) {
        let Policy::Preallocate { fraction } = self.config.policy else {
            return;
        };
        if !self.caches() {
            return;
        }
        let bytes = ((self.limit as f64 * fraction) as u64).max(GRANULE);
        if let Some(pt) = &self.pages {
            let n = (bytes / pt.size).max(1).min(u64::from(pt.len()));
            self.page_limit = n;
            if let Err(e) = self.map_run(0, n as u32, 0) {
                tracing::warn!("preallocating {n} pages failed: {}", describe_place(&e));
            }
        } else {
            let bytes = bytes.next_multiple_of(GRANULE);
            if let Err(e) = self.add_region(bytes) {
                tracing::warn!("preallocating {bytes} bytes failed: {}", describe_place(&e));
            }
        }
    }

    fn oom(&mut self, requested: u64, rounded: u64, tenant: TenantId, cause: OomCause) -> Error {
        let largest = self.largest_free_block();
        let t = &mut self.tenants[tenant.index()];
        t.ooms += 1;
        let (tenant_name, tenant_in_use, tenant_limit, own_unmet) =
            (t.name.clone(), t.in_use, t.limits.limit, t.unmet_reserve());
        self.c.ooms += 1;
        self.record(EventKind::Oom, tenant, rounded, 0);
        let cached_free = self.c.reserved.saturating_sub(self.c.in_use);
        let fragmentation = fragmentation(largest, cached_free);
        Error::OutOfMemory(Box::new(OutOfMemory {
            device: self.name.clone(),
            requested,
            rounded,
            tenant,
            tenant_name,
            tenant_in_use,
            tenant_limit,
            in_use: self.c.in_use,
            reserved: self.c.reserved,
            limit: self.limit,
            reserved_for_others: self.unmet_total - own_unmet,
            device_free: self.source.device_free(),
            largest_free_block: largest,
            fragmentation,
            cause,
        }))
    }

    fn place(&mut self, rounded: u64, tenant: TenantId) -> std::result::Result<u32, PlaceError> {
        if self.stitched() {
            return self.place_stitched(rounded, tenant);
        }
        let i = match self.bins[0].best_fit(&self.chunks.v, rounded) {
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

    fn shortage_cause(&self, rounded: u64) -> OomCause {
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
    fn grow(&mut self, rounded: u64) -> std::result::Result<u32, PlaceError> {
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

    fn add_region(&mut self, bytes: u64) -> std::result::Result<u32, PlaceError> {
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
            left: NIL,
            right: NIL,
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

    /// Takes free chunk `i` out of its bin, splits off what is beyond `rounded`, marks it used.
    fn carve(&mut self, i: u32, rounded: u64, tenant: TenantId) -> u32 {
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
    fn coalesce(&mut self, mut i: u32) -> u32 {
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
    fn absorb_next(&mut self, i: u32) {
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

    fn place_stitched(
        &mut self,
        rounded: u64,
        tenant: TenantId,
    ) -> std::result::Result<u32, PlaceError> {
        let arena = self.arena_for(rounded);
        let Some(first) = self.bins[arena].best_fit(&self.chunks.v, rounded) else {
            return Err(PlaceError::Oom(OomCause::Fragmentation));
        };
        // Page-aware best fit: among the few smallest free chunks that fit, take the one (and the end of it) whose
        // pages are already backed, so that a block lands where physical memory is, instead of pulling pages
        // away from where the next step will want them.
        let pt = self
            .pages
            .as_ref()
            .expect("stitched layout has a page table");
        let mut best = (first, false, u64::MAX);
        let mut cand = Some(first);
        let mut seen = 0;
        while let Some(i) = cand {
            let c = self.chunks.v[i as usize];
            let (a, b) = pt.span(c.ptr, rounded);
            let front = pt.demand(a, b).0;
            if front < best.2 {
                best = (i, false, front);
            }
            if self.config.placement_candidates > 1 && c.size > rounded && best.2 > 0 {
                let (a, b) = pt.span(c.ptr + c.size - rounded, rounded);
                let back = pt.demand(a, b).0;
                if back < best.2 {
                    best = (i, true, back);
                }
            }
            seen += 1;
            if best.2 == 0 || seen >= self.config.placement_candidates {
                break;
            }
            cand = self.bins[arena].successor(&self.chunks.v, i);
        }
        let (mut i, at_end, _) = best;
        // A large block starts on a page boundary where its chunk has room: it then touches no page more than its
        // size needs (0.30 % instead of 1.39 % on transformer-lm). The padding stays a free chunk.
        if !at_end && arena == 1 {
            let c = self.chunks.v[i as usize];
            let page = self.pages.as_ref().expect("pages").size;
            let pad = c.ptr.next_multiple_of(page) - c.ptr;
            if pad > 0 && pad + rounded <= c.size {
                i = self.split_front(i, pad);
            }
        }
        let i = if at_end {
            self.carve_end(i, rounded, tenant)
        } else {
            self.carve(i, rounded, tenant)
        };
        let ptr = self.chunks.v[i as usize].ptr;
        match self.back_pages(ptr, rounded) {
            Ok(()) => Ok(i),
            Err(e) => {
                let m = self.coalesce(i);
                self.bin_insert(m);
                Err(e)
            }
        }
    }

    /// Splits free chunk `i` after its first `pad` bytes; returns the (free) second part.
    fn split_front(&mut self, i: u32, pad: u64) -> u32 {
        self.bin_remove(i);
        let j = self.split_off(i, pad);
        self.bin_insert(i);
        self.bin_insert(j);
        j
    }

    /// Cuts chunk `i` (in no bin) at byte `at`; the second part becomes a free chunk linked after it (in no bin).
    fn split_off(&mut self, i: u32, at: u64) -> u32 {
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
    fn carve_end(&mut self, i: u32, rounded: u64, tenant: TenantId) -> u32 {
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

    /// Makes every page under `[ptr, ptr + len)` backed and counts the block on them.
    fn back_pages(&mut self, ptr: u64, len: u64) -> std::result::Result<(), PlaceError> {
        let page_limit = self.page_limit;
        let pt = self
            .pages
            .as_mut()
            .expect("stitched layout has a page table");
        let (a, b) = pt.span(ptr, len);
        let (need, idle_in, regret) = pt.demand(a, b);
        if need == 0 {
            pt.acquire(a, b);
            return Ok(());
        }
        // A block wants pages back that a move took: a step's own churn exceeds the slack, and each move costs a
        // device synchronization. Grow the slack by those pages, up to a quarter of the peak in use.
        self.grown_slack = (self.grown_slack + regret).min(self.c.peak_in_use / pt.size / 4);
        let slack = self.config.idle_page_slack.max(self.grown_slack);
        let idle_avail = pt.idle - idle_in;
        let mut create = if self.no_sync {
            need
        } else if idle_avail > slack {
            need.saturating_sub(idle_avail - slack)
        } else {
            need
        };
        create = create.min(page_limit.saturating_sub(pt.mapped));
        let moves = need - create;
        if moves > idle_avail || (self.no_sync && moves > 0) {
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
        Ok(())
    }

    /// Backs pages `start..start+run`, moving `moves` idle pages and creating the rest, in one source call.
    fn map_run(&mut self, start: u32, run: u32, moves: u64) -> std::result::Result<(), PlaceError> {
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

    fn free(&mut self, block: Block) -> Result<()> {
        let foreign = Error::ForeignBlock {
            ptr: block.ptr,
            size: block.size,
        };
        let Some(c) = self.chunks.v.get(block.chunk as usize).copied() else {
            return Err(foreign);
        };
        if c.state != State::Used
            || c.ptr != block.ptr
            || c.size != block.size
            || c.tenant != block.tenant.0
        {
            return Err(foreign);
        }
        if let Some(pt) = &mut self.pages {
            let (a, b) = pt.span(c.ptr, c.size);
            pt.release(a, b);
        }
        let t = &mut self.tenants[block.tenant.index()];
        let before = t.unmet_reserve();
        t.in_use -= c.size;
        t.frees += 1;
        let after = t.unmet_reserve();
        self.unmet_total = self.unmet_total - before + after;
        self.c.in_use -= c.size;
        self.c.frees += 1;
        self.c.live_blocks -= 1;
        let m = self.coalesce(block.chunk);
        self.bin_insert(m);
        self.record(EventKind::Free, block.tenant, c.size, c.ptr);
        if !self.caches() && !self.stitched() {
            let mc = self.chunks.v[m as usize];
            if mc.prev == NIL && mc.next == NIL {
                if let Err(e) = self.release_region(mc.region) {
                    tracing::error!("releasing a region: {e}");
                }
            }
        }
        Ok(())
    }

    /// Releases region `slot`, whose one chunk is free.
    fn release_region(&mut self, slot: u32) -> Result<()> {
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

    fn trim(&mut self) -> u64 {
        self.c.trims += 1;
        // Memory given back is a fresh start: the slack learnt from earlier steps goes too.
        self.grown_slack = 0;
        let before = self.c.reserved;
        if let Some(pt) = &self.pages {
            let mut idle = std::mem::take(&mut self.scratch_pages);
            pt.idle_pages(&mut idle);
            idle.sort_unstable();
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
        } else {
            for slot in 0..self.regions.len() {
                let r = self.regions[slot];
                if !r.live {
                    continue;
                }
                let c = self.chunks.v[r.first as usize];
                if c.state == State::Free && c.next == NIL {
                    if let Err(e) = self.release_region(slot as u32) {
                        tracing::error!("trim: {e}");
                    }
                }
            }
        }
        before - self.c.reserved
    }

    fn largest_free_block(&self) -> u64 {
        let largest = self.largest_free_chunk();
        match &self.pages {
            Some(pt) => {
                let backable = self.page_limit.saturating_sub(pt.touched) * pt.size;
                largest.min(backable)
            }
            None => {
                let growable = if self.caches() && self.config.policy != Policy::Growth {
                    0
                } else {
                    self.limit.saturating_sub(self.c.reserved)
                };
                largest.max(growable / GRANULE * GRANULE)
            }
        }
    }

    fn report(&self) -> MemoryReport {
        let cached_free = self.c.reserved.saturating_sub(self.c.in_use);
        let largest = self.largest_free_block();
        let cached_largest = match &self.pages {
            Some(_) => cached_free,
            None => self.largest_free_chunk(),
        };
        MemoryReport {
            device: self.name.clone(),
            layout: if self.stitched() {
                "stitched"
            } else {
                "segments"
            }
            .into(),
            backend: self.config.backend.to_string(),
            limit: self.limit,
            device_free: self.source.device_free(),
            largest_free_block: largest,
            cached_free,
            fragmentation: fragmentation(cached_largest, cached_free),
            page_size: self.pages.as_ref().map_or(0, |p| p.size),
            pages_mapped: self.pages.as_ref().map_or(0, |p| p.mapped),
            pages_idle: self.pages.as_ref().map_or(0, |p| p.idle),
            counters: self.c,
            tenants: self
                .tenants
                .iter()
                .enumerate()
                .map(|(i, t)| tenant_report(TenantId(i as u16), t))
                .collect(),
        }
    }

    fn check(&self) -> std::result::Result<(), String> {
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
                let mut touched = 0;
                for (p, &n) in counts.iter().enumerate() {
                    if pt.live(p as u32) != n {
                        return Err(format!(
                            "page {p}: {} live recorded, {n} recounted",
                            pt.live(p as u32)
                        ));
                    }
                    if pt.is_mapped(p as u32) {
                        mapped += 1;
                        if n == 0 {
                            idle += 1;
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

fn fragmentation(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - (largest.min(free) as f64 / free as f64)
    }
}

fn describe_place(e: &PlaceError) -> String {
    match e {
        PlaceError::Oom(c) => c.to_string(),
        PlaceError::Fatal(e) => e.to_string(),
    }
}
