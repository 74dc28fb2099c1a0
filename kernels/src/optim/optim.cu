// Multi-tensor optimizer steps: one launch updates up to MT_MAX parameter ranges. Block b works on
// chunk (b - block_start[k]) of entry k; each entry has one rate pair per member (lr table).

#define MT_MAX 24
#define MT_RATES 256
#define MT_CHUNK 1024  // one float4 per thread of a 256-thread block: many blocks, every load in flight at once

// Must match MtEntry / MtTable in optim/cuda.rs.
struct MtEntry {
    u64 p, g, a, b;    // param, grad, state 1, state 2 (0 when unused)
    u64 n;             // elements
    u64 per_member;    // elements per member (n when one rate)
    u32 rate0;         // first rate pair of this entry in `rates`
    u32 pad;
};
struct MtTable {
    u32 count;
    u32 pad;
    u64 block_start[MT_MAX + 1];
    MtEntry e[MT_MAX];
    float rates[2 * MT_RATES];  // per member: (lr, lr·wd for AdamW's decoupled decay else 0)
};

// A captured step's state in device memory (set by the host before each replay): the last finished
// step, a count of finished blocks (0 between steps), and the factor the rates are scaled by (the
// learning-rate schedule's factor relative to the one at capture).
struct StepState {
    u32 last;
    u32 blocks;
    float scale;
    u32 pad;
};

__device__ __forceinline__ int mt_entry(const MtTable& t, u64 b) {
    int k = 0;
    while (k + 1 < (int)t.count && b >= t.block_start[k + 1]) ++k;
    return k;
}

// Whether a loss scaler's overflow flag (`skip`, null for none) says this update is skipped: its gradients were
// not finite. Read on the device, so that a captured step skips or updates on each replay's own gradients.
__device__ __forceinline__ bool skipped(const float* skip) { return skip && *skip != 0.0f; }

// SGD, PyTorch semantics with a zero-initialised buffer (see cpu.rs); `state` (null outside a
// captured step) scales the rates.
extern "C" __global__ void sgd_f32(MtTable t, float wd, float mom, float damp, u32 nesterov, u32 use_buf,
                                   const StepState* state, const float* skip) {
    if (skipped(skip)) return;
    const float scale = state ? state->scale : 1.0f;
    const int k = mt_entry(t, blockIdx.x);
    const MtEntry e = t.e[k];
    float* p = (float*)e.p;
    const float* g = (const float*)e.g;
    float* buf = (float*)e.a;
    const u64 start = (blockIdx.x - t.block_start[k]) * MT_CHUNK;
    const u64 end = start + MT_CHUNK < e.n ? start + MT_CHUNK : e.n;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float lr = t.rates[2 * (e.rate0 + i / e.per_member)] * scale;
        const float pv = p[i];
        float gv = g[i] + wd * pv;
        if (use_buf) {
            const float b = mom * buf[i] + damp * gv;
            buf[i] = b;
            gv = nesterov ? gv + mom * b : b;
        }
        p[i] = pv - lr * gv;
    }
}

// One Adam / AdamW element: l2 = wd for Adam (0 for AdamW, whose decay is the shrink factor).
struct AdamConsts {
    float b1, b2, one_b1, one_b2, eps, inv_sqrt_bc2, l2, inv_bc1, scale;
};
__device__ __forceinline__ void adam_one(const AdamConsts& c, float step_size, float shrink, float& p, float g,
                                         float& m, float& v) {
    const float gv = g + c.l2 * p;
    m = c.b1 * m + c.one_b1 * gv;
    v = c.b2 * v + c.one_b2 * gv * gv;
    p = p * shrink - step_size * m / (sqrtf(v) * c.inv_sqrt_bc2 + c.eps);
}

// This block's chunk of its entry; member r steps by rates[2r]·scale·inv_bc1 and shrinks by
// 1 - rates[2r+1]·scale (AdamW). Four elements per load
// where every member's range and every buffer is 16-byte aligned (a float4 then never straddles two members).
__device__ void adam_chunk(const MtTable& t, const AdamConsts& c) {
    const int k = mt_entry(t, blockIdx.x);
    const MtEntry e = t.e[k];
    float* p = (float*)e.p;
    const float* g = (const float*)e.g;
    float* m = (float*)e.a;
    float* v = (float*)e.b;
    const u64 start = (blockIdx.x - t.block_start[k]) * MT_CHUNK;
    const u64 end = start + MT_CHUNK < e.n ? start + MT_CHUNK : e.n;
    if (e.per_member % 4 == 0 && ((e.p | e.g | e.a | e.b) & 15) == 0) {
        for (u64 i = start + 4 * threadIdx.x; i < end; i += 4 * blockDim.x) {
            const u32 r = e.rate0 + (u32)(i / e.per_member);
            const float step_size = t.rates[2 * r] * c.scale * c.inv_bc1;
            const float shrink = 1.0f - t.rates[2 * r + 1] * c.scale;
            float4 pv = *(float4*)(p + i), mv = *(float4*)(m + i), vv = *(float4*)(v + i);
            const float4 gv = *(const float4*)(g + i);
            adam_one(c, step_size, shrink, pv.x, gv.x, mv.x, vv.x);
            adam_one(c, step_size, shrink, pv.y, gv.y, mv.y, vv.y);
            adam_one(c, step_size, shrink, pv.z, gv.z, mv.z, vv.z);
            adam_one(c, step_size, shrink, pv.w, gv.w, mv.w, vv.w);
            *(float4*)(p + i) = pv;
            *(float4*)(m + i) = mv;
            *(float4*)(v + i) = vv;
        }
    } else {
        for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            const u32 r = e.rate0 + (u32)(i / e.per_member);
            adam_one(c, t.rates[2 * r] * c.scale * c.inv_bc1, 1.0f - t.rates[2 * r + 1] * c.scale, p[i], g[i], m[i],
                     v[i]);
        }
    }
}

// Adam / AdamW; l2 = wd for Adam.
extern "C" __global__ void adam_f32(MtTable t, float b1, float b2, float one_b1, float one_b2, float eps,
                                    float inv_sqrt_bc2, float inv_bc1, float l2, const float* skip) {
    if (skipped(skip)) return;
    adam_chunk(t, AdamConsts{b1, b2, one_b1, one_b2, eps, inv_sqrt_bc2, l2, inv_bc1, 1.0f});
}

// 1 - beta^step, the power taken by squaring in f64: `bias_correction` in optim/mod.rs, operation for
// operation (the _rn intrinsics are never contracted into a fused multiply-add), so that the bias
// correction a replay computes here is the bits an eager step has from the host.
__device__ double bias_correction(double beta, u32 step) {
    double power = 1.0;
    while (step > 0u) {
        if (step & 1u) power = __dmul_rn(power, beta);
        beta = __dmul_rn(beta, beta);
        step >>= 1;
    }
    return __dsub_rn(1.0, power);
}

// Graph-capturable Adam: the step and the rates' scale live in device memory (`state`), so every
// replay of a captured step applies the right bias correction and schedule. The last block of the
// step's last launch (`advance`) moves the step on, counting finished blocks in `state->blocks`:
// no separate kernel on the step's critical path. A skipped update moves the step on too, as an eager one counts.
// `beta1` and `beta2` are the betas in f64, for the bias corrections (`adam_f32` has them from the host).
extern "C" __global__ void adam_f32_counted(MtTable t, float b1, float b2, float one_b1, float one_b2,
                                            float eps, float l2, double beta1, double beta2, StepState* state,
                                            u32 advance, const float* skip) {
    const u32 step = state->last + 1u;
    const float inv_bc1 = __double2float_rn(__drcp_rn(bias_correction(beta1, step)));
    const float inv_sqrt_bc2 = __double2float_rn(__drcp_rn(__dsqrt_rn(bias_correction(beta2, step))));
    if (!skipped(skip))
        adam_chunk(t, AdamConsts{b1, b2, one_b1, one_b2, eps, inv_sqrt_bc2, l2, inv_bc1, state->scale});
    if (!advance) return;
    __syncthreads();  // every thread of this block has read state->last
    // An integer count: whatever order blocks finish in, the last one moves the step on, and no float is summed.
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&state->blocks, 1u) == gridDim.x - 1) {
            state->blocks = 0;
            state->last += 1;
        }
    }
}

// Dynamic loss scaling (GradScaler's, on the device so that a captured step needs no read-back). Its state, as
// LossScaleState in optim/cuda.rs: {overflow flag, scale, clean steps in a row, skipped steps}, f32 each.

// Gradients of the scaled loss back to the loss's (times 1 / scale), each table entry's `p` a gradient; any that
// is not finite raises the overflow flag, which the optimizer kernels then read as `skip`.
extern "C" __global__ void unscale_f32(MtTable t, float* ls) {
    const float inv = 1.0f / ls[1];
    const int k = mt_entry(t, blockIdx.x);
    const MtEntry e = t.e[k];
    float* g = (float*)e.p;
    const u64 start = (blockIdx.x - t.block_start[k]) * MT_CHUNK;
    const u64 end = start + MT_CHUNK < e.n ? start + MT_CHUNK : e.n;
    bool bad = false;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float v = g[i] * inv;
        g[i] = v;
        bad |= !isfinite(v);
    }
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) ls[0] = 1.0f;
}

// After the update (or its skip): an overflow halves the scale (not below min_scale) and counts a skipped step;
// `interval` clean steps in a row double it (not above max_scale). The flag clears for the next step.
extern "C" __global__ void update_scale_f32(float* ls, float interval, float min_scale, float max_scale) {
    if (ls[0] != 0.0f) {
        ls[1] = fmaxf(ls[1] * 0.5f, min_scale);
        ls[2] = 0.0f;
        ls[3] += 1.0f;
    } else if (ls[2] + 1.0f >= interval) {
        ls[1] = fminf(ls[1] * 2.0f, max_scale);
        ls[2] = 0.0f;
    } else {
        ls[2] += 1.0f;
    }
    ls[0] = 0.0f;
}
