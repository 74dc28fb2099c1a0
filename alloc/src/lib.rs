//! cohort-alloc: the BFC caching allocator with a memory budget per model.
//!
//! One [`Bfc`] serves one device. It hands out [`Block`]s (an address and a size, 256-byte granularity and
//! alignment) by best fit with immediate coalescing, over memory from a [`MemorySource`]:
//!
//! | source | memory | layout |
//! | --- | --- | --- |
//! | [`SimMemory`] | none (fake addresses and a capacity; for tests and trace replay) | segments, or stitched pages with [`SimMemory::stitched`] |
//! | [`HostMemory`] | aligned host memory | segments |
//! | [`CudaMemory`] (feature `cuda`) | `cuMemAlloc` / `cuMemFree` | segments |
//! | [`CudaVmm`] (feature `cuda`) | one reserved virtual range, 2 MiB physical pages mapped where blocks are | stitched |
//! | [`CudaAsyncPool`] (feature `cuda`) | `cuMemAllocAsync` with a release threshold | one block per call |
//!
//! In the **stitched** layout every block is placed by best fit in one virtual range; physical pages back only the
//! pages live blocks touch, and when a block lands on unbacked pages, idle pages (mapped, touched by no live block)
//! are moved there before new ones are created. Physical memory then stays within a page or so of the peak of live
//! bytes, where segments lose memory to blocks stranded in separate regions.
//!
//! Free chunks sit in 48 size-class bins (bin `b` holds `(256·2^(b-1), 256·2^b]`), each an intrusive treap ordered
//! by (size, address) and threaded by in-order neighbours, over a slab of chunks linked to their address
//! neighbours; a bitmap finds the next non-empty bin. Alloc and free are O(log n) under one short lock; a free chunk
//! that a block is cut from or given back to keeps its treap place when its order allows (an O(1) check), and the
//! block freed last is parked for the next allocation of its size where best fit would place it anyway. A cached
//! alloc + free makes no source call and no heap allocation.
//!
//! What the allocator promises about fragmentation is stated as properties in `tests/fragmentation.rs` (a million
//! random and adversarial operations per release run, a soak of tens of millions behind `--ignored`): the stitched
//! layout fails a request only for want of pages, and its peak reserved stays within the idle-page slack of the
//! pages live blocks touched; segments grow only without a fit and report fragmentation and OOM causes truthfully;
//! trim returns everything idle, after which a replay makes the same choices. A failing sequence is written as a
//! trace for `cohort replay`.
//!
//! On top: policies ([`Policy::Growth`], [`Policy::Preallocate`], a hard [`Limit`], [`Bfc::trim`]), backends
//! ([`Backend`]: BFC, the driver's async pool, direct), tenants (one budget per model: a hard limit, a reserve the
//! others cannot take, borrowing of everything else, stats each), configuration by [`ConfigBuilder`] or the
//! `COHORT_MEMORY_LIMIT`, `COHORT_MEMORY_GROWTH`, `COHORT_ALLOCATOR` and `COHORT_DEVICE` variables (frozen at the
//! first allocation), a [`MemoryReport`] (`Display` table, serde JSON), bounded event recording exported as Chrome
//! trace JSON ([`Bfc::chrome_trace`]), and a structured [`OutOfMemory`] error (cause and advice) after one trim and
//! retry. [`replay`] replays real allocation traces.
//!
//! ```
//! use cohort_alloc::{Bfc, Config, OomCause, SimMemory, TenantId, TenantLimits};
//!
//! # fn main() -> cohort_alloc::Result<()> {
//! // A simulated 1 GiB device in the stitched layout, capped at 256 MiB.
//! let config = Config::builder().limit_bytes(256 << 20).build()?;
//! let bfc = Bfc::new(SimMemory::stitched(1 << 30), config)?;
//! let cnn = bfc.add_tenant("cnn", TenantLimits::limit(64 << 20))?;
//!
//! let block = bfc.alloc(10_000, cnn)?;
//! assert_eq!(block.size, 10_240); // rounded up to 256 bytes
//! assert_eq!(block.ptr % 256, 0);
//!
//! // Past its limit a tenant fails alone, with a report that says why and what to do.
//! let err = bfc.alloc(100 << 20, cnn).unwrap_err();
//! assert_eq!(err.out_of_memory().unwrap().cause, OomCause::TenantLimit);
//! let other = bfc.alloc(100 << 20, TenantId::DEFAULT)?;
//!
//! bfc.free(block);
//! bfc.free(other);
//! println!("{}", bfc.stats()); // a table; bfc.stats().to_json() for machines
//! # Ok(())
//! # }
//! ```
//!
//! A tensor crate gets one allocator per device with [`device_allocator`] (the stitched [`CudaVmm`] on a GPU under
//! the default `bfc` backend, host memory on the CPU), keeps it in an `Arc`, and charges each member's blocks to
//! its tenant.
//!
//! ## Measured on the shared traces (`cargo run --release -p cohort-alloc --bin replay -- TRACE --passes 2`)
//!
//! Peak reserved over peak live with the replay's defaults (stitched layout on [`SimMemory`], idle-page slack 8,
//! large blocks from 1 MiB in their own arena, page-aligned), against PyTorch on the same runs (mlp-grid8's floor is
//! 1.48 %: its 102.5 MiB peak needs 52 pages of 2 MiB), and the page moves of the second pass:
//!
//! | trace | stitched | second pass: page moves | PyTorch default / expandable |
//! | --- | --- | --- | --- |
//! | transformer-lm | 7.66 % | 0 | 20.1 % / 8.1 % |
//! | transformer-varlen | 6.70 % | 0 | 11.6 % / 7.5 % |
//! | mlp-grid8 | 1.48 % | 0 | 3.4 % / 13.2 % |
//!
//! The stitched layout keeps physical memory near the peak of touched pages and pays with page moves, each of which
//! synchronizes the device on a GPU ([`CudaVmm`] synchronizes before it unmaps). So the idle-page slack
//! ([`ConfigBuilder::idle_page_slack`], idle pages kept mapped before moving instead of creating) is a floor: the
//! allocator grows it by every page a later block wanted back after a move took it, up to a quarter of the peak in
//! use, until a repeating step moves no page; [`Bfc::trim`] forgets what it learnt. With the slack fixed at 8 pages
//! the overheads were 1.27 % and 0.72 % on the transformer traces, at 68 and 33 page moves per step; on the H200,
//! 34 moves a step held an eager step of 128 fused MLPs at 1.7 ms, which now takes about 0.6 ms and moves no page. Three placement choices were measured
//! and kept: large blocks in their own arena (transformer-varlen 1.33 % to 0.38 %), large blocks starting on a page
//! boundary (transformer-lm 1.39 % to 0.30 %, transformer-varlen 0.38 % to 0.17 %, at slack 0), and moving the
//! highest idle page first rather than the one idle longest (31 % and 47 % fewer moves on the two transformer
//! traces). Looking past the best fit for chunks on mapped pages ([`ConfigBuilder::placement_candidates`]) saved a
//! few moves for more memory, so it is off.
//!
//! Speed (criterion, `cargo bench -p cohort-alloc`, on a 2-core AMD EPYC): a cached alloc + free pair costs about
//! 34 ns of CPU time in either layout (94 ns before the threaded bins and the parked block); 4 threads contending
//! for one allocator on 2 cores take about 0.7 µs per pair.

mod bfc;
mod bin;
mod config;
mod cuda;
mod device;
mod error;
mod events;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault;
mod host;
mod pages;
pub mod replay;
mod sim;
mod source;
mod stats;
mod tenant;

pub use bfc::{Bfc, Block, ChunkInfo};
pub use config::{
    Backend, Config, ConfigBuilder, DEFAULT_IDLE_PAGE_SLACK, DEFAULT_LARGE_BLOCK,
    DEFAULT_PLACEMENT_CANDIDATES, DEFAULT_PREALLOCATE_FRACTION, DeviceSelector, Limit, MIN_POOL,
    PROCESS_HEADROOM, Policy, Scope, parse_bytes, pool_share,
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
