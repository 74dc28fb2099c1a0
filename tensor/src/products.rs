//! Matrix products and convolutions under a precision policy other than fp32 (see [`Precision`]): which
//! [`Math`] a product runs in, its operands cast to that math's type, and the 16-bit convolutions with their
//! f32 fallback. The ops in `ops.rs` route here when [`Precision::math_for`] names a math.

use cohort_kernels::Math;
use cohort_kernels::conv::{ConvParams, ConvPass};
use cohort_kernels::matmul::MatmulShape;

use crate::backend::CudaBackend;
use crate::storage::Storage;
use crate::{DType, Precision, Result, Tensor};

impl Precision {
    /// The kernels' name for this policy's arithmetic.
    fn math(self) -> Math {
        match self {
            Precision::Fp32 => Math::Fp32,
            Precision::Tf32 => Math::Tf32,
            Precision::Bf16 => Math::Bf16,
            Precision::F16 => Math::F16,
        }
    }

    /// The math a product of `a` and `b` runs in under this policy, where that is not the plain one: on CUDA,
    /// `Tf32` for f32 operands under `tf32`, and under a mixed policy its 16-bit math for operands each f32 or of
    /// its low type (autograd keeps the low copies for the backward pass). `None`: the op runs as without a
    /// policy (fp32, the CPU, other dtypes).
    pub fn math_for(self, a: &Tensor, b: &Tensor) -> Option<Math> {
        let math = self.math();
        let operand = operand_type(math);
        let fits = |t: DType| t == DType::F32 || t == operand;
        (a.device().is_cuda() && math != Math::Fp32 && fits(a.dtype()) && fits(b.dtype()))
            .then_some(math)
    }
}

/// The type a product's operands take under `math`.
pub(crate) fn operand_type(math: Math) -> DType {
    match math {
        Math::Fp32 | Math::Tf32 => DType::F32,
        Math::Bf16 => DType::BF16,
        Math::F16 => DType::F16,
    }
}

impl Tensor {
    /// `self` as an operand of a product under `math`: itself where it has the math's type, else a cast copy.
    ///
    /// # Errors
    /// When the cast fails (out of memory).
    pub fn as_operand(&self, math: Math) -> Result<Tensor> {
        let t = operand_type(math);
        if self.dtype() == t {
            Ok(self.clone())
        } else {
            self.to_dtype(t)
        }
    }

    /// [`Tensor::matmul_t`] under `math`, into f32.
    pub(crate) fn matmul_under(
        &self,
        rhs: &Tensor,
        (trans_lhs, trans_rhs): (bool, bool),
        math: Math,
    ) -> Result<Tensor> {
        let (a, b) = (self.as_operand(math)?, rhs.as_operand(math)?);
        let (shape, out): (MatmulShape, _) = a.matmul_shape(&b, trans_lhs, trans_rhs)?;
        let y = Tensor::read_all(&[&a, &b], |st| match (st[0], st[1]) {
            (Storage::Cuda(x), Storage::Cuda(w)) => x.matmul_as(w, &shape, math),
            _ => Err(a.device_mismatch("matmul", &b)),
        })?;
        Ok(Tensor::from_storage(Storage::Cuda(y), out))
    }

    /// One pass of a convolution under a 16-bit `math`: the forward from the input `a` and the weight `b` (then
    /// `bias`, then a ReLU when `relu`), the input's gradient from the output's (`a`) and the weight, or the
    /// weight's gradient from the input and the output's (`b`). The forward and the input's gradient come out in
    /// the low type where `a` came in it (activations a mixed policy keeps in the low type, as autocast does),
    /// else in f32, like the weight's gradient. A forward's bias, ReLU and any cast run as one kernel. Where
    /// cuDNN does not run the pass (absent, or no algorithm), it runs in f32 on the own kernels, as it would
    /// under fp32.
    pub(crate) fn conv_16bit(
        (pass, math): (ConvPass, Math),
        a: &Tensor,
        b: &Tensor,
        (bias, relu): (Option<&Tensor>, bool),
        p: &ConvParams,
    ) -> Result<Tensor> {
        let (a16, b16) = (a.as_operand(math)?, b.as_operand(math)?);
        let keep = a.dtype() == a16.dtype() && pass != ConvPass::BackwardFilter;
        let ran = Tensor::read_all(&[&a16, &b16], |st| match (st[0], st[1]) {
            (Storage::Cuda(x), Storage::Cuda(y)) => x.conv_pass_16bit((pass, math), y, p),
            _ => Err(a.device_mismatch("conv2d", b)),
        })?;
        let input = [p.batch, p.c_in, p.h, p.w];
        let weight = [p.c_out, p.c_in_g(), p.kh, p.kw];
        let shape = match pass {
            ConvPass::Forward { .. } => vec![p.batch, p.c_out, p.out_h(), p.out_w()],
            ConvPass::BackwardData => input.to_vec(),
            ConvPass::BackwardFilter => weight.to_vec(),
        };
        let y = match ran {
            Some(s) if matches!(pass, ConvPass::Forward { .. }) => {
                let y = match bias {
                    Some(bias) => match &*bias.read() {
                        Storage::Cuda(b) => s.conv_epilogue(Some(b), p, (relu, keep))?,
                        Storage::Cpu(_) => return Err(a.device_mismatch("conv2d", bias)),
                    },
                    None => s.conv_epilogue(None, p, (relu, keep))?,
                };
                return Ok(Tensor::from_storage(Storage::Cuda(y), shape));
            }
            Some(s) if keep => return Ok(Tensor::from_storage(Storage::Cuda(s), shape)),
            Some(s) => Tensor::from_storage(Storage::Cuda(s), shape).to_dtype(DType::F32)?,
            None => {
                let _fp32 = Precision::Fp32.enter();
                let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
                let (s, pad, g) = (p.stride, p.padding, p.groups);
                match pass {
                    ConvPass::Forward { .. } => a.conv2d(&b, None, s, pad, g)?,
                    ConvPass::BackwardData => {
                        Tensor::conv2d_backward_input(&a, &b, &input, s, pad, g)?
                    }
                    ConvPass::BackwardFilter => {
                        Tensor::conv2d_backward_weight(&a, &b, &weight, s, pad, g)?
                    }
                }
            }
        };
        let y = match bias {
            Some(bias) => y.add(&bias.reshape(&[1, p.c_out, 1, 1])?)?,
            None => y,
        };
        let y = if relu { y.relu()? } else { y };
        if keep { y.to_dtype(a.dtype()) } else { Ok(y) }
    }
}
