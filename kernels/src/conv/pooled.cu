// A convolution of few input channels (stride 1, zero padding, one group) and the max pool that tiles its output
// (S x S windows, stride S), with the pool's bias and ReLU: an image CNN's first layer. cuDNN's kernels for three
// input channels run far below the memory's speed, and the convolution's full-size output is written only to be
// pooled; here no full-size tensor exists, forward or backward. f32 math throughout (the weights are the f32
// masters), inputs and outputs of type T.

#define POOLED_TILE_H 8   // pooled rows of a forward block
#define POOLED_TILE_W 32  // pooled columns of a forward block: a warp
#define POOLED_GROUP 16   // output channels a forward thread computes
#define POOLED_BAND 4     // pooled rows a backward block covers
#define POOLED_MAX_C 4    // input channels at most (the host checks)

// Grid (tiles, ceil(cout / POOLED_GROUP), n), block (POOLED_TILE_W, POOLED_TILE_H); dynamic shared memory: the
// block's input tile, c x IH x IW floats, then its channels' weights, POOLED_GROUP x c x K x K. A thread makes the
// S x S convolution outputs of one window for POOLED_GROUP channels from the window's input patch held in registers,
// then each window's max, bias and ReLU: out [n, cout, ph, pw] (T) and idx, the max's flat index in the
// convolution's plane (oy * ow + ox), first one on ties, as max_pool2d records it.
template <int K, int S, typename T>
__device__ __forceinline__ void conv_pooled(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, const T* x,
                                            const float* wt, const float* bias, T* out, int* idx) {
    constexpr int P = S + K - 1;
    constexpr int IH = POOLED_TILE_H * S + K - 1, IW = POOLED_TILE_W * S + K - 1;
    constexpr int G = POOLED_GROUP, THREADS = POOLED_TILE_H * POOLED_TILE_W;
    extern __shared__ float smem[];
    float* xs = smem;
    float* ws = smem + c * IH * IW;
    const u32 tiles_w = (pw + POOLED_TILE_W - 1) / POOLED_TILE_W;
    const u32 py0 = blockIdx.x / tiles_w * POOLED_TILE_H, px0 = blockIdx.x % tiles_w * POOLED_TILE_W;
    const u32 co0 = blockIdx.y * G, n = blockIdx.z, tid = threadIdx.y * POOLED_TILE_W + threadIdx.x;
    const int iy0 = (int)(py0 * S) - (int)pad, ix0 = (int)(px0 * S) - (int)pad;
    const T* xn = x + (u64)n * c * h * w;
    for (u32 i = tid; i < c * IH * IW; i += THREADS) {
        const u32 ci = i / (IH * IW), r = i - ci * (IH * IW);
        const int yy = iy0 + (int)(r / IW), xx = ix0 + (int)(r % IW);
        const bool inside = yy >= 0 && yy < (int)h && xx >= 0 && xx < (int)w;
        xs[i] = inside ? to_f32(xn[((u64)ci * h + yy) * w + xx]) : 0.0f;
    }
    const u32 ckk = c * K * K;
    for (u32 i = tid; i < G * ckk; i += THREADS) {
        const u32 g = i / ckk;
        ws[i] = co0 + g < cout ? wt[(u64)(co0 + g) * ckk + (i - g * ckk)] : 0.0f;
    }
    __syncthreads();
    float acc[G][S * S];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int s = 0; s < S * S; ++s) acc[g][s] = 0.0f;
    for (u32 ci = 0; ci < c; ++ci) {
        float p[P][P];
        const float* src = xs + (ci * IH + threadIdx.y * S) * IW + threadIdx.x * S;
#pragma unroll
        for (int a = 0; a < P; ++a)
#pragma unroll
            for (int b = 0; b < P; ++b) p[a][b] = src[a * IW + b];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float* wg = ws + g * ckk + ci * K * K;
#pragma unroll
            for (int ky = 0; ky < K; ++ky)
#pragma unroll
                for (int kx = 0; kx < K; ++kx) {
                    const float wv = wg[ky * K + kx];
#pragma unroll
                    for (int dy = 0; dy < S; ++dy)
#pragma unroll
                        for (int dx = 0; dx < S; ++dx)
                            acc[g][dy * S + dx] = fmaf(wv, p[dy + ky][dx + kx], acc[g][dy * S + dx]);
                }
        }
    }
    const u32 py = py0 + threadIdx.y, px = px0 + threadIdx.x, ow = pw * S;
    if (py >= ph || px >= pw) return;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const u32 co = co0 + g;
        if (co >= cout) break;
        float best = acc[g][0];
        int at = 0;
#pragma unroll
        for (int s = 1; s < S * S; ++s)
            if (acc[g][s] > best) {
                best = acc[g][s];
                at = s;
            }
        const float v = best + bias[co];
        const u64 o = (((u64)n * cout + co) * ph + py) * pw + px;
        out[o] = from_f32<T>(v > 0.0f ? v : 0.0f);
        idx[o] = (int)((py * S + at / S) * ow + px * S + at % S);
    }
}

// The weight's gradient from the pooled output's gradient g (after the ReLU's mask: [n, cout, ph, pw], T) and the
// maxima's indices: each window's gradient times the input patch under its max. Grid (ceil(ph / POOLED_BAND),
// ceil(cout / 8), chunks), block (32, 8): a warp per output channel, a lane per pooled column, over POOLED_BAND
// pooled rows of `chunk` images, with the band's input rows of each image in shared memory (c x BH x IW floats).
// Each lane keeps its c x K x K sums over every window it visits; the warp's sums go to
// partial[(chunk_index * bands + band) * cout + co][c * K * K], which conv_pooled_filter_finalize adds up in order:
// the same bits every run. An index outside its window is reported (the weight's gradient is then wrong).
template <int K, int S, typename T>
__device__ __forceinline__ void conv_pooled_filter(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, u32 n,
                                                   u32 chunk, const T* g, const int* idx, const T* x, float* partial,
                                                   int* flag) {
    constexpr int BH = POOLED_BAND * S + K - 1;
    const u32 iw = pw * S + K - 1, ow = pw * S;
    extern __shared__ float xs[];
    const u32 band = blockIdx.x, co = blockIdx.y * 8 + threadIdx.y, tid = threadIdx.y * 32 + threadIdx.x;
    const u32 py0 = band * POOLED_BAND, n0 = blockIdx.z * chunk, n1 = min(n0 + chunk, n);
    const int iy0 = (int)(py0 * S) - (int)pad;
    float acc[POOLED_MAX_C][K][K];
#pragma unroll
    for (int ci = 0; ci < POOLED_MAX_C; ++ci)
#pragma unroll
        for (int ky = 0; ky < K; ++ky)
#pragma unroll
            for (int kx = 0; kx < K; ++kx) acc[ci][ky][kx] = 0.0f;
    for (u32 img = n0; img < n1; ++img) {
        __syncthreads();
        const T* xn = x + (u64)img * c * h * w;
        for (u32 i = tid; i < c * BH * iw; i += 256) {
            const u32 ci = i / (BH * iw), r = i - ci * (BH * iw);
            const int yy = iy0 + (int)(r / iw), xx = (int)(r % iw) - (int)pad;
            const bool inside = yy >= 0 && yy < (int)h && xx >= 0 && xx < (int)w;
            xs[i] = inside ? to_f32(xn[((u64)ci * h + yy) * w + xx]) : 0.0f;
        }
        __syncthreads();
        if (co >= cout) continue;
        for (u32 r = 0; r < POOLED_BAND && py0 + r < ph; ++r) {
            const u32 py = py0 + r;
            for (u32 px = threadIdx.x; px < pw; px += 32) {
                const u64 o = (((u64)img * cout + co) * ph + py) * pw + px;
                const float gv = to_f32(g[o]);
                if (gv == 0.0f) continue;
                const int i = idx[o];
                const u32 oy = (u32)i / ow, ox = (u32)i - oy * ow;
                if (i < 0 || oy / S != py || ox / S != px) {
                    report_index_error(flag, OP_CONV_POOLED, i, (i64)ph * S * ow);
                    continue;
                }
                const float* src = xs + (oy - py0 * S) * iw + ox;
#pragma unroll
                for (int ci = 0; ci < POOLED_MAX_C; ++ci) {
                    if (ci >= (int)c) break;
#pragma unroll
                    for (int ky = 0; ky < K; ++ky)
#pragma unroll
                        for (int kx = 0; kx < K; ++kx)
                            acc[ci][ky][kx] = fmaf(gv, src[(ci * BH + ky) * iw + kx], acc[ci][ky][kx]);
                }
            }
        }
    }
    if (co >= cout) return;
    float* dst = partial + ((u64)(blockIdx.z * gridDim.x + band) * cout + co) * (c * K * K);
#pragma unroll
    for (int ci = 0; ci < POOLED_MAX_C; ++ci) {
        if (ci >= (int)c) break;
#pragma unroll
        for (int ky = 0; ky < K; ++ky)
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                const float s = warp_sum(acc[ci][ky][kx]);
                if (threadIdx.x == 0) dst[(ci * K + ky) * K + kx] = s;
            }
    }
}

// dw[j] = the sum over parts of partial[part][j], in order (len = cout * c * K * K).
extern "C" __global__ void conv_pooled_filter_finalize(u32 parts, u32 len, const float* partial, float* dw) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= len) return;
    float s = 0.0f;
    for (u32 p = 0; p < parts; ++p) s += partial[(u64)p * len + j];
    dw[j] = s;
}

#define CONV_POOLED(KS, K, S, TN, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        conv_pooled_##KS##_##TN(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, const T* x,                \
                                const float* wt, const float* bias, T* out, int* idx) {                            \
        conv_pooled<K, S, T>(c, h, w, cout, pad, ph, pw, x, wt, bias, out, idx);                                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        conv_pooled_filter_##KS##_##TN(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, u32 n, u32 chunk,  \
                                       const T* g, const int* idx, const T* x, float* partial, int* flag) {        \
        conv_pooled_filter<K, S, T>(c, h, w, cout, pad, ph, pw, n, chunk, g, idx, x, partial, flag);                \
    }
#define CONV_POOLED_TYPES(KS, K, S)        \
    CONV_POOLED(KS, K, S, f32, float)      \
    CONV_POOLED(KS, K, S, bf16, bf16_t)    \
    CONV_POOLED(KS, K, S, f16, f16_t)
CONV_POOLED_TYPES(k3s2, 3, 2)
CONV_POOLED_TYPES(k5s2, 5, 2)
