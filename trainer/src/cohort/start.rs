//! Starting a run, fresh or resumed: the device, the data, every model checked against its data, the member
//! folders locked, and on a resume each member's newest good checkpoint checked against the config (its member
//! settings, its data settings, its vocabulary, the set of members) before the units are built from them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cohort_data::Position;
use cohort_tensor::Device;

use super::{Cohort, Counters, MemberRun, RunOptions, State, budget, checkpoints, schedule, unit};
use crate::checkpoint::{Checkpoint, CheckpointDir};
use crate::config::{Config, Devices, Visible};
use crate::control::ControlFile;
use crate::dataset::DataSet;
use crate::error::{Error, Result};
use crate::metrics::MetricsWriter;
use crate::progress::Progress;
use crate::run_dir::{MemberLock, RunDir};
use crate::tensorboard::EventWriter;
use crate::tuning::TuningFile;

impl Cohort {
    pub(super) fn start(
        mut config: Config,
        run: RunDir,
        opts: RunOptions,
        resuming: bool,
    ) -> Result<Cohort> {
        let cards = run_cards(&mut config)?;
        budget::apply_memory_env(&config, cards.first().copied());
        cohort_tensor::set_deterministic(config.run.deterministic);
        crate::kernel_cache::configure();
        let device = cards.first().map_or(Device::Cpu, |&n| Device::Cuda(n));
        // Opened now, after the last environment change (its kernels compile on threads of their own), so that a
        // machine's first run compiles them while it loads its data.
        device.open()?;
        let config_dir = run
            .config_dir()
            .or_else(|| Path::new(&config.file).parent().map(Path::to_path_buf));
        let mut data = BTreeMap::new();
        for m in &config.members {
            if !data.contains_key(&m.data) {
                let d = DataSet::load(&config.data[&m.data], config_dir.as_deref())?;
                data.insert(m.data.clone(), Arc::new(d));
            }
        }
        // Every model fits its data before a member starts.
        for cfg in &config.members {
            if let Some(reason) = unit::misfit(cfg, &data[&cfg.data], &opts.models) {
                return Err(Error::Model {
                    member: cfg.name.clone(),
                    reason,
                });
            }
        }
        // A sweep ranks its trials, and an early stop watches a member, on validation: there must be one.
        for cfg in &config.members {
            let why = match (&config.search, cfg.early_stopping) {
                (Some(s), _) => Some(format!("the sweep ranks trials by {}", s.metric.name())),
                (None, Some(e)) => Some(format!("its early_stopping watches {}", e.metric.name())),
                (None, None) => None,
            };
            if let Some(why) = why
                && data[&cfg.data].val.is_none()
            {
                return Err(Error::Model {
                    member: cfg.name.clone(),
                    reason: format!(
                        "{why}, but [data.{}] has no validation split: add val = 0.1 (a tenth of the training \
                         examples held out) or validation files",
                        cfg.data
                    ),
                });
            }
        }
        for d in data.values() {
            if let Some(words) = &d.vocabulary {
                run.write_vocabulary(&d.name, words)?;
            }
        }
        if resuming {
            check_member_set(&run, &config)?;
        }
        let sweep = config
            .search
            .as_ref()
            .map(|s| crate::sweep::Sweep::open(run.root(), s, resuming))
            .transpose()?;
        // Lock every member directory first: two members (or runs) never share one.
        let mut members = Vec::new();
        let mut loaded: Vec<Option<Checkpoint>> = Vec::new();
        let mut messages = Vec::new();
        let mut time_offset: f64 = 0.0;
        for cfg in &config.members {
            let dir = run.member_dir(&cfg.name);
            let lock = MemberLock::acquire(&dir)?;
            let ckpt = CheckpointDir::new(run.checkpoint_dir(&cfg.name), cfg.checkpoint.keep)?;
            let best_ckpt = CheckpointDir::new(run.checkpoint_dir(&cfg.name).join("best"), 1)?;
            let latest = if resuming { ckpt.load_latest()? } else { None };
            let checkpoint = match latest {
                Some(l) => {
                    for s in &l.skipped {
                        messages.push(format!(
                            "warning: member \"{}\": skipping a corrupt checkpoint: {s}",
                            cfg.name
                        ));
                    }
                    let m = &l.checkpoint.manifest;
                    if m.config_hash != cfg.config_hash() {
                        return Err(Error::IncompatibleResume {
                            member: cfg.name.clone(),
                            differences: checkpoints::differences(&m.config, &cfg.identity()),
                        });
                    }
                    let settings = config.data[&cfg.data].identity();
                    if !m.data_settings.is_null() && m.data_settings != settings {
                        return Err(Error::IncompatibleResume {
                            member: cfg.name.clone(),
                            differences: checkpoints::differences(&m.data_settings, &settings)
                                .into_iter()
                                .map(|d| format!("[data.{}] {d}", cfg.data))
                                .collect(),
                        });
                    }
                    let words = m.vocabulary.clone().map(cohort_data::Vocabulary::reindexed);
                    if words.is_some() && words != data[&cfg.data].vocabulary {
                        return Err(Error::IncompatibleResume {
                            member: cfg.name.clone(),
                            differences: vec![format!(
                                "the vocabulary of [data.{}]: its training text changed",
                                cfg.data
                            )],
                        });
                    }
                    Some(l.checkpoint)
                }
                None => None,
            };
            let d = &data[&cfg.data];
            let (step, pos, batch, mut c, dev) = match &checkpoint {
                Some(ck) => {
                    let m = &ck.manifest;
                    let pos: Position = serde_json::from_value(m.data_position.clone())
                        .map_err(|e| Error::json("checkpoint data position", e))?;
                    let c: Counters =
                        serde_json::from_value(m.trainer_state.clone()).unwrap_or_default();
                    let dev = if m.device == "cpu" {
                        Device::Cpu
                    } else {
                        device
                    };
                    (m.step, pos, m.batch, c, dev)
                }
                None => (
                    0,
                    Position::default(),
                    cfg.batch,
                    Counters::default(),
                    device,
                ),
            };
            time_offset = time_offset.max(c.time);
            if let Some((status, why)) = sweep.as_ref().and_then(|s| s.ended(&cfg.name)) {
                c.status = *status;
                c.stopped = why.clone().or_else(|| Some(status.to_string()));
            }
            let metrics = MetricsWriter::open(&dir, resuming.then_some(step))?;
            let events = EventWriter::create(&dir, resuming.then_some(step))?;
            let epochs_done = d.epochs_done(&pos);
            // A member that ended early (pruned, stopped, failed) says so in its last checkpoint: it stays ended.
            let done = epochs_done >= u64::from(cfg.epochs)
                || cfg.max_steps.is_some_and(|s| step >= s)
                || c.stopped.is_some();
            // A sweep's trial that has not started waits for room (`admit`).
            let state = match (done, &checkpoint) {
                (true, _) => State::Done,
                (false, None) if config.search.is_some() => State::Queued,
                (false, _) => State::Running,
            };
            members.push(MemberRun {
                cfg: cfg.clone(),
                events,
                metrics,
                ckpt,
                best_ckpt,
                _lock: lock,
                step,
                epochs_done,
                batch,
                state,
                log_mark: (c.train_time, step),
                c,
                mem_now: 0,
                device: dev,
                fused_with: Vec::new(),
                last_ckpt_step: checkpoint.as_ref().map(|c| c.manifest.step),
                finalized: done,
                diverged: false,
            });
            loaded.push(checkpoint);
        }
        let names: Vec<String> = members.iter().map(|m| m.cfg.name.clone()).collect();
        let schedule_kind = config.run.schedule;
        let tuning = TuningFile::new(run.root(), device);
        let mut cohort = Cohort {
            control: ControlFile::new(run.control_path()),
            progress: match config.search {
                Some(_) => Progress::new(&names, opts.progress).only_active(),
                None => Progress::new(&names, opts.progress),
            },
            config,
            run,
            device,
            data,
            members,
            units: Vec::new(),
            started: Instant::now(),
            time_offset,
            schedule: schedule::new(schedule_kind),
            next_unit: std::cell::Cell::new(0),
            opts,
            halted: false,
            last_memory_tick: None,
            last_process: None,
            peak_process: 0,
            said_all_paused: false,
            tuning,
            sweep,
            validated: Vec::new(),
        };
        // Before the first product: a resumed run's products run on the algorithms the interrupted run chose.
        if resuming && let Some(m) = cohort.tuning.adopt() {
            messages.push(m);
        }
        for m in messages {
            cohort.progress.message(&m);
        }
        cohort.write_hparams()?;
        cohort.place(&cards)?;
        cohort.build_units(loaded)?;
        cohort.admit()?;
        Ok(cohort)
    }
}

/// A resumed run must train the members it trained: a member folder with checkpoints that the config no longer names
/// (a grid value changed or removed) would be abandoned, and a member without a folder is one the run never had.
///
/// # Errors
/// [`Error::ChangedMembers`] listing each.
fn check_member_set(run: &RunDir, config: &Config) -> Result<()> {
    let named: std::collections::BTreeSet<&str> =
        config.members.iter().map(|m| m.name.as_str()).collect();
    let mut changes = Vec::new();
    let entries = std::fs::read_dir(run.root()).map_err(|e| Error::io(run.root(), e))?;
    let mut folders: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("checkpoints").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    for f in &folders {
        // Read only: this runs before the member locks are taken, while another process may be writing here.
        let has_checkpoints = std::fs::read_dir(run.checkpoint_dir(f)).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with("ckpt-") && n.ends_with(".json")
            })
        });
        if has_checkpoints && !named.contains(f.as_str()) {
            changes.push(format!(
                "\"{f}\" has checkpoints here but is not in the config"
            ));
        }
    }
    for m in &config.members {
        if !run.member_dir(&m.name).is_dir() {
            changes.push(format!(
                "\"{}\" is in the config but never ran here",
                m.name
            ));
        }
    }
    if changes.is_empty() {
        Ok(())
    } else {
        Err(Error::ChangedMembers {
            run: run.root().to_path_buf(),
            changes,
        })
    }
}

/// The cards a run trains on (none: the CPU): `COHORT_DEVICE` where set (the environment wins over the config, as
/// for memory, and `config` says so from then on), else `[run] device`; checked to exist, with every member's pin.
/// The allocator's other variables (`COHORT_MEMORY_LIMIT`, `COHORT_MEMORY_SCOPE`, `COHORT_MEMORY_GROWTH`,
/// `COHORT_ALLOCATOR`) are checked here too, on every machine: a GPU's allocator reads them, and a bad value must
/// not pass unnoticed where there is none.
///
/// # Errors
/// A `COHORT_*` value the allocator refuses, naming the variable and the accepted forms; a card that does not
/// exist; several cards ([`Error::SeveralCards`]).
fn run_cards(config: &mut Config) -> Result<Vec<usize>> {
    let env = cohort_alloc::Config::from_env()?;
    if std::env::var_os("COHORT_DEVICE").is_some() {
        config.run.device = match env.device {
            cohort_alloc::DeviceSelector::Auto => Devices::Auto,
            cohort_alloc::DeviceSelector::Cpu => Devices::Cpu,
            cohort_alloc::DeviceSelector::Cuda(n) => {
                Device::Cuda(n).verify()?;
                Devices::Cards(vec![n])
            }
        };
    }
    let cards = config.cards(&Visible::now())?;
    if cards.len() > 1 {
        return Err(Error::SeveralCards {
            devices: config.run.device.to_string(),
            cards,
        });
    }
    Ok(cards)
}
