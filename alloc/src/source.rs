//! Memory sources: where the allocator's regions come from.

use std::fmt;

use crate::error::Error;

/// A contiguous address range handed out by a [`MemorySource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Region {
    /// First address (device or host).
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
}

impl Region {
    /// One past the last address.
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
}

/// How a source failed: out of memory (the allocator may trim and retry) or anything else.
#[derive(Debug)]
pub enum SourceError {
    /// The source has no memory left for this request.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
    },
    /// Any other failure.
    Failed(Error),
}

impl From<Error> for SourceError {
    fn from(e: Error) -> Self {
        SourceError::Failed(e)
    }
}

/// Raw memory for a [`Bfc`](crate::Bfc): segments (`reserve`/`release`) and, optionally, physical pages mapped into
/// one virtual range ([`PagedMemory`]), the "stitched" layout.
///
/// The allocator calls a source only to grow, to trim, or on a page fault of the stitched layout; never on a cached
/// allocation.
pub trait MemorySource: Send + fmt::Debug {
    /// A short name for reports and errors (`"sim"`, `"host"`, `"cuda:0"`).
    fn name(&self) -> String;
    /// Total bytes of the device behind the source.
    fn capacity(&self) -> u64;
    /// Bytes the device still has free, as its driver (or the simulation) reports them.
    fn device_free(&self) -> u64;
    /// Every region and page starts at a multiple of this (a power of two, at least 256).
    fn alignment(&self) -> u64 {
        256
    }
    /// Reserves one region of exactly `bytes` (a multiple of 256).
    ///
    /// # Errors
    /// [`SourceError::OutOfMemory`] when the device is full, [`SourceError::Failed`] otherwise.
    fn reserve(&mut self, bytes: u64) -> Result<Region, SourceError>;
    /// Gives back a region obtained from [`reserve`](Self::reserve).
    ///
    /// # Errors
    /// When the region is unknown or the driver fails.
    fn release(&mut self, region: Region) -> Result<(), SourceError>;
    /// The paged (stitched) interface, for sources that map physical pages into one virtual range.
    fn paged(&mut self) -> Option<&mut dyn PagedMemory> {
        None
    }
}

/// Physical pages mapped on demand into one reserved virtual range (CUDA's virtual memory management API, or its
/// simulation).
pub trait PagedMemory {
    /// Size of one physical page (2 MiB on current NVIDIA GPUs).
    fn page_size(&self) -> u64;
    /// Reserves (once) and returns the virtual range; its size is a multiple of the page size.
    ///
    /// # Errors
    /// When the range cannot be reserved.
    fn virtual_range(&mut self) -> Result<Region, SourceError>;
    /// Backs `pages` consecutive virtual pages from `va` with physical pages. The first `moved_from.len()` of them
    /// are the physical pages mapped at the addresses in `moved_from`, which stay mapped there too until
    /// [`unmap`](Self::unmap)ped (queued work may still use the old addresses; the allocator unmaps them once the
    /// stream has passed their last use); the rest are created. Access is granted over the whole run at once.
    ///
    /// # Errors
    /// [`SourceError::OutOfMemory`] when no physical page can be created.
    fn map(&mut self, va: u64, pages: u64, moved_from: &[u64]) -> Result<(), SourceError>;
    /// Unmaps `pages` consecutive virtual pages from `va`; a physical page is released with its last mapping. The
    /// allocator calls it only once the stream has passed the pages' last use, so the source does not wait.
    ///
    /// # Errors
    /// When the pages were not mapped or the driver fails.
    fn unmap(&mut self, va: u64, pages: u64) -> Result<(), SourceError>;
    /// Marks the end of the work queued so far on the stream that blocks are used and freed in order on (on CUDA an
    /// event recorded on it), without waiting. Points are numbered 1, 2, 3, … in the order they are recorded.
    ///
    /// # Errors
    /// When the driver cannot record it.
    fn record_point(&mut self) -> Result<u64, SourceError>;
    /// The highest point the stream has passed (all work queued before it is done), asked without waiting; 0 when
    /// none has been passed yet.
    fn passed_point(&mut self) -> u64;
    /// Waits until the stream has passed `point` (one recorded by [`record_point`](Self::record_point)).
    ///
    /// # Errors
    /// When the driver fails while waiting.
    fn wait_point(&mut self, point: u64) -> Result<(), SourceError>;
}

impl<S: MemorySource + ?Sized> MemorySource for Box<S> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn device_free(&self) -> u64 {
        (**self).device_free()
    }
    fn alignment(&self) -> u64 {
        (**self).alignment()
    }
    fn reserve(&mut self, bytes: u64) -> Result<Region, SourceError> {
        (**self).reserve(bytes)
    }
    fn release(&mut self, region: Region) -> Result<(), SourceError> {
        (**self).release(region)
    }
    fn paged(&mut self) -> Option<&mut dyn PagedMemory> {
        (**self).paged()
    }
}
