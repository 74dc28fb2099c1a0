//! Fused batch and layer normalization on [`CpuStorage`] ([`Normalization`]).

use cohort_kernels::Float;
use cohort_kernels::batchnorm::{BatchNormShape, Running, cpu as batchnorm_cpu};
use cohort_kernels::layernorm::{LayerNormShape, cpu as layernorm_cpu};

use super::{like, unsupported};
use crate::backend::Normalization;
use crate::storage::CpuStorage;
use crate::{DType, Element, Error, Result};

impl Normalization for CpuStorage {
    /// Batch normalization in training of `x` (see [`cohort_kernels::batchnorm`]): `(out, mean, invstd)`, moving
    /// the running `(mean, var, momentum)` in place when given; all of one float dtype.
    fn batch_norm(
        &self,
        (weight, bias): (&CpuStorage, &CpuStorage),
        (shape, eps): (&BatchNormShape, f64),
        relu: bool,
        running: Option<(&mut CpuStorage, &mut CpuStorage, f64)>,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        const OP: &str = "batch_norm";
        type Stats<'a> = Option<(&'a mut CpuStorage, &'a mut CpuStorage, f64)>;
        fn on<T: Element + Float>(
            x: &CpuStorage,
            [w, b]: [&CpuStorage; 2],
            shape: (&BatchNormShape, f64),
            relu: bool,
            running: Stats<'_>,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let running = match running {
                Some((m, v, momentum)) => {
                    let bad = |rhs: DType| Error::DTypeMismatch {
                        op: OP,
                        lhs: x.dtype(),
                        rhs,
                    };
                    let (dm, dv) = (m.dtype(), v.dtype());
                    Some(Running {
                        mean: T::slice_mut(m).ok_or_else(|| bad(dm))?,
                        var: T::slice_mut(v).ok_or_else(|| bad(dv))?,
                        momentum,
                    })
                }
                None => None,
            };
            let wb = (like::<T>(OP, x, w)?, like::<T>(OP, x, b)?);
            let (y, m, i) = batchnorm_cpu::forward(like::<T>(OP, x, x)?, wb, shape, relu, running);
            Ok((T::into_storage(y), T::into_storage(m), T::into_storage(i)))
        }
        match self.dtype() {
            DType::F32 => on::<f32>(self, [weight, bias], (shape, eps), relu, running),
            DType::F64 => on::<f64>(self, [weight, bias], (shape, eps), relu, running),
            other => Err(unsupported(OP, other)),
        }
    }

    /// The gradients `(dx, dweight, dbias)` of [`Normalization::batch_norm`] from its input `x`, its output `out` when it rectified,
    /// the output's gradient `dout`, and its `mean`, `invstd` and `weight`.
    fn batch_norm_backward(
        &self,
        out: Option<&CpuStorage>,
        dout: &CpuStorage,
        (mean, invstd, weight): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &BatchNormShape,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        const OP: &str = "batch_norm_backward";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            out: Option<&CpuStorage>,
            [dout, mean, invstd, weight]: [&CpuStorage; 4],
            shape: &BatchNormShape,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let out = out.map(|o| like::<T>(OP, x, o)).transpose()?;
            let [g, m, i, w] = [dout, mean, invstd, weight].map(|s| like::<T>(OP, x, s));
            let (dx, dw, db) =
                batchnorm_cpu::backward(like::<T>(OP, x, x)?, out, g?, (m?, i?, w?), shape);
            Ok((
                T::into_storage(dx),
                T::into_storage(dw),
                T::into_storage(db),
            ))
        }
        let rest = [dout, mean, invstd, weight];
        match self.dtype() {
            DType::F32 => on::<f32>(self, out, rest, shape),
            DType::F64 => on::<f64>(self, out, rest, shape),
            other => Err(unsupported(OP, other)),
        }
    }

    /// Layer normalization of `x` over its last dimension (see [`cohort_kernels::layernorm`]): `(out, mean, invstd)`.
    fn layer_norm(
        &self,
        (weight, bias): (&CpuStorage, &CpuStorage),
        shape: (&LayerNormShape, f64),
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        const OP: &str = "layer_norm";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            [w, b]: [&CpuStorage; 2],
            shape: (&LayerNormShape, f64),
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let wb = (like::<T>(OP, x, w)?, like::<T>(OP, x, b)?);
            let (y, m, i) = layernorm_cpu::forward(like::<T>(OP, x, x)?, wb, shape);
            Ok((T::into_storage(y), T::into_storage(m), T::into_storage(i)))
        }
        match self.dtype() {
            DType::F32 => on::<f32>(self, [weight, bias], shape),
            DType::F64 => on::<f64>(self, [weight, bias], shape),
            other => Err(unsupported(OP, other)),
        }
    }

    /// The gradients `(dx, dweight, dbias)` of [`Normalization::layer_norm`] from its input `x`, the output's gradient `dout`, and
    /// its `mean`, `invstd` and `weight`.
    fn layer_norm_backward(
        &self,
        dout: &CpuStorage,
        (mean, invstd, weight): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &LayerNormShape,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        const OP: &str = "layer_norm_backward";
        fn on<T: Element + Float>(
            x: &CpuStorage,
            rest: [&CpuStorage; 4],
            shape: &LayerNormShape,
        ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
            let [g, m, i, w] = rest.map(|s| like::<T>(OP, x, s));
            let (dx, dw, db) =
                layernorm_cpu::backward(like::<T>(OP, x, x)?, g?, (m?, i?, w?), shape);
            Ok((
                T::into_storage(dx),
                T::into_storage(dw),
                T::into_storage(db),
            ))
        }
        let rest = [dout, mean, invstd, weight];
        match self.dtype() {
            DType::F32 => on::<f32>(self, rest, shape),
            DType::F64 => on::<f64>(self, rest, shape),
            other => Err(unsupported(OP, other)),
        }
    }
}
