// Fused self-attention over a packed qkv ([n, L, 3, heads, d]), flash-style (see attention/mod.rs).
//
// A block of 16 x 16 threads takes a tile of B rows (queries in the forward pass and dq, keys in dk and dv) of one
// (sequence, head) and walks the other side's tiles of B rows through shared memory, so scores are never stored
// whole. Each product is register-blocked: thread (ty, tx) holds the scores of rows ty + 16a against columns
// tx + 16b (a, b < B/16), and of each output row ty + 16a the DP/16 columns `col` gives. Rows are read as float4
// along the head's width from tiles [B][DP + 4] (DP: d padded with zeros); the pad of 4 puts the 8 threads of a
// quarter-warp's float4 reads on 32 distinct banks. A row's 16 threads are one half of a warp, so its reductions
// are four shuffles. No atomics: every output element has one writer, so results are the same from run to run.

#define THREADS 256
#define FULL 0xffffffffu

// Max and sum over the 16 threads of a row (lanes differing in their low 4 bits).
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float lane(const float4& v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// The c-th of thread tx's DP/16 output columns: float4 groups 16 apart, or (DP = 32) a pair.
template <int DP>
__device__ __forceinline__ int col(int tx, int c) {
    if constexpr (DP >= 64) return 4 * (tx + 16 * (c / 4)) + c % 4;
    else return 2 * tx + c;
}

// Thread tx's columns of a tile row.
template <int DP>
__device__ __forceinline__ void read_cols(float (&v)[DP / 16], const float* row, int tx) {
    if constexpr (DP >= 64) {
#pragma unroll
        for (int e = 0; e < DP / 64; ++e) {
            const float4 q = *reinterpret_cast<const float4*>(row + 4 * (tx + 16 * e));
            v[4 * e] = q.x, v[4 * e + 1] = q.y, v[4 * e + 2] = q.z, v[4 * e + 3] = q.w;
        }
    } else {
        const float2 q = *reinterpret_cast<const float2*>(row + 2 * tx);
        v[0] = q.x, v[1] = q.y;
    }
}

// Rows [r0, r0 + R) of a buffer whose rows are `stride` apart, d columns each, into a tile [R][DP + 4]; rows
// past len and columns past d are zero.
template <int R, int DP>
__device__ __forceinline__ void load_tile(float* dst, const float* src, u64 stride, u64 r0, u64 len, u64 d) {
    for (int t = threadIdx.x; t < R * DP; t += THREADS) {
        const int r = t / DP, c = t % DP;
        dst[r * (DP + 4) + c] = r0 + r < len && c < d ? src[(r0 + r) * stride + c] : 0.0f;
    }
}

// s[a][b] = row ty + 16a of tile x · row tx + 16b of tile y (both [*][DP + 4]).
template <int RA, int DP>
__device__ __forceinline__ void dots(float (&s)[RA][RA], const float* x, const float* y, int ty, int tx) {
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int b = 0; b < RA; ++b) s[a][b] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < DP; c += 4) {
        float4 xr[RA], yr[RA];
#pragma unroll
        for (int a = 0; a < RA; ++a) xr[a] = *reinterpret_cast<const float4*>(x + (ty + 16 * a) * (DP + 4) + c);
#pragma unroll
        for (int b = 0; b < RA; ++b) yr[b] = *reinterpret_cast<const float4*>(y + (tx + 16 * b) * (DP + 4) + c);
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < RA; ++b) {
                float v = s[a][b];
                v = fmaf(xr[a].x, yr[b].x, v);
                v = fmaf(xr[a].y, yr[b].y, v);
                v = fmaf(xr[a].z, yr[b].z, v);
                s[a][b] = fmaf(xr[a].w, yr[b].w, v);
            }
    }
}

// acc[a][c] += Σ_k w[ty + 16a][k] · v[k][col(tx, c)], for w a tile [*][B + 4] of weights and v a tile [B][DP + 4].
template <int RA, int DP>
__device__ __forceinline__ void accumulate(float (&acc)[RA][DP / 16], const float* w, const float* v, int ty, int tx) {
    constexpr int B = 16 * RA;
#pragma unroll 2
    for (int k = 0; k < B; k += 4) {
        float4 wr[RA];
#pragma unroll
        for (int a = 0; a < RA; ++a) wr[a] = *reinterpret_cast<const float4*>(w + (ty + 16 * a) * (B + 4) + k);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            float vr[DP / 16];
            read_cols<DP>(vr, v + (k + kk) * (DP + 4), tx);
#pragma unroll
            for (int a = 0; a < RA; ++a) {
                const float p = lane(wr[a], kk);
#pragma unroll
                for (int c = 0; c < DP / 16; ++c) acc[a][c] = fmaf(p, vr[c], acc[a][c]);
            }
        }
    }
}

// Row r (of len, d columns, `stride` apart) of dst gets thread tx's columns of acc row a, times f.
template <int RA, int DP>
__device__ __forceinline__ void store_rows(float* dst, u64 stride, u64 r0, u64 len, u64 d, const float (&acc)[RA][DP / 16],
                                           float f, int ty, int tx) {
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const u64 r = r0 + ty + 16 * a;
        if (r >= len) continue;
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) {
            const int k = col<DP>(tx, c);
            if ((u64)k < d) dst[r * stride + k] = acc[a][c] * f;
        }
    }
}

// Grid (groups, query tiles); shared: q tile, key and value tiles [B][DP + 4], weights [B][B + 4].
template <int RA, int DP>
__device__ void forward(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const float* mask, float* out, float* lse) {
    constexpr int B = 16 * RA, T = B * (DP + 4);
    extern __shared__ float4 sm4[];
    float* qs = reinterpret_cast<float*>(sm4);
    float* ks = qs + T;
    float* vs = ks + T;
    float* ps = vs + T;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 i0 = (u64)(gridDim.y - 1 - blockIdx.y) * B;  // causal: the longest tiles first
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const float c2 = scale * LOG2E;  // scores in base 2
    load_tile<B, DP>(qs, base, stride, i0, len, d);
    float acc[RA][DP / 16], m[RA], l[RA];
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        m[a] = NEG_INF, l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) acc[a][c] = 0.0f;
    }
    const u64 kend = causal ? min(len, i0 + B) : len;
    for (u64 j0 = 0; j0 < kend; j0 += B) {
        __syncthreads();  // the last tile is read
        load_tile<B, DP>(ks, base + width, stride, j0, len, d);
        load_tile<B, DP>(vs, base + 2 * width, stride, j0, len, d);
        __syncthreads();
        float s[RA][RA];
        dots<RA, DP>(s, qs, ks, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; ++a) {
            const u64 i = i0 + ty + 16 * a;
            float mx = NEG_INF;
#pragma unroll
            for (int b = 0; b < RA; ++b) {
                s[a][b] = visible(i, j0 + tx + 16 * b, len, causal, keep) ? s[a][b] * c2 : NEG_INF;
                mx = fmaxf(mx, s[a][b]);
            }
            const float mn = fmaxf(m[a], row_max(mx));
            // nothing seen yet (the same for the row's 16 threads): no weight, nothing to rescale
            const float alpha = mn == NEG_INF ? 1.0f : exp2f(m[a] - mn);
            float sum = 0.0f;
#pragma unroll
            for (int b = 0; b < RA; ++b) {
                const float p = s[a][b] == NEG_INF ? 0.0f : exp2f(s[a][b] - mn);
                ps[(ty + 16 * a) * (B + 4) + tx + 16 * b] = p;
                sum += p;
            }
            l[a] = l[a] * alpha + sum;  // this thread's share; the row's is summed at the end
#pragma unroll
            for (int c = 0; c < DP / 16; ++c) acc[a][c] *= alpha;
            m[a] = mn;
        }
        __syncthreads();
        accumulate<RA, DP>(acc, ps, vs, ty, tx);
    }
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const float total = row_sum(l[a]);
        const u64 i = i0 + ty + 16 * a;
        if (tx == 0 && i < len) lse[g * len + i] = total > 0.0f ? (m[a] + log2f(total)) / LOG2E : NEG_INF;
        l[a] = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) acc[a][c] *= l[a];
    }
    store_rows<RA, DP>(out + seq * len * width + head * d, width, i0, len, d, acc, 1.0f, ty, tx);
}

// The query gradient, and delta = rowsum(dO ∘ O) for grad_kv. Grid as the forward's; shared: q and dO tiles, key
// and value tiles, the score gradients [B][B + 4].
template <int RA, int DP>
__device__ void grad_q(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                       const float* mask, const float* out, const float* lse, const float* dout, float* delta,
                       float* dqkv) {
    constexpr int B = 16 * RA, T = B * (DP + 4);
    extern __shared__ float4 sm4[];
    float* qs = reinterpret_cast<float*>(sm4);
    float* dos = qs + T;
    float* ks = dos + T;
    float* vs = ks + T;
    float* dss = vs + T;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 i0 = (u64)(gridDim.y - 1 - blockIdx.y) * B;
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const u64 orow = seq * len * width + head * d;  // this head's column block of out and dout
    const float c2 = scale * LOG2E;
    load_tile<B, DP>(qs, base, stride, i0, len, d);
    load_tile<B, DP>(dos, dout + orow, width, i0, len, d);
    float dl[RA], l2[RA], acc[RA][DP / 16];
#pragma unroll
    for (int a = 0; a < RA; ++a) {
        const u64 i = i0 + ty + 16 * a;
        float part = 0.0f;
        if (i < len)
            for (u64 c = tx; c < d; c += 16) part = fmaf(dout[orow + i * width + c], out[orow + i * width + c], part);
        dl[a] = row_sum(part);
        if (tx == 0 && i < len) delta[g * len + i] = dl[a];
        l2[a] = i < len ? lse[g * len + i] * LOG2E : 0.0f;
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) acc[a][c] = 0.0f;
    }
    const u64 kend = causal ? min(len, i0 + B) : len;
    for (u64 j0 = 0; j0 < kend; j0 += B) {
        __syncthreads();
        load_tile<B, DP>(ks, base + width, stride, j0, len, d);
        load_tile<B, DP>(vs, base + 2 * width, stride, j0, len, d);
        __syncthreads();
        float s[RA][RA], dp[RA][RA];
        dots<RA, DP>(s, qs, ks, ty, tx);
        dots<RA, DP>(dp, dos, vs, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < RA; ++b) {
                const bool seen = visible(i0 + ty + 16 * a, j0 + tx + 16 * b, len, causal, keep);
                const float p = seen ? exp2f(s[a][b] * c2 - l2[a]) : 0.0f;
                dss[(ty + 16 * a) * (B + 4) + tx + 16 * b] = p * (dp[a][b] - dl[a]);
            }
        __syncthreads();
        accumulate<RA, DP>(acc, dss, ks, ty, tx);
    }
    store_rows<RA, DP>(dqkv + seq * len * stride + head * d, stride, i0, len, d, acc, scale, ty, tx);
}

// The key and value gradients. Grid (groups, key tiles); shared: k and v tiles, q and dO tiles, the tile's lse
// (base 2) and delta [B] each, then the weights and score gradients [B][B + 4] with keys as rows.
template <int RA, int DP>
__device__ void grad_kv(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const float* mask, const float* lse, const float* dout, const float* delta, float* dqkv) {
    constexpr int B = 16 * RA, T = B * (DP + 4), W = B * (B + 4);
    extern __shared__ float4 sm4[];
    float* ks = reinterpret_cast<float*>(sm4);
    float* vs = ks + T;
    float* qs = vs + T;
    float* dos = qs + T;
    float* ls = dos + T;
    float* dls = ls + B;
    float* pts = dls + B;
    float* dsts = pts + W;
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 j0 = (u64)blockIdx.y * B;  // causal: the first key tiles see the most queries, and go first
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const float c2 = scale * LOG2E;
    load_tile<B, DP>(ks, base + width, stride, j0, len, d);
    load_tile<B, DP>(vs, base + 2 * width, stride, j0, len, d);
    float ak[RA][DP / 16], av[RA][DP / 16];
#pragma unroll
    for (int a = 0; a < RA; ++a)
#pragma unroll
        for (int c = 0; c < DP / 16; ++c) ak[a][c] = av[a][c] = 0.0f;
    for (u64 q0 = causal ? j0 : 0; q0 < len; q0 += B) {
        __syncthreads();
        load_tile<B, DP>(qs, base, stride, q0, len, d);
        load_tile<B, DP>(dos, dout + seq * len * width + head * d, width, q0, len, d);
        for (int t = threadIdx.x; t < B; t += THREADS) {
            ls[t] = q0 + t < len ? lse[g * len + q0 + t] * LOG2E : 0.0f;
            dls[t] = q0 + t < len ? delta[g * len + q0 + t] : 0.0f;
        }
        __syncthreads();
        float s[RA][RA], dp[RA][RA];
        dots<RA, DP>(s, ks, qs, ty, tx);
        dots<RA, DP>(dp, vs, dos, ty, tx);
#pragma unroll
        for (int a = 0; a < RA; ++a)
#pragma unroll
            for (int b = 0; b < RA; ++b) {
                const int qi = tx + 16 * b;
                const bool seen = visible(q0 + qi, j0 + ty + 16 * a, len, causal, keep);
                const float p = seen ? exp2f(s[a][b] * c2 - ls[qi]) : 0.0f;
                pts[(ty + 16 * a) * (B + 4) + qi] = p;
                dsts[(ty + 16 * a) * (B + 4) + qi] = p * (dp[a][b] - dls[qi]);
            }
        __syncthreads();
        accumulate<RA, DP>(av, pts, dos, ty, tx);
        accumulate<RA, DP>(ak, dsts, qs, ty, tx);
    }
    float* dk = dqkv + seq * len * stride + width + head * d;
    store_rows<RA, DP>(dk, stride, j0, len, d, ak, scale, ty, tx);
    store_rows<RA, DP>(dk + width, stride, j0, len, d, av, 1.0f, ty, tx);
}

// Entry points per padded head width DP, with tiles of 16·RA rows: _32 and _64 for d <= 32 and 64 (tiles of 64),
// _128 and _256 (tiles of 32).
#define ATTENTION_KERNELS(DP, RA)                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) attention_forward_f32_##DP(                            \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const float* mask,  \
        float* out, float* lse) {                                                                                \
        forward<RA, DP>(len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse);                           \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) attention_grad_q_f32_##DP(                             \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const float* mask,  \
        const float* out, const float* lse, const float* dout, float* delta, float* dqkv) {                     \
        grad_q<RA, DP>(len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse, dout, delta, dqkv);         \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(THREADS) attention_grad_kv_f32_##DP(                            \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const float* mask,  \
        const float* lse, const float* dout, const float* delta, float* dqkv) {                                 \
        grad_kv<RA, DP>(len, heads, d, scale, causal, mask_rows, qkv, mask, lse, dout, delta, dqkv);             \
    }

ATTENTION_KERNELS(32, 4)
ATTENTION_KERNELS(64, 4)
ATTENTION_KERNELS(128, 2)
ATTENTION_KERNELS(256, 2)
