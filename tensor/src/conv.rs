//! Convolutions and max pooling on [`Tensor`]: the forward passes and their gradients, each validating shapes,
//! dtypes and devices before it dispatches to the CPU or CUDA backend (under a 16-bit policy through
//! `products.rs`).

use cohort_kernels::conv::{ConvParams, ConvPass};
use cohort_kernels::pool::PoolParams;

use crate::backend::{Convolutions, CudaBackend};
use crate::storage::Storage;
use crate::tensor::{elem_count, map2};
use crate::{DType, Error, Precision, Result, Tensor};

impl Tensor {
    pub(crate) fn conv_params(
        op: &'static str,
        input: &[usize],
        weight: &[usize],
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<ConvParams> {
        let bad = |reason: String| Error::InvalidArgument { op, reason };
        if input.len() != 4 || weight.len() != 4 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: input.to_vec(),
                rhs: weight.to_vec(),
            });
        }
        if stride == 0 || groups == 0 {
            return Err(bad(format!(
                "stride ({stride}) and groups ({groups}) must be >= 1"
            )));
        }
        let p = ConvParams {
            batch: input[0],
            c_in: input[1],
            h: input[2],
            w: input[3],
            c_out: weight[0],
            kh: weight[2],
            kw: weight[3],
            stride,
            padding,
            groups,
        };
        if p.c_in % groups != 0 || p.c_out % groups != 0 || weight[1] * groups != p.c_in {
            return Err(bad(format!(
                "input {input:?} and weight {weight:?} do not fit {groups} group(s): weight must be [O, C/groups, kh, kw] with C and O multiples of groups"
            )));
        }
        if p.kh == 0 || p.kw == 0 || p.h + 2 * padding < p.kh || p.w + 2 * padding < p.kw {
            return Err(bad(format!(
                "kernel {}x{} does not fit input {}x{} with padding {padding}",
                p.kh, p.kw, p.h, p.w
            )));
        }
        Ok(p)
    }

    /// Checks that `self` has the shape of `p`'s output (an output gradient for a backward pass).
    fn is_output_of(&self, op: &'static str, p: &ConvParams) -> Result<()> {
        let out = [p.batch, p.c_out, p.out_h(), p.out_w()];
        if self.shape != out {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape.clone(),
                rhs: out.to_vec(),
            });
        }
        Ok(())
    }

    /// 2-D convolution, NCHW: `self [N,C,H,W]`, `weight [O,C/groups,kh,kw]`, `bias [O]`.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; stride or groups of 0; a kernel larger than the padded
    /// input.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Tensor> {
        self.conv2d_act(weight, bias, (stride, padding, groups), false)
    }

    /// [`conv2d`](Tensor::conv2d) followed by a ReLU: under a 16-bit policy on CUDA the output's cast to f32,
    /// its bias and the ReLU run as one kernel; otherwise the ReLU is a pass of its own.
    ///
    /// # Errors
    /// As [`conv2d`](Tensor::conv2d).
    pub fn conv2d_relu(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Tensor> {
        self.conv2d_act(weight, bias, (stride, padding, groups), true)
    }

    fn conv2d_act(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (stride, padding, groups): (usize, usize, usize),
        relu: bool,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d";
        let math = Precision::current().math_for(self, weight);
        self.same_device(OP, weight)?;
        let p = Tensor::conv_params(OP, &self.shape, &weight.shape, stride, padding, groups)?;
        if let Some(b) = bias {
            self.same_device(OP, b)?;
            if b.shape != [p.c_out] {
                return Err(weight.shape_mismatch(OP, b));
            }
        }
        if let Some(m) = math.filter(|m| !m.f32_operands()) {
            return Tensor::conv_16bit(
                (ConvPass::Forward { bias: false }, m),
                self,
                weight,
                (bias, relu),
                &p,
            );
        }
        self.same_dtype(OP, weight)?;
        self.require_float(OP)?;
        if let Some(b) = bias {
            self.same_dtype(OP, b)?;
        }
        let math = math.unwrap_or_default();
        let out = vec![p.batch, p.c_out, p.out_h(), p.out_w()];
        // Distinct storages only: a second read lock on one storage could deadlock behind a writer.
        let weight = &if weight.same_storage(self) {
            weight.copy()?
        } else {
            weight.clone()
        };
        let bias = match bias {
            Some(b) if b.same_storage(self) || b.same_storage(weight) => Some(b.copy()?),
            other => other.cloned(),
        };
        let bias = bias.as_ref();
        let (xg, wg) = (self.read(), weight.read());
        let bg = bias.map(Tensor::read);
        let s = match (&*xg, &*wg, bg.as_deref()) {
            (Storage::Cpu(x), Storage::Cpu(w), None) => Storage::Cpu(x.conv2d(w, None, &p, math)?),
            (Storage::Cpu(x), Storage::Cpu(w), Some(Storage::Cpu(b))) => {
                Storage::Cpu(x.conv2d(w, Some(b), &p, math)?)
            }
            (Storage::Cuda(x), Storage::Cuda(w), None) => {
                Storage::Cuda(x.conv2d(w, None, &p, math)?)
            }
            (Storage::Cuda(x), Storage::Cuda(w), Some(Storage::Cuda(b))) => {
                Storage::Cuda(x.conv2d(w, Some(b), &p, math)?)
            }
            _ => return Err(self.device_mismatch(OP, weight)),
        };
        let y = Tensor::from_storage(s, out);
        if relu { y.relu() } else { Ok(y) }
    }

    /// Gradient of [`Tensor::conv2d`] with respect to its input, shape `input_shape`.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn conv2d_backward_input(
        grad_out: &Tensor,
        weight: &Tensor,
        input_shape: &[usize],
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_input";
        let math = Precision::current().math_for(grad_out, weight);
        let p = Tensor::conv_params(OP, input_shape, &weight.shape, stride, padding, groups)?;
        grad_out.is_output_of(OP, &p)?;
        if let Some(m) = math.filter(|m| !m.f32_operands()) {
            return Tensor::conv_16bit(
                (ConvPass::BackwardData, m),
                grad_out,
                weight,
                (None, false),
                &p,
            );
        }
        grad_out.same_dtype(OP, weight)?;
        grad_out.require_float(OP)?;
        let math = math.unwrap_or_default();
        map2!(grad_out, OP, weight, input_shape.to_vec(), |g, w| g
            .conv2d_backward_input(w, &p, math))
    }

    /// Gradient of [`Tensor::conv2d`] with respect to its weight, shape `weight_shape`.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches.
    pub fn conv2d_backward_weight(
        input: &Tensor,
        grad_out: &Tensor,
        weight_shape: &[usize],
        stride: usize,
        padding: usize,
        groups: usize,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_weight";
        let math = Precision::current().math_for(input, grad_out);
        let p = Tensor::conv_params(OP, &input.shape, weight_shape, stride, padding, groups)?;
        grad_out.is_output_of(OP, &p)?;
        if let Some(m) = math.filter(|m| !m.f32_operands()) {
            return Tensor::conv_16bit(
                (ConvPass::BackwardFilter, m),
                input,
                grad_out,
                (None, false),
                &p,
            );
        }
        input.same_dtype(OP, grad_out)?;
        input.require_float(OP)?;
        let math = math.unwrap_or_default();
        map2!(input, OP, grad_out, weight_shape.to_vec(), |x, g| x
            .conv2d_backward_weight(g, &p, math))
    }

    /// Gradient of [`Tensor::conv2d`] with respect to its bias, from the output's gradient `grad_out`
    /// (`[N, O, OH, OW]`): each channel's sum, `[O]`, in f32 from a bf16 or f16 gradient (on CUDA), else in the
    /// gradient's type.
    ///
    /// # Errors
    /// Not of rank 4, or not a float type.
    pub fn conv2d_backward_bias(grad_out: &Tensor) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_bias";
        grad_out.require_float(OP)?;
        let &[batch, c_out, oh, ow] = &grad_out.shape[..] else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: grad_out.shape.clone(),
                reason: "expected an output gradient [N, O, OH, OW]".into(),
            });
        };
        // A 16-bit gradient's sums in f32, in one kernel; an f32 one's through the reduction as before (with
        // the per-channel kernel the fp32 CNN's step ran 1.5 % slower in two calls on the H100).
        if let (Storage::Cuda(g), DType::BF16 | DType::F16) = (&*grad_out.read(), grad_out.dtype) {
            let sums = g.conv_bias_grad([batch, c_out, oh * ow])?;
            return Ok(Tensor::from_storage(Storage::Cuda(sums), vec![c_out]));
        }
        grad_out.sum_to(&[1, c_out, 1, 1])?.reshape(&[c_out])
    }

    /// `max(self + bias, 0)` with a bias per channel of image features `self` (`[N, C, H, W]`, bias `[C]` of any
    /// float type, or none): a convolution's bias and ReLU moved after the max pool that follows it, so that they
    /// run at the pooled size. `relu(maxpool(conv + b)) = relu(maxpool(conv) + b)` exactly, since adding `b` and
    /// rounding keep the order within each channel's windows. On CUDA one kernel, the bias read in f32 (a mixed
    /// policy's master); on the CPU the bias is taken in `self`'s type.
    ///
    /// # Errors
    /// `self` not of rank 4 or not a float type; a bias of another shape or device.
    pub fn channel_bias_relu(&self, bias: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "channel_bias_relu";
        self.require_float(OP)?;
        let &[_, c, h, w] = &self.shape[..] else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: self.shape.clone(),
                reason: "expected image features [N, C, H, W]".into(),
            });
        };
        if let Some(b) = bias {
            self.same_device(OP, b)?;
            if b.shape != [c] {
                return Err(self.shape_mismatch(OP, b));
            }
        }
        if !self.device().is_cuda() {
            return match bias {
                Some(b) => self
                    .add(&b.to_dtype(self.dtype)?.reshape(&[1, c, 1, 1])?)?
                    .relu(),
                None => self.relu(),
            };
        }
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        let mut ts = vec![self];
        ts.extend(bias.as_ref());
        let s = Tensor::read_all(&ts, |st| match st {
            [Storage::Cuda(x)] => x.channel_bias_relu(None, [c, h * w]),
            [Storage::Cuda(x), Storage::Cuda(b)] => x.channel_bias_relu(Some(b), [c, h * w]),
            _ => Err(self.device_mismatch(OP, ts[ts.len() - 1])),
        })?;
        Ok(Tensor::from_storage(Storage::Cuda(s), self.shape.clone()))
    }

    /// The backward of [`channel_bias_relu`](Tensor::channel_bias_relu) (or of a convolution's bias and ReLU) from
    /// its output `y`: the gradient `self` where `y > 0`, and the bias's gradient, each channel's sum of that, as
    /// [`conv2d_backward_bias`](Tensor::conv2d_backward_bias) gives it (f32 from a 16-bit gradient on CUDA). One
    /// pass on CUDA, where the two apart read the gradient twice; the two apart on the CPU.
    ///
    /// # Errors
    /// `self` not of rank 4 or not a float type; `y` of another shape, type or device.
    pub fn relu_backward_channel_bias(&self, y: &Tensor) -> Result<(Tensor, Tensor)> {
        const OP: &str = "relu_backward_channel_bias";
        self.require_float(OP)?;
        self.same_shape(OP, y)?;
        self.same_dtype(OP, y)?;
        self.same_device(OP, y)?;
        let &[n, c, h, w] = &self.shape[..] else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: self.shape.clone(),
                reason: "expected image features [N, C, H, W]".into(),
            });
        };
        if !self.device().is_cuda() {
            let dx = self.relu_backward(y)?;
            let db = Tensor::conv2d_backward_bias(&dx)?;
            return Ok((dx, db));
        }
        let (dx, db) = Tensor::read_all(&[self, y], |st| match st {
            [Storage::Cuda(g), Storage::Cuda(v)] => g.relu_backward_channel_bias(v, [n, c, h * w]),
            _ => Err(self.device_mismatch(OP, y)),
        })?;
        Ok((
            Tensor::from_storage(Storage::Cuda(dx), self.shape.clone()),
            Tensor::from_storage(Storage::Cuda(db), vec![c]),
        ))
    }

    /// Max pooling over `kernel × kernel` windows of the last two dims (no padding); returns the
    /// pooled values and, per output, the i32 flat index (`y·W + x`) of its max in the input plane.
    ///
    /// # Errors
    /// Rank below 2; kernel or stride of 0; a kernel larger than the input.
    pub fn max_pool2d(&self, kernel: usize, stride: usize) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool2d";
        self.require_float(OP)?;
        let r = self.rank();
        if r < 2
            || kernel == 0
            || stride == 0
            || self.shape[r - 2] < kernel
            || self.shape[r - 1] < kernel
        {
            return Err(Error::InvalidShape {
                op: OP,
                shape: self.shape.clone(),
                reason: format!(
                    "needs [.., H, W] with H, W >= kernel ({kernel}) and kernel, stride ({stride}) >= 1"
                ),
            });
        }
        let p = PoolParams {
            planes: elem_count(&self.shape[..r - 2]),
            h: self.shape[r - 2],
            w: self.shape[r - 1],
            kernel,
            stride,
        };
        let mut shape = self.shape.clone();
        shape[r - 2] = p.out_h();
        shape[r - 1] = p.out_w();
        let (o, i) = match &*self.read() {
            Storage::Cpu(s) => {
                let (o, i) = s.max_pool2d(&p)?;
                (Storage::Cpu(o), Storage::Cpu(i))
            }
            Storage::Cuda(s) => {
                let (o, i) = s.max_pool2d(&p)?;
                (Storage::Cuda(o), Storage::Cuda(i))
            }
        };
        Ok((
            Tensor::from_storage(o, shape.clone()),
            Tensor::from_storage(i, shape),
        ))
    }

    /// [`max_pool2d`](Tensor::max_pool2d) of image features `[N, C, H, W]` then
    /// [`channel_bias_relu`](Tensor::channel_bias_relu) with `bias` (`[C]`): the pooled, biased and rectified
    /// features and the maxima's indices. One pass on CUDA where the windows tile the planes (stride = kernel,
    /// dividing H and W), with no pooled tensor written out and read back; elsewhere the two ops.
    ///
    /// # Errors
    /// As the two ops: `self` not image features, a window larger than them, a bias of another shape or device.
    pub fn max_pool2d_bias_relu(
        &self,
        kernel: usize,
        stride: usize,
        bias: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool2d_bias_relu";
        let &[n, c, h, w] = &self.shape[..] else {
            return Err(Error::InvalidShape {
                op: OP,
                shape: self.shape.clone(),
                reason: "expected image features [N, C, H, W]".into(),
            });
        };
        let p = PoolParams {
            planes: n * c,
            h,
            w,
            kernel,
            stride,
        };
        if !self.device().is_cuda() || !p.tiles() {
            let (pooled, idx) = self.max_pool2d(kernel, stride)?;
            return Ok((pooled.channel_bias_relu(Some(bias))?, idx));
        }
        self.require_float(OP)?;
        self.same_device(OP, bias)?;
        if bias.shape != [c] {
            return Err(self.shape_mismatch(OP, bias));
        }
        let bias = bias.to_dtype(DType::F32)?;
        let (o, i) = Tensor::read_all(&[self, &bias], |st| match st {
            [Storage::Cuda(x), Storage::Cuda(b)] => x.max_pool2d_bias_relu(b, c, &p),
            _ => Err(self.device_mismatch(OP, &bias)),
        })?;
        let shape = vec![n, c, p.out_h(), p.out_w()];
        Ok((
            Tensor::from_storage(Storage::Cuda(o), shape.clone()),
            Tensor::from_storage(Storage::Cuda(i), shape),
        ))
    }

    /// Gradient of [`Tensor::max_pool2d`] over `kernel × kernel` windows at `stride`: each output gradient goes
    /// to its window's max.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches (the gradient not the pooled shape of `input_shape`); indices outside
    /// the input plane.
    pub fn max_pool2d_backward(
        grad_out: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
        (kernel, stride): (usize, usize),
    ) -> Result<Tensor> {
        const OP: &str = "max_pool2d_backward";
        grad_out.require_float(OP)?;
        indices.require_i32(OP)?;
        grad_out.same_shape(OP, indices)?;
        let r = input_shape.len();
        let p = (r >= 2 && kernel > 0 && stride > 0).then(|| PoolParams {
            planes: elem_count(&input_shape[..r - 2]),
            h: input_shape[r - 2],
            w: input_shape[r - 1],
            kernel,
            stride,
        });
        let fits = |p: &PoolParams| {
            p.h >= kernel
                && p.w >= kernel
                && grad_out.rank() == r
                && grad_out.shape[..r - 2] == input_shape[..r - 2]
                && grad_out.shape[r - 2..] == [p.out_h(), p.out_w()]
        };
        let Some(p) = p.filter(fits) else {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: grad_out.shape.clone(),
                rhs: input_shape.to_vec(),
            });
        };
        map2!(grad_out, OP, indices, input_shape.to_vec(), |g, i| g
            .max_pool2d_backward(i, &p))
    }
}
