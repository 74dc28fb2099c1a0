//! Fused self-attention on [`CpuStorage`] ([`Attention`]).

use cohort_kernels::Float;
use cohort_kernels::attention::{AttentionShape, cpu as attention_cpu};

use super::{like, unsupported};
use crate::backend::Attention;
use crate::storage::CpuStorage;
use crate::{DType, Element, Result};

impl Attention for CpuStorage {
    /// Fused self-attention of a packed `qkv` with an optional key-padding mask of its dtype: the output and each
    /// query's log-sum-exp (see [`cohort_kernels::attention`]).
    fn attention(
        &self,
        mask: Option<&CpuStorage>,
        shape: &AttentionShape,
    ) -> Result<(CpuStorage, CpuStorage)> {
        fn on<T: Element + Float>(
            qkv: &CpuStorage,
            mask: Option<&CpuStorage>,
            shape: &AttentionShape,
        ) -> Result<(CpuStorage, CpuStorage)> {
            let m = mask.map_or(Ok(&[][..]), |m| like::<T>("attention", qkv, m))?;
            let (out, lse) = attention_cpu::forward(like::<T>("attention", qkv, qkv)?, m, shape);
            Ok((T::into_storage(out), T::into_storage(lse)))
        }
        match self.dtype() {
            DType::F32 => on::<f32>(self, mask, shape),
            DType::F64 => on::<f64>(self, mask, shape),
            other => Err(unsupported("attention", other)),
        }
    }

    /// The gradient of [`Attention::attention`]'s `qkv`, given its output `out`, log-sum-exps `lse` and the output's gradient
    /// `dout` (all of `qkv`'s dtype).
    fn attention_backward(
        &self,
        mask: Option<&CpuStorage>,
        (out, lse, dout): (&CpuStorage, &CpuStorage, &CpuStorage),
        shape: &AttentionShape,
    ) -> Result<CpuStorage> {
        const OP: &str = "attention_backward";
        fn on<T: Element + Float>(
            qkv: &CpuStorage,
            mask: Option<&CpuStorage>,
            [out, lse, dout]: [&CpuStorage; 3],
            shape: &AttentionShape,
        ) -> Result<CpuStorage> {
            let m = mask.map_or(Ok(&[][..]), |m| like::<T>(OP, qkv, m))?;
            let [x, o, l, g] = [qkv, out, lse, dout].map(|s| like::<T>(OP, qkv, s));
            Ok(T::into_storage(attention_cpu::backward(
                x?,
                m,
                (o?, l?),
                g?,
                shape,
            )))
        }
        match self.dtype() {
            DType::F32 => on::<f32>(self, mask, [out, lse, dout], shape),
            DType::F64 => on::<f64>(self, mask, [out, lse, dout], shape),
            other => Err(unsupported(OP, other)),
        }
    }
}
