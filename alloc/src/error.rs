//! The crate's one error type and the structured out-of-memory report.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::stats::fmt_bytes;
use crate::tenant::TenantId;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the allocator, its sources and its configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An allocation could not be served; the payload says why and what to do.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),

    /// A memory source failed for a reason other than running out of memory.
    #[error("memory source {source_name}: {call} failed: {detail}")]
    Source {
        /// The source (`"sim"`, `"host"`, `"cuda:0"`, ...).
        source_name: String,
        /// The call that failed (`"cuMemCreate"`, `"reserve"`, ...).
        call: &'static str,
        /// The driver's or the OS's words.
        detail: String,
    },

    /// This build has no CUDA support, but a CUDA source or device was asked for.
    #[error(
        "{what} needs CUDA, but cohort-alloc was built without the `cuda` feature; rebuild with `--features cuda` \
         or use the CPU (COHORT_DEVICE=cpu)"
    )]
    NotCompiledWithCuda {
        /// What was asked for.
        what: String,
    },

    /// The CUDA driver library could not be found or no such device exists.
    #[error("no CUDA device for {what}: {detail}; use COHORT_DEVICE=cpu to run on the CPU")]
    NoCudaDevice {
        /// What was asked for (`"cuda:0"`).
        what: String,
        /// Why (driver missing, ordinal out of range, ...).
        detail: String,
    },

    /// An environment variable held a value that is not one of its accepted forms.
    #[error("environment variable {var}={value:?} is not valid: expected {expected}")]
    InvalidEnv {
        /// The variable's name.
        var: &'static str,
        /// Its value as found.
        value: String,
        /// The accepted forms.
        expected: &'static str,
    },

    /// A configuration value (from the builder or a string) is not valid.
    #[error("invalid allocator setting {setting} = {value:?}: expected {expected}")]
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// The value given.
        value: String,
        /// The accepted forms.
        expected: &'static str,
    },

    /// The configuration was changed after the allocator's first allocation.
    #[error(
        "the allocator configuration of {device} is frozen: it was first used at {first_use}; \
         set {setting} before the first allocation (builder or COHORT_* environment variables)"
    )]
    ConfigFrozen {
        /// The allocator's device.
        device: String,
        /// What the caller tried to change.
        setting: &'static str,
        /// Source location of the first allocation.
        first_use: String,
    },

    /// A tenant was named that this allocator does not know.
    #[error("unknown tenant {0}: add it with Bfc::add_tenant first")]
    UnknownTenant(TenantId),

    /// A process-wide limit that leaves the pool nothing after what the process holds outside it.
    #[error(
        "the process-wide memory limit of {} is below what the process needs outside the allocator's pool ({}: the CUDA \
         context and what is loaded into it, and headroom for its growth) plus a pool of {}: raise the limit to at least {}, or \
         set scope = \"pool\" to cap only the pool",
        crate::fmt_bytes(*limit), crate::fmt_bytes(*outside), crate::fmt_bytes(*min_pool),
        crate::fmt_bytes(outside + min_pool)
    )]
    LimitBelowOutside {
        /// The limit for the whole process.
        limit: u64,
        /// What lies outside the pool, with the headroom kept for its growth.
        outside: u64,
        /// The least pool worth running with.
        min_pool: u64,
    },

    /// Tenant limits that can never hold together.
    #[error("tenant {name:?}: {detail}")]
    InvalidTenant {
        /// The tenant's name.
        name: String,
        /// What is wrong.
        detail: String,
    },

    /// A block was given back that this allocator did not hand out (or was already freed).
    #[error(
        "block at {ptr:#x} ({size} bytes) does not belong to this allocator or was already freed; \
         free each block once, on the allocator that made it"
    )]
    ForeignBlock {
        /// The block's address.
        ptr: u64,
        /// The block's size.
        size: u64,
    },

    /// A trace file could not be read or parsed.
    #[error("trace {path}, line {line}: {detail}")]
    Trace {
        /// The file.
        path: String,
        /// 1-based line number (0 when the file itself could not be opened).
        line: usize,
        /// What is wrong.
        detail: String,
    },
}

impl Error {
    /// True for an out-of-memory error (the caller may shrink its request and retry).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_))
    }

    /// The structured report of an out-of-memory error.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            Error::OutOfMemory(oom) => Some(oom),
            _ => None,
        }
    }
}

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// The tenant would pass its own `limit`; other tenants are unaffected.
    TenantLimit,
    /// The memory left is promised to other tenants' reserves.
    ReservedByOthers,
    /// The allocator's limit or the device is full of live blocks.
    DeviceFull,
    /// Enough bytes are free in total, but no free block is large enough.
    Fragmentation,
    /// The request is larger than the allocator's limit: it can never fit.
    TooLarge,
}

impl OomCause {
    /// Short words for the cause.
    pub fn as_str(self) -> &'static str {
        match self {
            OomCause::TenantLimit => "tenant limit",
            OomCause::ReservedByOthers => "reserved by other tenants",
            OomCause::DeviceFull => "device full",
            OomCause::Fragmentation => "fragmentation",
            OomCause::TooLarge => "can never fit",
        }
    }
}

impl fmt::Display for OomCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything known at the moment an allocation failed (after one trim and retry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutOfMemory {
    /// The allocator's device (`"cuda:0"`, `"sim"`).
    pub device: String,
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes after rounding to the allocator's granularity.
    pub rounded: u64,
    /// The tenant that asked.
    pub tenant: TenantId,
    /// Its name.
    pub tenant_name: String,
    /// Its live bytes.
    pub tenant_in_use: u64,
    /// Its limit, if any.
    pub tenant_limit: Option<u64>,
    /// Live bytes of all tenants.
    pub in_use: u64,
    /// Bytes the allocator holds from its source.
    pub reserved: u64,
    /// The allocator's limit.
    pub limit: u64,
    /// Bytes other tenants' reserves still hold back.
    pub reserved_for_others: u64,
    /// Free bytes of the device as its driver reports them.
    pub device_free: u64,
    /// The largest block that could be handed out without growing.
    pub largest_free_block: u64,
    /// 1 − largest free block / free bytes of the cache.
    pub fragmentation: f64,
    /// Why it failed.
    pub cause: OomCause,
}

impl OutOfMemory {
    /// One sentence that tells the user what to do about it.
    pub fn advice(&self) -> &'static str {
        match self.cause {
            OomCause::TenantLimit => {
                "Raise this tenant's limit, or lower its batch size; other tenants are unaffected"
            }
            OomCause::ReservedByOthers => {
                "The free memory is promised to other tenants' reserves: lower their reserve, or give this tenant one"
            }
            OomCause::DeviceFull => {
                "Lower the batch size or the number of models, raise COHORT_MEMORY_LIMIT, or free tensors that are no longer needed"
            }
            OomCause::Fragmentation => {
                "Free memory is split into blocks too small for this request: call trim() and retry, or use the stitched \
                 (virtual memory) source, which does not fragment"
            }
            OomCause::TooLarge => {
                "This one request is larger than the allocator's whole limit: raise COHORT_MEMORY_LIMIT or split the tensor"
            }
        }
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory on {}: tenant {:?} asked {}",
            self.device,
            self.tenant_name,
            fmt_bytes(self.requested)
        )?;
        match self.tenant_limit {
            Some(limit) => write!(
                f,
                "; the tenant uses {} of its {} limit",
                fmt_bytes(self.tenant_in_use),
                fmt_bytes(limit)
            )?,
            None => write!(
                f,
                "; the tenant uses {} (no limit)",
                fmt_bytes(self.tenant_in_use)
            )?,
        }
        write!(
            f,
            "; all tenants use {} of the allocator's {} limit, {} reserved from the device, {} held for other \
             tenants' reserves; device free {}; largest free block {}; fragmentation {:.1} %. Cause: {}. {}",
            fmt_bytes(self.in_use),
            fmt_bytes(self.limit),
            fmt_bytes(self.reserved),
            fmt_bytes(self.reserved_for_others),
            fmt_bytes(self.device_free),
            fmt_bytes(self.largest_free_block),
            self.fragmentation * 100.0,
            self.cause,
            self.advice()
        )
    }
}
