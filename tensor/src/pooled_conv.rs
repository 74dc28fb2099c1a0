//! A convolution of few input channels with the max pool, bias and ReLU after it, as one op on [`Tensor`] (an
//! image CNN's first layer, [`PooledConv`]): one pass each way on CUDA where the kernels take the geometry, with
//! no full-size output or gradient; the ops apart elsewhere.

use cohort_kernels::conv::pooled::PooledConv;

use crate::backend::CudaBackend;
use crate::storage::Storage;
use crate::{DType, Error, Result, Tensor};

impl Tensor {
    /// The geometry of `input` convolved with `weight` (stride 1, one group) then pooled in `pool` x `pool`
    /// windows of stride `pool`.
    fn pooled_conv(
        op: &'static str,
        input: &[usize],
        weight: &[usize],
        padding: usize,
        pool: usize,
    ) -> Result<PooledConv> {
        let conv = Tensor::conv_params(op, input, weight, 1, padding, 1)?;
        if pool == 0 || conv.out_h() < pool || conv.out_w() < pool {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "{pool}x{pool} pooling windows do not fit the convolution's {}x{} output",
                    conv.out_h(),
                    conv.out_w()
                ),
            });
        }
        Ok(PooledConv { conv, pool })
    }

    /// Whether [`conv2d_max_pool_bias_relu`](Tensor::conv2d_max_pool_bias_relu) of `self` with `weight` runs as
    /// one pass (on CUDA, for geometries [`PooledConv::fuses`] takes), where the two ops apart would write and
    /// read a full-size tensor each way.
    pub fn conv2d_max_pool_fuses(&self, weight: &Tensor, padding: usize, pool: usize) -> bool {
        Tensor::pooled_conv("conv2d", &self.shape, &weight.shape, padding, pool)
            .is_ok_and(|p| self.runs_in_one_pass(&p))
    }

    /// Whether `p` on `self`'s device runs on the one-pass kernels.
    fn runs_in_one_pass(&self, p: &PooledConv) -> bool {
        self.device().is_cuda() && p.fuses()
    }

    /// [`conv2d`](Tensor::conv2d) of `self` (`[N, C, H, W]`) with `weight` (`[O, C, k, k]`), stride 1, one group,
    /// no bias, then [`max_pool2d_bias_relu`](Tensor::max_pool2d_bias_relu) over `pool` x `pool` windows of stride
    /// `pool` with `bias` (`[O]`): the pooled, biased and rectified features and the maxima's indices in the
    /// convolution's planes. One pass where [`conv2d_max_pool_fuses`](Tensor::conv2d_max_pool_fuses), in f32 math
    /// on f32 weights under every precision policy (the output in the input's type); elsewhere the two ops.
    ///
    /// # Errors
    /// As the two ops: shapes that do not fit, different devices, a bias of another shape.
    pub fn conv2d_max_pool_bias_relu(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        padding: usize,
        pool: usize,
    ) -> Result<(Tensor, Tensor)> {
        const OP: &str = "conv2d_max_pool_bias_relu";
        let p = Tensor::pooled_conv(OP, &self.shape, &weight.shape, padding, pool)?;
        if bias.shape != [p.conv.c_out] {
            return Err(weight.shape_mismatch(OP, bias));
        }
        if !self.runs_in_one_pass(&p) {
            let y = self.conv2d(weight, None, 1, padding, 1)?;
            return y.max_pool2d_bias_relu(pool, pool, bias);
        }
        self.require_float(OP)?;
        self.same_device(OP, weight)?;
        self.same_device(OP, bias)?;
        let (weight, bias) = (weight.to_dtype(DType::F32)?, bias.to_dtype(DType::F32)?);
        let (o, i) = Tensor::read_all(&[self, &weight, &bias], |st| match st {
            [Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(b)] => {
                x.conv2d_max_pool_bias_relu(w, b, &p)
            }
            _ => Err(self.device_mismatch(OP, &weight)),
        })?;
        let shape = vec![p.conv.batch, p.conv.c_out, p.out_h(), p.out_w()];
        Ok((
            Tensor::from_storage(Storage::Cuda(o), shape.clone()),
            Tensor::from_storage(Storage::Cuda(i), shape),
        ))
    }

    /// Gradients of [`conv2d_max_pool_bias_relu`](Tensor::conv2d_max_pool_bias_relu) with respect to its input
    /// and its `weight` (each where asked for) and its bias, from `grad`, the pooled output's gradient, the output
    /// `y`, the forward's `indices` and its `input`. Without the input's, one pass where the forward was one (the
    /// ReLU's mask, the bias's sums and the weight's from the pooled gradient, in a fixed order: the same bits every
    /// run); else [`relu_backward_channel_bias`](Tensor::relu_backward_channel_bias), the pool's backward into the
    /// convolution's full-size gradient, and the convolution's backward passes from it.
    ///
    /// # Errors
    /// Shape, dtype or device mismatches; indices outside their windows (on CUDA at the next synchronisation).
    pub fn conv2d_max_pool_backward(
        input: &Tensor,
        weight: &Tensor,
        (grad, y, indices): (&Tensor, &Tensor, &Tensor),
        (padding, pool): (usize, usize),
        (input_grad, weight_grad): (bool, bool),
    ) -> Result<(Option<Tensor>, Option<Tensor>, Tensor)> {
        const OP: &str = "conv2d_max_pool_backward";
        let p = Tensor::pooled_conv(OP, &input.shape, &weight.shape, padding, pool)?;
        let pooled = [p.conv.batch, p.conv.c_out, p.out_h(), p.out_w()];
        if grad.shape != pooled {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: grad.shape.clone(),
                rhs: pooled.to_vec(),
            });
        }
        grad.same_shape(OP, y)?;
        grad.same_shape(OP, indices)?;
        if input_grad || !input.runs_in_one_pass(&p) {
            let (gp, gb) = grad.relu_backward_channel_bias(y)?;
            let conv = [p.conv.batch, p.conv.c_out, p.conv.out_h(), p.conv.out_w()];
            let full = Tensor::max_pool2d_backward(&gp, indices, &conv, (pool, pool))?;
            let gx = input_grad
                .then(|| Tensor::conv2d_backward_input(&full, weight, &input.shape, 1, padding, 1))
                .transpose()?;
            let gw = weight_grad
                .then(|| Tensor::conv2d_backward_weight(input, &full, &weight.shape, 1, padding, 1))
                .transpose()?;
            return Ok((gx, gw, gb));
        }
        input.require_float(OP)?;
        indices.require_i32(OP)?;
        for t in [grad, y, indices] {
            input.same_device(OP, t)?;
        }
        let (grad, y) = (grad.to_dtype(input.dtype())?, y.to_dtype(input.dtype())?);
        let (dw, db) = Tensor::read_all(&[&grad, &y, indices, input], |st| match st {
            [
                Storage::Cuda(g),
                Storage::Cuda(y),
                Storage::Cuda(i),
                Storage::Cuda(x),
            ] => g.conv2d_max_pool_backward(y, i, x, &p),
            _ => Err(input.device_mismatch(OP, &grad)),
        })?;
        Ok((
            None,
            weight_grad.then(|| Tensor::from_storage(Storage::Cuda(dw), weight.shape.clone())),
            Tensor::from_storage(Storage::Cuda(db), vec![p.conv.c_out]),
        ))
    }
}
