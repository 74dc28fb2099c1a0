//! A unit's training step captured as a CUDA graph and replayed: one launch per step instead of a
//! step's dozens of kernels and cuBLAS calls, so a small model's step costs GPU time, not host time.
//!
//! When: on a GPU, once a full batch of the unit's size has run eagerly (Adam's moments exist and
//! cuBLASLt has tuned the step's products), for as long as the batch size stays. An epoch's short
//! last batch runs eagerly between replays; a new batch size (control file, OOM) warms up and
//! captures again; a split or a move builds a new unit, which starts eager. Models with dropout stay
//! eager: a replay would draw the captured mask again.
//!
//! What keeps a replay equal to an eager step: the batch is copied into the graph's static inputs;
//! the optimizer's step number and the schedule's factor over the one at capture are set on the
//! device before each replay, and the host optimizer's count advances with it; Adam's bias
//! correction comes from the same f64 operations on the device as on the host, so a replay at the
//! capture's rates gives the eager step's bits. Rates scaled on the device round otherwise than the
//! host's: under deterministic algorithms a step whose schedule factor is not the capture's runs
//! eagerly, so that a run ends on the same bits however its steps split between eager and replayed.
//! Under f16 the loss scale, its overflow flag and the decision to skip an update all live on the
//! device, so a replay scales, checks and skips as an eager step does. The graph's memory comes
//! from the shared allocator under the unit's tenant, so it counts against the member's budget.
//! Cohorts in other threads of the process may share the GPU: their work waits while a step is captured.

use cohort_autograd::{Model, Tape, Var};
use cohort_optim::{LossScaler, Optimizer};
use cohort_tensor::cuda::CudaGraph;
use cohort_tensor::{Device, Tensor};

use crate::error::Result;
use crate::objective::Objective;

/// The backward pass from the loss `l` on `tape` and the update of `opt`, as eager and captured steps both run them.
/// Under a loss scaler (f16), from the loss times its scale; the scaler then unscales the gradients and steps `opt`,
/// or skips the update where they overflowed, all on the device.
///
/// # Errors
/// A failed backward pass or update.
pub(crate) fn backward_and_step(
    tape: &Tape,
    l: &Var,
    opt: &mut Optimizer,
    scaler: Option<&LossScaler>,
) -> Result<()> {
    match scaler {
        Some(s) => {
            tape.backward(&s.scaled(l)?)?;
            s.step(opt)?;
        }
        None => {
            tape.backward(l)?;
            opt.step()?;
        }
    }
    Ok(())
}

/// A captured step with the tensors its replays read and write.
pub(crate) struct StepGraph {
    graph: CudaGraph,
    x: Tensor,
    y: Tensor,
    /// Per-member loss, written by every replay.
    loss: Tensor,
    batch: usize,
    /// The schedule's factor at capture: the captured rates are the base rates times this.
    factor: f64,
    /// The loss scaler whose state the graph reads and writes (f16), kept as long as the graph.
    _scaler: Option<LossScaler>,
}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepGraph(batch {})", self.batch)
    }
}

/// Whether a unit's steps are captured, and how far.
#[derive(Debug)]
pub(crate) enum Graphs {
    /// Every step runs eagerly (the CPU, dropout, `cuda_graphs = false`, a failed capture).
    Off,
    /// Eager steps; the next full batch of `warm` examples (one ran eagerly) is captured.
    Warming { warm: Option<usize> },
    /// Full batches replay this graph.
    Ready(Box<StepGraph>),
}

impl Graphs {
    /// The state of a new unit.
    pub(crate) fn new(enabled: bool) -> Graphs {
        if enabled {
            Graphs::Warming { warm: None }
        } else {
            Graphs::Off
        }
    }

    /// Before a step of `n` examples in a unit of batch size `batch`: drops a graph of another
    /// batch size; whether this step should be captured.
    pub(crate) fn should_capture(&mut self, n: usize, batch: usize, opt: &Optimizer) -> bool {
        if matches!(self, Graphs::Ready(g) if g.batch != batch) {
            *self = Graphs::Warming { warm: None };
        }
        // A factor of 0 (the first step of some warm-ups) cannot be scaled from: wait a step. Members with
        // schedules of their own have no one factor to scale a captured step's rates by: they step eagerly.
        n == batch
            && matches!(self, Graphs::Warming { warm: Some(w) } if *w == n)
            && opt.rate_factor().is_some_and(|f| f > 0.0)
    }

    /// The graph to replay for the next step of `opt`, of `n` examples, if there is one; under deterministic
    /// algorithms only at the rates of its capture (see the [module docs](self)).
    pub(crate) fn replayable(&self, n: usize, opt: &Optimizer) -> Option<&StepGraph> {
        match self {
            Graphs::Ready(g)
                if g.batch == n
                    && (!cohort_tensor::deterministic() || opt.rate_factor() == Some(g.factor)) =>
            {
                Some(g.as_ref())
            }
            _ => None,
        }
    }

    /// After an eager step of `n` examples in a unit of batch size `batch`.
    pub(crate) fn ran_eagerly(&mut self, n: usize, batch: usize) {
        if let Graphs::Warming { warm } = self
            && n == batch
        {
            *warm = Some(n);
        }
    }
}

impl StepGraph {
    /// Captures one training step of `model` and `opt` on `(x, y)`, which become the graph's
    /// static inputs. Nothing runs: the caller replays it for this batch too. Run in the unit's
    /// tenant scope, so that the graph's memory is charged to it.
    ///
    /// # Errors
    /// Anything that cannot be captured (the error says what); the optimizer is as before.
    pub(crate) fn capture(
        model: &Model,
        opt: &mut Optimizer,
        objective: &Objective,
        scaler: Option<&LossScaler>,
        device: &Device,
        x: Tensor,
        y: Tensor,
    ) -> Result<StepGraph> {
        let steps = opt.steps();
        let factor = opt.rate_factor().unwrap_or(1.0);
        let batch = y.shape().first().copied().unwrap_or(0);
        let captured = cohort_tensor::cuda::capture(device, || -> Result<Tensor> {
            let tape = Tape::new();
            let logits = model.forward(&tape, &x)?;
            let l = objective.loss(&logits, &y)?;
            backward_and_step(&tape, &l, opt, scaler)?;
            opt.zero_grad();
            Ok(l.value().clone())
        });
        // The capture ran nothing: the host's count stays, and a failed capture's gradients go.
        opt.set_steps(steps);
        opt.zero_grad();
        let (graph, loss) = captured?;
        Ok(StepGraph {
            graph,
            x,
            y,
            loss,
            batch,
            factor,
            _scaler: scaler.cloned(),
        })
    }

    /// Copies the batch into the static inputs and queues one replay, as the optimizer's next
    /// step; returns the per-member loss (the graph's own tensor, rewritten by the next replay).
    ///
    /// # Errors
    /// Device errors.
    pub(crate) fn replay(&self, opt: &mut Optimizer, x: &Tensor, y: &Tensor) -> Result<&Tensor> {
        self.x.assign_(x)?;
        self.y.assign_(y)?;
        let next = opt.steps() + 1;
        let scale = (opt.rate_factor().unwrap_or(self.factor) / self.factor) as f32;
        self.graph.set_optimizer_step(next, scale)?;
        self.graph.replay()?;
        opt.set_steps(next);
        Ok(&self.loss)
    }

    /// Bytes of the graph's private pool (charged to the unit's tenant).
    pub(crate) fn pool_bytes(&self) -> u64 {
        self.graph.pool_stats().counters.reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_optim::{OptimConfig, Schedule};

    fn adam(schedule: Schedule) -> Optimizer {
        Optimizer::new(OptimConfig::adam(1e-3), &[])
            .unwrap()
            .with_schedule(schedule)
    }

    #[test]
    fn a_step_is_captured_only_after_a_full_batch_ran_eagerly() {
        let opt = adam(Schedule::Constant);
        let mut off = Graphs::new(false);
        off.ran_eagerly(32, 32);
        assert!(!off.should_capture(32, 32, &opt), "graphs off stay off");

        let mut g = Graphs::new(true);
        assert!(!g.should_capture(32, 32, &opt), "nothing ran eagerly yet");
        g.ran_eagerly(20, 32);
        assert!(
            !g.should_capture(32, 32, &opt),
            "a short batch does not warm"
        );
        g.ran_eagerly(32, 32);
        assert!(
            !g.should_capture(20, 32, &opt),
            "a short batch is never captured"
        );
        assert!(g.should_capture(32, 32, &opt));
        assert!(g.replayable(32, &opt).is_none());
        // The unit's batch changed (OOM, control file): the new size warms up first.
        assert!(!g.should_capture(16, 16, &opt));
        g.ran_eagerly(16, 16);
        assert!(g.should_capture(16, 16, &opt));
    }

    #[test]
    fn a_schedule_at_zero_waits_for_a_step_it_can_scale_from() {
        let mut opt = adam(Schedule::Step {
            every: 1,
            gamma: 0.0,
        });
        let mut g = Graphs::new(true);
        g.ran_eagerly(8, 8);
        assert!(g.should_capture(8, 8, &opt), "factor 1 at step 0");
        opt.set_steps(1);
        assert_eq!(opt.rate_factor(), Some(0.0));
        assert!(!g.should_capture(8, 8, &opt));
    }

    #[test]
    fn members_with_schedules_of_their_own_step_eagerly() {
        let mut opt = adam(Schedule::Constant);
        opt.set_member_schedules(vec![Schedule::Constant]).unwrap();
        let mut g = Graphs::new(true);
        g.ran_eagerly(8, 8);
        assert_eq!(opt.rate_factor(), None);
        assert!(!g.should_capture(8, 8, &opt));
    }
}
