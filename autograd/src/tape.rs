//! The tape: records operations on [`Var`]s and runs them backwards.

use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use cohort_tensor::{DType, Precision, Tensor};

use crate::backward::Op;
use crate::{Error, Param, Result};

/// Records differentiable operations, like `tf.GradientTape`.
///
/// Create one per step (or reuse one: [`Tape::backward`] clears the recording and keeps its buffers). Leaves enter
/// with [`Tape::param`] (a trainable [`Param`]: its gradient is accumulated into it) or [`Tape::watch`] (any tensor:
/// its gradient is returned in [`Gradients`]); every op on a recorded [`Var`] is then recorded. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tape(Rc<RefCell<State>>);

#[derive(Default)]
struct State {
    generation: u64,
    next_id: usize,
    nodes: Vec<Node>,
    params: Vec<(usize, Param)>,
    paused: usize,
    eval: bool,
}

pub(crate) struct Node {
    out: usize,
    /// The output's dtype: its gradient comes in it (an op may give an input's gradient in another, as a
    /// product's backward gives f32 for 16-bit activations).
    dtype: DType,
    inputs: Vec<Option<usize>>,
    op: Op,
    /// The policy the forward ran under: the backward's products run under it too.
    precision: Precision,
}

impl fmt::Debug for Tape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.borrow();
        f.debug_struct("Tape")
            .field("nodes", &s.nodes.len())
            .field("params", &s.params.len())
            .field("recording", &(s.paused == 0))
            .field("training", &!s.eval)
            .finish()
    }
}

/// A value on a tape (or a constant, when recorded on none or under [`Tape::no_grad`]).
#[derive(Clone)]
pub struct Var {
    value: Tensor,
    slot: Option<Slot>,
}

#[derive(Clone)]
struct Slot {
    tape: Tape,
    id: usize,
    generation: u64,
}

impl fmt::Debug for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Var")
            .field("shape", &self.value.shape())
            .field("dtype", &self.value.dtype())
            .field("id", &self.slot.as_ref().map(|s| s.id))
            .finish()
    }
}

impl Var {
    /// A constant: ops on it are recorded only when another input is on a tape.
    pub fn constant(value: Tensor) -> Var {
        Var { value, slot: None }
    }

    /// The value.
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    /// The value's shape.
    pub fn shape(&self) -> &[usize] {
        self.value.shape()
    }

    /// Whether gradients flow to this value (it is on a tape that was recording).
    pub fn requires_grad(&self) -> bool {
        self.slot.is_some()
    }

    /// The value, leaving the tape behind.
    pub fn detach(&self) -> Var {
        Var::constant(self.value.clone())
    }

    /// Records `op` producing `value` from `inputs`; a constant when no input is recorded or the tape is paused.
    pub(crate) fn record(
        name: &'static str,
        value: Tensor,
        inputs: &[&Var],
        op: impl FnOnce() -> Op,
    ) -> Result<Var> {
        let Some(first) = inputs.iter().find_map(|v| v.slot.as_ref()) else {
            return Ok(Var::constant(value));
        };
        let tape = first.tape.clone();
        let mut state = tape.0.borrow_mut();
        let mut ids = Vec::with_capacity(inputs.len());
        for v in inputs {
            match &v.slot {
                Some(s) if Rc::ptr_eq(&s.tape.0, &tape.0) && s.generation == state.generation => {
                    ids.push(Some(s.id))
                }
                Some(_) => return Err(Error::TapeMismatch(name)),
                None => ids.push(None),
            }
        }
        if state.paused > 0 {
            return Ok(Var::constant(value));
        }
        let id = state.next_id;
        state.next_id += 1;
        let generation = state.generation;
        state.nodes.push(Node {
            out: id,
            dtype: value.dtype(),
            inputs: ids,
            op: op(),
            precision: Precision::current(),
        });
        drop(state);
        Ok(Var {
            value,
            slot: Some(Slot {
                tape,
                id,
                generation,
            }),
        })
    }
}

/// Gradients of one backward pass: by watched [`Var`] and by [`Param`].
#[derive(Debug, Default)]
pub struct Gradients {
    generation: u64,
    by_id: Vec<Option<Tensor>>,
    by_param: Vec<(u64, Tensor)>,
}

impl Gradients {
    /// The gradient of a leaf made by [`Tape::watch`] (or [`Tape::param`]) before this pass; `None` when the loss
    /// does not depend on it.
    pub fn get(&self, v: &Var) -> Option<&Tensor> {
        let s = v.slot.as_ref()?;
        if s.generation != self.generation {
            return None;
        }
        self.by_id.get(s.id)?.as_ref()
    }

    /// This pass's gradient of `p` (the accumulated one is [`Param::grad`]).
    pub fn param(&self, p: &Param) -> Option<&Tensor> {
        self.by_param
            .iter()
            .find(|(id, _)| *id == p.id())
            .map(|(_, g)| g)
    }
}

impl Tape {
    /// An empty tape in training mode.
    pub fn new() -> Tape {
        Tape::default()
    }

    fn leaf(&self, value: Tensor, param: Option<&Param>) -> Var {
        let mut s = self.0.borrow_mut();
        if s.paused > 0 {
            return Var::constant(value);
        }
        let id = s.next_id;
        s.next_id += 1;
        if let Some(p) = param {
            s.params.push((id, p.clone()));
        }
        let generation = s.generation;
        drop(s);
        Var {
            value,
            slot: Some(Slot {
                tape: self.clone(),
                id,
                generation,
            }),
        }
    }

    /// A leaf whose gradient [`Tape::backward`] returns in [`Gradients::get`].
    pub fn watch(&self, value: Tensor) -> Var {
        self.leaf(value, None)
    }

    /// A leaf for a trainable parameter: backward accumulates its gradient into it.
    pub fn param(&self, p: &Param) -> Var {
        self.leaf(p.value().clone(), Some(p))
    }

    /// Runs `f` without recording (inference, metrics): everything made inside is a constant.
    pub fn no_grad<R>(&self, f: impl FnOnce() -> R) -> R {
        self.0.borrow_mut().paused += 1;
        let r = f();
        self.0.borrow_mut().paused -= 1;
        r
    }

    /// Whether ops are being recorded now (false inside [`Tape::no_grad`]).
    pub fn is_recording(&self) -> bool {
        self.0.borrow().paused == 0
    }

    /// Training mode (dropout active) or evaluation mode; a new tape trains.
    pub fn set_training(&self, training: bool) {
        self.0.borrow_mut().eval = !training;
    }

    /// Whether layers should behave as in training (dropout on).
    pub fn is_training(&self) -> bool {
        !self.0.borrow().eval
    }

    /// Number of recorded ops.
    pub fn len(&self) -> usize {
        self.0.borrow().nodes.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the recording (and frees the tensors it saved) without differentiating.
    pub fn clear(&self) {
        let mut s = self.0.borrow_mut();
        s.nodes.clear();
        s.params.clear();
        s.next_id = 0;
        s.generation += 1;
    }

    /// Differentiates `loss` (seeded with ones, so a per-member loss `[M]` gives every member its own gradient):
    /// accumulates into every [`Param`] recorded with [`Tape::param`] and returns all leaf gradients. The recording
    /// is then cleared; the tape can record the next step.
    ///
    /// # Errors
    /// When `loss` was not recorded on this tape's current recording, or a backward op fails.
    pub fn backward(&self, loss: &Var) -> Result<Gradients> {
        let (mut nodes, params, n, generation) = {
            let mut s = self.0.borrow_mut();
            match &loss.slot {
                Some(sl) if Rc::ptr_eq(&sl.tape.0, &self.0) && sl.generation == s.generation => {}
                _ => return Err(Error::TapeMismatch("backward")),
            }
            (
                std::mem::take(&mut s.nodes),
                std::mem::take(&mut s.params),
                s.next_id,
                s.generation,
            )
        };
        let result = run_backward(&nodes, &params, n, generation, loss);
        nodes.clear();
        let mut s = self.0.borrow_mut();
        s.nodes = nodes; // keep the capacity for the next step
        s.params = params;
        s.params.clear();
        s.next_id = 0;
        s.generation += 1;
        result
    }
}

fn run_backward(
    nodes: &[Node],
    params: &[(usize, Param)],
    n: usize,
    generation: u64,
    loss: &Var,
) -> Result<Gradients> {
    let mut grads: Vec<Option<Tensor>> = vec![None; n];
    let loss_id = loss.slot.as_ref().map(|s| s.id).unwrap_or_default();
    let mut need = Vec::with_capacity(4);
    let accumulate =
        |grads: &mut Vec<Option<Tensor>>, node: &Node, ins: Vec<Option<Tensor>>| -> Result<()> {
            for (input, gi) in node.inputs.iter().zip(ins) {
                if let (Some(id), Some(gi)) = (input, gi) {
                    grads[*id] = Some(match grads[*id].take() {
                        Some(prev) => {
                            // Converted only where it must be: a second handle would keep it from summing in place.
                            let gi = if gi.dtype() == prev.dtype() {
                                gi
                            } else {
                                gi.to_dtype(prev.dtype())?
                            };
                            prev.accumulate(gi)?
                        }
                        None => gi,
                    });
                }
            }
            Ok(())
        };
    // The loss's own op may know its inputs' gradients for a seed of ones without making or multiplying by one.
    let mut rest = nodes;
    if let Some((last, before)) = nodes.split_last().filter(|(l, _)| l.out == loss_id) {
        need.extend(last.inputs.iter().map(Option::is_some));
        let _p = last.precision.enter();
        if let Some(ins) = last.op.backward_of_ones(&need) {
            accumulate(&mut grads, last, ins?)?;
            rest = before;
        }
    }
    if rest.len() == nodes.len() {
        let lv = loss.value();
        grads[loss_id] = Some(Tensor::ones(lv.shape(), lv.dtype(), &lv.device())?);
    }
    for node in rest.iter().rev() {
        let Some(g) = grads[node.out].take() else {
            continue;
        };
        let g = g.to_dtype(node.dtype)?;
        need.clear();
        need.extend(node.inputs.iter().map(Option::is_some));
        let ins = {
            let _p = node.precision.enter();
            node.op.backward(&g, &need)?
        };
        accumulate(&mut grads, node, ins)?;
    }
    let mut by_param = Vec::with_capacity(params.len());
    for (id, p) in params {
        if let Some(g) = &grads[*id] {
            p.accumulate_grad(g.clone())?;
            match by_param
                .iter_mut()
                .find(|(pid, _): &&mut (u64, Tensor)| *pid == p.id())
            {
                Some((_, prev)) => *prev = prev.add(g)?,
                None => by_param.push((p.id(), g.clone())),
            }
        }
    }
    Ok(Gradients {
        generation,
        by_id: grads,
        by_param,
    })
}
