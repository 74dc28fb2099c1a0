// A convolution of few input channels (stride 1, zero padding, one group) and the max pool that tiles its output
// (S x S windows, stride S), with the pool's bias and ReLU: an image CNN's first layer. cuDNN's kernels for three
// input channels run far below the memory's speed, and the convolution's full-size output is written only to be
// pooled; here no full-size tensor exists, forward or backward. f32 math throughout (the weights are the f32
// masters), inputs and outputs of type T.

#define POOLED_TILE_H 8   // pooled rows of a forward block
#define POOLED_TILE_W 32  // pooled columns of a forward block: a warp
#define POOLED_GROUP 16   // output channels a forward thread computes
#define POOLED_BAND 2     // pooled rows of a backward block
#define POOLED_COLS 32    // pooled columns of a backward block
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
    // The input under the tile (the divisions are by constants).
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

// The weight's and the bias's gradients from the pooled output's gradient g and the output y ([n, cout, ph, pw], T:
// the ReLU's mask is y > 0) and the maxima's indices: each window's masked gradient times the input patch under its
// max, and each channel's sum of them. Grid (bands x column tiles, ceil(cout / 32), chunks), block 256: a block
// covers POOLED_BAND x POOLED_COLS windows of 32 output channels in `chunk` images, a lane per channel (so that
// a warp's lanes read one window's patch, at most four distinct addresses a load, which fall in distinct banks) and
// a warp per window at a time. Per image the block stages the tile's masked gradients and indices, channel-major,
// and the input under the tile. Each lane keeps its channel's c x K x K + 1 sums over every window it visits; the
// block's eight warps are added up in order into partial[(chunk_index * tiles + tile) * cout + co][c * K * K + 1],
// which conv_pooled_filter_finalize adds up in order: the same bits every run. An index outside its window is
// reported (the weight's gradient is then wrong).
template <int K, int S, typename T>
__device__ __forceinline__ void conv_pooled_filter(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, u32 n,
                                                   u32 chunk, const T* g, const T* y, const int* idx, const T* x,
                                                   float* partial, int* flag) {
    constexpr int BH = POOLED_BAND * S + K - 1, BW = POOLED_COLS * S + K - 1;
    constexpr int POS = POOLED_BAND * POOLED_COLS, PS = POS + 1;  // a channel's row of the staged tiles, padded
    constexpr int SUMS = POOLED_MAX_C * K * K + 1;
    extern __shared__ float smem[];
    float* gs = smem;
    int* is = (int*)(smem + 32 * PS);
    float* xs = smem + 2 * 32 * PS;
    const u32 col_tiles = (pw + POOLED_COLS - 1) / POOLED_COLS;
    const u32 band = blockIdx.x / col_tiles, py0 = band * POOLED_BAND;
    const u32 px0 = (blockIdx.x - band * col_tiles) * POOLED_COLS;
    const u32 co0 = blockIdx.y * 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, co = co0 + lane;
    const u32 ow = pw * S, len = c * K * K + 1, n1 = min(blockIdx.z * chunk + chunk, n);
    const int iy0 = (int)(py0 * S) - (int)pad, ix0 = (int)(px0 * S) - (int)pad;
    float acc[SUMS];
#pragma unroll
    for (int j = 0; j < SUMS; ++j) acc[j] = 0.0f;
    for (u32 img = blockIdx.z * chunk; img < n1; ++img) {
        __syncthreads();
        // Every load of the image's share is issued before any is stored: the loop is latency-bound otherwise.
        constexpr int ROWS = 32 * POOLED_BAND / 8, XS = (POOLED_MAX_C * BH * BW + 255) / 256;
        float gv[ROWS], yv[ROWS], xv[XS];
        int iv[ROWS];
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            const u32 r = warp + 8 * k, ch = r / POOLED_BAND, py = py0 + r % POOLED_BAND, px = px0 + lane;
            gv[k] = 0.0f;
            yv[k] = 0.0f;
            iv[k] = -1;
            if (co0 + ch < cout && py < ph && px < pw) {
                const u64 o = (((u64)img * cout + co0 + ch) * ph + py) * pw + px;
                gv[k] = to_f32(g[o]);
                yv[k] = to_f32(y[o]);
                iv[k] = idx[o];
            }
        }
        const T* xn = x + (u64)img * c * h * w;
#pragma unroll
        for (int k = 0; k < XS; ++k) {
            const u32 i = threadIdx.x + 256 * k, ci = i / (BH * BW), r = i - ci * (BH * BW);
            const int yy = iy0 + (int)(r / BW), xx = ix0 + (int)(r % BW);
            const bool inside = ci < c && yy >= 0 && yy < (int)h && xx >= 0 && xx < (int)w;
            xv[k] = inside ? to_f32(xn[((u64)ci * h + yy) * w + xx]) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < ROWS; ++k) {
            const u32 r = warp + 8 * k, at = r / POOLED_BAND * PS + r % POOLED_BAND * POOLED_COLS + lane;
            gs[at] = yv[k] > 0.0f ? gv[k] : 0.0f;
            is[at] = iv[k];
        }
#pragma unroll
        for (int k = 0; k < XS; ++k)
            if (threadIdx.x + 256 * k < c * BH * BW) xs[threadIdx.x + 256 * k] = xv[k];
        __syncthreads();
        if (co >= cout) continue;
        for (u32 pos = warp; pos < POS; pos += 8) {
            const float gv = gs[lane * PS + pos];
            if (gv == 0.0f) continue;
            acc[SUMS - 1] += gv;
            // The max's place in its window, (dy, dx), from its flat index: no division by the row's length.
            const int i = is[lane * PS + pos], row = (int)(pos / POOLED_COLS), col = (int)(pos % POOLED_COLS);
            const int off = i - (int)(((py0 + row) * S * ow + (px0 + col) * S));
            int dy = 0;
#pragma unroll
            for (int s = 1; s < S; ++s) dy += off >= s * (int)ow ? 1 : 0;
            const int dx = off - dy * (int)ow;
            if (off < 0 || dx < 0 || dx >= S) {
                report_index_error(flag, OP_CONV_POOLED, i, (i64)ph * S * ow);
                continue;
            }
            const float* src = xs + (row * S + dy) * BW + col * S + dx;
#pragma unroll
            for (int ci = 0; ci < POOLED_MAX_C; ++ci) {
                if (ci >= (int)c) break;
#pragma unroll
                for (int ky = 0; ky < K; ++ky)
#pragma unroll
                    for (int kx = 0; kx < K; ++kx)
                        acc[(ci * K + ky) * K + kx] = fmaf(gv, src[(ci * BH + ky) * BW + kx], acc[(ci * K + ky) * K + kx]);
            }
        }
    }
    // The warps' sums, eight at a time through shared memory: sums j0..j0+7 of warp v, lane l at red[(j * 8 + v) *
    // 32 + l]; thread (j, l) then adds the eight warps' in order. The bias's sum is the last.
    float* red = smem;
    float* dst = partial + ((u64)(blockIdx.z * gridDim.x + blockIdx.x) * cout + co0) * len;
#pragma unroll
    for (int j0 = 0; j0 < SUMS; j0 += 8) {
        __syncthreads();
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int j = j0 + jj;
            if (j < SUMS) red[(jj * 8 + warp) * 32 + lane] = acc[j];
        }
        __syncthreads();
        const int j = j0 + (int)warp;
        if (j < SUMS && co < cout) {
            float s = 0.0f;
            for (int v = 0; v < 8; ++v) s += red[(warp * 8 + v) * 32 + lane];
            // The sum's place: the weight's (ci, ky, kx) while ci < c, the bias's last.
            const int ci = j / (K * K);
            if (j == SUMS - 1) dst[(u64)lane * len + len - 1] = s;
            else if (ci < (int)c) dst[(u64)lane * len + j] = s;
        }
    }
}

// dw[co][j] and db[co] from the sums of every part in order (partial [parts][cout][ckk + 1]).
extern "C" __global__ void conv_pooled_filter_finalize(u32 parts, u32 cout, u32 ckk, const float* partial, float* dw,
                                                      float* db) {
    const u32 t = blockIdx.x * blockDim.x + threadIdx.x, len = ckk + 1;
    if (t >= cout * len) return;
    float s = 0.0f;
    for (u32 p = 0; p < parts; ++p) s += partial[(u64)p * cout * len + t];
    const u32 co = t / len, j = t - co * len;
    if (j < ckk) dw[co * ckk + j] = s;
    else db[co] = s;
}

#define CONV_POOLED(KS, K, S, TN, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        conv_pooled_##KS##_##TN(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, const T* x,                \
                                const float* wt, const float* bias, T* out, int* idx) {                            \
        conv_pooled<K, S, T>(c, h, w, cout, pad, ph, pw, x, wt, bias, out, idx);                                    \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        conv_pooled_filter_##KS##_##TN(u32 c, u32 h, u32 w, u32 cout, u32 pad, u32 ph, u32 pw, u32 n, u32 chunk,  \
                                       const T* g, const T* y, const int* idx, const T* x, float* partial,         \
                                       int* flag) {                                                                \
        conv_pooled_filter<K, S, T>(c, h, w, cout, pad, ph, pw, n, chunk, g, y, idx, x, partial, flag);             \
    }
#define CONV_POOLED_TYPES(KS, K, S)        \
    CONV_POOLED(KS, K, S, f32, float)      \
    CONV_POOLED(KS, K, S, bf16, bf16_t)    \
    CONV_POOLED(KS, K, S, f16, f16_t)
CONV_POOLED_TYPES(k3s2, 3, 2)
CONV_POOLED_TYPES(k5s2, 5, 2)
