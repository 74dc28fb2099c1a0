// Fused self-attention over a packed qkv ([n, L, 3, heads, d]), flash-style (see attention/mod.rs).
//
// One warp per query row (forward, dq) or key row (dk, dv); a block's warps share tiles of keys (or queries) in
// shared memory, so scores are never stored. Lane c owns columns c, c + 32, ... of its row (DPL of them); lane t
// scores key (or query) t of a tile. Tiles of rows read per lane are stored with an odd stride, so the 32 lanes
// reading row t's column c hit 32 banks. No atomics: every output element has one writer, so results are the
// same from run to run.

#define FULL 0xffffffffu

// Does query i see key j? keep: the sequence's row of the key-padding mask, or null.
__device__ __forceinline__ bool visible(u64 i, u64 j, u64 len, int causal, const float* keep) {
    return i < len && j < len && !(causal && j > i) && !(keep && keep[j] == 0.0f);
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, u64 d) {
    float s = 0.0f;
    for (u64 c = 0; c < d; ++c) s = fmaf(a[c], b[c], s);
    return s;
}

// rows x d of a buffer whose positions are `stride` apart, from position r0, into shared memory with row stride
// `sst`; rows past the end are zero.
__device__ __forceinline__ void load_rows(float* dst, u64 sst, const float* src, u64 stride, u64 r0, u64 rows,
                                          u64 d, u64 len) {
    for (u64 t = threadIdx.x; t < rows * d; t += blockDim.x) {
        const u64 r = t / d, c = t % d;
        dst[r * sst + c] = r0 + r < len ? src[(r0 + r) * stride + c] : 0.0f;
    }
}

// Grid (groups, query blocks); block ROWS warps. Shared: q rows [ROWS, d], key tile [KT, d|1], value tile [KT, d].
template <int DPL, int KT>
__device__ void forward(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const float* mask, float* out, float* lse) {
    extern __shared__ float sm[];
    const u64 rows = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32, kst = d | 1;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 i0 = (u64)blockIdx.y * rows, i = i0 + w;
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    float* qs = sm;
    float* ks = qs + rows * d;
    float* vs = ks + KT * kst;
    load_rows(qs, d, base, stride, i0, rows, d, len);
    float acc[DPL];
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[c] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    const u64 kend = causal ? min(len, i0 + rows) : len;
    for (u64 j0 = 0; j0 < kend; j0 += KT) {
        __syncthreads();  // the last tile is read
        load_rows(ks, kst, base + width, stride, j0, KT, d, len);
        load_rows(vs, d, base + 2 * width, stride, j0, KT, d, len);
        __syncthreads();
        float s = NEG_INF;
        if (lane < KT && visible(i, j0 + lane, len, causal, keep)) s = dot_rows(qs + w * d, ks + lane * kst, d) * scale;
        const float mn = fmaxf(m, warp_max(s));
        if (mn == NEG_INF) continue;  // nothing seen yet: the same for the whole warp
        const float alpha = expf(m - mn), p = s == NEG_INF ? 0.0f : expf(s - mn);
        l = l * alpha + warp_sum(p);
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[c] *= alpha;
        for (int t = 0; t < KT; ++t) {
            const float pt = __shfl_sync(FULL, p, t);
            const float* vr = vs + t * d;
#pragma unroll
            for (int c = 0; c < DPL; ++c) {
                const u64 col = lane + 32 * c;
                if (col < d) acc[c] = fmaf(pt, vr[col], acc[c]);
            }
        }
        m = mn;
    }
    if (i >= len) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = out + (seq * len + i) * width + head * d;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
        const u64 col = lane + 32 * c;
        if (col < d) o[col] = acc[c] * inv;
    }
    if (lane == 0) lse[g * len + i] = l > 0.0f ? m + logf(l) : NEG_INF;
}

// The query gradient, and delta = rowsum(dO ∘ O) for dkv. Grid and block as the forward's. Shared: q and dO rows
// [ROWS, d] each, key and value tiles [KT, d|1] each.
template <int DPL, int KT>
__device__ void grad_q(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                       const float* mask, const float* out, const float* lse, const float* dout, float* delta,
                       float* dqkv) {
    extern __shared__ float sm[];
    const u64 rows = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32, kst = d | 1;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 i0 = (u64)blockIdx.y * rows, i = i0 + w;
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const u64 orow = seq * len * width + head * d;  // this head's column block of out and dout
    float* qs = sm;
    float* dos = qs + rows * d;
    float* ks = dos + rows * d;
    float* vs = ks + KT * kst;
    load_rows(qs, d, base, stride, i0, rows, d, len);
    load_rows(dos, d, dout + orow, width, i0, rows, d, len);
    float dl = 0.0f;
    if (i < len)
        for (u64 c = lane; c < d; c += 32) dl = fmaf(dout[orow + i * width + c], out[orow + i * width + c], dl);
    dl = warp_sum(dl);
    if (i < len && lane == 0) delta[g * len + i] = dl;
    const float li = i < len ? lse[g * len + i] : 0.0f;
    float acc[DPL];
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[c] = 0.0f;
    const u64 kend = causal ? min(len, i0 + rows) : len;
    for (u64 j0 = 0; j0 < kend; j0 += KT) {
        __syncthreads();
        load_rows(ks, kst, base + width, stride, j0, KT, d, len);
        load_rows(vs, kst, base + 2 * width, stride, j0, KT, d, len);
        __syncthreads();
        float ds = 0.0f;
        if (lane < KT && visible(i, j0 + lane, len, causal, keep)) {
            const float p = expf(dot_rows(qs + w * d, ks + lane * kst, d) * scale - li);
            ds = p * (dot_rows(dos + w * d, vs + lane * kst, d) - dl);
        }
        for (int t = 0; t < KT; ++t) {
            const float dt = __shfl_sync(FULL, ds, t);
            const float* kr = ks + t * kst;
#pragma unroll
            for (int c = 0; c < DPL; ++c) {
                const u64 col = lane + 32 * c;
                if (col < d) acc[c] = fmaf(dt, kr[col], acc[c]);
            }
        }
    }
    if (i >= len) return;
    float* dq = dqkv + seq * len * stride + i * stride + head * d;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
        const u64 col = lane + 32 * c;
        if (col < d) dq[col] = acc[c] * scale;
    }
}

// The key and value gradients. Grid (groups, key blocks); block ROWS warps, one per key. Shared: k and v rows
// [ROWS, d] each, query and dO tiles [KT, d|1] each, the tile's lse and delta [KT] each.
template <int DPL, int KT>
__device__ void grad_kv(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const float* mask, const float* lse, const float* dout, const float* delta, float* dqkv) {
    extern __shared__ float sm[];
    const u64 rows = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x % 32, kst = d | 1;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 j0 = (u64)blockIdx.y * rows, j = j0 + w;
    const float* base = qkv + seq * len * stride + head * d;
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    float* kr = sm;
    float* vr = kr + rows * d;
    float* qs = vr + rows * d;
    float* dos = qs + KT * kst;
    float* ls = dos + KT * kst;
    float* dls = ls + KT;
    load_rows(kr, d, base + width, stride, j0, rows, d, len);
    load_rows(vr, d, base + 2 * width, stride, j0, rows, d, len);
    float ak[DPL], av[DPL];
#pragma unroll
    for (int c = 0; c < DPL; ++c) ak[c] = av[c] = 0.0f;
    for (u64 q0 = causal ? j0 : 0; q0 < len; q0 += KT) {
        __syncthreads();
        load_rows(qs, kst, base, stride, q0, KT, d, len);
        load_rows(dos, kst, dout + seq * len * width + head * d, width, q0, KT, d, len);
        for (u64 t = threadIdx.x; t < KT; t += blockDim.x) {
            ls[t] = q0 + t < len ? lse[g * len + q0 + t] : 0.0f;
            dls[t] = q0 + t < len ? delta[g * len + q0 + t] : 0.0f;
        }
        __syncthreads();
        float p = 0.0f, ds = 0.0f;
        if (lane < KT && visible(q0 + lane, j, len, causal, keep)) {
            p = expf(dot_rows(qs + lane * kst, kr + w * d, d) * scale - ls[lane]);
            ds = p * (dot_rows(dos + lane * kst, vr + w * d, d) - dls[lane]);
        }
        for (int t = 0; t < KT; ++t) {
            const float pt = __shfl_sync(FULL, p, t), dt = __shfl_sync(FULL, ds, t);
#pragma unroll
            for (int c = 0; c < DPL; ++c) {
                const u64 col = lane + 32 * c;
                if (col < d) {
                    av[c] = fmaf(pt, dos[t * kst + col], av[c]);
                    ak[c] = fmaf(dt, qs[t * kst + col], ak[c]);
                }
            }
        }
    }
    if (j >= len) return;
    float* dk = dqkv + seq * len * stride + j * stride + width + head * d;
#pragma unroll
    for (int c = 0; c < DPL; ++c) {
        const u64 col = lane + 32 * c;
        if (col < d) {
            dk[col] = ak[c] * scale;
            dk[width + col] = av[c];
        }
    }
}

// Entry points per head width: _64 for d <= 64 (2 columns a lane), _128, _256 (tiles of 16).
#define ATTENTION_KERNELS(SUFFIX, DPL, KT)                                                                        \
    extern "C" __global__ void attention_forward_f32##SUFFIX(u64 len, u64 heads, u64 d, float scale, int causal, \
                                                             u64 mask_rows, const float* qkv, const float* mask, \
                                                             float* out, float* lse) {                           \
        forward<DPL, KT>(len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse);                          \
    }                                                                                                            \
    extern "C" __global__ void attention_grad_q_f32##SUFFIX(                                                     \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const float* mask,  \
        const float* out, const float* lse, const float* dout, float* delta, float* dqkv) {                     \
        grad_q<DPL, KT>(len, heads, d, scale, causal, mask_rows, qkv, mask, out, lse, dout, delta, dqkv);        \
    }                                                                                                            \
    extern "C" __global__ void attention_grad_kv_f32##SUFFIX(                                                    \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const float* mask,  \
        const float* lse, const float* dout, const float* delta, float* dqkv) {                                 \
        grad_kv<DPL, KT>(len, heads, d, scale, causal, mask_rows, qkv, mask, lse, dout, delta, dqkv);            \
    }

ATTENTION_KERNELS(_64, 2, 32)
ATTENTION_KERNELS(_128, 4, 32)
ATTENTION_KERNELS(_256, 8, 16)
