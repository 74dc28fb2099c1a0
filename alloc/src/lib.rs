//! cohort-alloc: the BFC caching allocator with a memory budget per model.

mod bfc;
mod bin;
mod config;
mod cuda;
mod device;
mod error;
mod events;
mod host;
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
#[cfg(feature = "cuda")]
pub use cuda::cuda_context;
pub use cuda::{CudaAsyncPool, CudaMemory, CudaVmm, cuda_available};
pub use device::{DeviceBfc, device_allocator, resolve_device};
pub use error::{Error, OomCause, OutOfMemory, Result};
pub use events::{Event, EventKind};
pub use host::HostMemory;
pub use sim::{SimCounters, SimMemory};
pub use source::{MemorySource, PagedMemory, Region, SourceError};
pub use stats::{Counters, MemoryReport, TenantReport, fmt_bytes};
pub use tenant::{TenantId, TenantLimits};

#[cfg(test)]
mod tests;
