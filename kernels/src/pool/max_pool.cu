// 2-D max pooling without padding; idx holds the flat in-plane index (y·w + x) of each max.

template <typename T>
__device__ __forceinline__ void max_pool(u64 planes, u64 h, u64 w, u64 k, u64 stride, u64 oh, u64 ow, const T* x,
                                         T* out, int* idx) {
    const u64 n = planes * oh * ow;
    GRID_STRIDE(t, n) {
        const u64 ox = t % ow, oy = (t / ow) % oh, pl = t / (ow * oh);
        const T* src = x + pl * h * w;
        float best = 0.0f;
        int bi = 0;
        bool first = true;
        for (u64 ky = 0; ky < k; ++ky) {
            const u64 y = oy * stride + ky;
            for (u64 kx = 0; kx < k; ++kx) {
                const u64 xx = ox * stride + kx;
                const float v = to_f32(src[y * w + xx]);
                if (first || v > best) {
                    best = v;
                    bi = (int)(y * w + xx);
                    first = false;
                }
            }
        }
        out[t] = from_f32<T>(best);
        idx[t] = bi;
    }
}

// Windows that tile the planes (stride k, h and w multiples of k: the usual 2x2 pools), a thread per window with
// 32-bit index math (the host checks that planes·h·w fits): n windows, ow of them a row, ohw a plane. The generic
// kernels' 64-bit divisions per element cost them most of their time.
#define FOR_WINDOW(t, n) for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < (n); t += gridDim.x * blockDim.x)

// With a bias (f32, one per channel of `channels`; null: none), each max then gets its channel's bias and a ReLU
// (NaN gives 0), as conv_epilogue would make them in a pass of its own: a convolution's bias and ReLU moved after
// the pool that follows it.
template <typename T>
__device__ __forceinline__ void max_pool_tiled(u32 n, u32 w, u32 k, u32 ow, u32 ohw, u32 channels, const float* bias,
                                               const T* x, T* out, int* idx) {
    FOR_WINDOW(t, n) {
        const u32 pl = t / ohw, oy = (t - pl * ohw) / ow, ox = t - pl * ohw - oy * ow;
        const T* src = x + (u64)pl * ohw * k * k;
        float best = 0.0f;
        u32 bi = 0;
        bool first = true;
        for (u32 y = oy * k; y < oy * k + k; ++y) {
            for (u32 xx = ox * k; xx < ox * k + k; ++xx) {
                const float v = to_f32(src[y * w + xx]);
                if (first || v > best) {
                    best = v;
                    bi = y * w + xx;
                    first = false;
                }
            }
        }
        if (bias) {
            const float v = best + bias[pl % channels];
            best = v > 0.0f ? v : 0.0f;
        }
        out[t] = from_f32<T>(best);
        idx[t] = (int)bi;
    }
}

#define MAX_POOL(SUFFIX, T)                                                                                   \
    extern "C" __global__ void max_pool2d_##SUFFIX(u64 planes, u64 h, u64 w, u64 k, u64 stride, u64 oh, u64 ow, \
                                                   const T* x, T* out, int* idx) {                             \
        max_pool<T>(planes, h, w, k, stride, oh, ow, x, out, idx);                                              \
    }                                                                                                         \
    extern "C" __global__ void max_pool2d_tiled_##SUFFIX(u32 n, u32 w, u32 k, u32 ow, u32 ohw, u32 channels,    \
                                                         const float* bias, const T* x, T* out, int* idx) {    \
        max_pool_tiled<T>(n, w, k, ow, ohw, channels, bias, x, out, idx);                                       \
    }
MAX_POOL(f32, float)
MAX_POOL(bf16, bf16_t)
MAX_POOL(f16, f16_t)

// The backward of windows that do not overlap (stride >= k), for the 16-bit types: each input element lies in at
// most one window, so it gathers its gradient (that window's where it was the max, else 0): no zeroed output, no
// atomics, the same bits every run. The thread of a window's first element checks the window's index.
template <typename T>
__device__ __forceinline__ void max_pool_backward_gather(u64 planes, u64 h, u64 w, u64 k, u64 stride, u64 oh,
                                                         u64 ow, const T* g, const int* idx, T* gin, int* flag) {
    GRID_STRIDE(t, planes * h * w) {
        const u64 xx = t % w, y = (t / w) % h, pl = t / (w * h);
        const u64 oy = y / stride, ox = xx / stride;
        T v = from_f32<T>(0.0f);
        if (oy < oh && ox < ow && y - oy * stride < k && xx - ox * stride < k) {
            const u64 o = (pl * oh + oy) * ow + ox;
            const int i = idx[o];
            if (i < 0 || (u64)i >= h * w) {
                if (y == oy * stride && xx == ox * stride) report_index_error(flag, OP_MAX_POOL_BACKWARD, i, (i64)(h * w));
            } else if ((u64)i == y * w + xx) {
                v = g[o];
            }
        }
        gin[t] = v;
    }
}

// The same over tiling windows (see max_pool_tiled), for every float type: a thread per window writes its k x k
// elements.
template <typename T>
__device__ __forceinline__ void max_pool_backward_tiled(u32 n, u32 w, u32 k, u32 ow, u32 ohw, const T* g,
                                                        const int* idx, T* gin, int* flag) {
    FOR_WINDOW(t, n) {
        const u32 pl = t / ohw, oy = (t - pl * ohw) / ow, ox = t - pl * ohw - oy * ow, hw = ohw * k * k;
        const int i = idx[t];
        if (i < 0 || (u32)i >= hw) report_index_error(flag, OP_MAX_POOL_BACKWARD, i, (i64)hw);
        const T v = g[t], zero = from_f32<T>(0.0f);
        T* dst = gin + (u64)pl * hw;
        for (u32 y = oy * k; y < oy * k + k; ++y)
            for (u32 xx = ox * k; xx < ox * k + k; ++xx) dst[y * w + xx] = (u32)i == y * w + xx ? v : zero;
    }
}

#define MAX_POOL_BACKWARD_GATHER(SUFFIX, T)                                                                     \
    extern "C" __global__ void max_pool2d_backward_gather_##SUFFIX(u64 planes, u64 h, u64 w, u64 k, u64 stride,  \
                                                                   u64 oh, u64 ow, const T* g, const int* idx,   \
                                                                   T* gin, int* flag) {                          \
        max_pool_backward_gather<T>(planes, h, w, k, stride, oh, ow, g, idx, gin, flag);                        \
    }
MAX_POOL_BACKWARD_GATHER(bf16, bf16_t)
MAX_POOL_BACKWARD_GATHER(f16, f16_t)

#define MAX_POOL_BACKWARD_TILED(SUFFIX, T)                                                                     \
    extern "C" __global__ void max_pool2d_backward_tiled_##SUFFIX(u32 n, u32 w, u32 k, u32 ow, u32 ohw,        \
                                                                  const T* g, const int* idx, T* gin, int* flag) { \
        max_pool_backward_tiled<T>(n, w, k, ow, ohw, g, idx, gin, flag);                                        \
    }
MAX_POOL_BACKWARD_TILED(f32, float)
MAX_POOL_BACKWARD_TILED(bf16, bf16_t)
MAX_POOL_BACKWARD_TILED(f16, f16_t)

// grad_in (zeroed by the host) [planes, hw_in] += grad_out routed by idx. Where windows overlap, several outputs
// add into one input element, in whatever order their threads arrive: the bits vary from run to run.
extern "C" __global__ void max_pool2d_backward_f32(u64 planes, u64 hw_in, u64 hw_out, const float* g,
                                                   const int* idx, float* gin, int* flag) {
    const u64 n = planes * hw_out;
    GRID_STRIDE(t, n) {
        const int i = idx[t];
        if (i < 0 || (u64)i >= hw_in) {
            report_index_error(flag, OP_MAX_POOL_BACKWARD, i, (i64)hw_in);
        } else {
            atomicAdd(&gin[(t / hw_out) * hw_in + (u64)i], g[t]);
        }
    }
}

// The same in a fixed order (deterministic mode). A warp per plane walks its outputs in order, 32 at a time; the
// lanes that route to one input element (__match_any_sync) leave the adding to the lowest of them, which adds their
// gradients in lane order to what earlier rounds left there. Every input element thus sums its gradients in output
// order, as the CPU kernel does: the CPU's bits, whatever the scheduling. Needs no window geometry.
extern "C" __global__ void max_pool2d_backward_ordered_f32(u64 planes, u64 hw_in, u64 hw_out, const float* g,
                                                           const int* idx, float* gin, int* flag) {
    const unsigned lane = threadIdx.x & 31;
    // blockDim.x is a multiple of 32, so a warp's lanes share `pl` and every loop below runs warp-wide.
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 pl = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; pl < planes; pl += warps) {
        const int* ix = idx + pl * hw_out;
        const float* go = g + pl * hw_out;
        float* gi = gin + pl * hw_in;
        for (u64 base = 0; base < hw_out; base += 32) {
            const u64 t = base + lane;
            int i = -1;  // routes nowhere
            float v = 0.0f;
            if (t < hw_out) {
                i = ix[t];
                v = go[t];
                if (i < 0 || (u64)i >= hw_in) {
                    report_index_error(flag, OP_MAX_POOL_BACKWARD, i, (i64)hw_in);
                    i = -1;
                }
            }
            const unsigned peers = __match_any_sync(0xffffffffu, i);
            const bool head = i >= 0 && (unsigned)(__ffs(peers) - 1) == lane;
            float acc = head ? gi[i] : 0.0f;
            for (int src = 0; src < 32; ++src) {
                const float s = __shfl_sync(0xffffffffu, v, src);
                if (head && ((peers >> src) & 1u)) acc += s;
            }
            if (head) gi[i] = acc;
            __syncwarp();  // the next round's heads read what this one wrote
        }
    }
}
