//! What a member learns from its data's [`Task`]: the training loss, and the scores an evaluation gives.
//!
//! Classification trains on softmax cross-entropy and scores accuracy and top-k accuracy; regression trains on
//! and scores the mean squared error; language modelling trains on the cross-entropy of every position's next
//! token and scores next-token accuracy and perplexity. Every score is per member, so a fused group evaluates in
//! one pass.

use cohort_autograd::{Var, loss};
use cohort_data::Task;
use cohort_tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A member's scores on one split (validation or test).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// Examples scored.
    pub examples: u64,
    /// The training loss's mean over the split: cross-entropy, or the mean squared error for regression.
    pub loss: f64,
    /// Fraction of examples (of tokens, for a language model) whose highest score is the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Fraction whose target is among the `k` highest scores (classification with more than `k` classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<f64>,
    /// `exp(loss)`, for a language model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
}

impl Scores {
    /// The headline figure with its name: `acc 0.9712`, `mse 0.0131`, `ppl 4.21`.
    pub fn headline(&self) -> String {
        match (self.perplexity, self.accuracy) {
            (Some(p), _) => format!("ppl {p:.2}"),
            (None, Some(a)) => format!("acc {a:.4}"),
            (None, None) => format!("mse {:.4}", self.loss),
        }
    }

    /// Whether these scores are better than `other`'s: higher accuracy for classification, lower loss otherwise.
    pub fn better_than(&self, other: &Scores) -> bool {
        match (self.accuracy, other.accuracy, self.perplexity.is_none()) {
            (Some(a), Some(b), true) if a != b => a > b,
            _ => self.loss < other.loss,
        }
    }
}

/// The loss and scores of one task.
#[derive(Debug, Clone)]
pub struct Objective {
    task: Task,
    top_k: usize,
}

/// Sums over the batches of an evaluation, per member.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    examples: u64,
    rows: u64,
    loss: f64,
    hits: u64,
    top_hits: u64,
}

impl Objective {
    /// For `task`; top-k accuracy with this `k` (where a classification has more classes than `k`).
    pub fn new(task: Task, top_k: usize) -> Objective {
        Objective { task, top_k }
    }

    /// The task.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The `k` of top-k accuracy, when it is scored.
    pub fn top_k(&self) -> Option<usize> {
        match &self.task {
            Task::Classify { classes } if self.top_k > 1 && classes.len() > self.top_k => {
                Some(self.top_k)
            }
            _ => None,
        }
    }

    /// The training loss of outputs `out` (`[M, B, ..]`) against targets `y` (`[B, ..]`), one value per member.
    ///
    /// # Errors
    /// When the shapes do not fit the task.
    pub fn loss(&self, out: &Var, y: &Tensor) -> Result<Var> {
        Ok(match &self.task {
            Task::Classify { .. } => loss::cross_entropy(out, y)?,
            Task::Regress { .. } => loss::mse(out, y)?,
            Task::NextToken { .. } => {
                // Every position is a prediction: [M, B, T, V] as [M, B·T, V] against [B·T].
                let s = out.shape().to_vec();
                let rows = y.elem_count();
                let flat = out.reshape(&[s[0], rows, s[s.len() - 1]])?;
                loss::cross_entropy(&flat, &y.reshape(&[rows])?)?
            }
        })
    }

    /// Adds one batch's outputs (`[M, B, ..]`, no gradient needed) against targets `y` to the per-member tallies.
    ///
    /// # Errors
    /// When the shapes do not fit the task, or a copy back from the device fails.
    pub fn tally(&self, out: &Var, y: &Tensor, tallies: &mut [Tally]) -> Result<()> {
        let losses = self.loss(out, y)?.value().to_vec::<f32>()?;
        let examples = y.shape().first().copied().unwrap_or(0) as u64;
        let rows = match self.task {
            Task::NextToken { .. } => y.elem_count() as u64,
            _ => examples,
        };
        for (t, l) in tallies.iter_mut().zip(&losses) {
            t.examples += examples;
            t.rows += rows;
            t.loss += f64::from(*l) * rows as f64;
        }
        if matches!(self.task, Task::Regress { .. }) {
            return Ok(());
        }
        let scores = out.value().to_device(&Device::Cpu)?.to_vec::<f32>()?;
        let labels = y.to_device(&Device::Cpu)?.to_vec::<i32>()?;
        let classes = out.shape().last().copied().unwrap_or(1).max(1);
        let k = self.top_k().unwrap_or(1);
        for (m, t) in tallies.iter_mut().enumerate() {
            let member = &scores[m * labels.len() * classes..(m + 1) * labels.len() * classes];
            for (row, &label) in member.chunks(classes).zip(&labels) {
                let target = row
                    .get(label as usize)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY);
                // Its rank as argmax breaks ties: by higher scores, then by equal ones before it.
                let rank = row.iter().filter(|&&s| s > target).count()
                    + row[..(label as usize).min(row.len())]
                        .iter()
                        .filter(|&&s| s == target)
                        .count();
                t.hits += u64::from(rank == 0);
                t.top_hits += u64::from(rank < k);
            }
        }
        Ok(())
    }

    /// The scores of a finished tally.
    pub fn scores(&self, t: &Tally) -> Scores {
        let rows = t.rows.max(1) as f64;
        let loss = t.loss / rows;
        let counted = !matches!(self.task, Task::Regress { .. });
        Scores {
            examples: t.examples,
            loss,
            accuracy: counted.then(|| t.hits as f64 / rows),
            top_k: self.top_k().map(|_| t.top_hits as f64 / rows),
            perplexity: matches!(self.task, Task::NextToken { .. }).then(|| loss.exp()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally_of(
        task: Task,
        top_k: usize,
        logits: Vec<f32>,
        shape: &[usize],
        labels: Vec<i32>,
    ) -> Scores {
        let o = Objective::new(task, top_k);
        let out = Var::constant(Tensor::from_vec(logits, shape, &Device::Cpu).unwrap());
        let n = labels.len();
        let y = Tensor::from_vec(labels, &[n], &Device::Cpu).unwrap();
        let mut t = vec![Tally::default(); shape[0]];
        o.tally(&out, &y, &mut t).unwrap();
        o.scores(&t[0])
    }

    #[test]
    fn accuracy_and_top_k_count_ranks_as_argmax_does() {
        let classes: Vec<String> = (0..4).map(|c| c.to_string()).collect();
        // rows: label 0 is top; label 1 is second; label 3 ties the top but comes after it; label 2 is last
        let logits = vec![
            3.0, 1.0, 0.0, 0.0, //
            3.0, 2.0, 0.0, 0.0, //
            5.0, 0.0, 0.0, 5.0, //
            1.0, 1.0, -1.0, 1.0,
        ];
        let s = tally_of(
            Task::Classify { classes },
            2,
            logits,
            &[1, 4, 4],
            vec![0, 1, 3, 2],
        );
        assert_eq!(s.examples, 4);
        assert_eq!(s.accuracy, Some(0.25));
        assert_eq!(s.top_k, Some(0.75));
        assert!(s.loss > 0.0 && s.perplexity.is_none());
    }

    #[test]
    fn a_language_model_scores_every_position_and_its_perplexity() {
        let o = Objective::new(Task::NextToken { vocab: 3 }, 5);
        // one member, batch 1, 2 positions, vocab 3: uniform scores, so the perplexity is 3
        let out =
            Var::constant(Tensor::from_vec(vec![0.0f32; 6], &[1, 1, 2, 3], &Device::Cpu).unwrap());
        let y = Tensor::from_vec(vec![2i32, 0], &[1, 2], &Device::Cpu).unwrap();
        let mut t = vec![Tally::default()];
        o.tally(&out, &y, &mut t).unwrap();
        let s = o.scores(&t[0]);
        assert!((s.perplexity.unwrap() - 3.0).abs() < 1e-5, "{s:?}");
        assert_eq!(
            s.accuracy,
            Some(0.5),
            "ties go to the first id, which is right once"
        );
        assert_eq!(o.top_k(), None);
    }

    #[test]
    fn regression_scores_the_mean_squared_error() {
        let o = Objective::new(Task::Regress { width: 1 }, 5);
        let out =
            Var::constant(Tensor::from_vec(vec![1.0f32, 3.0], &[1, 2, 1], &Device::Cpu).unwrap());
        let y = Tensor::from_vec(vec![0.0f32, 1.0], &[2, 1], &Device::Cpu).unwrap();
        let mut t = vec![Tally::default()];
        o.tally(&out, &y, &mut t).unwrap();
        let s = o.scores(&t[0]);
        assert!((s.loss - 2.5).abs() < 1e-6, "{s:?}");
        assert_eq!(s.headline(), "mse 2.5000");
        assert!(s.accuracy.is_none());
        let better = Scores {
            loss: 1.0,
            ..s.clone()
        };
        assert!(better.better_than(&s));
    }
}
