//! Tenants: one memory budget per model, sharing one allocator.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Names a tenant of one allocator. [`TenantId::DEFAULT`] always exists and has no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantId(pub u16);

impl TenantId {
    /// The tenant of allocations made outside any member.
    pub const DEFAULT: TenantId = TenantId(0);

    /// Index into the allocator's tenant table.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant#{}", self.0)
    }
}

/// A tenant's budget: a hard `limit` on its live bytes and a `reserve` that other tenants may not take.
///
/// Memory no tenant needs is shared: a tenant without a reserve borrows whatever is not promised to others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// At most this many live bytes (rounded sizes); `None`: bounded only by the allocator's limit.
    pub limit: Option<u64>,
    /// This many bytes are kept available for the tenant: others' allocations that would eat into it fail.
    pub reserve: u64,
}

impl TenantLimits {
    /// No limit, no reserve.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// A hard limit and no reserve.
    pub fn limit(bytes: u64) -> Self {
        Self {
            limit: Some(bytes),
            reserve: 0,
        }
    }

    /// Adds a reserve.
    pub fn with_reserve(mut self, bytes: u64) -> Self {
        self.reserve = bytes;
        self
    }
}

/// Live accounting of one tenant.
#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    pub name: String,
    pub limits: TenantLimits,
    pub in_use: u64,
    pub peak_in_use: u64,
    pub allocs: u64,
    pub frees: u64,
    pub ooms: u64,
}

impl Tenant {
    pub fn new(name: String, limits: TenantLimits) -> Self {
        Self {
            name,
            limits,
            in_use: 0,
            peak_in_use: 0,
            allocs: 0,
            frees: 0,
            ooms: 0,
        }
    }

    /// Bytes of its reserve it does not use yet (what others must leave alone).
    pub fn unmet_reserve(&self) -> u64 {
        self.limits.reserve.saturating_sub(self.in_use)
    }
}
