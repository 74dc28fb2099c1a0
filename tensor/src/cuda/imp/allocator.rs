//! The device's caching allocator as tensors and the GPU runtime see it: one pool for tensors and for the
//! runtime's own scratch areas and library workspaces, and under a process-wide limit ([`Scope::Process`]) a pool
//! that gets what the limit leaves after what lies outside it: the CUDA context and what the driver loads into it
//! (kernels, library code and handles, graph instantiations). That part is measured as a whole, NVML's figure for
//! the process less the pool: on the H200 the driver serves kernel loads and graph instantiations out of memory the
//! context already holds (the device's free memory does not move across them), so no finer split can be measured.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cohort_alloc::{Block, DeviceBfc, MemoryReport, Scope, TenantId, TenantLimits, TenantReport};
use cohort_kernels::cuda::{DeviceArena, Gpu, pinned_host_bytes};

use super::gpu;
use crate::Result;
use crate::memory::{DeviceAllocator, ProcessMemory};

/// The device's allocator, with `trim` made safe for queued work: returning regions to the driver waits for the
/// device first, since a freed block may still be read by a queued kernel.
struct GpuAllocator {
    bfc: Arc<DeviceBfc>,
    gpu: Arc<Gpu>,
    /// The tenant of the runtime's own buffers.
    runtime: TenantId,
    /// The card's PCI address, by which NVML knows it.
    bus_id: Option<String>,
    scope: Scope,
    /// The configured limit in bytes.
    limit: Option<u64>,
    /// What lay outside the pool when it was made.
    outside_pool_at_start: Option<u64>,
}

impl fmt::Debug for GpuAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuAllocator(cuda:{})", self.gpu.ordinal())
    }
}

impl GpuAllocator {
    /// Waits for queued work, so that idle memory may go back to the driver. A failed synchronisation means the
    /// context is broken: then nothing is released.
    fn quiesced(&self) -> bool {
        self.gpu.synchronize().is_ok()
    }
}

impl DeviceAllocator for GpuAllocator {
    fn alloc(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block> {
        self.bfc.alloc(bytes, tenant)
    }
    fn alloc_without_sync(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block> {
        self.bfc.alloc_without_sync(bytes, tenant)
    }
    fn free(&self, block: Block) {
        self.bfc.free(block);
    }
    fn add_tenant(&self, name: &str, limits: TenantLimits) -> cohort_alloc::Result<TenantId> {
        self.bfc.add_tenant(name, limits)
    }
    fn tenant(&self, name: &str) -> Option<TenantId> {
        self.bfc.tenant(name)
    }
    fn set_tenant_limits(&self, id: TenantId, limits: TenantLimits) -> cohort_alloc::Result<()> {
        self.bfc.set_tenant_limits(id, limits)
    }
    fn trim(&self) -> u64 {
        if !self.quiesced() {
            return 0;
        }
        self.bfc.trim()
    }
    fn resize_limit(&self, bytes: u64) -> cohort_alloc::Result<u64> {
        let reserved = self.bfc.counters().reserved;
        if bytes < reserved && !self.quiesced() {
            return Ok(reserved);
        }
        self.bfc.resize_limit(bytes)
    }
    fn stats(&self) -> MemoryReport {
        self.bfc.stats()
    }
    fn tenant_stats(&self, id: TenantId) -> Option<TenantReport> {
        self.bfc.tenant_stats(id)
    }
    fn reset_tenant_peak(&self, id: TenantId) -> bool {
        self.bfc.reset_tenant_peak(id)
    }
    fn reset_peak(&self) {
        self.bfc.reset_peak();
    }
    fn process_memory(&self) -> Option<ProcessMemory> {
        let card_total = self.gpu.context().total_mem().ok()? as u64;
        let report = self.bfc.stats();
        let runtime_in_pool = report
            .tenants
            .iter()
            .find(|t| t.id == self.runtime)
            .map_or(0, |t| t.in_use);
        let process = self.bus_id.as_deref().and_then(nvml::process_bytes);
        let pool_reserved = report.counters.reserved;
        Some(ProcessMemory {
            device: format!("cuda:{} ({})", self.gpu.ordinal(), self.gpu.name()),
            card_total,
            card_free: report.device_free,
            process,
            pool_reserved,
            runtime_in_pool,
            outside_pool: process.map(|p| p.saturating_sub(pool_reserved)),
            outside_pool_at_start: self.outside_pool_at_start,
            pinned_host: pinned_host_bytes(),
            scope: self.scope,
            limit: self.limit,
            pool_limit: report.limit,
        })
    }
    fn apply_process_limit(&self, now: &ProcessMemory) -> cohort_alloc::Result<()> {
        let (Scope::Process, Some(limit)) = (self.scope, self.limit) else {
            return Ok(());
        };
        if now.process.is_none() {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                tracing::warn!(
                    "scope = \"process\": NVML cannot see this process, so only the pool is counted \
                     against the limit (the CUDA context and what is loaded into it are not)"
                );
            });
        }
        let share = cohort_alloc::pool_share(limit, now.outside_pool.unwrap_or(0))?;
        if share != now.pool_limit || now.pool_reserved > share {
            self.resize_limit(share)?;
        }
        Ok(())
    }
}

/// The runtime's own buffers (scratch areas, library workspaces, flags) as blocks of the pool, charged to the
/// runtime's tenant.
struct RuntimeArena {
    bfc: Arc<DeviceBfc>,
    tenant: TenantId,
    blocks: Mutex<HashMap<u64, Block>>,
}

impl DeviceArena for RuntimeArena {
    fn alloc(
        &self,
        bytes: usize,
        may_sync: bool,
    ) -> std::result::Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        let block = if may_sync {
            self.bfc.alloc(bytes, self.tenant)
        } else {
            self.bfc.alloc_without_sync(bytes, self.tenant)
        }?;
        let ptr = block.ptr;
        self.blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ptr, block);
        Ok(ptr)
    }

    fn free(&self, ptr: u64) {
        let block = self
            .blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ptr);
        if let Some(block) = block {
            self.bfc.free(block);
        }
    }
}

/// A graph capture's private pool (over regions of the shared one) as an allocator: no limit of its own, no
/// runtime buffers.
pub(super) fn graph_pool(bfc: DeviceBfc, gpu: Arc<Gpu>) -> Arc<dyn DeviceAllocator> {
    Arc::new(GpuAllocator {
        bfc: Arc::new(bfc),
        bus_id: None,
        gpu,
        runtime: TenantId::DEFAULT,
        scope: Scope::Pool,
        limit: None,
        outside_pool_at_start: None,
    })
}

/// Creates the allocator of device `ordinal` from the environment's configuration (`COHORT_ALLOCATOR`,
/// `COHORT_MEMORY_LIMIT`, `COHORT_MEMORY_SCOPE`, ...), and makes the runtime's own buffers come from it.
///
/// # Errors
/// No driver or device, a configuration the allocator rejects, or a process-wide limit below what the process
/// already holds outside the pool.
pub fn create_allocator(ordinal: usize) -> Result<Arc<dyn DeviceAllocator>> {
    let gpu = gpu(ordinal)?;
    let config = cohort_alloc::Config::builder()
        .env()?
        .device(cohort_alloc::DeviceSelector::Cuda(ordinal))
        .build()?;
    // Blocks are used and freed in the compute stream's order: pages move without waiting for the device.
    let bfc = Arc::new(cohort_alloc::stream_allocator(
        &config,
        gpu.compute_stream().clone(),
    )?);
    let runtime = bfc.add_tenant("cuda runtime", TenantLimits::unlimited())?;
    let bus_id = gpu.pci_bus_id().ok();
    let outside_pool_at_start = bus_id.as_deref().and_then(nvml::process_bytes);
    let a = Arc::new(GpuAllocator {
        // The allocator's own limit is the configured one, in bytes of this card.
        limit: config.limit.map(|_| bfc.limit()),
        bfc: bfc.clone(),
        bus_id,
        gpu: gpu.clone(),
        runtime,
        scope: config.scope,
        outside_pool_at_start,
    });
    if let Some(now) = a.process_memory() {
        a.apply_process_limit(&now)?;
    }
    gpu.set_arena(Arc::new(RuntimeArena {
        bfc,
        tenant: runtime,
        blocks: Mutex::new(HashMap::new()),
    }));
    Ok(a)
}

/// The driver's per-process figure through NVML (`libnvidia-ml.so.1`, part of every NVIDIA driver), loaded at
/// run time like the driver itself.
mod nvml {
    use std::ffi::OsStr;
    use std::sync::OnceLock;

    use nvml_wrapper::Nvml;
    use nvml_wrapper::enums::device::UsedGpuMemory;

    fn nvml() -> Option<&'static Nvml> {
        static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
        NVML.get_or_init(|| {
            Nvml::builder()
                .lib_path(OsStr::new("libnvidia-ml.so.1"))
                .init()
                .map_err(|e| {
                    tracing::info!("NVML unavailable ({e}): the process's own figure is not read")
                })
                .ok()
        })
        .as_ref()
    }

    /// What this process holds on the card at PCI address `bus_id`, as `nvidia-smi` shows it.
    pub(super) fn process_bytes(bus_id: &str) -> Option<u64> {
        let device = nvml()?.device_by_pci_bus_id(bus_id).ok()?;
        let pid = std::process::id();
        device
            .running_compute_processes()
            .ok()?
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
    }
}
