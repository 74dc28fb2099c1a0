//! Checkpoints of a running cohort: a member's own slice of its unit written as safetensors beside its manifest,
//! read back on resume, and what changed in a member's config since.

use std::collections::BTreeMap;
use std::path::Path;

use cohort_optim::OptimizerState;
use cohort_tensor::{DType, Device, Tensor};
use safetensors::tensor::Dtype;

use crate::checkpoint::{Checkpoint, FORMAT, Manifest, TensorData};
use crate::error::{Error, Result};

use super::{Cohort, MemberId, MemberState, Scaling};

pub(super) fn tensor_data(t: &Tensor) -> Result<TensorData> {
    let t = t.to_device(&Device::Cpu)?;
    let (dtype, data) = match t.dtype() {
        DType::F32 => (
            Dtype::F32,
            bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
        ),
        DType::F64 => (
            Dtype::F64,
            bytemuck::cast_slice(&t.to_vec::<f64>()?).to_vec(),
        ),
        DType::I32 => (
            Dtype::I32,
            bytemuck::cast_slice(&t.to_vec::<i32>()?).to_vec(),
        ),
        _ => {
            let t = t.to_dtype(DType::F32)?;
            (
                Dtype::F32,
                bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
            )
        }
    };
    Ok(TensorData {
        dtype,
        shape: t.shape().to_vec(),
        data,
    })
}

pub(super) fn tensor_from(d: &TensorData, path: &Path) -> Result<Tensor> {
    let bad = |m: String| Error::Checkpoint {
        path: path.to_path_buf(),
        message: m,
    };
    match d.dtype {
        Dtype::F32 => {
            let v: Vec<f32> = d.to_f32().map_err(bad)?;
            Ok(Tensor::from_vec(v, &d.shape, &Device::Cpu)?)
        }
        Dtype::F64 => {
            let v: Vec<f64> = d
                .data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            Ok(Tensor::from_vec(v, &d.shape, &Device::Cpu)?)
        }
        other => Err(bad(format!(
            "tensor of dtype {other:?}: cohort saves f32 and f64"
        ))),
    }
}

/// Compares two config identities key by key.
pub(super) fn differences(saved: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(a), Some(b)) = (saved.as_object(), now.as_object()) {
        for (k, va) in a {
            let vb = b.get(k).cloned().unwrap_or(serde_json::Value::Null);
            if *va != vb {
                out.push(format!("{k}: {va} in the checkpoint, {vb} now"));
            }
        }
        for (k, vb) in b {
            if !a.contains_key(k) {
                out.push(format!("{k}: absent in the checkpoint, {vb} now"));
            }
        }
    } else if saved != now {
        out.push(format!("{saved} in the checkpoint, {now} now"));
    }
    out
}

/// Which of a member's checkpoints a save writes.
#[derive(Clone, Copy)]
enum Kept {
    /// One of the newest, rotated by `keep`: what a resume starts from.
    Newest,
    /// The one of its best validation, kept until a better one.
    Best,
}

impl Cohort {
    pub(super) fn state_from_checkpoint(
        &self,
        ck: &Checkpoint,
        i: MemberId,
    ) -> Result<MemberState> {
        let path = self.members[i].ckpt.tensors_path(ck.manifest.step);
        let mut params = Vec::new();
        let mut bufs = Vec::new();
        for (name, t) in &ck.tensors {
            if let Some(n) = name.strip_prefix("model.") {
                params.push((n.to_string(), tensor_from(t, &path)?));
            } else if let Some(n) = name.strip_prefix("optim.") {
                bufs.push((n.to_string(), tensor_from(t, &path)?));
            }
        }
        let step = ck
            .manifest
            .trainer_state
            .get("optimizer_step")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(ck.manifest.step);
        Ok((
            params,
            OptimizerState {
                step,
                tensors: bufs,
            },
        ))
    }

    /// Writes the checkpoints of `members` of unit `ui` (each its own slice; the unit's state is read once).
    pub(super) fn checkpoint(&mut self, ui: usize, members: &[MemberId]) -> Result<()> {
        if members.is_empty() {
            return Ok(());
        }
        // Every checkpoint on disk has the product algorithms its steps ran on saved beside it.
        self.tuning.save()?;
        self.save_states(ui, members, Kept::Newest)
    }

    /// Writes the best checkpoints (`checkpoints/best/`) of `members` of unit `ui`, whose validation just beat
    /// their best.
    pub(super) fn checkpoint_best(&mut self, ui: usize, members: &[MemberId]) -> Result<()> {
        self.save_states(ui, members, Kept::Best)
    }

    /// Writes `members`' checkpoints of one kind, the unit's state read once.
    fn save_states(&mut self, ui: usize, members: &[MemberId], kept: Kept) -> Result<()> {
        if members.is_empty() {
            return Ok(());
        }
        let u = &self.units[ui];
        let js: Vec<usize> = members
            .iter()
            .map(|i| u.members.iter().position(|x| x == i).unwrap_or(0))
            .collect();
        let states = Cohort::member_states(u, &js)?;
        for (&i, state) in members.iter().zip(states) {
            self.checkpoint_member(ui, i, state, kept)?;
        }
        Ok(())
    }

    /// Writes member `i`'s checkpoint from its state, among its newest or as its best.
    fn checkpoint_member(
        &mut self,
        ui: usize,
        i: MemberId,
        (params, ostate): MemberState,
        kept: Kept,
    ) -> Result<()> {
        let u = &self.units[ui];
        let mut tensors = BTreeMap::new();
        for (n, t) in &params {
            tensors.insert(format!("model.{n}"), tensor_data(t)?);
        }
        for (n, t) in &ostate.tensors {
            tensors.insert(format!("optim.{n}"), tensor_data(t)?);
        }
        let pos = u.feed.position();
        let forwards = u.forwards;
        let loss_scaler = u.scaling.as_ref().map(Scaling::now).transpose()?;
        let time = self.elapsed();
        let m = &mut self.members[i];
        m.c.time = time;
        let mut trainer_state =
            serde_json::to_value(&m.c).map_err(|e| Error::json("trainer state", e))?;
        trainer_state["optimizer_step"] = serde_json::json!(ostate.step);
        let mut ck = Checkpoint {
            manifest: Manifest {
                format: FORMAT,
                member: m.cfg.name.clone(),
                step: m.step,
                epoch: m.epochs_done,
                batch: m.batch,
                device: m.device.to_string(),
                data_position: serde_json::to_value(pos)
                    .map_err(|e| Error::json("data position", e))?,
                rng: serde_json::json!({
                    "seed": m.cfg.seed,
                    "data_epoch": pos.epoch,
                    "data_index": pos.index,
                    "dropout_forwards": forwards,
                }),
                config_hash: m.cfg.config_hash(),
                config: m.cfg.identity(),
                vocabulary: self.data[&m.cfg.data].vocabulary.clone(),
                trainer_state,
                tensors_file: String::new(),
                tensors_bytes: 0,
                checksum: String::new(),
                wall_time: crate::tensorboard::now(),
                data_settings: self.config.data[&m.cfg.data].identity(),
                manifest_checksum: String::new(),
                loss_scaler,
            },
            tensors,
        };
        // The logs up to the checkpoint are as durable as it is: a resume keeps them.
        m.metrics.sync()?;
        m.events.sync()?;
        match kept {
            Kept::Newest => {
                m.ckpt.save(&mut ck)?;
                m.last_ckpt_step = Some(m.step);
            }
            Kept::Best => {
                m.best_ckpt.save(&mut ck)?;
            }
        }
        Ok(())
    }
}
