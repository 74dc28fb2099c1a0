//! cohort-trainer: train a cohort of models in one process.
//!
//! A [`Cohort`](cohort::Cohort) runs members (each a model, an optimizer, a batch size, data and a memory budget)
//! under a schedule, writes per-member checkpoints, TensorBoard event files and `metrics.jsonl`, recovers from
//! out-of-memory errors member by member, and reports a summary table, `summary.json` and PNG plots. The `cohort`
//! binary is its command line.
//!
//! - [`config`]: the TOML config, grid expansion, errors naming file, key and what is accepted.
//! - [`cohort`]: members, units of `M` fused members, schedules, OOM recovery, control, resume.
//! - [`dataset`]: each `[data.NAME]` opened once, split into train, validation and test, made into pipelines.
//! - [`feed`]: per-member batch feeds with a saved position.
//! - [`objective`]: the loss and the evaluation scores of a data set's task.
//! - `graph`: a unit's training step captured as a CUDA graph and replayed.
//! - [`memory`]: member budgets as allocator tenants (host accounting on the CPU).
//! - [`models`]: models of one's own, registered by name for `model = { custom = "NAME" }` members.
//! - [`checkpoint`]: safetensors + JSON manifest, atomic writes, rotation, corrupt-checkpoint fallback.
//! - [`tensorboard`], [`metrics`], [`progress`], [`report`], [`plot`]: what a run writes and shows.
//! - [`control`], [`run_dir`]: the control file and the run directory layout.
//! - [`tuning`]: the GPU's choices made by timing, saved with the run and reused on resume.
//! - [`placement`]: which card each member trains on, a pure function of the cards and the members' estimates.
//! - [`shard`]: a grid or sweep shared among hosts (`--shard I/N`), and the shards' summaries merged.
//!
//! ```
//! use cohort_trainer::config::Config;
//! let config = Config::parse(
//!     r#"
//!     [[member]]
//!     name = "mlp"
//!     model = { layers = [{ linear = 64, act = "relu" }, { linear = 10 }] }
//!     optimizer = { adam = { lr = [1e-3, 3e-3] } }
//!     "#,
//!     "example.toml",
//! )
//! .unwrap();
//! let names: Vec<&str> = config.members.iter().map(|m| m.name.as_str()).collect();
//! assert_eq!(names, ["mlp-lr1e-3", "mlp-lr3e-3"]);
//! ```

pub mod checkpoint;
pub mod cohort;
pub mod config;
pub mod control;
pub mod dataset;
pub mod error;
pub mod feed;
mod graph;
mod kernel_cache;
pub mod leaderboard;
pub mod memory;
pub mod memory_now;
pub mod memory_timeline;
pub mod memory_trace;
pub mod metrics;
pub mod models;
pub mod objective;
pub mod placement;
pub mod plot;
pub mod progress;
pub mod report;
pub mod run_dir;
pub mod shard;
pub mod sweep;
pub mod tensorboard;
pub mod tuning;

pub use error::{Error, Result};
