use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use cohort_tensor::Tensor;
use serde::Serialize;

use super::{Features, Layout, Module, mix};
use crate::spec::{Fields, SpecResult};
use crate::{Error, Param, Result, Tape, Var};

/// Zeroes each value with probability `p` while training (scaling the rest by `1 / (1 - p)`); identity in eval
/// mode. Seeded: the n-th training call of a layer draws the same mask in every run. In a fused model each member
/// may have a rate of its own ([`Module::set_dropout_rates`]).
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    /// A rate per member, where the members' rates differ.
    member_p: OnceLock<Vec<f64>>,
    /// Their thresholds and scales as tensors (see [`Dropout::member_tensors`]).
    member_cache: Mutex<Option<(Tensor, Tensor)>>,
    seed: u64,
    calls: AtomicU64,
}

impl Dropout {
    /// Dropout with rate `p` in `[0, 1)`.
    ///
    /// # Errors
    /// When `p` is outside `[0, 1)`.
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Shape {
                op: "dropout",
                reason: format!("rate {p} outside [0, 1)"),
            });
        }
        Ok(Dropout {
            p,
            member_p: OnceLock::new(),
            member_cache: Mutex::new(None),
            seed,
            calls: AtomicU64::new(0),
        })
    }

    /// How many masks were drawn (part of a checkpoint's RNG state).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Continues the mask sequence from `calls` (when resuming).
    pub fn set_calls(&self, calls: u64) {
        self.calls.store(calls, Ordering::Relaxed);
    }
}

impl Dropout {
    /// Each member's threshold and scale, shaped to broadcast along its place in `v`: made once, then taken from
    /// the cache while the value's shape, dtype and device stay (every training step of a model).
    fn member_tensors(&self, r: &[f64], v: &Tensor, layout: Layout) -> Result<(Tensor, Tensor)> {
        let m = r.len();
        let (shape, per): (Vec<usize>, usize) = match layout {
            Layout::Members => {
                let mut s = vec![1; v.shape().len()];
                s[0] = m;
                (s, 1)
            }
            Layout::Packed => (vec![1, v.shape()[1], 1, 1], v.shape()[1] / m),
            Layout::Shared => {
                return Err(Error::Shape {
                    op: "dropout",
                    reason: "rates per member need the member dimension: the layer comes before the first layer \
                             with parameters"
                        .into(),
                });
            }
        };
        let mut cache = self.member_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((t, s)) = cache.as_ref()
            && t.shape() == shape.as_slice()
            && t.dtype() == v.dtype()
            && t.device() == v.device()
        {
            return Ok((t.clone(), s.clone()));
        }
        let each = |f: &dyn Fn(f64) -> f64| -> Vec<f32> {
            r.iter()
                .flat_map(|&p| std::iter::repeat_n(f(p) as f32, per))
                .collect()
        };
        let dev = v.device();
        let threshold = Tensor::from_vec(each(&|p| p), &shape, &dev)?.to_dtype(v.dtype())?;
        let scale =
            Tensor::from_vec(each(&|p| 1.0 / (1.0 - p)), &shape, &dev)?.to_dtype(v.dtype())?;
        *cache = Some((threshold.clone(), scale.clone()));
        Ok((threshold, scale))
    }
}

impl Module for Dropout {
    fn forward(&self, tape: &Tape, x: Features) -> Result<Features> {
        let rates = self.member_p.get();
        let drops = rates.map_or(self.p > 0.0, |r| r.iter().any(|&p| p > 0.0));
        if !tape.is_training() || !drops {
            return Ok(x);
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let v = x.var.value();
        let u = Tensor::rand_uniform(
            v.shape(),
            0.0,
            1.0,
            v.dtype(),
            mix(self.seed, n),
            &v.device(),
        )?;
        let keep = match rates {
            Some(r) => {
                let (threshold, scale) = self.member_tensors(r, v, x.layout)?;
                u.gt(&threshold)?.mul(&scale)?
            }
            None => u.gt_scalar(self.p)?.mul_scalar(1.0 / (1.0 - self.p))?,
        };
        Ok(x.keep_mask(x.var.mul(&Var::constant(keep))?, x.layout))
    }

    fn set_dropout_rates(&self, rates: &mut dyn Iterator<Item = Vec<f64>>) {
        if let Some(r) = rates.next()
            && r.iter().any(|&p| p != self.p)
        {
            let _ = self.member_p.set(r);
        }
    }

    fn params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn set_masks_drawn(&self, n: u64) {
        self.set_calls(n);
    }

    fn kind(&self) -> &'static str {
        "dropout"
    }
}

/// `{ dropout = P }`: zero each value with probability `P` while training.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DropoutSpec {
    /// The rate, in `[0, 1)`.
    pub p: f64,
}

impl DropoutSpec {
    pub(crate) fn read(f: &Fields<'_>) -> SpecResult<DropoutSpec> {
        let p = f.f64("dropout")?.unwrap_or(0.0);
        if !(0.0..1.0).contains(&p) {
            return Err(f.error("dropout", format!("expected a rate in [0, 1), found {p}")));
        }
        Ok(DropoutSpec { p })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_tensor::Device;

    /// The fraction of each member's values a training pass zeroes, and the scale of those it keeps.
    fn dropped(d: &Dropout, layout: Layout, shape: &[usize]) -> Vec<(f64, f64)> {
        let tape = Tape::new();
        tape.set_training(true);
        let n: usize = shape.iter().product();
        let x = Var::constant(Tensor::from_vec(vec![1f32; n], shape, &Device::Cpu).unwrap());
        let out = d.forward(&tape, Features::new(x, layout)).unwrap();
        let v: Vec<f32> = out.var.value().to_vec().unwrap();
        // Members are the leading dimension, or blocks of the channels when packed.
        let m = 2;
        (0..m)
            .map(|j| {
                let mine: Vec<f32> = match layout {
                    Layout::Packed => {
                        let (b, c, hw) = (shape[0], shape[1] / m, shape[2] * shape[3]);
                        (0..b)
                            .flat_map(|bi| {
                                let start = (bi * shape[1] + j * c) * hw;
                                v[start..start + c * hw].to_vec()
                            })
                            .collect()
                    }
                    _ => v[j * n / m..(j + 1) * n / m].to_vec(),
                };
                let zeros = mine.iter().filter(|&&x| x == 0.0).count() as f64 / mine.len() as f64;
                let kept = mine.iter().copied().find(|&x| x != 0.0).unwrap_or(0.0);
                (zeros, f64::from(kept))
            })
            .collect()
    }

    #[test]
    fn members_of_a_fused_group_drop_at_their_own_rates() {
        for (layout, shape) in [
            (Layout::Members, vec![2, 400, 10]),
            (Layout::Packed, vec![10, 8, 10, 10]),
        ] {
            let d = Dropout::new(0.0, 3).unwrap();
            d.set_dropout_rates(&mut [vec![0.0, 0.5]].into_iter());
            let got = dropped(&d, layout, &shape);
            assert_eq!(got[0], (0.0, 1.0), "{layout:?}: member 0 keeps everything");
            assert!(
                (got[1].0 - 0.5).abs() < 0.05,
                "{layout:?}: member 1 drops {}",
                got[1].0
            );
            assert_eq!(
                got[1].1, 2.0,
                "{layout:?}: and scales the rest by 1 / (1 - 0.5)"
            );
        }
        // Rates all equal to the layer's own change nothing; a shared input cannot take rates per member.
        let same = Dropout::new(0.2, 3).unwrap();
        same.set_dropout_rates(&mut [vec![0.2, 0.2]].into_iter());
        assert!(same.member_p.get().is_none());
        let d = Dropout::new(0.0, 3).unwrap();
        d.set_dropout_rates(&mut [vec![0.1, 0.3]].into_iter());
        let tape = Tape::new();
        tape.set_training(true);
        let x = Var::constant(Tensor::from_vec(vec![1f32; 20], &[2, 10], &Device::Cpu).unwrap());
        assert!(d.forward(&tape, Features::shared(x)).is_err());
    }
}
