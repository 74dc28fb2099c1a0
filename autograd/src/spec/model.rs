//! [`Model`]: a network of `M` members with its parameters by name, from a spec or from a module of one's own.

use cohort_tensor::{DType, Device, Tensor};

use super::ModelSpec;
use crate::nn::{Features, Module};
use crate::{Error, Param, Result, Tape, Var};

/// A network of `M` members: every parameter is `[M, ..]`. Built by [`ModelSpec::build`], or by [`Model::new`] from
/// a [`Module`] of one's own that follows the same convention.
#[derive(Debug)]
pub struct Model {
    spec: Option<ModelSpec>,
    input: Vec<usize>,
    members: usize,
    net: Box<dyn Module>,
    params: Vec<Param>,
    output: Vec<usize>,
    dtype: DType,
    device: Device,
}

impl Model {
    /// A model of `net`, for examples of shape `input` giving `output` per member. `net`'s parameters (and buffers)
    /// must carry the member dimension first (`[members, ..]`), and its forward must take the shared batch
    /// (`Features::shared`, `[B, ..input]`) or one batch per member (`Features::members`, `[M, B, ..input]`) and give
    /// `[M, B, ..output]`, as every layer of [`crate::nn`] does.
    pub fn new(
        net: impl Module + 'static,
        input: &[usize],
        output: &[usize],
        members: usize,
        dtype: DType,
        device: Device,
    ) -> Model {
        // Checkpoints name tensors by `Param::name`: a module of one's own names its parameters in `params()`.
        for (name, p) in net.params().into_iter().chain(net.buffers()) {
            p.set_name(name);
        }
        let params = net.params().into_iter().map(|(_, p)| p).collect();
        Model {
            spec: None,
            input: input.to_vec(),
            members,
            net: Box::new(net),
            params,
            output: output.to_vec(),
            dtype,
            device,
        }
    }

    pub(super) fn with_spec(mut self, spec: ModelSpec) -> Model {
        self.spec = Some(spec);
        self
    }

    /// `x` as the model takes it: token ids that come as exact float values (a pipeline of f32 arrays) as i32.
    fn input(&self, x: &Tensor) -> Result<Tensor> {
        let tokens = self.spec.as_ref().is_some_and(|s| s.vocab().is_some());
        Ok(if tokens && x.dtype().is_float() {
            x.to_dtype(DType::I32)?
        } else {
            x.clone()
        })
    }

    /// The spec it was built from; `None` for a module of one's own.
    pub fn spec(&self) -> Option<&ModelSpec> {
        self.spec.as_ref()
    }

    /// Number of members `M`.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Per-example input shape.
    pub fn input_shape(&self) -> &[usize] {
        &self.input
    }

    /// Per-example output shape.
    pub fn output_shape(&self) -> &[usize] {
        &self.output
    }

    /// Parameter dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the parameters live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The network.
    pub fn net(&self) -> &dyn Module {
        self.net.as_ref()
    }

    /// Trainable parameters in a stable order, named `layers.<i>.<name>` ([`Param::name`]).
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Number of trainable values of one member.
    pub fn member_param_count(&self) -> usize {
        self.params
            .iter()
            .map(|p| p.value().elem_count() / self.members)
            .sum()
    }

    /// Runs all members on a shared batch `x` (`[B, ..input]` or `[B, prod(input)]`; i32 ids for embeddings),
    /// giving `[M, B, ..output]`. Parameters are recorded on `tape` (use [`Tape::no_grad`] for inference).
    ///
    /// # Errors
    /// When `x` does not have the input's shape.
    pub fn forward(&self, tape: &Tape, x: &Tensor) -> Result<Var> {
        let s = x.shape();
        let per: usize = self.input.iter().product();
        let ok = !s.is_empty() && s[1..].iter().product::<usize>() == per;
        if !ok {
            return Err(Error::Shape {
                op: "model",
                reason: format!(
                    "batch {s:?} for examples of shape {:?}: expected [B, {:?}]",
                    self.input, self.input
                ),
            });
        }
        let mut shape = vec![s[0]];
        shape.extend_from_slice(&self.input);
        let xv = Var::constant(self.input(x)?.reshape(&shape)?);
        self.net
            .forward(tape, Features::shared(xv))?
            .in_f32()?
            .into_members(self.members)
    }

    /// Runs member `m` on its own batch `x[m]` (`x`: `[M, B, ..input]`), giving `[M, B, ..output]`.
    ///
    /// # Errors
    /// When `x` does not have the input's shape.
    pub fn forward_members(&self, tape: &Tape, x: &Tensor) -> Result<Var> {
        let s = x.shape();
        let per: usize = self.input.iter().product();
        if s.len() < 2 || s[0] != self.members || s[2..].iter().product::<usize>() != per {
            return Err(Error::Shape {
                op: "model",
                reason: format!(
                    "per-member batch {s:?}: expected [{}, B, {:?}]",
                    self.members, self.input
                ),
            });
        }
        let mut shape = vec![s[0], s[1]];
        shape.extend_from_slice(&self.input);
        let xv = Var::constant(self.input(x)?.reshape(&shape)?);
        self.net
            .forward(tape, Features::members(xv))?
            .in_f32()?
            .into_members(self.members)
    }

    /// Continues every dropout layer's mask sequence after `n` training passes (see [`Module::set_masks_drawn`]).
    pub fn set_masks_drawn(&self, n: u64) {
        self.net.set_masks_drawn(n);
    }

    /// Gives the spec's top-level `{ dropout = P }` layers, in order, one rate per member each: the members of a
    /// fused group may differ in them (see [`Module::set_dropout_rates`]).
    pub fn set_dropout_rates(&self, rates: Vec<Vec<f64>>) {
        self.net.set_dropout_rates(&mut rates.into_iter());
    }

    /// Clears every parameter's accumulated gradient.
    pub fn zero_grad(&self) {
        self.params.iter().for_each(Param::zero_grad);
    }

    /// Parameters and buffers (running statistics), by name: what a checkpoint holds.
    fn saved(&self) -> Vec<Param> {
        let mut all = self.params.clone();
        all.extend(self.net.buffers().into_iter().map(|(_, b)| b));
        all
    }

    /// Every parameter and buffer, whole (`[M, ..]`), by name.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.saved()
            .iter()
            .map(|p| (p.name(), p.value().clone()))
            .collect()
    }

    /// Member `m`'s own parameters and buffers by name, without the member dimension (`layers.0.weight`:
    /// `[in, out]`): what a checkpoint of that member holds.
    ///
    /// # Errors
    /// When `m >= M`.
    pub fn member_state(&self, m: usize) -> Result<Vec<(String, Tensor)>> {
        self.saved()
            .iter()
            .map(|p| Ok((p.name(), p.member(m)?)))
            .collect()
    }

    /// Overwrites every parameter and buffer, whole (`[M, ..]`, as given by [`Model::state`]); tensors are moved
    /// and cast to the model's device and dtype.
    ///
    /// # Errors
    /// When a parameter is missing, unknown or has the wrong shape.
    pub fn load_state(&self, state: &[(String, Tensor)]) -> Result<()> {
        self.load_each(state, |p, t| p.set(t))
    }

    /// Writes member `m`'s parameters and buffers (as given by [`Model::member_state`], with or without a leading 1).
    ///
    /// # Errors
    /// When a parameter is missing, unknown or has the wrong shape.
    pub fn load_member(&self, m: usize, state: &[(String, Tensor)]) -> Result<()> {
        self.load_each(state, |p, t| p.set_member(m, t))
    }

    /// Checks that `state` names exactly this model's parameters and buffers, then hands each its tensor.
    fn load_each(
        &self,
        state: &[(String, Tensor)],
        load: impl Fn(&Param, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let saved = self.saved();
        for (name, _) in state {
            if !saved.iter().any(|p| &p.name() == name) {
                return Err(Error::Param {
                    name: name.clone(),
                    reason: "not a parameter of this model".into(),
                });
            }
        }
        for p in &saved {
            let name = p.name();
            let (_, t) = state
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| Error::Param {
                    name: name.clone(),
                    reason: "missing from the state".into(),
                })?;
            load(p, t)?;
        }
        Ok(())
    }
}
