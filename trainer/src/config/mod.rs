//! The TOML run configuration: `[run]`, `[memory]`, `[search]`, `[data.NAME]` and `[[member]]` tables.
//! Where the run trains (the CPU, cards, a limit per card, a member pinned to one place): `devices`.
//!
//! A config is parsed by hand from a [`toml::Table`] so that every error names the file, the table, the key and what
//! is accepted. Lists of scalar values inside a `[[member]]` table are a hyper-parameter grid (`grid`); search
//! spaces such as `{ loguniform = [1e-4, 1e-1] }` are sampled into trials (`search`). See `examples/*.toml` for
//! documented configs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use cohort_alloc::{Limit, Scope};
use cohort_autograd::ModelSpec;
use cohort_autograd::spec::{Fields, SpecError, describe};
use cohort_optim::OptimConfig;
use cohort_tensor::Precision;
use serde::Serialize;
use toml::{Table, Value};

use crate::shard::Shard;

mod data;
mod devices;
mod grid;
mod search;

pub use data::{DataConfig, DataSource, Files, NpyFiles, SyntheticData, TokenData};
pub use devices::{Devices, Pin, Visible};
pub use grid::grid_value_name;
pub use search::{EarlyStopping, Metric, Mode, Resource, SchedulerConfig, Score, SearchConfig};

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
    /// What the run may train on: `auto`, `cpu`, every visible card (`cuda`), or cards.
    pub device: Devices,
    /// Train only this share of the members (a grid's points, a sweep's trials), as one of several hosts.
    pub shard: Option<Shard>,
    /// The run's base seed; a member's own seed is derived from it unless the member sets one.
    pub seed: u64,
    /// The directory runs are created in.
    pub dir: PathBuf,
    /// Log a metrics record every this many steps.
    pub log_every: u64,
    /// Evaluate on the validation split every this many steps, besides every epoch's end.
    pub eval_every: Option<u64>,
    /// Run a small-batch warm-up step per member before timing starts.
    pub warmup: bool,
    /// On a GPU, capture each unit's training step as a CUDA graph and replay it.
    pub cuda_graphs: bool,
    /// Only kernels whose results do not depend on timing or on the order threads finish: products on the
    /// heuristics' pick rather than the fastest timed algorithm, ordered sums instead of atomic ones (PyTorch's
    /// `use_deterministic_algorithms(True)` with `cudnn.benchmark = False`), and a step replayed from a CUDA graph
    /// only where it gives the eager step's bits (see [`crate::graph`]). On the CPU every kernel already is.
    pub deterministic: bool,
    /// Every member's precision policy unless it sets its own ([`MemberConfig::precision`]).
    #[serde(serialize_with = "precision_name")]
    pub precision: Precision,
}

/// `[memory]`: the allocator of the device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryConfig {
    /// Grow the pool on demand (allow_growth) instead of reserving the limit up front.
    pub growth: bool,
    /// A hard cap on the pool, or on everything the process holds on the device (`scope`).
    pub limit: Option<Limit>,
    /// What `limit` covers: `"pool"` (the default, as TensorFlow's `memory_limit`) or `"process"` (the CUDA
    /// context, modules and library handles too: what `nvidia-smi` shows for the process stays within it).
    pub scope: Scope,
    /// Limits of cards of their own (`[memory.cards]`, `"cuda:1" = "20GiB"`), by ordinal, over `limit`.
    pub cards: BTreeMap<usize, Limit>,
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
    pub limit: Option<Limit>,
    /// Bytes guaranteed to the member.
    pub reserve: Option<Limit>,
}

/// A member's model: a spec written in the config, or a model a Rust program builds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberModel {
    /// `model = { layers = [...] }`.
    Spec(ModelSpec),
    /// `model = { custom = "NAME" }`: built by the function a program registered under `NAME`
    /// ([`crate::cohort::Models`]); trains unfused.
    Custom(String),
}

impl MemberModel {
    /// The spec, for a model written in the config.
    pub fn spec(&self) -> Option<&ModelSpec> {
        match self {
            MemberModel::Spec(s) => Some(s),
            MemberModel::Custom(_) => None,
        }
    }
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
    /// Its index among the sweep's sampled trials.
    pub trial: Option<usize>,
    /// Its sampled and grid values by their short names, for reports.
    pub hyperparameters: BTreeMap<String, serde_json::Value>,
    /// When its validation metric stops improving, it stops.
    pub early_stopping: Option<EarlyStopping>,
    /// Its model.
    pub model: MemberModel,
    /// Its optimizer.
    pub optimizer: OptimConfig,
    /// Its learning-rate schedule.
    pub lr_schedule: LrScheduleConfig,
    /// Its batch size.
    pub batch: usize,
    /// The `[data.NAME]` it trains on.
    pub data: String,
    /// The one place it trains (`device = "cpu"` or `"cuda:N"`), where the placement would otherwise choose.
    #[serde(rename = "device", skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
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
    /// In what arithmetic its products run on CUDA: `fp32`, `tf32`, or mixed `bf16` / `f16` (fp32 master weights;
    /// `f16` with dynamic loss scaling). Members of different precisions never fuse. It is no part of
    /// [`MemberConfig::identity`]: parameters and optimizer state are fp32 under every policy, so a run may resume
    /// under another one.
    #[serde(serialize_with = "precision_name")]
    pub precision: Precision,
}

/// A precision policy as configs write it (`"bf16"`).
fn precision_name<S: serde::Serializer>(
    p: &Precision,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// The values `precision` takes, for messages about a value of the wrong type.
const PRECISION_ACCEPTED: &str = "\"fp32\", \"tf32\", \"bf16\" or \"f16\"";

/// The `precision` key of table `s`, if there: a name `Precision`'s `FromStr` knows, or an error naming the key with
/// its message (which lists the accepted values); `whose` (e.g. `member "cnn": `) starts the message.
fn read_precision(s: &Section<'_>, whose: &str) -> CResult<Option<Precision>> {
    s.str("precision", PRECISION_ACCEPTED)?
        .map(|v| {
            v.parse::<Precision>()
                .map_err(|m| s.error("precision", format!("{whose}{m}")))
        })
        .transpose()
}

impl MemberConfig {
    /// The part of the config that must not change across a resume, as JSON: model, optimizer, schedule, data,
    /// batch, seed.
    pub fn identity(&self) -> serde_json::Value {
        let model = match &self.model {
            // The key checkpoints have recorded since cohort 0.1.
            MemberModel::Spec(s) => ("layers", serde_json::json!(s.layers)),
            MemberModel::Custom(name) => ("custom", serde_json::json!(name)),
        };
        let mut identity = serde_json::json!({
            "optimizer": optimizer_identity(&self.optimizer),
            "lr_schedule": self.lr_schedule,
            "data": self.data,
            "batch": self.batch,
            "seed": self.seed,
            "epochs": self.epochs,
            "max_steps": self.max_steps,
        });
        identity[model.0] = model.1;
        identity
    }

    /// A 64-bit FNV-1a hash of [`MemberConfig::identity`], in hex (checkpoints record it; resume compares).
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

/// The optimizer as a member's identity records it: the form checkpoints have hashed since cohort 0.1 (`{"adam":
/// {"lr", "beta1", "beta2", "eps", "weight_decay", "decoupled"}}`), so that their runs still resume.
fn optimizer_identity(o: &OptimConfig) -> serde_json::Value {
    match *o {
        OptimConfig::Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } => serde_json::json!({ "sgd": {
            "lr": lr, "momentum": momentum, "dampening": dampening,
            "weight_decay": weight_decay, "nesterov": nesterov,
        }}),
        OptimConfig::Adam {
            lr,
            betas,
            eps,
            weight_decay,
        }
        | OptimConfig::AdamW {
            lr,
            betas,
            eps,
            weight_decay,
        } => serde_json::json!({ "adam": {
            "lr": lr, "beta1": betas.0, "beta2": betas.1, "eps": eps,
            "weight_decay": weight_decay, "decoupled": matches!(o, OptimConfig::AdamW { .. }),
        }}),
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
    /// `[search]`: the run is a sweep.
    pub search: Option<SearchConfig>,
    /// `[data.NAME]` by name.
    pub data: BTreeMap<String, DataConfig>,
    /// The members after sampling and grid expansion, in file order.
    pub members: Vec<MemberConfig>,
}

/// The built-in default job: a small lr grid of MLPs and one CNN on the bundled MNIST digits.
pub const DEFAULT_JOB: &str = include_str!("../../../examples/default.toml");

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
        let top = Section::new(file, "the top level", &root, false);
        let run_t = top.table("run")?;
        let memory_t = top.table("memory")?;
        let data_t = top.table("data")?;
        let search_t = top.table("search")?;
        let members_v = top.take("member");
        top.finish()?;

        let empty = Table::new();
        let run = parse_run(&Section::new(file, "[run]", run_t.unwrap_or(&empty), false))?;
        let memory = parse_memory(&Section::new(
            file,
            "[memory]",
            memory_t.unwrap_or(&empty),
            false,
        ))?;

        let mut search = search_t
            .map(|t| search::parse_search(&Section::new(file, "[search]", t, false), run.seed))
            .transpose()?;
        let mut data = BTreeMap::new();
        if let Some(dt) = data_t {
            for (name, v) in dt {
                let section = format!("[data.{name}]");
                let Value::Table(t) = v else {
                    return Err(err(
                        "[data]",
                        name,
                        format!("expected a table {section}, found {}", describe(v)),
                    ));
                };
                let d = data::parse(name, &Section::new(file, &section, t, false))?;
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
                                format!("expected a [[member]] table, found {}", describe(other)),
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
                    format!("expected [[member]] tables, found {}", describe(other)),
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
        let mut next_trial = 0;
        let most_trials: usize = search.as_ref().map_or(0, |s| {
            member_tables
                .iter()
                .map(|t| search::table_trials(t).unwrap_or(s.trials))
                .sum()
        });
        for (i, t) in member_tables.iter().enumerate() {
            let section = format!("[[member]] {}", i + 1);
            let trials = search::trials(file, &section, t, i, search.as_mut(), &mut next_trial)?;
            for trial in trials {
                for point in grid::expand_grid(&trial.table) {
                    let mut hyperparameters: BTreeMap<String, serde_json::Value> = trial
                        .values
                        .iter()
                        .map(|(k, v)| (k.clone(), search::json(v)))
                        .collect();
                    for (k, v) in &point.values {
                        hyperparameters.insert(k.clone(), search::json(v));
                        if let Some(s) = search.as_mut() {
                            search::note_dimension(s, k, "grid");
                        }
                    }
                    let s = Section::new(file, &section, &point.table, true);
                    let naming = Naming {
                        grid: point.naming,
                        trial: trial.index.map(|t| (t, most_trials)),
                    };
                    let mut m = parse_member(&s, &run, i, naming, hyperparameters)?;
                    if !data.contains_key(&m.data) {
                        if data.is_empty() && m.data == "mnist" {
                            data.insert("mnist".into(), data::default_mnist());
                        } else {
                            let known: Vec<String> =
                                data.keys().map(|k| format!("\"{k}\"")).collect();
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
        }
        // Reports group members by their hyper-parameters: where any member runs under another policy than fp32,
        // every member records its own (a grid or a sampled choice over `precision` recorded it already).
        if members.iter().any(|m| m.precision != Precision::Fp32) {
            for m in &mut members {
                m.hyperparameters
                    .entry("precision".to_string())
                    .or_insert_with(|| serde_json::json!(m.precision.name()));
            }
        }
        if let Some(s) = &search
            && next_trial == 0
            && s.trials > 1
        {
            return Err(err(
                "[search]",
                "trials",
                format!(
                    "trials = {} but no [[member]] table has a search space to sample, such as lr = {{ loguniform                      = [1e-4, 1e-1] }}, {{ uniform = [a, b] }}, {{ int = [a, b] }} or {{ choice = [...] }}",
                    s.trials
                ),
            ));
        }
        if let Some(shard) = run.shard {
            members = shard
                .select(members)
                .map_err(|m| err("[run]", "shard", m))?;
        }
        Ok(Config {
            file: file.to_string(),
            text: text.to_string(),
            run,
            memory,
            search,
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

/// A table being read, in a file and a section: cohort-autograd's [`Fields`] (which keys were asked for, what is
/// accepted) with the file and the table named in every error.
struct Section<'a> {
    file: &'a str,
    name: String,
    fields: Fields<'a>,
}

impl<'a> Section<'a> {
    /// The table `name` of `file`; `grid` where a list of values is a hyper-parameter grid (`[[member]]` tables).
    fn new(file: &'a str, name: &str, table: &'a Table, grid: bool) -> Self {
        Section {
            file,
            name: name.to_string(),
            fields: Fields::new(table, "", grid),
        }
    }

    /// The error `e` of a key of this table.
    fn wrap(&self, e: SpecError) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            section: self.name.clone(),
            key: e.key,
            message: e.message,
        }
    }

    fn error(&self, k: &str, message: String) -> ConfigError {
        self.wrap(self.fields.error(k, message))
    }

    fn take(&self, k: &str) -> Option<&'a Value> {
        self.fields.take(k)
    }

    fn sub(&self, k: &str, t: &'a Table) -> Section<'a> {
        Section {
            file: self.file,
            name: self.name.clone(),
            fields: self.fields.sub(k, t),
        }
    }

    fn table(&self, k: &str) -> CResult<Option<&'a Table>> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(t)),
            Some(v) => Err(self.error(k, format!("expected a table, found {}", describe(v)))),
        }
    }

    fn str(&self, k: &str, accepted: &str) -> CResult<Option<&'a str>> {
        self.fields.str(k, accepted).map_err(|e| self.wrap(e))
    }

    fn bool(&self, k: &str) -> CResult<Option<bool>> {
        self.fields.bool(k).map_err(|e| self.wrap(e))
    }

    fn f64_in(&self, k: &str, lo: f64, hi: f64, what: &str) -> CResult<Option<f64>> {
        self.fields
            .f64_in(k, lo, hi, what)
            .map_err(|e| self.wrap(e))
    }

    fn u64(&self, k: &str, min: u64) -> CResult<Option<u64>> {
        self.fields.u64(k, min).map_err(|e| self.wrap(e))
    }

    /// A memory amount, in the allocator's one syntax ([`Limit`]'s `FromStr`: `"2GiB"`, `"512MB"`, `"40%"`).
    fn mem(&self, k: &str) -> CResult<Option<Limit>> {
        match self.take(k) {
            None => Ok(None),
            Some(v) => memory_amount(v).map(Some).ok_or_else(|| {
                self.error(
                    k,
                    format!("expected {MEMORY_AMOUNT}, found {}", describe(v)),
                )
            }),
        }
    }

    /// Errors on keys that were never asked for, listing the accepted ones.
    fn finish(&self) -> CResult<()> {
        self.fields.finish().map_err(|e| self.wrap(e))
    }

    /// A single-key table such as `{ cosine = { … } }` (or the bare string `"constant"`): the key and its value.
    fn variant(&self, k: &str, accepted: &str) -> CResult<Option<(&'a str, &'a Value)>> {
        self.fields.variant(k, accepted).map_err(|e| self.wrap(e))
    }
}

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
    let epochs = s.u64("epochs", 1)?.unwrap_or(1) as u32;
    let max_steps = s.u64("steps", 1)?;
    let device = devices::parse_run_device(s)?;
    let shard = s
        .str("shard", Shard::ACCEPTED)?
        .map(|v| v.parse::<Shard>().map_err(|m| s.error("shard", m)))
        .transpose()?;
    let seed = s.u64("seed", 0)?.unwrap_or(0);
    let dir = PathBuf::from(s.str("dir", "a directory path")?.unwrap_or("runs"));
    let log_every = s.u64("log_every", 1)?.unwrap_or(20);
    let eval_every = s.u64("eval_every", 1)?;
    let warmup = s.bool("warmup")?.unwrap_or(true);
    let cuda_graphs = s.bool("cuda_graphs")?.unwrap_or(true);
    let deterministic = s.bool("deterministic")?.unwrap_or(false);
    let precision = read_precision(s, "")?.unwrap_or_default();
    s.finish()?;
    Ok(RunConfig {
        name,
        schedule,
        fuse,
        epochs,
        max_steps,
        device,
        shard,
        seed,
        dir,
        log_every,
        eval_every,
        warmup,
        cuda_graphs,
        deterministic,
        precision,
    })
}

/// The forms of a memory amount, for error messages.
pub(crate) const MEMORY_AMOUNT: &str =
    "a size such as \"2GiB\", \"512MiB\", \"40%\" or a number of bytes";

/// A memory amount in a TOML value: a positive number of bytes, or a string in the allocator's one syntax
/// ([`Limit`]'s `FromStr`: `"2GiB"`, `"512MB"`, `"40%"`). The config and the control file read sizes through it.
pub(crate) fn memory_amount(v: &Value) -> Option<Limit> {
    match v {
        Value::Integer(i) if *i > 0 => Some(Limit::Bytes(*i as u64)),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn parse_memory(s: &Section<'_>) -> CResult<MemoryConfig> {
    let growth = s.bool("growth")?.unwrap_or(true);
    let limit = s.mem("limit")?;
    let scope = match s.str("scope", "\"pool\" or \"process\"")? {
        None => Scope::Pool,
        Some(v) => v.parse().map_err(|_| {
            s.error(
                "scope",
                format!(
                    "expected \"pool\" (the limit caps the allocator's pool) or \"process\" (everything the \
                     process holds on the device), found \"{v}\""
                ),
            )
        })?,
    };
    let cards = devices::parse_card_limits(s, s.table("cards")?)?;
    s.finish()?;
    Ok(MemoryConfig {
        growth,
        limit,
        scope,
        cards,
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

/// What a member's name is made of besides its table's: its trial (index, and the sweep's size) and grid values.
struct Naming {
    grid: Vec<(String, String)>,
    trial: Option<(usize, usize)>,
}

fn parse_member(
    s: &Section<'_>,
    run: &RunConfig,
    index: usize,
    naming: Naming,
    hyperparameters: BTreeMap<String, serde_json::Value>,
) -> CResult<MemberConfig> {
    let base = match s.str("name", "a member name")? {
        Some(n) => n.to_string(),
        None => format!("member{}", index + 1),
    };
    let mut name = match naming.trial {
        Some((t, total)) => search::trial_name(&base, t, total),
        None => base,
    };
    for (k, v) in &naming.grid {
        name.push('-');
        name.push_str(k);
        name.push_str(v);
    }
    check_name(&name).map_err(|m| s.error("name", m))?;

    let model = s.table("model")?.ok_or_else(|| {
        s.error(
            "model",
            "missing; expected { layers = [ { linear = 10 } ] } (or { custom = \"NAME\" } for a model a program \
             registers)"
                .into(),
        )
    })?;
    let ms = s.sub("model", model);
    let model = match ms.str("custom", "the name a program registered its model under")? {
        Some(name) => MemberModel::Custom(name.to_string()),
        None => MemberModel::Spec(ModelSpec::read(&ms.fields).map_err(|e| ms.wrap(e))?),
    };
    ms.finish()?;
    let optimizer = OptimConfig::read(&s.fields, "optimizer").map_err(|e| s.wrap(e))?;

    let lr_accepted = "\"constant\", { cosine = { warmup = N, min_lr = X } } or { step = { every = N, gamma = X } }";
    let lr_schedule = match s.variant("lr_schedule", "constant, cosine, step")? {
        None | Some(("constant", _)) => LrScheduleConfig::Constant,
        Some(("cosine", Value::Table(t))) => {
            let ls = s.sub("lr_schedule.cosine", t);
            let c = LrScheduleConfig::Cosine {
                warmup: ls.u64("warmup", 0)?.unwrap_or(0),
                min_lr: ls
                    .f64_in("min_lr", 0.0, 1e3, "a learning rate ≥ 0")?
                    .unwrap_or(0.0),
            };
            ls.finish()?;
            c
        }
        Some(("step", Value::Table(t))) => {
            let ls = s.sub("lr_schedule.step", t);
            let c = LrScheduleConfig::Step {
                every: ls.u64("every", 1)?.unwrap_or(1000),
                gamma: ls
                    .f64_in("gamma", 0.0, 1.0, "a factor in (0, 1]")?
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

    let batch = s.u64("batch", 1)?.unwrap_or(64) as usize;
    let data = s
        .str("data", "the name of a [data.NAME] table")?
        .unwrap_or("mnist")
        .to_string();
    let pin = devices::parse_pin(s)?;
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
    let weight = s.u64("weight", 1)?.unwrap_or(1) as u32;
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
                    return Err(cs.error(
                        "every",
                        format!("expected {accepted}, found {}", describe(v)),
                    ));
                }
            };
            let keep = cs.u64("keep", 1)?.unwrap_or(3) as usize;
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
                    .f64_in("shrink", 0.01, 0.9, "a fraction in [0.01, 0.9]")?
                    .unwrap_or(0.15),
                min_batch: os.u64("min_batch", 1)?.unwrap_or(8) as usize,
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
                    describe(v)
                ),
            ));
        }
    };
    let epochs = s.u64("epochs", 1)?.map_or(run.epochs, |e| e as u32);
    let max_steps = s.u64("steps", 1)?.or(run.max_steps);
    let seed = s
        .u64("seed", 0)?
        .unwrap_or(run.seed.wrapping_add(index as u64));
    let fuse = s.bool("fuse")?.unwrap_or(run.fuse);
    let precision = read_precision(s, &format!("member \"{name}\": "))?.unwrap_or(run.precision);
    let early_stopping = search::parse_early_stopping(s)?;
    // Read by the sampling already; here its form is checked, and that there is something to sample.
    if s.u64("trials", 1)?.is_some() && naming.trial.is_none() {
        return Err(s.error(
            "trials",
            "this table has no search space to sample trials from: write a value as { loguniform = [lo, hi] }, \
             { choice = [...] }, ..., or remove trials"
                .into(),
        ));
    }
    s.finish()?;
    Ok(MemberConfig {
        name,
        table_index: index + 1,
        grid: naming.grid,
        trial: naming.trial.map(|(t, _)| t),
        hyperparameters,
        early_stopping,
        model,
        optimizer,
        lr_schedule,
        batch,
        data,
        pin,
        memory,
        weight,
        checkpoint,
        oom,
        epochs,
        max_steps,
        seed,
        fuse,
        precision,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_amounts_are_the_allocators() {
        let c = Config::parse(
            "[memory]\nlimit = \"1g\"\n[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 2 }] }\n\
             memory = { limit = \"1.5GB\", reserve = \"40%\" }\n",
            "m.toml",
        )
        .unwrap();
        // One syntax for every size: "1g" is 2^30 bytes here as in COHORT_MEMORY_LIMIT.
        assert_eq!(c.memory.limit, Some(Limit::Bytes(1 << 30)));
        assert_eq!(c.memory.limit, "1g".parse::<Limit>().ok());
        let m = &c.members[0].memory;
        assert_eq!(m.limit, Some(Limit::Bytes(1_500_000_000)));
        assert_eq!(m.reserve, Some(Limit::Percent(40.0)));
        let e = Config::parse(
            "[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 2 }] }\nmemory = { limit = \"lots\" }\n",
            "m.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "memory.limit");
        assert!(e.message.contains("\"512MiB\""), "{e}");
        assert_eq!(
            c.memory.scope,
            Scope::Pool,
            "the limit caps the pool unless told"
        );
        let member = "[[member]]\nname = \"m\"\nmodel = { layers = [{ linear = 2 }] }\n";
        let c = Config::parse(
            &format!("[memory]\nscope = \"process\"\n{member}"),
            "m.toml",
        )
        .unwrap();
        assert_eq!(c.memory.scope, Scope::Process);
        let e =
            Config::parse(&format!("[memory]\nscope = \"card\"\n{member}"), "m.toml").unwrap_err();
        assert_eq!((e.section.as_str(), e.key.as_str()), ("[memory]", "scope"));
        assert!(
            e.message.contains("\"process\"") && e.message.contains("\"card\""),
            "{e}"
        );
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
