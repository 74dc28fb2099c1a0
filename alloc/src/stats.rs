//! Statistics and the printable/serializable report.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::tenant::TenantId;

/// `1.50 GiB`, `512 B`: bytes for people.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// Live counters of one allocator (kept up to date on every call, so a report is cheap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Bytes of live blocks (rounded sizes).
    pub in_use: u64,
    /// Highest `in_use` so far.
    pub peak_in_use: u64,
    /// Bytes held from the source (segments, or mapped physical pages in the stitched layout).
    pub reserved: u64,
    /// Highest `reserved` so far.
    pub peak_reserved: u64,
    /// Live blocks.
    pub live_blocks: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations that failed.
    pub ooms: u64,
    /// Regions reserved from the source.
    pub source_reserves: u64,
    /// Regions released to the source.
    pub source_releases: u64,
    /// Stitched layout: map calls (one per contiguous run of pages).
    pub map_calls: u64,
    /// Stitched layout: physical pages created.
    pub page_creates: u64,
    /// Stitched layout: physical pages moved between virtual pages.
    pub page_moves: u64,
    /// Stitched layout: physical pages released (trim).
    pub page_releases: u64,
    /// Stitched layout: unmap calls of retired pages (one per contiguous run), the old mappings of moved pages.
    #[serde(default)]
    pub unmap_calls: u64,
    /// Stitched layout: pages backed only after waiting for the stream: a block landed on a page whose physical
    /// page a move took while queued work could still use the old mapping. 0 in steady state.
    #[serde(default)]
    pub synchronising_moves: u64,
    /// Stitched layout: waits for the stream, for a move or a trim.
    #[serde(default)]
    pub stream_waits: u64,
    /// Trims done (by the user or before failing an allocation).
    pub trims: u64,
    /// Largest single request.
    pub largest_alloc: u64,
}

impl Counters {
    /// Calls to the source of any kind: the cost that a cached allocation avoids.
    pub fn source_calls(&self) -> u64 {
        self.source_reserves
            + self.source_releases
            + self.map_calls
            + self.unmap_calls
            + self.page_releases
    }
}

/// One tenant's line of a [`MemoryReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantReport {
    /// Its id.
    pub id: TenantId,
    /// Its name.
    pub name: String,
    /// Live bytes.
    pub in_use: u64,
    /// Highest live bytes.
    pub peak_in_use: u64,
    /// Hard limit.
    pub limit: Option<u64>,
    /// Guaranteed reserve.
    pub reserve: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Failed allocations.
    pub ooms: u64,
}

/// Everything an allocator can say about itself: `Display` prints a table, serde gives JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// The source (`"cuda:0"`, `"sim (stitched)"`).
    pub device: String,
    /// `"segments"` or `"stitched"`.
    pub layout: String,
    /// `"bfc"`, `"async"` or `"direct"`.
    pub backend: String,
    /// The allocator's limit in bytes.
    pub limit: u64,
    /// Free bytes of the device (driver's view).
    pub device_free: u64,
    /// Largest block that could be handed out now: from the cache, or by growing (mapping pages) within the limit.
    pub largest_free_block: u64,
    /// Bytes reserved but not in live blocks.
    pub cached_free: u64,
    /// 1 − largest free block / cached free bytes (0 when nothing is cached).
    pub fragmentation: f64,
    /// Stitched layout: page size (0 for segments).
    pub page_size: u64,
    /// Stitched layout: mapped physical pages.
    pub pages_mapped: u64,
    /// Stitched layout: mapped pages that no live block touches.
    pub pages_idle: u64,
    /// Stitched layout: idle pages whose last use the stream was not yet seen to pass (not movable without a wait).
    #[serde(default)]
    pub pages_pending: u64,
    /// Stitched layout: pages still mapped to a physical page that a move gave to another page, until the stream
    /// passes their last use (they hold no physical memory of their own).
    #[serde(default)]
    pub pages_retired: u64,
    /// Counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Per tenant.
    pub tenants: Vec<TenantReport>,
}

impl MemoryReport {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

fn limit_str(l: Option<u64>) -> String {
    l.map_or_else(|| "none".to_string(), fmt_bytes)
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counters;
        writeln!(
            f,
            "allocator {} · {} · {} · limit {}",
            self.device,
            self.backend,
            self.layout,
            fmt_bytes(self.limit)
        )?;
        let rows: [(&str, String); 8] = [
            (
                "in use",
                format!(
                    "{} (peak {})",
                    fmt_bytes(c.in_use),
                    fmt_bytes(c.peak_in_use)
                ),
            ),
            (
                "reserved",
                format!(
                    "{} (peak {})",
                    fmt_bytes(c.reserved),
                    fmt_bytes(c.peak_reserved)
                ),
            ),
            ("cached free", fmt_bytes(self.cached_free)),
            ("largest free block", fmt_bytes(self.largest_free_block)),
            (
                "fragmentation",
                format!("{:.1} %", self.fragmentation * 100.0),
            ),
            ("device free", fmt_bytes(self.device_free)),
            (
                "allocs / frees / OOMs",
                format!(
                    "{} / {} / {} ({} live)",
                    c.allocs, c.frees, c.ooms, c.live_blocks
                ),
            ),
            (
                "source reserves / releases",
                format!(
                    "{} / {} ({} trims)",
                    c.source_reserves, c.source_releases, c.trims
                ),
            ),
        ];
        for (k, v) in rows {
            writeln!(f, "  {k:<28}{v}")?;
        }
        if self.page_size > 0 {
            writeln!(
                f,
                "  {:<28}{} mapped, {} idle ({} pending), {} retired, of {}; {} created, {} moved ({} after a wait), \
                 {} released in {} map calls; {} stream waits",
                "pages",
                self.pages_mapped,
                self.pages_idle,
                self.pages_pending,
                self.pages_retired,
                fmt_bytes(self.page_size),
                c.page_creates,
                c.page_moves,
                c.synchronising_moves,
                c.page_releases,
                c.map_calls,
                c.stream_waits
            )?;
        }
        writeln!(
            f,
            "  {:<20} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9} {:>5}",
            "tenant", "in use", "peak", "limit", "reserve", "allocs", "frees", "OOMs"
        )?;
        for t in &self.tenants {
            writeln!(
                f,
                "  {:<20} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9} {:>5}",
                t.name,
                fmt_bytes(t.in_use),
                fmt_bytes(t.peak_in_use),
                limit_str(t.limit),
                fmt_bytes(t.reserve),
                t.allocs,
                t.frees,
                t.ooms
            )?;
        }
        Ok(())
    }
}
