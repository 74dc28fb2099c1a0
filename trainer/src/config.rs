//! The TOML run configuration: `[run]`, `[memory]`, `[data.NAME]` and `[[member]]` tables.
//!
//! A config is parsed by hand from a [`toml::Table`] so that every error names the file, the table, the key and what
//! is accepted. Lists of scalar values inside a `[[member]]` table are a hyper-parameter grid: the member expands
//! into one member per combination, named by the values (`mlp` with `lr = [1e-3, 3e-3]` becomes `mlp-lr1e-3` and
//! `mlp-lr3e-3`). See `examples/*.toml` for documented configs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::{Table, Value};

/// A config error: the file, where in it, and what is accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The config file (or `<built-in default job>`).
    pub file: String,
    /// The table, e.g. `[run]` or `[[member]] 2`; empty for a syntax error.
    pub section: String,
    /// The dotted key inside the table; empty when the whole table is at fault.
    pub key: String,
    /// What is wrong and what is accepted.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.section.is_empty(), self.key.is_empty()) {
            (true, _) => write!(f, "{}: {}", self.file, self.message),
            (false, true) => write!(f, "{}: {}: {}", self.file, self.section, self.message),
            (false, false) => write!(
                f,
                "{}: {}, key \"{}\": {}",
                self.file, self.section, self.key, self.message
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

type CResult<T> = std::result::Result<T, ConfigError>;

/// How members take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// Every round, each member takes one step (members sharing data see the same batch).
    Lockstep,
    /// One member trains a whole epoch, then the next member.
    EpochSliced,
    /// Every round, each member takes `weight` steps.
    Weighted,
}

impl ScheduleKind {
    const ACCEPTED: &'static str = "\"lockstep\", \"epoch-sliced\", \"weighted\" or \"fused\"";
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScheduleKind::Lockstep => "lockstep",
            ScheduleKind::EpochSliced => "epoch-sliced",
            ScheduleKind::Weighted => "weighted",
        })
    }
}

/// A memory amount: bytes, or a fraction of the device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemAmount {
    /// An absolute number of bytes.
    Bytes(u64),
    /// A fraction (0, 1] of the device's total memory.
    Fraction(f64),
}

impl MemAmount {
    /// Parses `"12GiB"`, `"512 MiB"`, `"1.5GB"`, `"40%"` or a plain number of bytes.
    pub fn parse(s: &str) -> Option<MemAmount> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let v: f64 = p.trim().parse().ok()?;
            return (v > 0.0 && v <= 100.0).then_some(MemAmount::Fraction(v / 100.0));
        }
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let v: f64 = num.parse().ok()?;
        let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kb" => 1e3,
            "m" | "mb" => 1e6,
            "g" | "gb" => 1e9,
            "t" | "tb" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return None,
        };
        (v >= 0.0).then_some(MemAmount::Bytes((v * mult).round() as u64))
    }

    /// The number of bytes on a device with `total` bytes.
    pub fn bytes(&self, total: u64) -> u64 {
        match *self {
            MemAmount::Bytes(b) => b,
            MemAmount::Fraction(f) => (total as f64 * f) as u64,
        }
    }
}

/// `[run]`: the run as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunConfig {
    /// The run's name, its directory under `dir`; a timestamp when absent.
    pub name: Option<String>,
    /// How members take turns.
    pub schedule: ScheduleKind,
    /// Train members with the same model spec as one fused model (issue 7) where the schedule allows.
    pub fuse: bool,
    /// Epochs per member (a member may override).
    pub epochs: u32,
    /// A cap on each member's optimizer steps, if any.
    pub max_steps: Option<u64>,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// The run's base seed; a member's own seed is derived from it unless the member sets one.
    pub seed: u64,
    /// The directory runs are created in.
    pub dir: PathBuf,
    /// Log a metrics record every this many steps.
    pub log_every: u64,
    /// Run a small-batch warm-up step per member before timing starts.
    pub warmup: bool,
    /// On a GPU, capture each unit's training step as a CUDA graph and replay it.
    pub cuda_graphs: bool,
}

/// `[memory]`: the allocator of the device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryConfig {
    /// Grow the pool on demand (allow_growth) instead of reserving the limit up front.
    pub growth: bool,
    /// A hard cap on the whole pool.
    pub limit: Option<MemAmount>,
}

/// Where a data set's examples come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataSource {
    /// A directory holding MNIST-layout IDX files (`train-images-idx3-ubyte[.gz]`, `t10k-…`).
    Idx(PathBuf),
    /// Deterministic random examples, for tests and benchmarks.
    Synthetic {
        /// Training examples.
        train: usize,
        /// Test examples.
        test: usize,
        /// Classes.
        classes: usize,
        /// Shape of one example, e.g. `[1, 28, 28]`.
        shape: Vec<usize>,
    },
}

/// `[data.NAME]`: one input pipeline, shared by every member naming it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataConfig {
    /// The name members refer to.
    pub name: String,
    /// Where examples come from.
    pub source: DataSource,
    /// Shuffle buffer size (0: no shuffling).
    pub shuffle: usize,
    /// Batches prepared ahead by background threads.
    pub prefetch: usize,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Use only the first this many training examples.
    pub limit: Option<usize>,
    /// Use only the first this many test examples.
    pub test_limit: Option<usize>,
}

/// An activation after a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// GELU (tanh approximation).
    Gelu,
    /// tanh.
    Tanh,
    /// logistic sigmoid.
    Sigmoid,
}

impl Activation {
    const ACCEPTED: &'static str = "\"relu\", \"gelu\", \"tanh\" or \"sigmoid\"";
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "tanh" => Activation::Tanh,
            "sigmoid" => Activation::Sigmoid,
            _ => return None,
        })
    }
}

/// One layer of a member's model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerConfig {
    /// A fully connected layer with `out` features (its input is flattened).
    Linear {
        /// Output features.
        out: usize,
        /// Activation after it.
        act: Option<Activation>,
    },
    /// A 2-D convolution with `out` channels.
    Conv {
        /// Output channels.
        out: usize,
        /// Square kernel size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding.
        padding: usize,
        /// Activation after it.
        act: Option<Activation>,
    },
    /// Max pooling with a square window.
    MaxPool {
        /// Window (and, unless given, stride).
        kernel: usize,
        /// Stride.
        stride: usize,
    },
    /// Flatten all but the batch dimension.
    Flatten,
    /// Dropout with probability `p` while training.
    Dropout {
        /// Drop probability.
        p: f64,
    },
    /// An activation on its own.
    Act(Activation),
}

/// The optimizer and its hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerConfig {
    /// Stochastic gradient descent.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum (0: none).
        momentum: f64,
        /// Dampening of the momentum.
        dampening: f64,
        /// L2 weight decay.
        weight_decay: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam (L2 weight decay) or AdamW (decoupled weight decay).
    Adam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator epsilon.
        eps: f64,
        /// Weight decay.
        weight_decay: f64,
        /// Decoupled weight decay (AdamW).
        decoupled: bool,
    },
}

impl OptimizerConfig {
    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match *self {
            OptimizerConfig::Sgd { lr, .. } | OptimizerConfig::Adam { lr, .. } => lr,
        }
    }
}

/// How the learning rate changes over a member's steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScheduleConfig {
    /// The base rate throughout.
    Constant,
    /// Linear warm-up over `warmup` steps, then cosine decay to `min_lr` at the last step.
    Cosine {
        /// Warm-up steps.
        warmup: u64,
        /// The final learning rate.
        min_lr: f64,
    },
    /// Multiply by `gamma` every `every` steps.
    Step {
        /// Steps between decays.
        every: u64,
        /// Decay factor.
        gamma: f64,
    },
}

/// When a member writes checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointEvery {
    /// Every this many epochs (and at the end).
    Epochs(u32),
    /// Every this many steps (and at the end).
    Steps(u64),
    /// Only at the end.
    End,
    /// Never.
    Never,
}

/// A member's checkpoint policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckpointPolicy {
    /// When to write.
    pub every: CheckpointEvery,
    /// How many checkpoints to keep (older ones are deleted).
    pub keep: usize,
}

/// What a member does when it runs out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OomPolicy {
    /// Trim the cache and shrink the batch on OOM (otherwise the run stops with the error).
    pub shrink: bool,
    /// The fraction the batch shrinks by per retry.
    pub factor: f64,
    /// The smallest batch to shrink to.
    pub min_batch: usize,
    /// Move the member to the CPU when even `min_batch` does not fit.
    pub cpu_fallback: bool,
}

/// A member's memory budget as an allocator tenant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemberMemory {
    /// Hard cap on the member's allocations.
    pub limit: Option<MemAmount>,
    /// Bytes guaranteed to the member.
    pub reserve: Option<MemAmount>,
}

/// One member after grid expansion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberConfig {
    /// The member's name (and directory name).
    pub name: String,
    /// The `[[member]]` table it came from (1-based), for messages.
    #[serde(skip)]
    pub table_index: usize,
    /// The grid values that distinguish it from its siblings: `(key, value)`.
    pub grid: Vec<(String, String)>,
    /// Its model's layers.
    pub layers: Vec<LayerConfig>,
    /// Its optimizer.
    pub optimizer: OptimizerConfig,
    /// Its learning-rate schedule.
    pub lr_schedule: LrScheduleConfig,
    /// Its batch size.
    pub batch: usize,
    /// The `[data.NAME]` it trains on.
    pub data: String,
    /// Its memory budget.
    pub memory: MemberMemory,
    /// Steps per round under the weighted schedule.
    pub weight: u32,
    /// Checkpoint policy.
    pub checkpoint: CheckpointPolicy,
    /// OOM policy.
    pub oom: OomPolicy,
    /// Epochs to train.
    pub epochs: u32,
    /// A cap on optimizer steps.
    pub max_steps: Option<u64>,
    /// Seed of its initialization and dropout.
    pub seed: u64,
    /// May be fused with same-spec members.
    pub fuse: bool,
}

impl MemberConfig {
    /// The part of the config that must not change across a resume, as JSON: model, optimizer, schedule, data,
    /// batch, seed.
    pub fn identity(&self) -> serde_json::Value {
        serde_json::json!({
            "layers": self.layers,
            "optimizer": self.optimizer,
            "lr_schedule": self.lr_schedule,
            "data": self.data,
            "batch": self.batch,
            "seed": self.seed,
            "epochs": self.epochs,
            "max_steps": self.max_steps,
        })
    }

    /// A 64-bit FNV-1a hash of [`MemberConfig::identity`], in hex.
    pub fn config_hash(&self) -> String {
        let text = self.identity().to_string();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// A parsed, validated and expanded config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// The file it came from, for messages.
    pub file: String,
    /// Its text, saved into the run directory for `cohort resume`.
    #[serde(skip)]
    pub text: String,
    /// `[run]`.
    pub run: RunConfig,
    /// `[memory]`.
    pub memory: MemoryConfig,
    /// `[data.NAME]` by name.
    pub data: BTreeMap<String, DataConfig>,
    /// The members after grid expansion, in file order.
    pub members: Vec<MemberConfig>,
}

/// The built-in default job: a small lr grid of MLPs and one CNN on the bundled MNIST digits.
pub const DEFAULT_JOB: &str = include_str!("../../examples/default.toml");

/// The name used for the built-in config in messages.
pub const DEFAULT_JOB_FILE: &str = "<built-in default job: examples/default.toml>";

impl Config {
    /// Reads and parses a config file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file when it cannot be read or is invalid.
    pub fn from_file(path: &Path) -> CResult<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            section: String::new(),
            key: String::new(),
            message: format!("cannot read the config: {e}"),
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// The built-in default job.
    ///
    /// # Errors
    /// Only if the bundled text is invalid (a bug; the test suite parses it).
    pub fn default_job() -> CResult<Config> {
        Config::parse(DEFAULT_JOB, DEFAULT_JOB_FILE)
    }

    /// Parses config text; `file` names it in errors.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, the key and what is accepted.
    pub fn parse(text: &str, file: &str) -> CResult<Config> {
        let err = |section: &str, key: &str, message: String| ConfigError {
            file: file.to_string(),
            section: section.to_string(),
            key: key.to_string(),
            message,
        };
        let root: Table = text.parse::<Table>().map_err(|e| {
            let msg = e.to_string();
            err("", "", format!("not valid TOML: {}", msg.trim()))
        })?;
        let top = Section::new(file, "the top level", "", &root);
        let run_t = top.table("run")?;
        let memory_t = top.table("memory")?;
        let data_t = top.table("data")?;
        let members_v = top.take("member");
        top.finish()?;

        let empty = Table::new();
        let run = parse_run(&Section::new(file, "[run]", "", run_t.unwrap_or(&empty)))?;
        let memory = parse_memory(&Section::new(
            file,
            "[memory]",
            "",
            memory_t.unwrap_or(&empty),
        ))?;

        let mut data = BTreeMap::new();
        if let Some(dt) = data_t {
            for (name, v) in dt {
                let section = format!("[data.{name}]");
                let Value::Table(t) = v else {
                    return Err(err(
                        "[data]",
                        name,
                        format!("expected a table {section}, found {}", kind(v)),
                    ));
                };
                let d = parse_data(name, &Section::new(file, &section, "", t))?;
                data.insert(name.clone(), d);
            }
        }

        let member_tables: Vec<&Table> = match members_v {
            None => Vec::new(),
            Some(Value::Array(a)) => {
                let mut v = Vec::new();
                for (i, m) in a.iter().enumerate() {
                    match m {
                        Value::Table(t) => v.push(t),
                        other => {
                            return Err(err(
                                &format!("[[member]] {}", i + 1),
                                "",
                                format!("expected a [[member]] table, found {}", kind(other)),
                            ));
                        }
                    }
                }
                v
            }
            Some(other) => {
                return Err(err(
                    "the top level",
                    "member",
                    format!("expected [[member]] tables, found {}", kind(other)),
                ));
            }
        };
        if member_tables.is_empty() {
            return Err(err(
                "the top level",
                "",
                "no [[member]] table: a config needs at least one member, e.g.\n  [[member]]\n  name = \"mlp\"\n  \
                 model = { layers = [{ linear = 128, act = \"relu\" }, { linear = 10 }] }\n  \
                 optimizer = { adam = { lr = 1e-3 } }"
                    .to_string(),
            ));
        }

        let mut members = Vec::new();
        for (i, t) in member_tables.iter().enumerate() {
            let section = format!("[[member]] {}", i + 1);
            for (grid, expanded) in expand_grid(t) {
                let s = Section::new(file, &section, "", &expanded);
                let mut m = parse_member(&s, &run, i, grid)?;
                if !data.contains_key(&m.data) {
                    if data.is_empty() && m.data == "mnist" {
                        data.insert("mnist".into(), default_mnist());
                    } else {
                        let known: Vec<String> = data.keys().map(|k| format!("\"{k}\"")).collect();
                        return Err(err(
                            &section,
                            "data",
                            format!(
                                "no [data.{}] table; the data sets defined are {}",
                                m.data,
                                if known.is_empty() {
                                    "none".to_string()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        ));
                    }
                }
                m.table_index = i + 1;
                members.push(m);
            }
        }
        Ok(Config {
            file: file.to_string(),
            text: text.to_string(),
            run,
            memory,
            data,
            members,
        })
    }

    /// This config with `[run].KEY = value` set (a command-line override), as text and parsed again, so that the
    /// run directory's `config.toml` says what actually ran. Overriding `epochs` also drops members' own `epochs`.
    ///
    /// # Errors
    /// When the new value is not valid for the key.
    pub fn with_run_override(&self, key: &str, value: Value) -> CResult<Config> {
        let mut root: Table = self.text.parse::<Table>().map_err(|e| ConfigError {
            file: self.file.clone(),
            section: String::new(),
            key: String::new(),
            message: format!("not valid TOML: {}", e.to_string().trim()),
        })?;
        let run = root
            .entry("run")
            .or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(t) = run {
            t.insert(key.to_string(), value.clone());
        }
        if key == "epochs"
            && let Some(Value::Array(members)) = root.get_mut("member")
        {
            for m in members {
                if let Value::Table(t) = m {
                    t.remove("epochs");
                }
            }
        }
        let body = toml::to_string(&root).map_err(|e| ConfigError {
            file: self.file.clone(),
            section: "[run]".into(),
            key: key.into(),
            message: format!("cannot write the config back: {e}"),
        })?;
        let mut text = String::new();
        for line in self.text.lines().take_while(|l| l.starts_with('#')) {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&format!(
            "# [run].{key} = {value} set on the command line\n"
        ));
        text.push_str(&body);
        Config::parse(&text, &self.file)
    }

    /// The member named `name`.
    pub fn member(&self, name: &str) -> Option<&MemberConfig> {
        self.members.iter().find(|m| m.name == name)
    }
}

fn default_mnist() -> DataConfig {
    DataConfig {
        name: "mnist".into(),
        source: DataSource::Idx(PathBuf::from("data/mnist")),
        shuffle: 8000,
        prefetch: 4,
        seed: 0,
        limit: None,
        test_limit: None,
    }
}

/// A human name for a TOML value's type (and the value, when short).
fn kind(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Float(f) => format!("the number {f}"),
        Value::Boolean(b) => format!("{b}"),
        Value::Datetime(d) => format!("the date {d}"),
        Value::Array(_) => "a list".into(),
        Value::Table(_) => "a table".into(),
    }
}

/// A table being read: records which keys were used so that unknown keys are reported with the accepted ones.
struct Section<'a> {
    file: &'a str,
    name: String,
    prefix: String,
    table: &'a Table,
    used: std::cell::RefCell<Vec<String>>,
}

impl<'a> Section<'a> {
    fn new(file: &'a str, name: &str, prefix: &str, table: &'a Table) -> Self {
        Section {
            file,
            name: name.to_string(),
            prefix: prefix.to_string(),
            table,
            used: Default::default(),
        }
    }

    fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    fn error(&self, k: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            section: self.name.clone(),
            key: if k.is_empty() {
                self.prefix.clone()
            } else {
                self.key(k)
            },
            message,
        }
    }

    fn take(&self, k: &str) -> Option<&'a Value> {
        self.used.borrow_mut().push(k.to_string());
        self.table.get(k)
    }

    fn sub(&self, k: &str, t: &'a Table) -> Section<'a> {
        Section::new(self.file, &self.name, &self.key(k), t)
    }

    fn table(&self, k: &str) -> CResult<Option<&'a Table>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(t)),
            Some(v) => Err(self.error(k, format!("expected a table, found {}", kind(v)))),
        }
    }

    fn str(&self, k: &str, accepted: &str) -> CResult<Option<&'a str>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.error(k, format!("expected {accepted}, found {}", kind(v)))),
        }
    }

    fn bool(&self, k: &str) -> CResult<Option<bool>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.error(k, format!("expected true or false, found {}", kind(v)))),
        }
    }

    /// A number; `grid` says whether a list was allowed (for the message).
    fn f64(&self, k: &str, grid: bool) -> CResult<Option<f64>> {
        let expected = if grid {
            "a number or a list of numbers"
        } else {
            "a number"
        };
        match self.take(k) {
            None => Ok(None),
            Some(Value::Float(f)) if f.is_finite() => Ok(Some(*f)),
            Some(Value::Integer(i)) => Ok(Some(*i as f64)),
            Some(v) => Err(self.error(k, format!("expected {expected}, found {}", kind(v)))),
        }
    }

    fn f64_in(&self, k: &str, grid: bool, lo: f64, hi: f64, what: &str) -> CResult<Option<f64>> {
        match self.f64(k, grid)? {
            Some(v) if v < lo || v > hi => {
                Err(self.error(k, format!("expected {what}, found {v}")))
            }
            v => Ok(v),
        }
    }

    fn u64(&self, k: &str, grid: bool, min: u64) -> CResult<Option<u64>> {
        let expected = if grid {
            format!("an integer ≥ {min} or a list of them")
        } else {
            format!("an integer ≥ {min}")
        };
        match self.take(k) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= min as i64 => Ok(Some(*i as u64)),
            Some(v) => Err(self.error(k, format!("expected {expected}, found {}", kind(v)))),
        }
    }

    fn mem(&self, k: &str) -> CResult<Option<MemAmount>> {
        let accepted = "a size such as \"2GiB\", \"512MiB\", \"40%\" or a number of bytes";
        match self.take(k) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= 0 => Ok(Some(MemAmount::Bytes(*i as u64))),
            Some(Value::String(s)) => MemAmount::parse(s)
                .map(Some)
                .ok_or_else(|| self.error(k, format!("expected {accepted}, found \"{s}\""))),
            Some(v) => Err(self.error(k, format!("expected {accepted}, found {}", kind(v)))),
        }
    }

    /// Errors on keys that were never asked for, listing the accepted ones.
    fn finish(&self) -> CResult<()> {
        let used = self.used.borrow();
        for k in self.table.keys() {
            if !used.iter().any(|u| u == k) {
                let mut accepted: Vec<&str> = used.iter().map(String::as_str).collect();
                accepted.sort_unstable();
                accepted.dedup();
                return Err(self.error(
                    k,
                    format!("unknown key; accepted here: {}", accepted.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// A single-key table such as `{ adam = { … } }`: the key and its value.
    fn variant(&self, k: &str, accepted: &str) -> CResult<Option<(&'a str, &'a Value)>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some((s.as_str(), &*EMPTY_TABLE_VALUE))),
            Some(Value::Table(t)) if t.len() == 1 => {
                let (name, v) = t.iter().next().expect("one entry");
                Ok(Some((name.as_str(), v)))
            }
            Some(v) => Err(self.error(
                k,
                format!("expected a table with one of {accepted}, found {}", kind(v)),
            )),
        }
    }
}

static EMPTY_TABLE_VALUE: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| Value::Table(Table::new()));

fn parse_run(s: &Section<'_>) -> CResult<RunConfig> {
    let name = s.str("name", "a run name")?.map(str::to_string);
    if let Some(n) = &name {
        check_name(n).map_err(|m| s.error("name", m))?;
    }
    let (schedule, fused) = match s.str("schedule", ScheduleKind::ACCEPTED)? {
        None | Some("lockstep") => (ScheduleKind::Lockstep, false),
        Some("fused") => (ScheduleKind::Lockstep, true),
        Some("epoch-sliced") => (ScheduleKind::EpochSliced, false),
        Some("weighted") => (ScheduleKind::Weighted, false),
        Some(other) => {
            return Err(s.error(
                "schedule",
                format!("expected {}, found \"{other}\"", ScheduleKind::ACCEPTED),
            ));
        }
    };
    let fuse = s.bool("fuse")?.unwrap_or(true) || fused;
    let epochs = s.u64("epochs", false, 1)?.unwrap_or(1) as u32;
    let max_steps = s.u64("steps", false, 1)?;
    let device = s
        .str("device", "\"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")?
        .unwrap_or("auto")
        .to_string();
    let ok_device = device == "auto"
        || device == "cpu"
        || device == "cuda"
        || device
            .strip_prefix("cuda:")
            .is_some_and(|n| n.parse::<usize>().is_ok());
    if !ok_device {
        return Err(s.error(
            "device",
            format!("expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", found \"{device}\""),
        ));
    }
    let seed = s.u64("seed", false, 0)?.unwrap_or(0);
    let dir = PathBuf::from(s.str("dir", "a directory path")?.unwrap_or("runs"));
    let log_every = s.u64("log_every", false, 1)?.unwrap_or(20);
    let warmup = s.bool("warmup")?.unwrap_or(true);
    let cuda_graphs = s.bool("cuda_graphs")?.unwrap_or(true);
    s.finish()?;
    Ok(RunConfig {
        name,
        schedule,
        fuse,
        epochs,
        max_steps,
        device,
        seed,
        dir,
        log_every,
        warmup,
        cuda_graphs,
    })
}

fn parse_memory(s: &Section<'_>) -> CResult<MemoryConfig> {
    let growth = s.bool("growth")?.unwrap_or(true);
    let limit = s.mem("limit")?;
    s.finish()?;
    Ok(MemoryConfig { growth, limit })
}

fn parse_data(name: &str, s: &Section<'_>) -> CResult<DataConfig> {
    let accepted =
        "{ idx = \"DIR\" } or { synthetic = { train = N, test = N, classes = N, shape = [..] } }";
    let source = match s.variant("source", "idx, synthetic")? {
        None => {
            if name == "mnist" {
                DataSource::Idx(PathBuf::from("data/mnist"))
            } else {
                return Err(s.error("source", format!("missing; expected {accepted}")));
            }
        }
        Some(("idx", Value::String(p))) => DataSource::Idx(PathBuf::from(p)),
        Some(("synthetic", Value::Table(t))) => {
            let sub = s.sub("source.synthetic", t);
            let train = sub.u64("train", false, 1)?.unwrap_or(1024) as usize;
            let test = sub.u64("test", false, 1)?.unwrap_or(256) as usize;
            let classes = sub.u64("classes", false, 2)?.unwrap_or(10) as usize;
            let shape = match sub.take("shape") {
                None => vec![1, 28, 28],
                Some(Value::Array(a)) if !a.is_empty() => {
                    let mut v = Vec::new();
                    for x in a {
                        match x {
                            Value::Integer(i) if *i > 0 => v.push(*i as usize),
                            other => {
                                return Err(sub.error(
                                    "shape",
                                    format!(
                                        "expected a list of positive integers, found {}",
                                        kind(other)
                                    ),
                                ));
                            }
                        }
                    }
                    v
                }
                Some(other) => {
                    return Err(sub.error(
                        "shape",
                        format!(
                            "expected a list of positive integers, found {}",
                            kind(other)
                        ),
                    ));
                }
            };
            sub.finish()?;
            DataSource::Synthetic {
                train,
                test,
                classes,
                shape,
            }
        }
        Some((_, _)) => {
            return Err(s.error(
                "source",
                format!("expected {accepted}, found something else"),
            ));
        }
    };
    let shuffle = s.u64("shuffle", false, 0)?.unwrap_or(8000) as usize;
    let prefetch = s.u64("prefetch", false, 0)?.unwrap_or(4) as usize;
    let seed = s.u64("seed", false, 0)?.unwrap_or(0);
    let limit = s.u64("limit", false, 1)?.map(|v| v as usize);
    let test_limit = s.u64("test_limit", false, 1)?.map(|v| v as usize);
    s.finish()?;
    Ok(DataConfig {
        name: name.to_string(),
        source,
        shuffle,
        prefetch,
        seed,
        limit,
        test_limit,
    })
}

/// Checks that a name can be a directory name.
fn check_name(n: &str) -> std::result::Result<(), String> {
    let ok = !n.is_empty()
        && n != "."
        && n != ".."
        && n.len() <= 128
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected a name of letters, digits, '-', '_', '.', '+' (it becomes a directory name), found \"{n}\""
        ))
    }
}

fn parse_member(
    s: &Section<'_>,
    run: &RunConfig,
    index: usize,
    grid: Vec<(String, String)>,
) -> CResult<MemberConfig> {
    let base = match s.str("name", "a member name")? {
        Some(n) => n.to_string(),
        None => format!("member{}", index + 1),
    };
    let name = if grid.is_empty() {
        base
    } else {
        let mut n = base;
        for (k, v) in &grid {
            n.push('-');
            n.push_str(k);
            n.push_str(v);
        }
        n
    };
    check_name(&name).map_err(|m| s.error("name", m))?;

    let model = s.table("model")?.ok_or_else(|| {
        s.error(
            "model",
            "missing; expected { layers = [ { linear = 10 } ] }".into(),
        )
    })?;
    let ms = s.sub("model", model);
    let layers = parse_layers(&ms)?;
    ms.finish()?;

    let opt_names = "sgd, adam, adamw";
    let optimizer = match s.variant("optimizer", opt_names)? {
        None => OptimizerConfig::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        },
        Some((kind_name, Value::Table(t))) => {
            let os = s.sub(&format!("optimizer.{kind_name}"), t);
            let o = match kind_name {
                "sgd" => OptimizerConfig::Sgd {
                    lr: os
                        .f64_in("lr", true, 0.0, 1e3, "a learning rate > 0")?
                        .unwrap_or(0.01),
                    momentum: os
                        .f64_in("momentum", true, 0.0, 1.0, "a momentum in [0, 1]")?
                        .unwrap_or(0.0),
                    dampening: os
                        .f64_in("dampening", true, 0.0, 1.0, "a dampening in [0, 1]")?
                        .unwrap_or(0.0),
                    weight_decay: os
                        .f64_in("weight_decay", true, 0.0, 1e3, "a weight decay ≥ 0")?
                        .unwrap_or(0.0),
                    nesterov: os.bool("nesterov")?.unwrap_or(false),
                },
                "adam" | "adamw" => OptimizerConfig::Adam {
                    lr: os
                        .f64_in("lr", true, 0.0, 1e3, "a learning rate > 0")?
                        .unwrap_or(1e-3),
                    beta1: os
                        .f64_in("beta1", true, 0.0, 1.0, "a beta1 in [0, 1)")?
                        .unwrap_or(0.9),
                    beta2: os
                        .f64_in("beta2", true, 0.0, 1.0, "a beta2 in [0, 1)")?
                        .unwrap_or(0.999),
                    eps: os
                        .f64_in("eps", true, 0.0, 1.0, "an epsilon > 0")?
                        .unwrap_or(1e-8),
                    weight_decay: os
                        .f64_in("weight_decay", true, 0.0, 1e3, "a weight decay ≥ 0")?
                        .unwrap_or(if kind_name == "adamw" { 0.01 } else { 0.0 }),
                    decoupled: kind_name == "adamw",
                },
                other => {
                    return Err(s.error(
                        "optimizer",
                        format!("expected one of {opt_names}, found \"{other}\""),
                    ));
                }
            };
            os.finish()?;
            if o.lr() <= 0.0 {
                return Err(os.error("lr", "expected a learning rate > 0".into()));
            }
            o
        }
        Some((other, _)) => {
            return Err(s.error(
                "optimizer",
                format!("expected a table with one of {opt_names}, e.g. {{ adam = {{ lr = 1e-3 }} }}, found \"{other}\""),
            ));
        }
    };

    let lr_accepted = "\"constant\", { cosine = { warmup = N, min_lr = X } } or { step = { every = N, gamma = X } }";
    let lr_schedule = match s.variant("lr_schedule", "constant, cosine, step")? {
        None | Some(("constant", _)) => LrScheduleConfig::Constant,
        Some(("cosine", Value::Table(t))) => {
            let ls = s.sub("lr_schedule.cosine", t);
            let c = LrScheduleConfig::Cosine {
                warmup: ls.u64("warmup", true, 0)?.unwrap_or(0),
                min_lr: ls
                    .f64_in("min_lr", true, 0.0, 1e3, "a learning rate ≥ 0")?
                    .unwrap_or(0.0),
            };
            ls.finish()?;
            c
        }
        Some(("step", Value::Table(t))) => {
            let ls = s.sub("lr_schedule.step", t);
            let c = LrScheduleConfig::Step {
                every: ls.u64("every", true, 1)?.unwrap_or(1000),
                gamma: ls
                    .f64_in("gamma", true, 0.0, 1.0, "a factor in (0, 1]")?
                    .unwrap_or(0.5),
            };
            ls.finish()?;
            c
        }
        Some((other, _)) => {
            return Err(s.error(
                "lr_schedule",
                format!("expected {lr_accepted}, found \"{other}\""),
            ));
        }
    };

    let batch = s.u64("batch", true, 1)?.unwrap_or(64) as usize;
    let data = s
        .str("data", "the name of a [data.NAME] table")?
        .unwrap_or("mnist")
        .to_string();
    let memory = match s.table("memory")? {
        None => MemberMemory {
            limit: None,
            reserve: None,
        },
        Some(t) => {
            let mm = s.sub("memory", t);
            let m = MemberMemory {
                limit: mm.mem("limit")?,
                reserve: mm.mem("reserve")?,
            };
            mm.finish()?;
            m
        }
    };
    let weight = s.u64("weight", true, 1)?.unwrap_or(1) as u32;
    let checkpoint = match s.table("checkpoint")? {
        None => CheckpointPolicy {
            every: CheckpointEvery::Epochs(1),
            keep: 3,
        },
        Some(t) => {
            let cs = s.sub("checkpoint", t);
            let accepted =
                "\"N epoch(s)\", \"N step(s)\", an integer number of steps, \"end\" or \"never\"";
            let every = match cs.take("every") {
                None => CheckpointEvery::Epochs(1),
                Some(Value::Integer(i)) if *i > 0 => CheckpointEvery::Steps(*i as u64),
                Some(Value::String(v)) => parse_every(v).ok_or_else(|| {
                    cs.error("every", format!("expected {accepted}, found \"{v}\""))
                })?,
                Some(v) => {
                    return Err(
                        cs.error("every", format!("expected {accepted}, found {}", kind(v)))
                    );
                }
            };
            let keep = cs.u64("keep", false, 1)?.unwrap_or(3) as usize;
            cs.finish()?;
            CheckpointPolicy { every, keep }
        }
    };
    let oom_default = OomPolicy {
        shrink: true,
        factor: 0.15,
        min_batch: 8,
        cpu_fallback: true,
    };
    let oom = match s.take("oom") {
        None => oom_default,
        Some(Value::String(v)) if v == "shrink" => oom_default,
        Some(Value::String(v)) if v == "fail" => OomPolicy {
            shrink: false,
            cpu_fallback: false,
            ..oom_default
        },
        Some(Value::Table(t)) => {
            let os = s.sub("oom", t);
            let p = OomPolicy {
                shrink: true,
                factor: os
                    .f64_in("shrink", false, 0.01, 0.9, "a fraction in [0.01, 0.9]")?
                    .unwrap_or(0.15),
                min_batch: os.u64("min_batch", false, 1)?.unwrap_or(8) as usize,
                cpu_fallback: os.bool("cpu")?.unwrap_or(true),
            };
            os.finish()?;
            p
        }
        Some(v) => {
            return Err(s.error(
                "oom",
                format!(
                    "expected \"shrink\", \"fail\" or {{ shrink = 0.15, min_batch = 8, cpu = true }}, found {}",
                    kind(v)
                ),
            ));
        }
    };
    let epochs = s.u64("epochs", true, 1)?.map_or(run.epochs, |e| e as u32);
    let max_steps = s.u64("steps", true, 1)?.or(run.max_steps);
    let seed = s
        .u64("seed", true, 0)?
        .unwrap_or(run.seed.wrapping_add(index as u64));
    let fuse = s.bool("fuse")?.unwrap_or(run.fuse);
    s.finish()?;
    Ok(MemberConfig {
        name,
        table_index: index + 1,
        grid,
        layers,
        optimizer,
        lr_schedule,
        batch,
        data,
        memory,
        weight,
        checkpoint,
        oom,
        epochs,
        max_steps,
        seed,
        fuse,
    })
}

fn parse_every(v: &str) -> Option<CheckpointEvery> {
    let v = v.trim();
    match v {
        "end" => return Some(CheckpointEvery::End),
        "never" => return Some(CheckpointEvery::Never),
        "epoch" => return Some(CheckpointEvery::Epochs(1)),
        _ => {}
    }
    let (n, unit) = v.split_once(' ').unwrap_or((v, "steps"));
    let n: u64 = n.trim().parse().ok().filter(|&n| n > 0)?;
    match unit.trim() {
        "epoch" | "epochs" => Some(CheckpointEvery::Epochs(n as u32)),
        "step" | "steps" => Some(CheckpointEvery::Steps(n)),
        _ => None,
    }
}

fn parse_layers(ms: &Section<'_>) -> CResult<Vec<LayerConfig>> {
    let example = "a list of layers such as [{ conv = 16, kernel = 3, act = \"relu\" }, { maxpool = 2 }, \
                   { flatten = true }, { linear = 128, act = \"relu\" }, { dropout = 0.1 }, { linear = 10 }]";
    let arr = match ms.take("layers") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(v) => return Err(ms.error("layers", format!("expected {example}, found {}", kind(v)))),
        None => return Err(ms.error("layers", format!("missing; expected {example}"))),
    };
    let mut layers = Vec::new();
    for (i, v) in arr.iter().enumerate() {
        let Value::Table(t) = v else {
            return Err(ms.error(
                &format!("layers[{i}]"),
                format!("expected a layer table, found {}", kind(v)),
            ));
        };
        let ls = ms.sub(&format!("layers[{i}]"), t);
        let act = match ls.str("act", Activation::ACCEPTED)? {
            None => None,
            Some(a) => Some(Activation::parse(a).ok_or_else(|| {
                ls.error(
                    "act",
                    format!("expected {}, found \"{a}\"", Activation::ACCEPTED),
                )
            })?),
        };
        let layer = if let Some(out) = ls.u64("linear", true, 1)? {
            LayerConfig::Linear {
                out: out as usize,
                act,
            }
        } else if let Some(out) = ls.u64("conv", true, 1)? {
            LayerConfig::Conv {
                out: out as usize,
                kernel: ls.u64("kernel", true, 1)?.unwrap_or(3) as usize,
                stride: ls.u64("stride", true, 1)?.unwrap_or(1) as usize,
                padding: ls.u64("padding", true, 0)?.unwrap_or(0) as usize,
                act,
            }
        } else if let Some(k) = ls.u64("maxpool", true, 1)? {
            LayerConfig::MaxPool {
                kernel: k as usize,
                stride: ls.u64("stride", true, 1)?.unwrap_or(k) as usize,
            }
        } else if let Some(f) = ls.bool("flatten")? {
            if !f {
                return Err(ls.error(
                    "flatten",
                    "expected true (leave the layer out otherwise)".into(),
                ));
            }
            LayerConfig::Flatten
        } else if let Some(p) = ls.f64_in("dropout", true, 0.0, 0.999, "a probability in [0, 1)")? {
            LayerConfig::Dropout { p }
        } else if let Some(a) = act {
            LayerConfig::Act(a)
        } else {
            return Err(ls.error(
                "",
                "expected one of the keys linear, conv, maxpool, flatten, dropout or act".into(),
            ));
        };
        ls.finish()?;
        layers.push(layer);
    }
    Ok(layers)
}

/// One grid axis: where the list is and its values.
struct Axis {
    path: Vec<PathSeg>,
    values: Vec<Value>,
}

#[derive(Clone)]
enum PathSeg {
    Key(String),
    Index(usize),
}

fn find_axes(t: &Table, path: &mut Vec<PathSeg>, out: &mut Vec<Axis>) {
    for (k, v) in t {
        path.push(PathSeg::Key(k.clone()));
        match v {
            Value::Table(sub) => find_axes(sub, path, out),
            Value::Array(a)
                if !a.is_empty()
                    && a.iter()
                        .all(|x| !matches!(x, Value::Table(_) | Value::Array(_))) =>
            {
                out.push(Axis {
                    path: path.clone(),
                    values: a.clone(),
                });
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    if let Value::Table(sub) = x {
                        path.push(PathSeg::Index(i));
                        find_axes(sub, path, out);
                        path.pop();
                    }
                }
            }
            _ => {}
        }
        path.pop();
    }
}

fn set_path(t: &mut Table, path: &[PathSeg], value: Value) {
    let mut cur: &mut Value = match &path[0] {
        PathSeg::Key(k) => t.get_mut(k).expect("path from find_axes"),
        PathSeg::Index(_) => unreachable!("a path starts with a key"),
    };
    for seg in &path[1..] {
        cur = match (seg, cur) {
            (PathSeg::Key(k), Value::Table(t)) => t.get_mut(k).expect("path from find_axes"),
            (PathSeg::Index(i), Value::Array(a)) => &mut a[*i],
            _ => unreachable!("path from find_axes"),
        };
    }
    *cur = value;
}

/// Formats a grid value for a member name: `1e-3`, `0.5`, `128`, `relu`.
pub fn grid_value_name(v: &Value) -> String {
    match v {
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => {
            if f.fract() == 0.0 && f.abs() < 1e6 {
                format!("{}", *f as i64)
            } else if f.abs() >= 0.01 && f.abs() < 1e6 {
                format!("{f}")
            } else {
                format!("{f:e}")
            }
        }
        Value::String(s) => format!("_{s}"),
        Value::Boolean(b) => format!("_{b}"),
        other => other.to_string(),
    }
}

/// Expands a `[[member]]` table into one table per grid combination, with the `(key, value)` naming pairs.
fn expand_grid(t: &Table) -> Vec<(Vec<(String, String)>, Table)> {
    let mut axes = Vec::new();
    find_axes(t, &mut Vec::new(), &mut axes);
    if axes.is_empty() {
        return vec![(Vec::new(), t.clone())];
    }
    let short = |p: &[PathSeg]| match p.last() {
        Some(PathSeg::Key(k)) => k.clone(),
        _ => String::new(),
    };
    let full = |p: &[PathSeg]| {
        p.iter()
            .filter_map(|s| match s {
                PathSeg::Key(k) if k != "optimizer" && k != "model" => Some(k.clone()),
                PathSeg::Index(i) => Some(i.to_string()),
                PathSeg::Key(_) => None,
            })
            .collect::<Vec<_>>()
            .join("")
    };
    let labels: Vec<String> = axes
        .iter()
        .map(|a| {
            let s = short(&a.path);
            if axes.iter().filter(|b| short(&b.path) == s).count() > 1 {
                full(&a.path)
            } else {
                s
            }
        })
        .collect();
    let mut out = Vec::new();
    let mut idx = vec![0usize; axes.len()];
    loop {
        let mut table = t.clone();
        let mut grid = Vec::new();
        for (a, (axis, &i)) in axes.iter().zip(&idx).enumerate() {
            set_path(&mut table, &axis.path, axis.values[i].clone());
            grid.push((labels[a].clone(), grid_value_name(&axis.values[i])));
        }
        out.push((grid, table));
        // Odometer: the last axis varies fastest.
        let mut d = axes.len();
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < axes[d].values.len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_amounts() {
        assert_eq!(MemAmount::parse("2GiB"), Some(MemAmount::Bytes(2 << 30)));
        assert_eq!(
            MemAmount::parse("512 MiB"),
            Some(MemAmount::Bytes(512 << 20))
        );
        assert_eq!(
            MemAmount::parse("1.5GB"),
            Some(MemAmount::Bytes(1_500_000_000))
        );
        assert_eq!(MemAmount::parse("40%"), Some(MemAmount::Fraction(0.4)));
        assert_eq!(MemAmount::parse("4096"), Some(MemAmount::Bytes(4096)));
        assert_eq!(MemAmount::parse("lots"), None);
        assert_eq!(MemAmount::parse("140%"), None);
    }

    #[test]
    fn grid_names() {
        assert_eq!(grid_value_name(&Value::Float(1e-3)), "1e-3");
        assert_eq!(grid_value_name(&Value::Float(3e-4)), "3e-4");
        assert_eq!(grid_value_name(&Value::Float(0.5)), "0.5");
        assert_eq!(grid_value_name(&Value::Float(2.0)), "2");
        assert_eq!(grid_value_name(&Value::Integer(128)), "128");
    }

    #[test]
    fn every_parses() {
        assert_eq!(parse_every("1 epoch"), Some(CheckpointEvery::Epochs(1)));
        assert_eq!(parse_every("500 steps"), Some(CheckpointEvery::Steps(500)));
        assert_eq!(parse_every("end"), Some(CheckpointEvery::End));
        assert_eq!(parse_every("0 steps"), None);
        assert_eq!(parse_every("1 fortnight"), None);
    }
}
