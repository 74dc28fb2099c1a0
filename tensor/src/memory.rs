//! Device memory: the per-device allocator registry and the current tenant.
//!
//! GPU storage is a block of its device's [`cohort_alloc::Bfc`], charged to the tenant that is
//! current on the allocating thread ([`with_tenant`]; [`TenantId::DEFAULT`] outside any scope).
//! CPU storage is plain host memory and is not charged to a tenant.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cohort_alloc::{
    Bfc, Block, MemoryReport, MemorySource, Scope, TenantId, TenantLimits, TenantReport, fmt_bytes,
};
use serde::{Deserialize, Serialize};

use crate::{Device, Error, Result};

thread_local! {
    static TENANT: Cell<TenantId> = const { Cell::new(TenantId::DEFAULT) };
}

/// Runs `f` with `tenant` as the current tenant of this thread; allocations inside are charged to
/// it. Scopes nest; the previous tenant is restored afterwards, also when `f` panics.
pub fn with_tenant<R>(tenant: TenantId, f: impl FnOnce() -> R) -> R {
    struct Restore(TenantId);
    impl Drop for Restore {
        fn drop(&mut self) {
            TENANT.with(|t| t.set(self.0));
        }
    }
    let _restore = Restore(TENANT.with(|t| t.replace(tenant)));
    f()
}

/// The tenant allocations on this thread are charged to.
pub fn current_tenant() -> TenantId {
    TENANT.with(Cell::get)
}

/// What tensors need from a device allocator; implemented by every [`Bfc`].
pub trait DeviceAllocator: Send + Sync + fmt::Debug {
    /// Allocates `bytes` for `tenant`.
    ///
    /// # Errors
    /// Out of memory or over the tenant's limit (a structured [`cohort_alloc::Error`]).
    #[track_caller]
    fn alloc(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block>;
    /// Returns a block to the cache.
    fn free(&self, block: Block);
    /// Registers a tenant with its limits.
    ///
    /// # Errors
    /// A duplicate name or limits that cannot be met.
    fn add_tenant(&self, name: &str, limits: TenantLimits) -> cohort_alloc::Result<TenantId>;
    /// Looks a tenant up by name.
    fn tenant(&self, name: &str) -> Option<TenantId>;
    /// Changes a tenant's limits.
    ///
    /// # Errors
    /// An unknown tenant or limits that cannot be met.
    fn set_tenant_limits(&self, id: TenantId, limits: TenantLimits) -> cohort_alloc::Result<()>;
    /// As [`alloc`](DeviceAllocator::alloc), but never synchronizes the device (no page moves, no
    /// trim on out-of-memory): what a CUDA graph capture may call.
    ///
    /// # Errors
    /// As [`alloc`](DeviceAllocator::alloc).
    fn alloc_without_sync(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block> {
        self.alloc(bytes, tenant)
    }
    /// Returns unused regions to the device; gives the bytes released.
    fn trim(&self) -> u64;
    /// Changes the pool's limit while in use: idle cache above it goes back to the device at once, live blocks
    /// stay (the pool only stops growing). Gives the bytes reserved afterwards.
    ///
    /// # Errors
    /// The tenants' reserves together exceed the new limit.
    fn resize_limit(&self, bytes: u64) -> cohort_alloc::Result<u64>;
    /// Everything the process holds on the device, measured now; `None` where only the pool is known.
    fn process_memory(&self) -> Option<ProcessMemory> {
        None
    }
    /// Under a process-wide limit ([`Scope::Process`]), gives the pool what the limit leaves after what lies
    /// outside it in `now` (a [`process_memory`](DeviceAllocator::process_memory) measurement), trimming its idle
    /// cache when that is less than it holds; nothing to do otherwise.
    ///
    /// # Errors
    /// [`cohort_alloc::Error::LimitBelowOutside`] when the limit leaves the pool nothing.
    fn apply_process_limit(&self, now: &ProcessMemory) -> cohort_alloc::Result<()> {
        let _ = now;
        Ok(())
    }
    /// Device-wide and per-tenant statistics.
    fn stats(&self) -> MemoryReport;
    /// One tenant's statistics.
    fn tenant_stats(&self, id: TenantId) -> Option<TenantReport>;
    /// Starts a tenant's peak afresh from what it holds now; `false` for an unknown tenant.
    fn reset_tenant_peak(&self, id: TenantId) -> bool;
    /// Starts the allocator-wide peaks (in use, reserved) afresh from what is held now, as
    /// `torch.cuda.reset_peak_memory_stats`; the tenants' peaks stay.
    fn reset_peak(&self);
}

impl<S: MemorySource + Sync> DeviceAllocator for Bfc<S> {
    // The allocator records its first use's location (for "configuration frozen" errors): pass
    // the caller's through.
    #[track_caller]
    fn alloc(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block> {
        Bfc::alloc(self, bytes, tenant)
    }
    #[track_caller]
    fn alloc_without_sync(&self, bytes: usize, tenant: TenantId) -> cohort_alloc::Result<Block> {
        Bfc::alloc_without_sync(self, bytes, tenant)
    }
    fn free(&self, block: Block) {
        Bfc::free(self, block);
    }
    fn add_tenant(&self, name: &str, limits: TenantLimits) -> cohort_alloc::Result<TenantId> {
        Bfc::add_tenant(self, name, limits)
    }
    fn tenant(&self, name: &str) -> Option<TenantId> {
        Bfc::tenant(self, name)
    }
    fn set_tenant_limits(&self, id: TenantId, limits: TenantLimits) -> cohort_alloc::Result<()> {
        Bfc::set_tenant_limits(self, id, limits)
    }
    fn trim(&self) -> u64 {
        Bfc::trim(self)
    }
    fn resize_limit(&self, bytes: u64) -> cohort_alloc::Result<u64> {
        Bfc::resize_limit(self, bytes)
    }
    fn stats(&self) -> MemoryReport {
        Bfc::stats(self)
    }
    fn tenant_stats(&self, id: TenantId) -> Option<TenantReport> {
        Bfc::tenant_stats(self, id)
    }
    fn reset_tenant_peak(&self, id: TenantId) -> bool {
        Bfc::reset_tenant_peak(self, id)
    }
    fn reset_peak(&self) {
        Bfc::reset_peak(self);
    }
}

/// Everything one process holds on one GPU, the allocator's pool and what lies outside it, measured at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// The device (`cuda:0 (NVIDIA H200)`).
    pub device: String,
    /// The card's memory.
    pub card_total: u64,
    /// Free on the card now (every process's use counts).
    pub card_free: u64,
    /// What the driver says this process holds on the card (NVML, the figure `nvidia-smi` shows); `None` where
    /// NVML cannot see the process.
    pub process: Option<u64>,
    /// The allocator's pool: reserved bytes.
    pub pool_reserved: u64,
    /// Of the pool, what the GPU runtime itself holds: scratch areas, cuBLAS and cuBLASLt workspaces, flags.
    pub runtime_in_pool: u64,
    /// Everything outside the pool: the CUDA context, the kernels and library code loaded into it (lazily, as
    /// they are first used), the libraries' handles and graph instantiations; the process's figure less the pool.
    pub outside_pool: Option<u64>,
    /// The same when the allocator was made, before any kernel ran: `outside_pool` less this is what loading
    /// kernels, libraries and graphs added since.
    pub outside_pool_at_start: Option<u64>,
    /// Page-locked host memory for staging copies (host memory, not the card's).
    pub pinned_host: u64,
    /// What the limit covers.
    pub scope: Scope,
    /// The configured limit in bytes, if any.
    pub limit: Option<u64>,
    /// The pool's own limit now (under [`Scope::Process`], what the limit leaves after the rest).
    pub pool_limit: u64,
}

impl fmt::Display for ProcessMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.process {
            Some(p) => writeln!(
                f,
                "{}: the process holds {} of the card's {} ({} free)",
                self.device,
                fmt_bytes(p),
                fmt_bytes(self.card_total),
                fmt_bytes(self.card_free)
            )?,
            None => writeln!(
                f,
                "{}: the card has {} ({} free); NVML cannot see this process, so the context is not counted",
                self.device,
                fmt_bytes(self.card_total),
                fmt_bytes(self.card_free)
            )?,
        }
        writeln!(
            f,
            "  {:<16} {:>12}  (limit {}; the runtime's scratch and workspaces {} of it)",
            "pool",
            fmt_bytes(self.pool_reserved),
            fmt_bytes(self.pool_limit),
            fmt_bytes(self.runtime_in_pool)
        )?;
        if let Some(c) = self.outside_pool {
            let start = self
                .outside_pool_at_start
                .map_or(String::new(), |s| format!("; {} at start", fmt_bytes(s)));
            writeln!(
                f,
                "  {:<16} {:>12}  (CUDA context, kernels, library handles, graphs{start})",
                "outside the pool",
                fmt_bytes(c)
            )?;
        }
        writeln!(
            f,
            "  {:<16} {:>12}  (host memory)",
            "pinned staging",
            fmt_bytes(self.pinned_host)
        )?;
        match (self.limit, self.scope) {
            (Some(l), Scope::Process) => {
                write!(f, "  limit {} for the whole process", fmt_bytes(l))
            }
            (Some(l), Scope::Pool) => write!(
                f,
                "  limit {} for the pool (scope = \"process\" would cover the rest too)",
                fmt_bytes(l)
            ),
            (None, _) => write!(f, "  no limit"),
        }
    }
}

type Registry = Mutex<HashMap<usize, Arc<dyn DeviceAllocator>>>;

fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The allocator of `device`, created on first use (from the environment's configuration).
///
/// # Errors
/// [`Error::Unsupported`] for the CPU (host tensors are plain vectors); for a GPU, whatever
/// creating its allocator reports (no driver, bad configuration).
pub fn allocator(device: &Device) -> Result<Arc<dyn DeviceAllocator>> {
    let ordinal = match device {
        Device::Cpu => {
            return Err(Error::Unsupported {
                op: "allocator",
                device: Device::Cpu,
            });
        }
        Device::Cuda(n) => *n,
    };
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(a) = reg.get(&ordinal) {
        return Ok(a.clone());
    }
    let a = crate::cuda::create_allocator(ordinal)?;
    reg.insert(ordinal, a.clone());
    Ok(a)
}

/// Installs `alloc` as the allocator of `device` (before its first use), e.g. one built from an
/// explicit configuration instead of the environment.
///
/// # Errors
/// [`Error::InvalidArgument`] when the device already has an allocator or is the CPU.
pub fn set_allocator(device: &Device, alloc: Arc<dyn DeviceAllocator>) -> Result<()> {
    let Device::Cuda(ordinal) = *device else {
        return Err(Error::Unsupported {
            op: "set_allocator",
            device: *device,
        });
    };
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    if reg.contains_key(&ordinal) {
        return Err(Error::InvalidArgument {
            op: "set_allocator",
            reason: format!("{device} already has an allocator; configure it before its first use"),
        });
    }
    reg.insert(ordinal, alloc);
    Ok(())
}

/// Makes the C allocator keep freed host memory for reuse instead of returning it to the system
/// at once (once per process; opt out with `COHORT_HOST_MALLOC=system`).
///
/// CPU tensors are plain vectors, and a training step frees and re-allocates the same large
/// buffers every step. With glibc's defaults, buffers above its mmap threshold (and heap tops
/// above its trim threshold) go back to the kernel on free, so each step pays page faults and
/// kernel zeroing for every activation again: measured 36% of the CPU time of a 16-member fused
/// MLP step. Raising the thresholds keeps that memory mapped; the process then holds its peak
/// host usage.
pub fn tune_host_malloc() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var("COHORT_HOST_MALLOC").is_ok_and(|v| v == "system") {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            const M_TRIM_THRESHOLD: i32 = -1;
            const M_TOP_PAD: i32 = -2;
            const M_MMAP_THRESHOLD: i32 = -3;
            unsafe extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            // SAFETY: mallopt only changes glibc's tuning parameters; the values are in range
            // (glibc caps the mmap threshold at 32 MiB on 64-bit targets).
            let ok = unsafe {
                mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
                    && mallopt(M_TRIM_THRESHOLD, i32::MAX) == 1
                    && mallopt(M_TOP_PAD, 64 << 20) == 1
            };
            if !ok {
                tracing::debug!("mallopt refused a setting; host buffers use glibc's defaults");
            }
        }
    });
}
