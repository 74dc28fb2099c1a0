use cohort_autograd::Param;
use cohort_autograd::spec::{Fields, SpecResult, describe};
use cohort_tensor::Tensor;
use serde::{Deserialize, Serialize};
use toml::Value;

use crate::{Error, Result, Schedule};

/// Which update rule, with its hyper-parameters (PyTorch's names and defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum OptimConfig {
    /// `torch.optim.SGD`.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum factor (0: plain SGD).
        #[serde(default)]
        momentum: f64,
        /// Dampening of the momentum.
        #[serde(default)]
        dampening: f64,
        /// L2 penalty added to the gradient.
        #[serde(default)]
        weight_decay: f64,
        /// Nesterov momentum.
        #[serde(default)]
        nesterov: bool,
    },
    /// `torch.optim.Adam` (weight decay added to the gradient).
    Adam {
        /// Learning rate.
        lr: f64,
        /// `(beta1, beta2)`.
        #[serde(default = "default_betas")]
        betas: (f64, f64),
        /// Denominator term.
        #[serde(default = "default_eps")]
        eps: f64,
        /// L2 penalty added to the gradient.
        #[serde(default)]
        weight_decay: f64,
    },
    /// `torch.optim.AdamW` (decoupled weight decay).
    AdamW {
        /// Learning rate.
        lr: f64,
        /// `(beta1, beta2)`.
        #[serde(default = "default_betas")]
        betas: (f64, f64),
        /// Denominator term.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Decoupled decay (PyTorch default 0.01).
        #[serde(default = "default_adamw_decay")]
        weight_decay: f64,
    },
}

fn default_betas() -> (f64, f64) {
    (0.9, 0.999)
}
fn default_eps() -> f64 {
    1e-8
}
fn default_adamw_decay() -> f64 {
    0.01
}

impl OptimConfig {
    /// Adam with PyTorch's defaults and rate `lr`.
    pub fn adam(lr: f64) -> OptimConfig {
        OptimConfig::Adam {
            lr,
            betas: default_betas(),
            eps: default_eps(),
            weight_decay: 0.0,
        }
    }

    /// AdamW with PyTorch's defaults and rate `lr`.
    pub fn adamw(lr: f64) -> OptimConfig {
        OptimConfig::AdamW {
            lr,
            betas: default_betas(),
            eps: default_eps(),
            weight_decay: default_adamw_decay(),
        }
    }

    /// Plain SGD with rate `lr`.
    pub fn sgd(lr: f64) -> OptimConfig {
        OptimConfig::Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }

    /// The optimizers a config names, for messages.
    pub const ACCEPTED: &'static str = "sgd, adam, adamw";

    /// Reads the value of `key` in `f`: `{ adam = { lr = 1e-3 } }`, `{ sgd = { lr = 0.1, momentum = 0.9 } }`,
    /// `{ adamw = { .. } }` or just `"adam"`; absent, Adam at 1e-3. The defaults are PyTorch's, but SGD's rate (0.01).
    ///
    /// # Errors
    /// [`cohort_autograd::SpecError`] naming the key: an unknown optimizer or option, a value out of range.
    pub fn read(f: &Fields<'_>, key: &str) -> SpecResult<OptimConfig> {
        let (kind, table) = match f.variant(key, Self::ACCEPTED)? {
            None => return Ok(OptimConfig::adam(1e-3)),
            Some((kind, Value::Table(t))) => (kind, t),
            Some((kind, v)) => {
                return Err(f.error(
                    &format!("{key}.{kind}"),
                    format!(
                        "expected a table of options such as {{ lr = 1e-3 }}, found {}",
                        describe(v)
                    ),
                ));
            }
        };
        let o = f.sub(&format!("{key}.{kind}"), table);
        let rate = |default| -> SpecResult<f64> {
            match o.f64("lr")? {
                Some(lr) if lr <= 0.0 || lr > 1e3 => Err(o.error(
                    "lr",
                    format!("expected a learning rate in (0, 1000], found {lr}"),
                )),
                lr => Ok(lr.unwrap_or(default)),
            }
        };
        let decay = |default| {
            o.f64_in("weight_decay", 0.0, 1e3, "a weight decay ≥ 0")
                .map(|d| d.unwrap_or(default))
        };
        let config = match kind {
            "sgd" => OptimConfig::Sgd {
                lr: rate(0.01)?,
                momentum: o
                    .f64_in("momentum", 0.0, 1.0, "a momentum in [0, 1]")?
                    .unwrap_or(0.0),
                dampening: o
                    .f64_in("dampening", 0.0, 1.0, "a dampening in [0, 1]")?
                    .unwrap_or(0.0),
                weight_decay: decay(0.0)?,
                nesterov: o.bool("nesterov")?.unwrap_or(false),
            },
            "adam" | "adamw" => {
                let lr = rate(1e-3)?;
                let betas = (
                    o.f64_in("beta1", 0.0, 0.999_999, "a beta1 in [0, 1)")?
                        .unwrap_or(0.9),
                    o.f64_in("beta2", 0.0, 0.999_999_999, "a beta2 in [0, 1)")?
                        .unwrap_or(0.999),
                );
                let eps = o
                    .f64_in("eps", 1e-30, 1.0, "an epsilon > 0")?
                    .unwrap_or(1e-8);
                if kind == "adam" {
                    OptimConfig::Adam {
                        lr,
                        betas,
                        eps,
                        weight_decay: decay(0.0)?,
                    }
                } else {
                    OptimConfig::AdamW {
                        lr,
                        betas,
                        eps,
                        weight_decay: decay(default_adamw_decay())?,
                    }
                }
            }
            other => {
                return Err(f.error(
                    key,
                    format!("expected one of {}, found \"{other}\"", Self::ACCEPTED),
                ));
            }
        };
        o.finish()?;
        Ok(config)
    }

    /// Buffers kept per parameter (Adam's two moments, SGD's momentum), for memory estimates.
    pub fn state_slots(&self) -> usize {
        self.buffers().len()
    }

    /// The base learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimConfig::Sgd { lr, .. }
            | OptimConfig::Adam { lr, .. }
            | OptimConfig::AdamW { lr, .. } => *lr,
        }
    }

    fn validate(&self) -> Result<()> {
        let check = |name, value: f64, ok: bool, reason| {
            if ok {
                Ok(())
            } else {
                Err(Error::Config {
                    name,
                    value,
                    reason,
                })
            }
        };
        check(
            "lr",
            self.lr(),
            self.lr() >= 0.0 && self.lr().is_finite(),
            "must be finite and >= 0",
        )?;
        match self {
            OptimConfig::Sgd {
                momentum,
                dampening,
                weight_decay,
                nesterov,
                ..
            } => {
                check("momentum", *momentum, *momentum >= 0.0, "must be >= 0")?;
                check(
                    "weight_decay",
                    *weight_decay,
                    *weight_decay >= 0.0,
                    "must be >= 0",
                )?;
                check(
                    "dampening",
                    *dampening,
                    !*nesterov || (*momentum > 0.0 && *dampening == 0.0),
                    "Nesterov momentum needs momentum > 0 and dampening = 0",
                )
            }
            OptimConfig::Adam {
                betas,
                eps,
                weight_decay,
                ..
            }
            | OptimConfig::AdamW {
                betas,
                eps,
                weight_decay,
                ..
            } => {
                check(
                    "beta1",
                    betas.0,
                    (0.0..1.0).contains(&betas.0),
                    "must be in [0, 1)",
                )?;
                check(
                    "beta2",
                    betas.1,
                    (0.0..1.0).contains(&betas.1),
                    "must be in [0, 1)",
                )?;
                check("eps", *eps, *eps >= 0.0, "must be >= 0")?;
                check(
                    "weight_decay",
                    *weight_decay,
                    *weight_decay >= 0.0,
                    "must be >= 0",
                )
            }
        }
    }

    fn buffers(&self) -> &'static [&'static str] {
        match self {
            OptimConfig::Sgd { momentum, .. } if *momentum > 0.0 => &["momentum_buffer"],
            OptimConfig::Sgd { .. } => &[],
            _ => &["exp_avg", "exp_avg_sq"],
        }
    }
}

/// Saved optimizer state: the step count and every buffer, named `<param>.<buffer>` (`layers.0.weight.exp_avg`).
#[derive(Clone, Debug)]
pub struct OptimizerState {
    /// Updates made so far.
    pub step: u64,
    /// Buffers by name.
    pub tensors: Vec<(String, Tensor)>,
}

impl OptimizerState {
    /// Member `m`'s slice of every buffer, without the member dimension (for that member's checkpoint).
    ///
    /// # Errors
    /// When `m` is out of range.
    pub fn member(&self, m: usize) -> Result<OptimizerState> {
        let mut tensors = Vec::with_capacity(self.tensors.len());
        for (name, t) in &self.tensors {
            let s = t.shape();
            if s.is_empty() || m >= s[0] {
                return Err(Error::State {
                    name: name.clone(),
                    reason: format!("member {m} of a buffer {s:?}"),
                });
            }
            tensors.push((name.clone(), t.narrow(0, m, 1)?.reshape(&s[1..])?));
        }
        Ok(OptimizerState {
            step: self.step,
            tensors,
        })
    }
}

#[derive(Debug)]
struct Slot {
    param: Param,
    /// Adam: `[exp_avg, exp_avg_sq]`; SGD with momentum: `[momentum_buffer]`; made at the first update.
    bufs: Vec<Tensor>,
}

/// Updates a set of parameters from their accumulated gradients.
#[derive(Debug)]
pub struct Optimizer {
    config: OptimConfig,
    schedule: Schedule,
    slots: Vec<Slot>,
    step: u64,
    /// Base rate per member (one value: all members).
    member_lrs: Vec<f64>,
    /// A schedule per member of a fused model whose members' schedules differ (a cosine floor each: PyTorch's
    /// `eta_min` is a rate, not a factor); empty: `schedule` for all.
    member_schedules: Vec<Schedule>,
    lrs_now: Vec<f64>,
}

impl Optimizer {
    /// An optimizer over `params` (a model's [`Model::params`](cohort_autograd::Model::params)).
    ///
    /// # Errors
    /// When a hyper-parameter is out of range.
    pub fn new(config: OptimConfig, params: &[Param]) -> Result<Optimizer> {
        config.validate()?;
        Ok(Optimizer {
            member_lrs: vec![config.lr()],
            member_schedules: Vec::new(),
            config,
            schedule: Schedule::Constant,
            slots: params
                .iter()
                .map(|p| Slot {
                    param: p.clone(),
                    bufs: Vec::new(),
                })
                .collect(),
            step: 0,
            lrs_now: Vec::with_capacity(1),
        })
    }

    /// With a learning-rate schedule.
    pub fn with_schedule(mut self, schedule: Schedule) -> Optimizer {
        self.schedule = schedule;
        self
    }

    /// The update rule.
    pub fn config(&self) -> &OptimConfig {
        &self.config
    }

    /// Base learning rate per member of a fused model (one value: the same for all).
    ///
    /// # Errors
    /// When the count is neither 1 nor the parameters' member count, or a rate is negative.
    pub fn set_member_lrs(&mut self, lrs: &[f64]) -> Result<()> {
        let members = self
            .slots
            .first()
            .map_or(1, |s| s.param.shape().first().copied().unwrap_or(1));
        if lrs.is_empty() || (lrs.len() != 1 && lrs.len() != members) {
            return Err(Error::MemberLrs {
                given: lrs.len(),
                members,
            });
        }
        if let Some(bad) = lrs.iter().find(|l| !(**l >= 0.0 && l.is_finite())) {
            return Err(Error::Config {
                name: "lr",
                value: *bad,
                reason: "must be finite and >= 0",
            });
        }
        self.member_lrs = lrs.to_vec();
        Ok(())
    }

    /// A schedule per member of a fused model, where their schedules differ (one per member of
    /// [`Optimizer::set_member_lrs`]); rates are then computed per member on the host, and
    /// [`Optimizer::rate_factor`] has no single value.
    ///
    /// # Errors
    /// When the count is not the members' count.
    pub fn set_member_schedules(&mut self, schedules: Vec<Schedule>) -> Result<()> {
        if schedules.len() != self.member_lrs.len() {
            return Err(Error::MemberLrs {
                given: schedules.len(),
                members: self.member_lrs.len(),
            });
        }
        self.member_schedules = schedules;
        Ok(())
    }

    /// Updates made so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Sets the update count (bias correction and schedules continue from it), e.g. after loading members'
    /// buffers one by one with [`Optimizer::load_member_state`].
    pub fn set_steps(&mut self, step: u64) {
        self.step = step;
    }

    /// The learning rate(s) the next update will use (schedule applied).
    pub fn current_lrs(&self) -> Vec<f64> {
        match self.rate_factor() {
            Some(f) => self.member_lrs.iter().map(|l| l * f).collect(),
            None => self
                .member_lrs
                .iter()
                .zip(&self.member_schedules)
                .map(|(l, s)| l * s.factor(self.step))
                .collect(),
        }
    }

    /// The schedule's factor on the base rates for the next update, the same for every member; `None` when
    /// members have schedules of their own ([`Optimizer::set_member_schedules`]). A step captured in a CUDA
    /// graph keeps the rates of its capture; replays scale them by this factor over the one at capture
    /// ([`CudaGraph::set_optimizer_step`](cohort_tensor::cuda::CudaGraph)), so a graph needs it.
    pub fn rate_factor(&self) -> Option<f64> {
        self.member_schedules
            .is_empty()
            .then(|| self.schedule.factor(self.step))
    }

    /// The accumulated gradients, one per parameter that has one (sharing its storage: an in-place op
    /// on one changes the gradient the next [`Optimizer::step`] reads).
    pub fn grads(&self) -> Vec<Tensor> {
        self.slots.iter().filter_map(|s| s.param.grad()).collect()
    }

    /// Clears the gradients of all parameters.
    pub fn zero_grad(&self) {
        self.slots.iter().for_each(|s| s.param.zero_grad());
    }

    /// One update of every parameter that has a gradient (one fused tensor call each).
    ///
    /// # Errors
    /// When a tensor op fails (device, dtype).
    pub fn step(&mut self) -> Result<()> {
        self.step_unless(None)
    }

    /// [`Optimizer::step`], except that no parameter or state changes where the overflow flag of the
    /// loss scale state `overflow` (see [`LossScaler`](crate::LossScaler)) is raised when the update
    /// runs: on CUDA the fused launch reads it, so no host read waits for the gradients. The step is
    /// counted either way, as PyTorch's schedulers step past a skipped one; Adam's bias correction
    /// counts it too (PyTorch's does not: a small difference, where skips are few).
    ///
    /// # Errors
    /// When a tensor op fails (device, dtype), or `overflow` is not a loss scale state.
    pub fn step_unless(&mut self, overflow: Option<&Tensor>) -> Result<()> {
        let lrs = self.current_lrs();
        self.lrs_now.clear();
        self.lrs_now.extend(lrs);
        let t = self.step + 1;
        let all = &self.lrs_now;
        // One rate per member when the parameter has that many members, else the first for all.
        let lrs_for = |p: &Tensor| -> &[f64] {
            if all.len() > 1 && p.shape().first() == Some(&all.len()) {
                all
            } else {
                &all[..1]
            }
        };
        match &self.config {
            OptimConfig::Sgd {
                momentum,
                dampening,
                weight_decay,
                nesterov,
                ..
            } => {
                // PyTorch starts a momentum buffer at the first gradient; the fused update computes
                // momentum * buf + (1 - dampening) * g, so a dampened one starts from
                // buf = dampening / momentum * g. That start reads the gradient, so an overflowed one
                // must not make it: the flag is read here, once, before any buffer exists.
                let starts = *momentum > 0.0
                    && *dampening != 0.0
                    && self
                        .slots
                        .iter()
                        .any(|s| s.bufs.is_empty() && s.param.grad().is_some());
                if starts
                    && let Some(o) = overflow
                    && o.to_vec::<f32>()?[0] != 0.0
                {
                    self.step = t;
                    return Ok(());
                }
                let grads = grads_with_state(&mut self.slots, |p, g, bufs| {
                    if *momentum > 0.0 {
                        bufs.push(if *dampening == 0.0 {
                            Tensor::zeros(p.shape(), p.dtype(), &p.device())?
                        } else {
                            let gd = if *weight_decay > 0.0 {
                                g.add(&p.mul_scalar(*weight_decay)?)?
                            } else {
                                g.clone()
                            };
                            gd.mul_scalar(dampening / momentum)?
                        });
                    }
                    Ok(())
                })?;
                let entries: Vec<_> = grads
                    .iter()
                    .map(|(i, g)| {
                        let s = &self.slots[*i];
                        let p = s.param.value();
                        (p, g, s.bufs.first(), lrs_for(p))
                    })
                    .collect();
                Tensor::sgd_step_many_(
                    &entries,
                    *momentum,
                    *dampening,
                    *weight_decay,
                    *nesterov,
                    overflow,
                )?;
            }
            OptimConfig::Adam {
                betas,
                eps,
                weight_decay,
                ..
            }
            | OptimConfig::AdamW {
                betas,
                eps,
                weight_decay,
                ..
            } => {
                let decoupled = matches!(self.config, OptimConfig::AdamW { .. });
                let grads = grads_with_state(&mut self.slots, |p, _, bufs| {
                    for _ in 0..2 {
                        bufs.push(Tensor::zeros(p.shape(), p.dtype(), &p.device())?);
                    }
                    Ok(())
                })?;
                // Every parameter in one call: one fused launch on the GPU.
                let entries: Vec<_> = grads
                    .iter()
                    .map(|(i, g)| {
                        let s = &self.slots[*i];
                        let p = s.param.value();
                        (p, g, &s.bufs[0], &s.bufs[1], lrs_for(p))
                    })
                    .collect();
                Tensor::adam_step_many_(
                    &entries,
                    betas.0,
                    betas.1,
                    *eps,
                    *weight_decay,
                    decoupled,
                    t,
                    overflow,
                )?;
            }
        }
        self.step = t;
        Ok(())
    }

    /// The step count and every buffer by name, for a checkpoint (buffers not made yet are left out).
    pub fn state_dict(&self) -> OptimizerState {
        let names = self.config.buffers();
        let mut tensors = Vec::new();
        for slot in &self.slots {
            let pn = slot.param.name();
            for (b, t) in names.iter().zip(&slot.bufs) {
                tensors.push((format!("{pn}.{b}"), t.clone()));
            }
        }
        OptimizerState {
            step: self.step,
            tensors,
        }
    }

    /// Restores a [`Optimizer::state_dict`] (copies the buffers).
    ///
    /// # Errors
    /// When a buffer is unknown or has the wrong shape, or some but not all buffers of a parameter are given.
    pub fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
        self.check_names(state)?;
        let names = self.config.buffers();
        for slot in &mut self.slots {
            let pn = slot.param.name();
            let mut bufs = Vec::with_capacity(names.len());
            for b in names {
                let name = format!("{pn}.{b}");
                if let Some((_, t)) = state.tensors.iter().find(|(n, _)| *n == name) {
                    if t.shape() != slot.param.shape() {
                        return Err(Error::State {
                            name,
                            reason: format!(
                                "shape {:?}, the parameter {:?}",
                                t.shape(),
                                slot.param.shape()
                            ),
                        });
                    }
                    let p = slot.param.value();
                    let own = Tensor::zeros(p.shape(), p.dtype(), &p.device())?;
                    own.assign_(&t.to_device(&p.device())?.to_dtype(p.dtype())?)?;
                    bufs.push(own);
                }
            }
            if !bufs.is_empty() && bufs.len() != names.len() {
                return Err(Error::State {
                    name: pn,
                    reason: format!("needs all of {names:?}"),
                });
            }
            slot.bufs = bufs;
        }
        self.step = state.step;
        Ok(())
    }

    /// Writes member `m`'s slice of every buffer from a [`OptimizerState::member`] state (the step count is
    /// shared by all members and left as is).
    ///
    /// # Errors
    /// When a buffer is unknown or has the wrong shape.
    pub fn load_member_state(&mut self, m: usize, state: &OptimizerState) -> Result<()> {
        self.check_names(state)?;
        let names = self.config.buffers();
        for slot in &mut self.slots {
            let pn = slot.param.name();
            let p = slot.param.value().clone();
            for (i, b) in names.iter().enumerate() {
                let name = format!("{pn}.{b}");
                let Some((_, t)) = state.tensors.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                if slot.bufs.len() < names.len() {
                    slot.bufs = names
                        .iter()
                        .map(|_| Tensor::zeros(p.shape(), p.dtype(), &p.device()))
                        .collect::<std::result::Result<_, _>>()?;
                }
                let s = p.shape();
                if m >= s[0] || t.elem_count() * s[0] != p.elem_count() {
                    return Err(Error::State {
                        name,
                        reason: format!("member {m} slice {:?} of a parameter {s:?}", t.shape()),
                    });
                }
                let mut one = vec![1];
                one.extend_from_slice(&s[1..]);
                slot.bufs[i].narrow_assign_(
                    0,
                    m,
                    &t.to_device(&p.device())?
                        .to_dtype(p.dtype())?
                        .reshape(&one)?,
                )?;
            }
        }
        Ok(())
    }

    fn check_names(&self, state: &OptimizerState) -> Result<()> {
        let names = self.config.buffers();
        for (n, _) in &state.tensors {
            let known = self.slots.iter().any(|s| {
                let pn = s.param.name();
                names.iter().any(|b| {
                    n.len() == pn.len() + 1 + b.len() && n.starts_with(&pn) && n.ends_with(b)
                })
            });
            if !known {
                return Err(Error::State {
                    name: n.clone(),
                    reason: "no such buffer in this optimizer".into(),
                });
            }
        }
        Ok(())
    }
}

/// The slots that have a gradient, by index, with it; `start` makes the state buffers of a slot that has
/// none yet from its parameter and gradient (PyTorch makes them at the first step).
fn grads_with_state(
    slots: &mut [Slot],
    mut start: impl FnMut(&Tensor, &Tensor, &mut Vec<Tensor>) -> Result<()>,
) -> Result<Vec<(usize, Tensor)>> {
    let mut grads = Vec::with_capacity(slots.len());
    for (i, slot) in slots.iter_mut().enumerate() {
        let Some(g) = slot.param.grad() else { continue };
        if slot.bufs.is_empty() {
            start(slot.param.value(), &g, &mut slot.bufs)?;
        }
        grads.push((i, g));
    }
    Ok(grads)
}
