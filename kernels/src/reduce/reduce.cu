// Reductions of a tensor seen as [outer, d, inner] along d.
// rows kernels (inner == 1): grid (rows, splits), one block per (row, split), out[row * splits + split].
// cols kernels (inner > 1): grid (ceil(outer*inner / block), splits), one thread per (o, i) and
// split, out[(o * inner + i) * splits + split]. `chunk` is the span of d one split covers.
// A second pass over the partial results (splits > 1), a rows one, finishes; `scale` multiplies the final value.

struct SumOp {
    template <typename T> __device__ static T init() { return (T)0; }
    template <typename T> __device__ static T apply(T a, T b) { return a + b; }
};
struct MaxOp {
    template <typename T> __device__ static T init();
    template <typename T> __device__ static T apply(T a, T b) { return a > b ? a : b; }
};
template <> __device__ float MaxOp::init<float>() { return NEG_INF; }
template <> __device__ int MaxOp::init<int>() { return (int)0x80000000; }
struct MinOp {
    template <typename T> __device__ static T init();
    template <typename T> __device__ static T apply(T a, T b) { return a < b ? a : b; }
};
template <> __device__ float MinOp::init<float>() { return POS_INF; }
template <> __device__ int MinOp::init<int>() { return 0x7fffffff; }

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v) {
    __shared__ T sh[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : Op::template init<T>();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

template <typename T> __device__ __forceinline__ T scaled(T v, float s) { return v; }
template <> __device__ __forceinline__ float scaled<float>(float v, float s) { return v * s; }

template <typename T, typename Op>
__device__ void reduce_rows(u64 d, u64 chunk, const T* x, T* out, float scale) {
    const u64 row = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const u64 start = split * chunk;
    const u64 end = start + chunk < d ? start + chunk : d;
    const T* r = x + row * d;
    T acc = Op::template init<T>();
    for (u64 j = start + threadIdx.x; j < end; j += blockDim.x) acc = Op::apply(acc, r[j]);
    acc = block_reduce<T, Op>(acc);
    if (threadIdx.x == 0) out[row * splits + split] = scaled<T>(acc, scale);
}

template <typename T, typename Op>
__device__ void reduce_cols(u64 outer, u64 d, u64 inner, u64 chunk, const T* x, T* out, float scale) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * inner) return;
    const u64 o = t / inner, i = t % inner, split = blockIdx.y;
    const u64 start = split * chunk;
    const u64 end = start + chunk < d ? start + chunk : d;
    const T* base = x + o * d * inner + i;
    // Four independent accumulators keep four loads in flight per thread: with one output per thread there are
    // too few warps to hide the latency of one load at a time.
    T a0 = Op::template init<T>(), a1 = a0, a2 = a0, a3 = a0;
    u64 j = start;
    for (; j + 4 <= end; j += 4) {
        a0 = Op::apply(a0, base[j * inner]);
        a1 = Op::apply(a1, base[(j + 1) * inner]);
        a2 = Op::apply(a2, base[(j + 2) * inner]);
        a3 = Op::apply(a3, base[(j + 3) * inner]);
    }
    for (; j < end; ++j) a0 = Op::apply(a0, base[j * inner]);
    const T acc = Op::apply(Op::apply(a0, a1), Op::apply(a2, a3));
    out[(o * inner + i) * gridDim.y + split] = scaled<T>(acc, scale);
}

#define REDUCE(NAME, OP, TNAME, T)                                                                      \
    extern "C" __global__ void NAME##_rows_##TNAME(u64 d, u64 chunk, const T* x, T* out, float scale) {  \
        reduce_rows<T, OP>(d, chunk, x, out, scale);                                                    \
    }                                                                                                   \
    extern "C" __global__ void NAME##_cols_##TNAME(u64 outer, u64 d, u64 inner, u64 chunk, const T* x,  \
                                                   T* out, float scale) {                               \
        reduce_cols<T, OP>(outer, d, inner, chunk, x, out, scale);                                      \
    }
REDUCE(sum, SumOp, f32, float)
REDUCE(max, MaxOp, f32, float)
REDUCE(min, MinOp, f32, float)
REDUCE(sum, SumOp, i32, int)
REDUCE(max, MaxOp, i32, int)
REDUCE(min, MinOp, i32, int)

// argmax: the first index of the largest value (index 0 when every value is the lowest).
template <typename T>
__device__ void argmax_rows(u64 d, const T* x, int* out) {
    const T* r = x + (u64)blockIdx.x * d;
    T best = MaxOp::init<T>();
    int bi = 0x7fffffff;
    for (u64 j = threadIdx.x; j < d; j += blockDim.x) {
        const T v = r[j];
        if (v > best || (v == best && (int)j < bi)) {
            best = v;
            bi = (int)j;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    __shared__ T sv[32];
    __shared__ int si[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[w] = best;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < nw; ++k) {
            if (sv[k] > best || (sv[k] == best && si[k] < bi)) {
                best = sv[k];
                bi = si[k];
            }
        }
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

template <typename T>
__device__ void argmax_cols(u64 outer, u64 d, u64 inner, const T* x, int* out) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= outer * inner) return;
    const u64 o = t / inner, i = t % inner;
    const T* base = x + o * d * inner + i;
    T best = base[0];
    int bi = 0;
    for (u64 j = 1; j < d; ++j) {
        const T v = base[j * inner];
        if (v > best) {
            best = v;
            bi = (int)j;
        }
    }
    out[t] = bi;
}

extern "C" __global__ void argmax_rows_f32(u64 d, const float* x, int* out) { argmax_rows<float>(d, x, out); }
extern "C" __global__ void argmax_rows_i32(u64 d, const int* x, int* out) { argmax_rows<int>(d, x, out); }
extern "C" __global__ void argmax_cols_f32(u64 outer, u64 d, u64 inner, const float* x, int* out) {
    argmax_cols<float>(outer, d, inner, x, out);
}
extern "C" __global__ void argmax_cols_i32(u64 outer, u64 d, u64 inner, const int* x, int* out) {
    argmax_cols<int>(outer, d, inner, x, out);
}
