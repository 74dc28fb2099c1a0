//! Member memory budgets as allocator tenants.
//!
//! On a GPU every tensor a member allocates is a block of the device's `Bfc` (cohort-alloc), charged to the
//! member's tenant (the step runs inside [`cohort_tensor::memory::with_tenant`]), so its limit, peak and OOMs are
//! the allocator's own. On the CPU, host tensors are plain vectors that no allocator sees; there the trainer charges
//! each member's working set to its tenant on a host-accounting `Bfc` over a [`SimMemory`] (addresses only, no
//! memory behind them): parameters, gradients and optimizer buffers for as long as the member lives, and the
//! activations of each step (every layer's output and its gradient for the batch) while the step runs. Limits,
//! peaks and out-of-memory errors then behave the same on both devices, and the OOM recovery path is tested on the
//! CPU.
//!
//! A program that trains models of its own outside a [`Cohort`](crate::cohort::Cohort) uses the same pattern: one
//! tenant per model, the model built and stepped inside [`Tenant::scope`], its bytes read back per model:
//!
//! ```
//! use cohort_alloc::TenantLimits;
//! use cohort_autograd::{BuildOptions, ModelSpec};
//! use cohort_tensor::Device;
//! use cohort_trainer::memory::Tenant;
//!
//! let dev = Device::Cpu; // or Device::Cuda(0): there every tensor the scope allocates is charged
//! let mut tenant = Tenant::new(&dev, "small", TenantLimits::limit(64 << 20).with_reserve(8 << 20))?;
//! let spec = ModelSpec::from_toml(r#"layers = [{ linear = 32, act = "relu" }, { linear = 10 }]"#).unwrap();
//! let model = tenant.scope(|| spec.build(&[784], &BuildOptions::new(1, 0, dev)))?;
//! // On the CPU the working set is charged by hand: parameters, gradients and Adam's two moments.
//! tenant.charge_persistent(model.member_param_count() as u64 * 4 * 4)?;
//! {
//!     let _step = tenant.charge_step(1 << 20)?; // one step's activations, while it runs
//!     assert!(tenant.usage().0 >= 25_450 * 16 + (1 << 20)); // 25,450 parameters, and the step
//! }
//! let (now, peak) = tenant.usage();
//! assert!(peak > now, "the step's bytes are gone, its peak is not");
//! tenant.reset_peak(); // measure the next phase's peak on its own
//! assert_eq!(tenant.usage(), (now, now));
//! # Ok::<(), cohort_trainer::Error>(())
//! ```

use std::sync::{Arc, OnceLock};

use cohort_alloc::{
    Bfc, Block, Config as AllocConfig, MemoryReport, SimMemory, TenantId, TenantLimits,
    TenantReport,
};
use cohort_tensor::Device;
use cohort_tensor::memory::{DeviceAllocator, ProcessMemory};

use crate::error::Result;

/// The host-accounting allocator: a simulated address space as large as anything a host could hold.
fn host_accounting() -> Result<Arc<Bfc<SimMemory>>> {
    static HOST: OnceLock<Arc<Bfc<SimMemory>>> = OnceLock::new();
    if let Some(h) = HOST.get() {
        return Ok(h.clone());
    }
    let bfc = Bfc::new(SimMemory::new(1 << 44), AllocConfig::default())?;
    Ok(HOST.get_or_init(|| Arc::new(bfc)).clone())
}

/// Total memory of the host (from /proc/meminfo), or 16 GiB when unknown.
pub fn host_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(16 << 30, |kb| kb * 1024)
}

/// Where a tenant's bytes are counted.
#[derive(Clone, Debug)]
enum Accounting {
    /// The GPU's allocator: tensors allocate from it.
    Device(Arc<dyn DeviceAllocator>),
    /// The host-accounting allocator: the trainer charges working sets to it.
    Host(Arc<Bfc<SimMemory>>),
}

/// One member's (or fused group's) budget.
#[derive(Debug)]
pub struct Tenant {
    accounting: Accounting,
    id: TenantId,
    name: String,
    persistent: Vec<Block>,
}

/// Unique tenant names: a member re-created after an OOM split or a move gets a fresh tenant.
fn unique_name(base: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{base}#{}", N.fetch_add(1, Ordering::Relaxed))
}

impl Tenant {
    /// A tenant for `name` on `device` with `limits`.
    ///
    /// # Errors
    /// When the device's allocator cannot be created or the limits cannot be met.
    pub fn new(device: &Device, name: &str, limits: TenantLimits) -> Result<Tenant> {
        let accounting = match device {
            Device::Cpu => Accounting::Host(host_accounting()?),
            Device::Cuda(_) => Accounting::Device(cohort_tensor::memory::allocator(device)?),
        };
        let unique = unique_name(name);
        let id = match &accounting {
            Accounting::Device(a) => a.add_tenant(&unique, limits)?,
            Accounting::Host(b) => b.add_tenant(unique.clone(), limits)?,
        };
        Ok(Tenant {
            accounting,
            id,
            name: name.to_string(),
            persistent: Vec::new(),
        })
    }

    /// The allocator's id of this tenant.
    pub fn id(&self) -> TenantId {
        self.id
    }

    /// Runs `f` with this tenant current, so that GPU allocations are charged to it.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        cohort_tensor::memory::with_tenant(self.id, f)
    }

    /// Charges `bytes` for as long as the tenant lives (CPU accounting; on a GPU the tensors themselves are).
    ///
    /// # Errors
    /// The allocator's out-of-memory error.
    pub fn charge_persistent(&mut self, bytes: u64) -> Result<()> {
        if let Accounting::Host(b) = &self.accounting
            && bytes > 0
        {
            self.persistent.push(b.alloc(bytes as usize, self.id)?);
        }
        Ok(())
    }

    /// Charges a step's working set of `bytes` until the returned guard drops (CPU accounting only).
    ///
    /// # Errors
    /// The allocator's out-of-memory error.
    pub fn charge_step(&self, bytes: u64) -> Result<StepCharge> {
        match &self.accounting {
            Accounting::Host(b) if bytes > 0 => Ok(StepCharge {
                held: Some((b.clone(), b.alloc(bytes as usize, self.id)?)),
            }),
            _ => Ok(StepCharge { held: None }),
        }
    }

    /// Bytes the tenant holds now and at its peak.
    pub fn usage(&self) -> (u64, u64) {
        self.stats().map_or((0, 0), |r| (r.in_use, r.peak_in_use))
    }

    /// The allocator's line for this tenant: what it holds and held at its peak, its limit and reserve now.
    pub fn stats(&self) -> Option<TenantReport> {
        match &self.accounting {
            Accounting::Device(a) => a.tenant_stats(self.id),
            Accounting::Host(b) => b.tenant_stats(self.id),
        }
    }

    /// One member's share of the tenant now, out of `members` (a fused group's bytes, limit and reserve are split
    /// evenly, as its memory accounting is): what it holds, its high-water mark since the peak was last reset, its
    /// limit and reserve.
    pub fn share(&self, members: usize) -> MemberUsage {
        let n = members.max(1) as u64;
        self.stats()
            .map_or_else(MemberUsage::default, |r| MemberUsage {
                live: r.in_use / n,
                high_water: r.peak_in_use / n,
                limit: r.limit.map(|l| l / n),
                reserve: r.reserve / n,
            })
    }

    /// Starts the tenant's peak afresh from what it holds now.
    pub fn reset_peak(&self) {
        match &self.accounting {
            Accounting::Device(a) => a.reset_tenant_peak(self.id),
            Accounting::Host(b) => b.reset_tenant_peak(self.id),
        };
    }

    /// Returns the cache's unused regions to the device (a GPU's pages to the driver; host accounting's
    /// simulated regions to its address space).
    pub fn trim(&self) -> u64 {
        match &self.accounting {
            Accounting::Device(a) => a.trim(),
            Accounting::Host(b) => b.trim(),
        }
    }

    /// Changes the tenant's limit and reserve while it trains. A limit below what it holds only stops its growth.
    ///
    /// # Errors
    /// The reserves of all tenants together would exceed the device's limit, or the reserve is above the limit.
    pub fn set_limits(&self, limits: TenantLimits) -> Result<()> {
        match &self.accounting {
            Accounting::Device(a) => a.set_tenant_limits(self.id, limits)?,
            Accounting::Host(b) => b.set_tenant_limits(self.id, limits)?,
        }
        Ok(())
    }

    /// The allocator's report (device-wide, every tenant).
    pub fn report(&self) -> MemoryReport {
        match &self.accounting {
            Accounting::Device(a) => a.stats(),
            Accounting::Host(b) => b.stats(),
        }
    }

    /// The member (or group) name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        if let Accounting::Host(b) = &self.accounting {
            for block in self.persistent.drain(..) {
                b.free(block);
            }
        }
        // A device tenant cannot be removed; its blocks went back with its tensors. Release its reserve.
        if let Accounting::Device(a) = &self.accounting {
            let _ = a.set_tenant_limits(self.id, TenantLimits::limit(0));
        }
    }
}

/// A member's memory at one moment, as its records and the live snapshot (`memory-now.json`) give it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberUsage {
    /// Bytes its tenant holds ("live"; in the records, at the height of its latest step).
    pub live: u64,
    /// Its tenant's high-water mark over an interval (in the records, since the member's previous record).
    pub high_water: u64,
    /// Its limit, if any.
    pub limit: Option<u64>,
    /// Its guaranteed reserve (0: none).
    pub reserve: u64,
}

impl MemberUsage {
    /// What the pool holds on the member's behalf ("reserved"): the bytes it grew to at its high-water mark (the
    /// caching allocator keeps them for it unless trimmed) or its guaranteed reserve, whichever is larger, and never
    /// less than what it holds.
    pub fn reserved(&self) -> u64 {
        self.live.max(self.high_water).max(self.reserve)
    }
}

/// A step's charged working set; released on drop.
#[derive(Debug)]
pub struct StepCharge {
    held: Option<(Arc<Bfc<SimMemory>>, Block)>,
}

impl Drop for StepCharge {
    fn drop(&mut self) {
        if let Some((b, block)) = self.held.take() {
            b.free(block);
        }
    }
}

/// Total bytes of a device (the GPU allocator's limit, or the host's memory).
///
/// # Errors
/// When the GPU allocator cannot be created.
pub fn device_total_bytes(device: &Device) -> Result<u64> {
    match device {
        Device::Cpu => Ok(host_total_bytes()),
        Device::Cuda(_) => {
            let a = cohort_tensor::memory::allocator(device)?;
            let r = a.stats();
            Ok(r.limit.max(r.device_free))
        }
    }
}

/// The allocator's report of a GPU (`None` for the CPU).
pub fn device_report(device: &Device) -> Option<MemoryReport> {
    match device {
        Device::Cpu => host_accounting().ok().map(|b| b.stats()),
        Device::Cuda(_) => cohort_tensor::memory::allocator(device)
            .ok()
            .map(|a| a.stats()),
    }
}

/// Gives `device`'s idle cache back to it (a GPU's cached pages to the driver, not only to the pool; host
/// accounting's regions on the CPU); the bytes released.
pub fn hand_back(device: &Device) -> u64 {
    match device {
        Device::Cpu => host_accounting().map_or(0, |b| b.trim()),
        Device::Cuda(_) => cohort_tensor::memory::allocator(device).map_or(0, |a| a.trim()),
    }
}

/// Everything the process holds on a GPU, measured now (`None` for the CPU, or where the GPU's allocator was never
/// made).
pub fn process_report(device: &Device) -> Option<ProcessMemory> {
    match device {
        Device::Cpu => None,
        Device::Cuda(_) => cohort_tensor::memory::allocator(device)
            .ok()
            .and_then(|a| a.process_memory()),
    }
}

/// Re-applies a process-wide limit on a GPU (`[memory] scope = "process"`): the pool gets what the limit leaves
/// after what lies outside it in `now` (a [`process_report`]).
///
/// # Errors
/// The limit is below what lies outside the pool.
pub fn apply_process_limit(device: &Device, now: &ProcessMemory) -> Result<()> {
    if let Device::Cuda(_) = device {
        cohort_tensor::memory::allocator(device)?.apply_process_limit(now)?;
    }
    Ok(())
}
