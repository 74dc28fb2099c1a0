//! Trainable parameters: a named tensor updated in place and the gradient accumulated for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use cohort_tensor::Tensor;

use crate::{Error, Result};

static NEXT_PARAM: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
struct ParamInner {
    id: u64,
    name: RwLock<String>,
    value: Tensor,
    grad: Mutex<Option<Tensor>>,
}

/// A trainable tensor with a stable name (`layers.0.weight`).
///
/// Cheap to clone (shared). The value is updated in place by optimizers; the gradient accumulates over
/// [`Tape::backward`](crate::Tape::backward) calls until [`Param::zero_grad`] clears it. Fused parameters carry the
/// member dimension first (`[M, in, out]`).
#[derive(Clone, Debug)]
pub struct Param(Arc<ParamInner>);

impl Param {
    /// A parameter named `name` holding `value`.
    pub fn new(name: impl Into<String>, value: Tensor) -> Param {
        Param(Arc::new(ParamInner {
            id: NEXT_PARAM.fetch_add(1, Ordering::Relaxed),
            name: RwLock::new(name.into()),
            value,
            grad: Mutex::new(None),
        }))
    }

    /// A process-unique id (used to match gradients and optimizer state).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The full name (`layers.0.weight`).
    pub fn name(&self) -> String {
        self.0
            .name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Renames the parameter (containers prefix their children's names: `layers.0.` + `weight`).
    pub fn set_name(&self, name: impl Into<String>) {
        *self.0.name.write().unwrap_or_else(|e| e.into_inner()) = name.into();
    }

    /// The current value (shared storage: in-place updates are visible through every clone).
    pub fn value(&self) -> &Tensor {
        &self.0.value
    }

    /// The parameter's shape.
    pub fn shape(&self) -> &[usize] {
        self.0.value.shape()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Tensor>> {
        // A poisoned lock only means another thread panicked mid-update; the Option is still valid.
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The accumulated gradient, if any backward pass reached this parameter since the last `zero_grad`.
    pub fn grad(&self) -> Option<Tensor> {
        self.lock().clone()
    }

    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.lock() = None;
    }

    /// Adds `g` to the accumulated gradient (the first contribution is kept as is, without a copy).
    ///
    /// # Errors
    /// When `g`'s shape differs from the parameter's, or the addition fails.
    pub fn accumulate_grad(&self, g: Tensor) -> Result<()> {
        if g.shape() != self.shape() {
            return Err(Error::Param {
                name: self.name(),
                reason: format!(
                    "gradient of shape {:?} for a parameter of shape {:?}",
                    g.shape(),
                    self.shape()
                ),
            });
        }
        let mut slot = self.lock();
        *slot = Some(match slot.take() {
            // Out of place: the stored gradient may share storage with other gradients of the same pass.
            Some(old) => old.add(&g)?,
            None => g,
        });
        Ok(())
    }

    /// `src` on this parameter's device and in its dtype (a checkpoint read on the CPU, a model on a GPU).
    fn conform(&self, src: &Tensor) -> Result<Tensor> {
        let v = &self.0.value;
        let mut t = src.clone();
        if t.device() != v.device() {
            t = t.to_device(&v.device())?;
        }
        if t.dtype() != v.dtype() {
            t = t.to_dtype(v.dtype())?;
        }
        Ok(t)
    }

    /// Overwrites the value with `src` (same shape; moved and cast to the parameter's device and dtype), in place.
    ///
    /// # Errors
    /// When the shape or dtype differs.
    pub fn set(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(Error::Param {
                name: self.name(),
                reason: format!(
                    "new value has shape {:?}, the parameter {:?}",
                    src.shape(),
                    self.shape()
                ),
            });
        }
        self.0.value.assign_(&self.conform(src)?)?;
        Ok(())
    }

    /// Member `m`'s slice of a fused parameter, without the member dimension (`[in, out]` of `[M, in, out]`).
    ///
    /// # Errors
    /// When `m` is out of range.
    pub fn member(&self, m: usize) -> Result<Tensor> {
        let shape = self.shape();
        if m >= shape[0] {
            return Err(Error::Param {
                name: self.name(),
                reason: format!("member {m} asked of a parameter with {} members", shape[0]),
            });
        }
        Ok(self.0.value.narrow(0, m, 1)?.reshape(&shape[1..])?)
    }

    /// Writes member `m`'s slice (moved and cast as needed); `src` may have the member dimension (`[1, in, out]`) or not (`[in, out]`).
    ///
    /// # Errors
    /// When `m` is out of range or the shape does not match a member's slice.
    pub fn set_member(&self, m: usize, src: &Tensor) -> Result<()> {
        let shape = self.shape();
        let inner = &shape[1..];
        let ok = src.shape() == inner
            || (src.shape().len() == shape.len()
                && src.shape()[0] == 1
                && &src.shape()[1..] == inner);
        if m >= shape[0] || !ok {
            return Err(Error::Param {
                name: self.name(),
                reason: format!(
                    "member {m} of {} with a slice of shape {:?}; expected {:?}",
                    shape[0],
                    src.shape(),
                    inner
                ),
            });
        }
        let mut one = vec![1];
        one.extend_from_slice(inner);
        self.0
            .value
            .narrow_assign_(0, m, &self.conform(src)?.reshape(&one)?)?;
        Ok(())
    }
}
