//! Losses (one value per member) and metrics.

use cohort_tensor::{DType, Tensor};

use crate::{Error, Result, Var};

fn check_labels(op: &'static str, logits: &[usize], labels: &Tensor) -> Result<()> {
    let batch_dims = &logits[..logits.len() - 1];
    let ok = labels.dtype() == DType::I32
        && (labels.shape() == batch_dims
            || (!batch_dims.is_empty() && labels.shape() == &batch_dims[batch_dims.len() - 1..]));
    if ok {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            reason: format!(
                "labels {:?} ({}) do not fit logits {logits:?}: expected i32 labels of shape [B] (shared) or {batch_dims:?}",
                labels.shape(),
                labels.dtype()
            ),
        })
    }
}

/// Softmax cross-entropy of `logits` `[M, B, C]` against integer `labels` `[B]` (the same for every member) or
/// `[M, B]`: the mean over the batch, one value per member (`[M]`; `[]` for logits `[B, C]`).
///
/// Fused and stable: one pass over the logits gives each row's `logsumexp - logit[label]` and the gradient
/// `(softmax - onehot) / B` the backward pass scales by the incoming gradient.
///
/// # Errors
/// When the labels' shape or dtype does not fit the logits, or a tensor op fails.
pub fn cross_entropy(logits: &Var, labels: &Tensor) -> Result<Var> {
    // The tensor op checks the logits' rank and the labels' dtype and shape.
    let (loss, grad) = logits.value().cross_entropy_mean(labels)?;
    if !logits.requires_grad() {
        return Ok(Var::constant(loss));
    }
    Var::record_cross_entropy(loss, logits, grad)
}

/// Mean squared error of `pred` `[M, B, ..]` against `target` (`[B, ..]` shared, or `[M, B, ..]`): one value per
/// member (`[M]`).
///
/// # Errors
/// When the shapes do not broadcast.
pub fn mse(pred: &Var, target: &Tensor) -> Result<Var> {
    let s = pred.shape().to_vec();
    if s.is_empty() {
        return Err(Error::Shape {
            op: "mse",
            reason: "a prediction of shape [] has no member dimension".into(),
        });
    }
    let d = pred.sub(&Var::constant(target.clone()))?;
    if d.shape() != s.as_slice() {
        return Err(Error::Shape {
            op: "mse",
            reason: format!(
                "target {:?} broadcasts the prediction {s:?} to {:?}",
                target.shape(),
                d.shape()
            ),
        });
    }
    let rest: usize = s[1..].iter().product();
    d.square()?.reshape(&[s[0], rest])?.mean(1, false)
}

/// Fraction of rows whose largest logit is the label, per member: logits `[M, B, C]`, labels `[B]` or `[M, B]`.
///
/// # Errors
/// When the shapes do not fit.
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> Result<Vec<f64>> {
    let s = logits.shape();
    if s.len() < 2 {
        return Err(Error::Shape {
            op: "accuracy",
            reason: format!("logits {s:?} need [.., B, C]"),
        });
    }
    check_labels("accuracy", s, labels)?;
    let pred = logits
        .argmax(s.len() - 1)?
        .to_device(&cohort_tensor::Device::Cpu)?
        .to_vec::<i32>()?;
    let labels = labels
        .to_device(&cohort_tensor::Device::Cpu)?
        .to_vec::<i32>()?;
    let batch = s[s.len() - 2];
    let members = pred.len() / batch.max(1);
    let mut out = Vec::with_capacity(members);
    for m in 0..members {
        let p = &pred[m * batch..(m + 1) * batch];
        let l = if labels.len() == batch {
            &labels[..]
        } else {
            &labels[m * batch..(m + 1) * batch]
        };
        let hits = p.iter().zip(l).filter(|(a, b)| a == b).count();
        out.push(hits as f64 / batch.max(1) as f64);
    }
    Ok(out)
}
