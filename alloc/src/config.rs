//! Configuration: builder, environment variables, byte sizes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Idle physical pages the stitched layout keeps mapped beyond what live blocks touch, before it moves pages instead
/// of creating new ones: memory traded for moves, each about 55 µs of driver calls on the host on an H200 (none of
/// them waits for the device). Measured on transformer-lm repeated step by step (crate docs): 0 pages move about
/// 85 a step at 0.42 % overhead, 16 about 60 at 2.2 %, 96 none at 7.66 %. The default keeps memory at its floor.
pub const DEFAULT_IDLE_PAGE_SLACK: u64 = 0;

/// Free chunks examined, from the best fit on, for a place on backed pages when the best fit's place would need new
/// ones (a move or a create). Measured on the shared traces (crate docs): 64 cut transformer-lm's steady-state
/// moves from about 300 pages a step (plain best fit) to about 85 in 3 map calls, at 0.42 % overhead instead of
/// 0.55 %; 8 moved about 140 a step; more than 64 changed nothing.
pub const DEFAULT_PLACEMENT_CANDIDATES: usize = 64;

/// Blocks of at least this size go to the stitched layout's large arena. Measured on the shared traces (crate
/// docs): 1 MiB lowered the overhead on transformer-varlen from 1.33 % to 0.38 % and changed no other trace.
pub const DEFAULT_LARGE_BLOCK: u64 = 1 << 20;

/// Fraction of the limit reserved up front by [`Policy::Preallocate`] when `COHORT_MEMORY_GROWTH=false`.
pub const DEFAULT_PREALLOCATE_FRACTION: f64 = 0.9;

/// Which allocator serves the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Best-fit with coalescing over cached regions (the default).
    #[default]
    Bfc,
    /// The driver's stream-ordered pool (cuMemAllocAsync / cuMemFreeAsync) with a release threshold.
    Async,
    /// No cache: every allocation is a source call (for debugging with compute-sanitizer and the like).
    Direct,
}

impl Backend {
    /// The name used in `COHORT_ALLOCATOR`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Bfc => "bfc",
            Backend::Async => "async",
            Backend::Direct => "direct",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bfc" => Ok(Backend::Bfc),
            "async" => Ok(Backend::Async),
            "direct" => Ok(Backend::Direct),
            _ => Err(Error::InvalidConfig {
                setting: "backend",
                value: s.into(),
                expected: BACKEND_FORMS,
            }),
        }
    }
}

const BACKEND_FORMS: &str = "one of bfc, async, direct";
const LIMIT_FORMS: &str = "a size such as 12GiB, 512MiB, 1.5GB or 1048576 (bytes), or a percent of the device such as 40%";
const BOOL_FORMS: &str = "true or false (also 1/0, yes/no, on/off)";
const DEVICE_FORMS: &str = "auto, cpu, cuda or cuda:N (N = device ordinal)";
const SCOPE_FORMS: &str = "pool (the limit caps the allocator's pool) or process (everything the process holds on the device)";

/// What the memory limit covers (`COHORT_MEMORY_SCOPE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The allocator's pool: the CUDA context, modules and library handles come on top (TensorFlow's
    /// `memory_limit` of a logical device, PyTorch's `set_per_process_memory_fraction`).
    #[default]
    Pool,
    /// Everything the process holds on the device: the pool gets what the limit leaves after the context,
    /// modules and library handles (what `nvidia-smi` shows for the process stays within the limit).
    Process,
}

impl Scope {
    /// The name used in `COHORT_MEMORY_SCOPE` and a config's `[memory] scope`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Pool => "pool",
            Scope::Process => "process",
        }
    }
}

/// What a [`Scope::Process`] limit keeps free beyond what lies outside the pool when it was measured: the outside
/// grows between measurements (kernels loaded at their first use, library handles, graphs) and the process must
/// stay within the limit meanwhile. Measured on the H200: it grew by 31 MiB over a run's first second.
pub const PROCESS_HEADROOM: u64 = 64 << 20;

/// The smallest pool a [`Scope::Process`] limit may leave (two 2 MiB pages).
pub const MIN_POOL: u64 = 4 << 20;

/// The pool's share of a process-wide `limit` when the process holds `outside` bytes outside the pool: the rest,
/// less [`PROCESS_HEADROOM`].
///
/// # Errors
/// [`Error::LimitBelowOutside`] with both figures when that leaves less than [`MIN_POOL`].
pub fn pool_share(limit: u64, outside: u64) -> Result<u64> {
    let outside = outside + PROCESS_HEADROOM;
    match limit.checked_sub(outside) {
        Some(pool) if pool >= MIN_POOL => Ok(pool),
        _ => Err(Error::LimitBelowOutside {
            limit,
            outside,
            min_pool: MIN_POOL,
        }),
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pool" => Ok(Scope::Pool),
            "process" => Ok(Scope::Process),
            _ => Err(Error::InvalidConfig {
                setting: "scope",
                value: s.into(),
                expected: SCOPE_FORMS,
            }),
        }
    }
}

/// How the cache grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Start empty, grow on demand in regions sized to waste little (TensorFlow's `allow_growth`).
    #[default]
    Growth,
    /// Reserve `fraction` of the limit at the first allocation and never grow past it (TensorFlow's default).
    Preallocate {
        /// In (0, 1].
        fraction: f64,
    },
}

/// A hard cap on what the allocator reserves from its source.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this percent (0, 100] of the device's capacity.
    Percent(f64),
}

impl Limit {
    /// The limit in bytes for a device of `capacity` bytes (never above the capacity).
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            Limit::Bytes(b) => b.min(capacity),
            Limit::Percent(p) => ((capacity as f64) * p / 100.0) as u64,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Bytes(b) => f.write_str(&crate::stats::fmt_bytes(*b)),
            Limit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for Limit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidConfig {
            setting: "limit",
            value: s.into(),
            expected: LIMIT_FORMS,
        };
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad());
            }
            return Ok(Limit::Percent(v));
        }
        parse_bytes(t).map(Limit::Bytes).ok_or_else(bad)
    }
}

/// Parses a size, the one syntax of every size cohort reads (`COHORT_MEMORY_LIMIT`, a config's `limit` and
/// `reserve`, `cohort replay --limit`): `12GiB`, `512 MiB`, `64k`, `1g` (a bare `k`, `m`, `g`, `t` is binary, as
/// `KiB` ...), `1.5GB`, `500kB` (decimal), `1048576` (bytes); case does not matter. `None` when it is not a
/// positive size.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = v * mult;
    if bytes.is_nan() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return None;
    }
    Some(bytes as u64)
}

/// Which device an allocator serves (`COHORT_DEVICE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceSelector {
    /// The first CUDA device when a driver and a GPU are found, else the CPU.
    #[default]
    Auto,
    /// Host memory.
    Cpu,
    /// CUDA device by ordinal.
    Cuda(usize),
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Auto => f.write_str("auto"),
            DeviceSelector::Cpu => f.write_str("cpu"),
            DeviceSelector::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSelector {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || Error::InvalidConfig {
            setting: "device",
            value: s.into(),
            expected: DEVICE_FORMS,
        };
        match t.as_str() {
            "auto" => Ok(DeviceSelector::Auto),
            "cpu" => Ok(DeviceSelector::Cpu),
            "cuda" | "gpu" => Ok(DeviceSelector::Cuda(0)),
            _ => {
                let n = t.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(DeviceSelector::Cuda).map_err(|_| bad())
            }
        }
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// The allocator's settings. Build with [`Config::builder`] or read with [`Config::from_env`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Which allocator serves the device.
    pub backend: Backend,
    /// Growth or preallocation.
    pub policy: Policy,
    /// Hard cap on reserved bytes; `None`: the device's capacity.
    pub limit: Option<Limit>,
    /// What the limit covers: the pool, or the whole process (applied by the tensor crate, which sees what lies
    /// outside the pool, through [`crate::Bfc::resize_limit`]).
    #[serde(default)]
    pub scope: Scope,
    /// Which device (used by [`crate::device_allocator`]).
    pub device: DeviceSelector,
    /// Stitched layout: idle physical pages kept mapped before pages are moved instead of created.
    pub idle_page_slack: u64,
    /// Keep the last this many allocator events for [`crate::Bfc::chrome_trace`]; 0 turns recording off.
    pub record_events: usize,
    /// Async backend: bytes the driver's pool keeps cached across synchronizations (`None`: keep everything).
    pub release_threshold: Option<u64>,
    /// Stitched layout: free chunks (the best fit and those next in size, then the arena's largest) examined for a
    /// place on backed pages when the best fit's place would need new ones.
    pub placement_candidates: usize,
    /// Stitched layout: blocks of at least this many bytes are placed in the large arena (`u64::MAX`: one arena).
    pub large_block: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            backend: Backend::Bfc,
            policy: Policy::Growth,
            limit: None,
            scope: Scope::Pool,
            device: DeviceSelector::Auto,
            idle_page_slack: DEFAULT_IDLE_PAGE_SLACK,
            record_events: 0,
            release_threshold: None,
            placement_candidates: DEFAULT_PLACEMENT_CANDIDATES,
            large_block: DEFAULT_LARGE_BLOCK,
        }
    }
}

impl Config {
    /// A builder starting from the defaults (BFC, growth, no limit, device auto).
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder {
            config: Config::default(),
        }
    }

    /// A builder starting from an existing configuration.
    pub fn builder_from(config: Config) -> ConfigBuilder {
        ConfigBuilder { config }
    }

    /// The defaults overridden by `COHORT_MEMORY_LIMIT`, `COHORT_MEMORY_SCOPE`, `COHORT_MEMORY_GROWTH`,
    /// `COHORT_ALLOCATOR` and `COHORT_DEVICE`.
    ///
    /// # Errors
    /// [`Error::InvalidEnv`] naming the variable, its value and the accepted forms.
    pub fn from_env() -> Result<Config> {
        Config::builder().env()?.build()
    }

    /// The limit in bytes for a device of `capacity` bytes.
    pub fn limit_bytes(&self, capacity: u64) -> u64 {
        self.limit.map_or(capacity, |l| l.bytes(capacity))
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] checks it.
#[derive(Clone, Debug)]
pub struct ConfigBuilder {
    config: Config,
}

impl ConfigBuilder {
    /// Sets the backend.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.config.backend = backend;
        self
    }
    /// Sets the growth policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.config.policy = policy;
        self
    }
    /// `true`: [`Policy::Growth`]; `false`: [`Policy::Preallocate`] of [`DEFAULT_PREALLOCATE_FRACTION`].
    pub fn growth(self, growth: bool) -> Self {
        self.policy(if growth {
            Policy::Growth
        } else {
            Policy::Preallocate {
                fraction: DEFAULT_PREALLOCATE_FRACTION,
            }
        })
    }
    /// Reserve `fraction` of the limit at the first allocation.
    pub fn preallocate(self, fraction: f64) -> Self {
        self.policy(Policy::Preallocate { fraction })
    }
    /// Sets a hard limit.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.config.limit = Some(limit);
        self
    }
    /// Sets a hard limit in bytes.
    pub fn limit_bytes(self, bytes: u64) -> Self {
        self.limit(Limit::Bytes(bytes))
    }
    /// Sets a hard limit as a percent of the device.
    pub fn limit_percent(self, percent: f64) -> Self {
        self.limit(Limit::Percent(percent))
    }
    /// Sets what the limit covers.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.config.scope = scope;
        self
    }
    /// Sets the device.
    pub fn device(mut self, device: DeviceSelector) -> Self {
        self.config.device = device;
        self
    }
    /// Sets the stitched layout's idle-page slack (pages).
    pub fn idle_page_slack(mut self, pages: u64) -> Self {
        self.config.idle_page_slack = pages;
        self
    }
    /// Records the last `events` allocator events (0: off).
    pub fn record_events(mut self, events: usize) -> Self {
        self.config.record_events = events;
        self
    }
    /// Sets how many free chunks the stitched layout examines for a place on backed pages (1: the best fit's chunk
    /// and the largest, and only when the best fit's place would wait for the stream).
    pub fn placement_candidates(mut self, n: usize) -> Self {
        self.config.placement_candidates = n.max(1);
        self
    }
    /// Sets the stitched layout's large-block threshold (`u64::MAX`: one arena for all sizes).
    pub fn large_block(mut self, bytes: u64) -> Self {
        self.config.large_block = bytes;
        self
    }
    /// Sets the async pool's release threshold.
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.config.release_threshold = Some(bytes);
        self
    }

    /// Applies the `COHORT_*` environment variables that are set.
    ///
    /// # Errors
    /// [`Error::InvalidEnv`] for the first variable with a bad value.
    pub fn env(self) -> Result<Self> {
        self.env_from(|name| std::env::var(name).ok())
    }

    /// Like [`env`](Self::env), reading variables through `get` (for tests and embedding).
    ///
    /// # Errors
    /// [`Error::InvalidEnv`] for the first variable with a bad value.
    pub fn env_from(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        if let Some(v) = get("COHORT_MEMORY_LIMIT") {
            let limit: Limit = v.parse().map_err(|_| Error::InvalidEnv {
                var: "COHORT_MEMORY_LIMIT",
                value: v.clone(),
                expected: LIMIT_FORMS,
            })?;
            self.config.limit = Some(limit);
        }
        if let Some(v) = get("COHORT_MEMORY_SCOPE") {
            self.config.scope = v.parse().map_err(|_| Error::InvalidEnv {
                var: "COHORT_MEMORY_SCOPE",
                value: v.clone(),
                expected: SCOPE_FORMS,
            })?;
        }
        if let Some(v) = get("COHORT_MEMORY_GROWTH") {
            let growth = parse_bool(&v).ok_or_else(|| Error::InvalidEnv {
                var: "COHORT_MEMORY_GROWTH",
                value: v.clone(),
                expected: BOOL_FORMS,
            })?;
            self = self.growth(growth);
        }
        if let Some(v) = get("COHORT_ALLOCATOR") {
            self.config.backend = v.parse().map_err(|_| Error::InvalidEnv {
                var: "COHORT_ALLOCATOR",
                value: v.clone(),
                expected: BACKEND_FORMS,
            })?;
        }
        if let Some(v) = get("COHORT_DEVICE") {
            self.config.device = v.parse().map_err(|_| Error::InvalidEnv {
                var: "COHORT_DEVICE",
                value: v.clone(),
                expected: DEVICE_FORMS,
            })?;
        }
        Ok(self)
    }

    /// Checks and returns the configuration.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a preallocation fraction outside (0, 1], a percent outside (0, 100] or a zero
    /// byte limit.
    pub fn build(self) -> Result<Config> {
        let c = self.config;
        if let Policy::Preallocate { fraction } = c.policy {
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(Error::InvalidConfig {
                    setting: "preallocate fraction",
                    value: fraction.to_string(),
                    expected: "a fraction in (0, 1], such as 0.9",
                });
            }
        }
        match c.limit {
            Some(Limit::Percent(p)) if !(p > 0.0 && p <= 100.0) => {
                return Err(Error::InvalidConfig {
                    setting: "limit",
                    value: format!("{p}%"),
                    expected: LIMIT_FORMS,
                });
            }
            Some(Limit::Bytes(0)) => {
                return Err(Error::InvalidConfig {
                    setting: "limit",
                    value: "0".into(),
                    expected: LIMIT_FORMS,
                });
            }
            _ => {}
        }
        Ok(c)
    }
}
