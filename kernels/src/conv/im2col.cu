// Convolution helpers: the own kernels' im2col and col2im around GEMM, and the epilogue of a 16-bit pass.
//
// The column matrix of a tile of n images is [C·kh·kw, n·OH·OW]: row (c, ki, kj),
// column (img, oy, ox), so one GEMM covers the tile and each group's rows are contiguous. The callers pass the
// tile's first image as x (and out, grad, ...) and its size as nimg.

extern "C" __global__ void im2col_f32(u64 nimg, u64 c, u64 h, u64 w, u64 kh, u64 kw, u64 stride, u64 pad,
                                      u64 oh, u64 ow, const float* x, float* col) {
    const u64 q_count = nimg * oh * ow;
    const u64 n = c * kh * kw * q_count;
    GRID_STRIDE(t, n) {
        const u64 q = t % q_count, row = t / q_count;
        const u64 kj = row % kw, ki = (row / kw) % kh, ch = row / (kw * kh);
        const u64 ox = q % ow, oy = (q / ow) % oh, img = q / (ow * oh);
        const i64 y = (i64)(oy * stride + ki) - (i64)pad;
        const i64 xx = (i64)(ox * stride + kj) - (i64)pad;
        float v = 0.0f;
        if (y >= 0 && y < (i64)h && xx >= 0 && xx < (i64)w) v = x[((img * c + ch) * h + (u64)y) * w + (u64)xx];
        col[t] = v;
    }
}

// The adjoint of im2col: each input element sums the column entries that read it (no atomics).
extern "C" __global__ void col2im_f32(u64 nimg, u64 c, u64 h, u64 w, u64 kh, u64 kw, u64 stride, u64 pad,
                                      u64 oh, u64 ow, const float* col, float* x) {
    const u64 q_count = nimg * oh * ow;
    const u64 n = nimg * c * h * w;
    GRID_STRIDE(t, n) {
        const u64 xx = t % w, y = (t / w) % h, ch = (t / (w * h)) % c, img = t / (w * h * c);
        float acc = 0.0f;
        for (u64 ki = 0; ki < kh; ++ki) {
            const i64 ty = (i64)(y + pad) - (i64)ki;
            if (ty < 0 || ty % (i64)stride != 0) continue;
            const u64 oy = (u64)ty / stride;
            if (oy >= oh) continue;
            for (u64 kj = 0; kj < kw; ++kj) {
                const i64 tx = (i64)(xx + pad) - (i64)kj;
                if (tx < 0 || tx % (i64)stride != 0) continue;
                const u64 ox = (u64)tx / stride;
                if (ox >= ow) continue;
                const u64 row = (ch * kh + ki) * kw + kj;
                acc += col[row * q_count + (img * oh + oy) * ow + ox];
            }
        }
        x[t] = acc;
    }
}

// out[n, o, p] = tmp[o, n·hw + p] + bias[o] (bias may be null).
extern "C" __global__ void conv_out_f32(u64 nimg, u64 cout, u64 hw, const float* tmp, const float* bias, float* out) {
    const u64 n = nimg * cout * hw;
    GRID_STRIDE(t, n) {
        const u64 p = t % hw, o = (t / hw) % cout, img = t / (hw * cout);
        float v = tmp[o * nimg * hw + img * hw + p];
        if (bias) v += bias[o];
        out[t] = v;
    }
}

// out[o, n·hw + p] = g[n, o, p].
extern "C" __global__ void conv_grad_cnhw_f32(u64 nimg, u64 cout, u64 hw, const float* g, float* out) {
    const u64 n = nimg * cout * hw;
    GRID_STRIDE(t, n) {
        const u64 p = t % hw, img = (t / hw) % nimg, o = t / (hw * nimg);
        out[t] = g[(img * cout + o) * hw + p];
    }
}

// dst[i] += src[i]: a weight gradient's later tiles added to the first's sum, in order.
extern "C" __global__ void conv_accumulate_f32(u64 n, const float* src, float* dst) {
    GRID_STRIDE(t, n) { dst[t] += src[t]; }
}

// A forward pass's epilogue in one pass: the bias of each channel (none where bias is null) and a ReLU when relu
// is set (as relu_f32: NaN gives 0). A 16-bit pass's output goes into f32 (conv_epilogue_<T>) or into its own
// type, in place allowed (conv_epilogue_<T>_<T>, for activations kept in the low type); conv_epilogue_f32_f32 is
// the bias and ReLU that follow a max pool in place of preceding it. NCHW: channel (i / inner) % channels,
// inner = OH·OW (in 32 bits where the tensor allows: a 64-bit division costs more than the element's traffic).
template <typename T, typename O>
__device__ __forceinline__ void conv_epilogue(u64 n, u64 channels, u64 inner, const T* y, const float* bias,
                                              u32 relu, O* out) {
    GRID_STRIDE(i, n) {
        float v = to_f32(y[i]);
        if (bias) v += bias[n <= 0xffffffffull ? ((u32)i / (u32)inner) % (u32)channels : (i / inner) % channels];
        out[i] = from_f32<O>(relu && !(v > 0.0f) ? 0.0f : v);
    }
}
#define CONV_EPILOGUE(NAME, T, O)                                                                     \
    extern "C" __global__ void NAME(u64 n, u64 channels, u64 inner, const T* y, const float* bias,   \
                                    u32 relu, O* out) {                                               \
        conv_epilogue<T, O>(n, channels, inner, y, bias, relu, out);                                  \
    }
CONV_EPILOGUE(conv_epilogue_bf16, bf16_t, float)
CONV_EPILOGUE(conv_epilogue_f16, f16_t, float)
CONV_EPILOGUE(conv_epilogue_bf16_bf16, bf16_t, bf16_t)
CONV_EPILOGUE(conv_epilogue_f16_f16, f16_t, f16_t)
CONV_EPILOGUE(conv_epilogue_f32_f32, float, float)
