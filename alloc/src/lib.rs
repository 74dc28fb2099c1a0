//! cohort-alloc: the BFC caching allocator with a memory budget per model.

mod bfc;
mod bin;
mod config;
mod error;
mod events;
mod pages;
pub mod replay;
mod sim;
mod source;
mod stats;
mod tenant;

pub use bfc::{Bfc, Block};
pub use config::{
    Backend, Config, ConfigBuilder, DEFAULT_IDLE_PAGE_SLACK, DEFAULT_PLACEMENT_CANDIDATES,
    DEFAULT_PREALLOCATE_FRACTION, DeviceSelector, Limit, Policy, parse_bytes,
};
pub use error::{Error, OomCause, OutOfMemory, Result};
pub use events::{Event, EventKind};
pub use sim::{SimCounters, SimMemory};
pub use source::{MemorySource, PagedMemory, Region, SourceError};
pub use stats::{Counters, MemoryReport, TenantReport, fmt_bytes};
pub use tenant::{TenantId, TenantLimits};

#[cfg(test)]
mod tests;
