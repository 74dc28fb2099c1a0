//! The cuDNN descriptors of one pass's geometry: the operands as the caller holds them (NCHW) and, under a policy
//! with tensor-core math, their channels-last twins.
//!
//! Channels last: cuDNN's tensor-core convolutions run on NHWC tensors. Given NCHW ones, its legacy API mostly
//! offers SIMT kernels instead (the bf16 CNN's forward timed fastest on `implicit_convolve_sgemm`), where PyTorch,
//! through the graph API, transposes to NHWC around tensor-core kernels. An algorithm [`Layout::Nhwc`] does the
//! same: the pass's inputs are transposed into the workspace (`cudnnTransformTensor`), the convolution runs there
//! and its output is transposed back, all inside the one workspace ([`Staging`]). The tuner times these beside the
//! NCHW algorithms and keeps whichever is fastest, so a geometry where the transposes cost more stays NCHW.

use cudarc::cudnn::{result as dnn, sys};

use super::super::{ConvParams, ConvPass};
use crate::Math;
use crate::cuda::CudaType;

/// How a candidate algorithm's operands lie in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// As the caller holds them.
    Nchw,
    /// Transposed to channels last around the call.
    Nhwc,
    /// As the caller holds them, converted to f32 around the call (16-bit operands only).
    F32,
}

impl Layout {
    /// The policy a candidate of this layout is listed and run under, for operands of the policy `math`: TF32 for
    /// f32 copies of 16-bit operands.
    pub(super) fn math(self, math: Math) -> Math {
        match self {
            Layout::F32 => Math::Tf32,
            Layout::Nchw | Layout::Nhwc => math,
        }
    }
}

/// The x, w and y descriptors of one layout.
pub(super) struct Views {
    pub x: sys::cudnnTensorDescriptor_t,
    pub w: sys::cudnnFilterDescriptor_t,
    pub y: sys::cudnnTensorDescriptor_t,
}

impl Drop for Views {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created once by this value and is destroyed once.
        unsafe {
            for t in [self.x, self.y] {
                if !t.is_null() {
                    let _ = dnn::destroy_tensor_descriptor(t);
                }
            }
            if !self.w.is_null() {
                let _ = dnn::destroy_filter_descriptor(self.w);
            }
        }
    }
}

impl Views {
    /// x `[n, c, h, w]`, w `[o, c/g, kh, kw]` and y `[n, o, oh, ow]` of elements `dt` laid out as `format`.
    fn new(
        format: sys::cudnnTensorFormat_t,
        dt: sys::cudnnDataType_t,
        [n, c, h, w, o, cg, kh, kw, _, _, _, oh, ow]: [i32; 13],
    ) -> Result<Views, dnn::CudnnError> {
        let mut v = Views {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
        };
        v.x = tensor4d(format, [n, c, h, w], dt)?;
        v.y = tensor4d(format, [n, o, oh, ow], dt)?;
        v.w = dnn::create_filter_descriptor()?;
        // SAFETY: created above and live.
        unsafe { dnn::set_filter4d_descriptor(v.w, dt, format, [o, cg, kh, kw])? };
        Ok(v)
    }
}

/// The channels-last twins of a pass's operands, and the weight as two plain tensors (NCHW and NHWC) for its
/// transposes: a filter descriptor describes no transpose.
pub(super) struct ChannelsLast {
    pub views: Views,
    pub w_nchw: sys::cudnnTensorDescriptor_t,
    pub w_nhwc: sys::cudnnTensorDescriptor_t,
}

impl Drop for ChannelsLast {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created once by this value and is destroyed once.
        unsafe {
            for t in [self.w_nchw, self.w_nhwc] {
                if !t.is_null() {
                    let _ = dnn::destroy_tensor_descriptor(t);
                }
            }
        }
    }
}

/// The descriptors of one pass's geometry, destroyed when dropped.
pub(super) struct Desc {
    pub conv: sys::cudnnConvolutionDescriptor_t,
    /// The operands as the caller holds them.
    pub nchw: Views,
    /// Their channels-last twins, under a policy with tensor-core math (`None` under `Fp32`, whose FMA kernels
    /// gain nothing from the transposes).
    pub nhwc: Option<ChannelsLast>,
    /// Their f32 twins, under a 16-bit policy.
    pub f32: Option<Views>,
    /// `[1, O, 1, 1]`, for a forward with a bias (else null).
    pub bias: sys::cudnnTensorDescriptor_t,
    /// The identity, for a forward with a fused bias (else null).
    pub act: sys::cudnnActivationDescriptor_t,
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created once by this value and is destroyed once.
        unsafe {
            if !self.act.is_null() {
                let _ = sys::cudnnDestroyActivationDescriptor(self.act);
            }
            if !self.bias.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.bias);
            }
            if !self.conv.is_null() {
                let _ = dnn::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

/// `p`'s dimensions as cuDNN takes them: N, C, H, W, O, C/groups, kh, kw, stride, padding, groups, OH, OW; `None`
/// where one, or a tensor's element count, is beyond its 32-bit sizes.
pub(super) fn dims(p: &ConvParams) -> Option<[i32; 13]> {
    let total = [p.input_len(), p.output_len(), p.weight_len()];
    if total.iter().any(|&n| i32::try_from(n).is_err()) {
        return None;
    }
    let d = [
        p.batch,
        p.c_in,
        p.h,
        p.w,
        p.c_out,
        p.c_in_g(),
        p.kh,
        p.kw,
        p.stride,
        p.padding,
        p.groups,
        p.out_h(),
        p.out_w(),
    ];
    let mut out = [0i32; 13];
    for (o, v) in out.iter_mut().zip(d) {
        *o = i32::try_from(v).ok()?;
    }
    Some(out)
}

/// The operands' element type under `math`.
fn data_type(math: Math) -> sys::cudnnDataType_t {
    match math {
        Math::Fp32 | Math::Tf32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        Math::Bf16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        Math::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
    }
}

/// The math type a descriptor asks the heuristics under `math` with: tensor cores as the policy allows (the
/// module docs of `conv::cudnn`). Each candidate then runs with the math type it was listed with.
pub(super) fn policy_math(math: Math) -> sys::cudnnMathType_t {
    match math {
        Math::Fp32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        Math::Tf32 => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        Math::Bf16 | Math::F16 => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    }
}

/// A 4-D tensor descriptor of elements `dt` laid out as `format`.
fn tensor4d(
    format: sys::cudnnTensorFormat_t,
    dims: [i32; 4],
    dt: sys::cudnnDataType_t,
) -> Result<sys::cudnnTensorDescriptor_t, dnn::CudnnError> {
    let t = dnn::create_tensor_descriptor()?;
    // SAFETY: `t` was just created; on failure it is destroyed here and not used after.
    unsafe {
        dnn::set_tensor4d_descriptor(t, format, dt, dims).inspect_err(|_| {
            let _ = dnn::destroy_tensor_descriptor(t);
        })?
    };
    Ok(t)
}

const NCHW: sys::cudnnTensorFormat_t = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
const NHWC: sys::cudnnTensorFormat_t = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;

impl Desc {
    /// The descriptors of `pass` under `math` on the geometry `dims` (see [`dims`]); `Ok(None)` where cuDNN
    /// computes another output shape.
    pub(super) fn describe(
        pass: ConvPass,
        math: Math,
        dims: [i32; 13],
    ) -> Result<Option<Desc>, dnn::CudnnError> {
        use sys::cudnnDataType_t::CUDNN_DATA_FLOAT as F32;
        let [n, _, _, _, o, cg, kh, kw, s, pad, g, oh, ow] = dims;
        let dt = data_type(math);
        let mut d = Desc {
            conv: std::ptr::null_mut(),
            nchw: Views::new(NCHW, dt, dims)?,
            nhwc: None,
            f32: None,
            bias: std::ptr::null_mut(),
            act: std::ptr::null_mut(),
        };
        d.conv = dnn::create_convolution_descriptor()?;
        // SAFETY: the descriptors were created above and are live.
        unsafe {
            dnn::set_convolution2d_descriptor(
                d.conv,
                pad,
                pad,
                s,
                s,
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                F32,
            )?;
            // Sums in fp32 (F32 above) whatever the operands.
            dnn::set_convolution_math_type(d.conv, policy_math(math))?;
            dnn::set_convolution_group_count(d.conv, g)?;
            let (mut n2, mut c2, mut h2, mut w2) = (0, 0, 0, 0);
            sys::cudnnGetConvolution2dForwardOutputDim(
                d.conv, d.nchw.x, d.nchw.w, &mut n2, &mut c2, &mut h2, &mut w2,
            )
            .result()?;
            if [n2, c2, h2, w2] != [n, o, oh, ow] {
                return Ok(None);
            }
        }
        if math != Math::Fp32 {
            let mut last = ChannelsLast {
                views: Views::new(NHWC, dt, dims)?,
                w_nchw: std::ptr::null_mut(),
                w_nhwc: std::ptr::null_mut(),
            };
            last.w_nchw = tensor4d(NCHW, [o, cg, kh, kw], dt)?;
            last.w_nhwc = tensor4d(NHWC, [o, cg, kh, kw], dt)?;
            d.nhwc = Some(last);
        }
        if !math.f32_operands() {
            d.f32 = Some(Views::new(NCHW, F32, dims)?);
        }
        if pass == (ConvPass::Forward { bias: true }) {
            d.bias = tensor4d(NCHW, [1, o, 1, 1], dt)?;
            d.act = dnn::create_activation_descriptor()?;
            // SAFETY: created above.
            unsafe {
                dnn::set_activation_descriptor(
                    d.act,
                    sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY,
                    sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                    0.0,
                )?
            };
        }
        Ok(Some(d))
    }

    /// The descriptors an algorithm of `layout` runs on.
    pub(super) fn views(&self, layout: Layout) -> Option<&Views> {
        match layout {
            Layout::Nchw => Some(&self.nchw),
            Layout::Nhwc => self.nhwc.as_ref().map(|l| &l.views),
            Layout::F32 => self.f32.as_ref(),
        }
    }
}

/// Where a channels-last or f32 call keeps its staged operands: the start of its workspace, each operand's bytes
/// rounded up to 256 so that every part stays aligned; the algorithm's own workspace follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Staging {
    /// Bytes of the staged x, w and y.
    pub parts: [usize; 3],
}

impl Staging {
    /// The staging `layout` needs for `p` under `math`: none for NCHW.
    pub(super) fn new(layout: Layout, p: &ConvParams, math: Math) -> Staging {
        let bytes = match layout {
            Layout::Nchw => return Staging { parts: [0; 3] },
            Layout::Nhwc => CudaType::operands_of(math).size(),
            Layout::F32 => CudaType::F32.size(),
        };
        let round = |elements: usize| (elements * bytes).next_multiple_of(256);
        Staging {
            parts: [
                round(p.input_len()),
                round(p.weight_len()),
                round(p.output_len()),
            ],
        }
    }

    /// Bytes of all three.
    pub(super) fn bytes(&self) -> usize {
        self.parts.iter().sum()
    }

    /// The addresses of the staged x, w and y in the workspace at `ws`.
    pub(super) fn at(&self, ws: u64) -> [u64; 3] {
        let [x, w, _] = self.parts.map(|b| b as u64);
        [ws, ws + x, ws + x + w]
    }
}
