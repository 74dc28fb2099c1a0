//! `HostMemory`: real, aligned host memory from the global allocator.

use std::alloc::Layout;
use std::collections::HashMap;

use crate::error::Error;
use crate::source::{MemorySource, Region, SourceError};

/// Alignment of every host region (a page: enough for any SIMD load and for pinning later).
const HOST_ALIGN: u64 = 4096;

/// Host memory in aligned regions; everything still reserved is freed when it is dropped.
#[derive(Debug)]
pub struct HostMemory {
    capacity: u64,
    used: u64,
    regions: HashMap<u64, u64>,
}

impl HostMemory {
    /// Host memory bounded by the machine's physical memory (`MemTotal` of /proc/meminfo; 16 GiB where unknown).
    pub fn new() -> Self {
        Self::with_capacity(meminfo("MemTotal:").unwrap_or(16 << 30))
    }

    /// Host memory bounded by `capacity` bytes.
    pub fn with_capacity(capacity: u64) -> Self {
        Self {
            capacity,
            used: 0,
            regions: HashMap::new(),
        }
    }
}

impl Default for HostMemory {
    fn default() -> Self {
        Self::new()
    }
}

fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl MemorySource for HostMemory {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn device_free(&self) -> u64 {
        let left = self.capacity - self.used;
        meminfo("MemAvailable:").map_or(left, |a| a.min(left))
    }

    fn alignment(&self) -> u64 {
        HOST_ALIGN
    }

    fn reserve(&mut self, bytes: u64) -> Result<Region, SourceError> {
        if self.used + bytes > self.capacity {
            return Err(SourceError::OutOfMemory { requested: bytes });
        }
        let layout = Layout::from_size_align(bytes as usize, HOST_ALIGN as usize).map_err(|e| {
            SourceError::Failed(Error::Source {
                source_name: "cpu".into(),
                call: "reserve",
                detail: format!("{bytes} bytes: {e}"),
            })
        })?;
        if layout.size() == 0 {
            return Err(SourceError::Failed(Error::Source {
                source_name: "cpu".into(),
                call: "reserve",
                detail: "zero-sized region".into(),
            }));
        }
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(SourceError::OutOfMemory { requested: bytes });
        }
        let base = ptr as u64;
        self.regions.insert(base, bytes);
        self.used += bytes;
        Ok(Region { base, size: bytes })
    }

    fn release(&mut self, region: Region) -> Result<(), SourceError> {
        match self.regions.get(&region.base) {
            Some(&size) if size == region.size => {
                self.regions.remove(&region.base);
                self.used -= size;
                // SAFETY: `base` came from `std::alloc::alloc` with exactly this layout (recorded in `regions`),
                // and it is removed from `regions`, so it is deallocated once.
                unsafe {
                    std::alloc::dealloc(
                        region.base as *mut u8,
                        Layout::from_size_align_unchecked(size as usize, HOST_ALIGN as usize),
                    );
                }
                Ok(())
            }
            _ => Err(SourceError::Failed(Error::Source {
                source_name: "cpu".into(),
                call: "release",
                detail: format!(
                    "region {:#x}+{} was never reserved",
                    region.base, region.size
                ),
            })),
        }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        for (base, size) in self.regions.drain() {
            // SAFETY: every entry was allocated with this layout and is deallocated once (drained).
            unsafe {
                std::alloc::dealloc(
                    base as *mut u8,
                    Layout::from_size_align_unchecked(size as usize, HOST_ALIGN as usize),
                );
            }
        }
    }
}
