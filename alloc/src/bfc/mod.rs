//! The best-fit-with-coalescing allocator.

use std::fmt;
use std::panic::Location;
use std::sync::{Mutex, MutexGuard};

use crate::bin::{Bins, Chunk, Chunks, GRANULE, NIL, State};
use crate::config::{Backend, Config, Limit, Policy};
use crate::error::{Error, OomCause, OutOfMemory, Result};
use crate::events::{Event, EventKind, EventLog, chrome_trace};
use crate::fault::Fault;
use crate::pages::PageTable;
use crate::source::{MemorySource, Region, SourceError};
use crate::stats::{Counters, MemoryReport, TenantReport, fmt_bytes};
use crate::tenant::{Tenant, TenantId, TenantLimits};

mod carve;
mod check;
mod park;
mod points;
mod segments;
mod stitched;

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

/// One chunk of [`Bfc::chunk_map`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    /// First byte.
    pub ptr: u64,
    /// Bytes.
    pub size: u64,
    /// Free (cached), or handed out.
    pub free: bool,
    /// The region it lies in (the stitched layout's arenas are regions 0 and 1).
    pub region: u32,
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
    /// The call in progress may not wait for the stream or record on it ([`Bfc::alloc_without_sync`]).
    no_sync: bool,
    tenants: Vec<Tenant>,
    unmet_total: u64,
    c: Counters,
    events: Option<EventLog>,
    first_use: Option<&'static Location<'static>>,
    scratch: Vec<u64>,
    scratch_pages: Vec<u32>,
    started: bool,
    /// The chunk of the block freed last, parked for the next allocation ([`park`]); `NIL` when none.
    parked: u32,
    #[cfg(feature = "fault-injection")]
    fault: Option<crate::fault::Fault>,
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
            no_sync: false,
            tenants: vec![Tenant::new("default".into(), TenantLimits::unlimited())],
            unmet_total: 0,
            c: Counters::default(),
            events: (config.record_events > 0).then(|| EventLog::new(config.record_events)),
            first_use: None,
            scratch: Vec::new(),
            scratch_pages: Vec::new(),
            started: false,
            parked: NIL,
            #[cfg(feature = "fault-injection")]
            fault: None,
            config,
            source,
        };
        inner.stitch()?;
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

    /// As [`alloc`](Self::alloc), but never waits for the stream nor records a point on it: only idle pages
    /// whose last use the stream was already seen to pass are moved, others are created, and an out-of-memory is
    /// reported without the trim and retry. For callers that may not synchronize, such as a CUDA graph's private
    /// pool growing during its capture.
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
    /// Stitched: idle pages whose last use the stream has not passed yet are waited for (one wait, counted in
    /// [`Counters::stream_waits`]). A source failure is logged through `tracing`.
    pub fn trim(&self) -> u64 {
        self.lock().trim()
    }

    /// The counters (cheap: no walk over chunks).
    pub fn counters(&self) -> Counters {
        self.lock().c
    }

    /// The full report: counters, largest free block, fragmentation, per-tenant lines.
    pub fn stats(&self) -> MemoryReport {
        let mut g = self.lock();
        g.unpark();
        g.report()
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

    /// Starts the allocator-wide peaks (`peak_in_use`, `peak_reserved`) afresh from what is held now, as
    /// `torch.cuda.reset_peak_memory_stats` does: the peak read after a phase is then the most its blocks (and
    /// whatever else was live) held at one moment. Tenants' peaks stay ([`reset_tenant_peak`](Self::reset_tenant_peak)
    /// restarts one), and so does how blocks are placed.
    pub fn reset_peak(&self) {
        let mut g = self.lock();
        g.c.peak_in_use = g.c.in_use;
        g.c.peak_reserved = g.c.reserved;
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

    /// Changes the hard limit while the allocator is in use: a process-wide limit moves the pool's share as memory
    /// outside the pool grows or shrinks. When the cache holds more than the new limit, its idle memory goes back
    /// to the source at once; live blocks are never touched, so a pool whose live bytes are above a lower limit
    /// stays there (it only stops growing) until they are freed and the limit is applied again (the same limit
    /// again trims what became idle above it). Gives the bytes reserved afterwards.
    ///
    /// On a GPU, wait for queued work first (as for [`trim`](Self::trim)): a freed block may still be read.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the tenants' reserves together exceed the new limit (nothing changes).
    pub fn resize_limit(&self, bytes: u64) -> Result<u64> {
        let mut g = self.lock();
        let limit = bytes.max(GRANULE);
        let reserves: u64 = g.tenants.iter().map(|t| t.limits.reserve).sum();
        if reserves > limit {
            return Err(Error::InvalidConfig {
                setting: "limit",
                value: format!(
                    "{} (below the {} the members' reserves promise)",
                    fmt_bytes(limit),
                    fmt_bytes(reserves)
                ),
                expected: "a limit at least the sum of the members' reserves: lower a reserve first",
            });
        }
        g.limit = limit;
        if let Some(pt) = &g.pages {
            let most = limit / pt.size;
            g.page_limit = match g.config.policy {
                Policy::Growth => most,
                Policy::Preallocate { .. } => g.page_limit.min(most),
            };
        }
        if g.c.reserved > limit {
            g.trim();
        }
        tracing::debug!(
            "{}: limit {} ({} reserved)",
            g.name,
            fmt_bytes(limit),
            fmt_bytes(g.c.reserved)
        );
        Ok(g.c.reserved)
    }

    /// Runs `f` on the source (for its own counters, or a device query).
    pub fn with_source<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.lock().source)
    }

    /// Every chunk, region by region in address order: what a memory map draws, and what the property tests
    /// recount the report's figures from.
    pub fn chunk_map(&self) -> Vec<ChunkInfo> {
        let mut g = self.lock();
        g.unpark();
        let mut out = Vec::with_capacity(g.chunks.v.len());
        for (slot, r) in g.regions.iter().enumerate().filter(|(_, r)| r.live) {
            let mut i = r.first;
            while i != NIL {
                let c = &g.chunks.v[i as usize];
                out.push(ChunkInfo {
                    ptr: c.ptr,
                    size: c.size,
                    free: c.state == State::Free,
                    region: slot as u32,
                });
                i = c.next;
            }
        }
        out
    }

    /// Breaks one placement rule from now on (`None` mends it), for the property tests' check of themselves.
    #[cfg(feature = "fault-injection")]
    pub fn inject(&self, fault: Option<crate::fault::Fault>) {
        self.lock().fault = fault;
    }

    /// Checks every invariant by walking all chunks and recounting (tests use it after every step).
    ///
    /// # Errors
    /// A description of the first broken invariant.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut g = self.lock();
        g.unpark();
        g.check()
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
                    detail: format!(
                        "reserve {} is above its limit {}",
                        fmt_bytes(limits.reserve),
                        fmt_bytes(l)
                    ),
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
                    fmt_bytes(limits.reserve),
                    fmt_bytes(others),
                    fmt_bytes(self.limit)
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
        let placed = match self.take_parked(rounded, tenant) {
            Some(i) => Ok(i),
            None => {
                self.unpark();
                if !self.started {
                    self.started = true;
                    self.preallocate();
                }
                self.place(rounded, tenant)
            }
        };
        let idx = match placed {
            Ok(i) => i,
            Err(PlaceError::Fatal(e)) => return Err(e),
            Err(PlaceError::Oom(cause)) if self.no_sync || self.faulty(Fault::NoPageReuse) => {
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
            self.place_stitched(rounded, tenant)
        } else {
            self.place_segments(rounded, tenant)
        }
    }

    fn free(&mut self, block: Block) -> Result<()> {
        let ours = |c: &Chunk| {
            c.state == State::Used
                && c.ptr == block.ptr
                && c.size == block.size
                && c.tenant == block.tenant.0
        };
        let Some(c) = self
            .chunks
            .v
            .get(block.chunk as usize)
            .copied()
            .filter(ours)
        else {
            return Err(Error::ForeignBlock {
                ptr: block.ptr,
                size: block.size,
            });
        };
        let t = &mut self.tenants[block.tenant.index()];
        let before = t.unmet_reserve();
        t.in_use -= c.size;
        t.frees += 1;
        let after = t.unmet_reserve();
        self.unmet_total = self.unmet_total - before + after;
        self.c.in_use -= c.size;
        self.c.frees += 1;
        self.c.live_blocks -= 1;
        self.record(EventKind::Free, block.tenant, c.size, c.ptr);
        if self.park(block.chunk) {
            return Ok(());
        }
        if let Some(pt) = &mut self.pages {
            let (a, b) = pt.span(c.ptr, c.size);
            pt.release(a, b);
        }
        let m = self.coalesce(block.chunk);
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

    fn trim(&mut self) -> u64 {
        self.unpark();
        self.c.trims += 1;
        let before = self.c.reserved;
        if self.stitched() {
            self.trim_pages();
        } else {
            self.trim_regions();
        }
        // A preallocating allocator that gave everything back preallocates again at its next allocation, as a
        // fresh one would (without this it could never allocate again: its policy forbids growth).
        if self.c.reserved == 0 {
            self.started = false;
        }
        before - self.c.reserved
    }

    /// Whether `fault` was injected (always `false` without the `fault-injection` feature).
    #[inline]
    fn faulty(&self, fault: Fault) -> bool {
        #[cfg(feature = "fault-injection")]
        return self.fault == Some(fault);
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = fault;
            false
        }
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
            pages_pending: self.pages.as_ref().map_or(0, |p| p.pending()),
            pages_retired: self.pages.as_ref().map_or(0, |p| p.retired),
            counters: self.c,
            tenants: self
                .tenants
                .iter()
                .enumerate()
                .map(|(i, t)| tenant_report(TenantId(i as u16), t))
                .collect(),
        }
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
