// Batch normalization in training over an input [outer, members, rows, channels, inner] (see batchnorm/mod.rs).
// Channel ch = g * channels + c; its elements e in [0, n), n = outer * rows * inner. I is the index type: u32
// where every index fits, so that the divisions that place an element are the cheap ones.
//
// Forward: batch_norm_stats (grid (channels, splits)) sums each split's shifted values and squares into
// partial[ch][split][2]; batch_norm_finalize (a thread per channel) makes mean and invstd and moves the running
// statistics; batch_norm_apply writes the output. Backward: batch_norm_grad_stats sums dy and dy * (x - mean) per
// split; batch_norm_grad_finalize makes dgamma and dbeta; batch_norm_grad_input writes dx. `out` (the forward's
// output) is 0 unless the forward rectified, in which case dy passes where out > 0. The activations (x, y, out, dy,
// dx) are T: f32, or bf16 / f16 where a mixed policy keeps them in the low type; statistics, parameters and their
// gradients are f32. Kernel names end in the index type, then T's name (batch_norm_stats_u32_bf16).

struct Dims {
    u64 outer, members, rows, channels, inner;
};

template <typename I>
__device__ __forceinline__ u64 element_offset(const Dims& d, I ch, I e) {
    const I g = ch / (I)d.channels, c = ch % (I)d.channels;
    const I pr = e / (I)d.inner, q = e % (I)d.inner;
    const I p = pr / (I)d.rows, r = pr % (I)d.rows;
    return ((((u64)p * d.members + g) * d.rows + r) * d.channels + c) * d.inner + q;
}

template <typename I>
__device__ __forceinline__ I channel_of(const Dims& d, I i) {
    const I row = i / (I)d.inner;
    const I c = row % (I)d.channels;
    const I g = (row / (I)(d.rows * d.channels)) % (I)d.members;
    return g * (I)d.channels + c;
}

// Sum of one float over the block into sh[0] / sh[1] for a pair; every thread gets both.
__device__ __forceinline__ float2 block_sum2(float a, float b) {
    return make_float2(block_sum(a), block_sum(b));
}

// The sums, over this block's split of its channel (grid (channels, splits), `chunk` elements a split), of the pair
// `f` gives for each element's offset, into partial[ch][split][0..2].
// A thread places its first element by division and each next one (blockDim.x further) by carrying, since
// divisions per element cost more than the loads (the bf16 CNN's bias gradients ran at a fifth of their memory bound).
template <typename I, typename F>
__device__ __forceinline__ void split_sums(const Dims& d, u64 chunk, float* partial, F f) {
    const I ch = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const I n = (I)(d.outer * d.rows * d.inner);
    const I start = (I)(split * chunk);
    const I end = start + (I)chunk < n ? start + (I)chunk : n;
    const I inner = (I)d.inner, rows = (I)d.rows, g = ch / (I)d.channels, c = ch % (I)d.channels;
    const I step = blockDim.x, dq = step % inner, dr = step / inner % rows, dp = step / inner / rows;
    I e = start + threadIdx.x, q = e % inner, r = e / inner % rows, p = e / inner / rows;
    float s1 = 0.0f, s2 = 0.0f;
    for (; e < end; e += step) {
        const float2 v = f(((((u64)p * d.members + g) * rows + r) * d.channels + c) * inner + q);
        s1 += v.x;
        s2 += v.y;
        q += dq;
        const I cq = q >= inner;
        q -= cq * inner;
        r += dr + cq;
        const I cr = r >= rows;
        r -= cr * rows;
        p += dp + cr;
    }
    const float2 s = block_sum2(s1, s2);
    if (threadIdx.x == 0) {
        partial[((u64)ch * splits + split) * 2] = s.x;
        partial[((u64)ch * splits + split) * 2 + 1] = s.y;
    }
}

// Each channel's values shifted by its first one (k: sums that keep their precision) and their squares.
template <typename I, typename T>
__device__ void stats(Dims d, u64 chunk, const T* x, float* partial) {
    const float k = to_f32(x[element_offset<I>(d, (I)blockIdx.x, 0)]);
    split_sums<I>(d, chunk, partial, [=](u64 o) {
        const float v = to_f32(x[o]) - k;
        return make_float2(v, v * v);
    });
}

// running_mean == 0: no running statistics to move.
template <typename T>
__device__ void finalize(Dims d, u64 splits, double eps, double momentum, const T* x, const float* partial,
                         float* mean, float* invstd, float* running_mean, float* running_var) {
    const u64 ch = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= d.members * d.channels) return;
    double s1 = 0.0, s2 = 0.0;
    for (u64 s = 0; s < splits; ++s) {
        s1 += partial[(ch * splits + s) * 2];
        s2 += partial[(ch * splits + s) * 2 + 1];
    }
    const double n = (double)(d.outer * d.rows * d.inner);
    const double m = s1 / n;
    const double mu = (double)to_f32(x[element_offset<u64>(d, ch, 0)]) + m;
    const double var = fmax(s2 / n - m * m, 0.0);
    mean[ch] = (float)mu;
    invstd[ch] = (float)(1.0 / sqrt(var + eps));
    if (running_mean) {
        const double unbiased = n > 1.0 ? var * n / (n - 1.0) : var;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mu);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
}

template <typename I, typename T>
__device__ void apply(Dims d, int relu, const T* x, const float* mean, const float* invstd, const float* gamma,
                      const float* beta, T* y) {
    const I len = (I)(d.outer * d.members * d.rows * d.channels * d.inner);
    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x) {
        const I ch = channel_of<I>(d, i);
        const float v = (to_f32(x[i]) - mean[ch]) * (invstd[ch] * gamma[ch]) + beta[ch];
        y[i] = from_f32<T>(relu && v < 0.0f ? 0.0f : v);  // NaN passes, as in PyTorch
    }
}

// dy (where the rectified output passed it) and dy * (x - mean).
template <typename I, typename T>
__device__ void grad_stats(Dims d, u64 chunk, const T* x, const T* out, const T* dy, const float* mean,
                           float* partial) {
    const float m = mean[blockIdx.x];
    split_sums<I>(d, chunk, partial, [=](u64 o) {
        const float g = out && !(to_f32(out[o]) > 0.0f) ? 0.0f : to_f32(dy[o]);
        return make_float2(g, g * (to_f32(x[o]) - m));
    });
}

extern "C" __global__ void batch_norm_grad_finalize(u64 channels, u64 splits, const float* partial,
                                                    const float* invstd, float* dgamma, float* dbeta) {
    const u64 ch = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels) return;
    double sd = 0.0, sdx = 0.0;
    for (u64 s = 0; s < splits; ++s) {
        sd += partial[(ch * splits + s) * 2];
        sdx += partial[(ch * splits + s) * 2 + 1];
    }
    dbeta[ch] = (float)sd;
    dgamma[ch] = (float)(sdx * (double)invstd[ch]);
}

template <typename I, typename T>
__device__ void grad_input(Dims d, const T* x, const T* out, const T* dy, const float* mean, const float* invstd,
                           const float* gamma, const float* dgamma, const float* dbeta, T* dx) {
    const I len = (I)(d.outer * d.members * d.rows * d.channels * d.inner);
    const float inv_n = 1.0f / (float)(d.outer * d.rows * d.inner);
    for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < len; i += gridDim.x * blockDim.x) {
        const I ch = channel_of<I>(d, i);
        const float is = invstd[ch];
        const float g = out && !(to_f32(out[i]) > 0.0f) ? 0.0f : to_f32(dy[i]);
        dx[i] = from_f32<T>(gamma[ch] * is *
                            (g - dbeta[ch] * inv_n - (to_f32(x[i]) - mean[ch]) * is * (dgamma[ch] * inv_n)));
    }
}


// Each channel's sum of T x into f32 (a convolution's bias gradient from a 16-bit output gradient): channel_sums
// (grid (channels, splits)) sums a split into partial[ch][split][0] (the pair's second is 0), channel_sums_finalize
// a channel's splits.
template <typename I, typename T>
__device__ void channel_sums(Dims d, u64 chunk, const T* x, float* partial) {
    split_sums<I>(d, chunk, partial, [=](u64 o) { return make_float2(to_f32(x[o]), 0.0f); });
}

extern "C" __global__ void channel_sums_finalize(u64 channels, u64 splits, const float* partial, float* out) {
    const u64 ch = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels) return;
    double acc = 0.0;
    for (u64 s = 0; s < splits; ++s) acc += partial[(ch * splits + s) * 2];
    out[ch] = (float)acc;
}

// ReLU's backward from its output with each channel's sum of the result: a convolution's bias gradient where a ReLU
// follows it, over image features [outer, channels, inner] (u32 indices: the host checks that they fit). Grid
// (channels, splits): dx = y > 0 ? dy : 0 (NaN stops, as relu_backward), and each split's sum of dx into
// partial[ch][split][0], which channel_sums_finalize adds up. `units` is a channel's elements over W and `chunk` a
// split's share of them: a thread moves W consecutive elements at a time (4 where inner is a multiple of 4, as one
// float4 or 8 bytes of a 16-bit type), so the pass runs at the memory's speed, which channel_sums does not.
template <u32 W, typename T>
__device__ void relu_channel_sums(u32 channels, u32 inner, u32 units, u32 chunk, const T* dy, const T* y, T* dx,
                                  float* partial) {
    const u32 c = blockIdx.x, split = blockIdx.y, plane = inner / W;
    const u32 start = split * chunk, end = min(start + chunk, units);
    float s = 0.0f;
    for (u32 u = start + threadIdx.x; u < end; u += blockDim.x) {
        const u32 p = u / plane;
        const u32 o = (p * channels + c) * plane + (u - p * plane);
        if constexpr (W == 4) {
            const float4 v = load4(y, o), g = load4(dy, o);
            const float4 r = make_float4(v.x > 0.0f ? g.x : 0.0f, v.y > 0.0f ? g.y : 0.0f, v.z > 0.0f ? g.z : 0.0f,
                                         v.w > 0.0f ? g.w : 0.0f);
            store4(dx, o, r);
            s += (r.x + r.y) + (r.z + r.w);
        } else {
            const float r = to_f32(y[o]) > 0.0f ? to_f32(dy[o]) : 0.0f;
            dx[o] = from_f32<T>(r);
            s += r;
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[((u64)c * gridDim.y + split) * 2] = s;
}

#define RELU_CHANNEL_SUMS(TN, T)                                                                                   \
    extern "C" __global__ void relu_channel_sums_##TN(u32 channels, u32 inner, u32 units, u32 chunk, const T* dy,  \
                                                      const T* y, T* dx, float* partial) {                        \
        relu_channel_sums<1, T>(channels, inner, units, chunk, dy, y, dx, partial);                                \
    }                                                                                                              \
    extern "C" __global__ void relu_channel_sums4_##TN(u32 channels, u32 inner, u32 units, u32 chunk, const T* dy, \
                                                       const T* y, T* dx, float* partial) {                       \
        relu_channel_sums<4, T>(channels, inner, units, chunk, dy, y, dx, partial);                                \
    }
RELU_CHANNEL_SUMS(f32, float)
RELU_CHANNEL_SUMS(bf16, bf16_t)
RELU_CHANNEL_SUMS(f16, f16_t)

// The entry points per index type I and activation type T.
#define BATCH_NORM_SIZED(IN, I, TN, T)                                                                            \
    extern "C" __global__ void batch_norm_stats_##IN##_##TN(Dims d, u64 chunk, const T* x, float* partial) {      \
        stats<I, T>(d, chunk, x, partial);                                                                        \
    }                                                                                                             \
    extern "C" __global__ void batch_norm_apply_##IN##_##TN(Dims d, int relu, const T* x, const float* mean,      \
                                                            const float* invstd, const float* gamma,              \
                                                            const float* beta, T* y) {                            \
        apply<I, T>(d, relu, x, mean, invstd, gamma, beta, y);                                                    \
    }                                                                                                             \
    extern "C" __global__ void batch_norm_grad_stats_##IN##_##TN(Dims d, u64 chunk, const T* x, const T* out,     \
                                                                 const T* dy, const float* mean, float* partial) { \
        grad_stats<I, T>(d, chunk, x, out, dy, mean, partial);                                                    \
    }                                                                                                             \
    extern "C" __global__ void batch_norm_grad_input_##IN##_##TN(                                                 \
        Dims d, const T* x, const T* out, const T* dy, const float* mean, const float* invstd, const float* gamma, \
        const float* dgamma, const float* dbeta, T* dx) {                                                         \
        grad_input<I, T>(d, x, out, dy, mean, invstd, gamma, dgamma, dbeta, dx);                                  \
    }                                                                                                             \
    extern "C" __global__ void channel_sums_##IN##_##TN(Dims d, u64 chunk, const T* x, float* partial) {          \
        channel_sums<I, T>(d, chunk, x, partial);                                                                 \
    }
#define BATCH_NORM(TN, T)                                                                                         \
    BATCH_NORM_SIZED(u32, u32, TN, T)                                                                             \
    BATCH_NORM_SIZED(u64, u64, TN, T)                                                                             \
    extern "C" __global__ void batch_norm_finalize_##TN(Dims d, u64 splits, double eps, double momentum,          \
                                                        const T* x, const float* partial, float* mean,            \
                                                        float* invstd, float* running_mean, float* running_var) { \
        finalize<T>(d, splits, eps, momentum, x, partial, mean, invstd, running_mean, running_var);               \
    }
BATCH_NORM(f32, float)
BATCH_NORM(bf16, bf16_t)
BATCH_NORM(f16, f16_t)
