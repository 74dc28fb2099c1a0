// Helpers shared by every kernel source; prepended to each .cu file before NVRTC compiles it.
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define MAX_RANK 8
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)

// Must match StridedShape in gpu.rs: an iteration shape and up to three stride sets (elements).
struct Strided {
    u32 rank;
    u32 flags;  // bit 0: all operands contiguous
    u64 shape[MAX_RANK];
    u64 s[3][MAX_RANK];
};

// Offsets of linear (row-major) index i in each of the three stride sets.
__device__ __forceinline__ void strided_offsets(const Strided& st, u64 i, u64* o0, u64* o1, u64* o2) {
    u64 a = 0, b = 0, c = 0;
#pragma unroll
    for (int k = 0; k < MAX_RANK; ++k) {
        const int d = MAX_RANK - 1 - k;
        if (d < (int)st.rank) {
            const u64 dim = st.shape[d];
            const u64 idx = i % dim;
            i /= dim;
            a += idx * st.s[0][d];
            b += idx * st.s[1][d];
            c += idx * st.s[2][d];
        }
    }
    *o0 = a;
    *o1 = b;
    *o2 = c;
}

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// Index errors: the first one is recorded in a 4-word flag the host reads at its next sync.
#define OP_INDEX_SELECT 0
#define OP_INDEX_ADD 1
#define OP_GATHER_LAST 2
#define OP_ONE_HOT 3
#define OP_MAX_POOL_BACKWARD 4
#define OP_SCATTER_ADD_LAST 5
#define OP_CROSS_ENTROPY 6
#define OP_BAG_MEAN 7
#define OP_CONV_POOLED 8
__device__ __forceinline__ void report_index_error(int* flag, int op, i64 index, i64 size) {
    if (atomicCAS(flag, 0, 1) == 0) {
        flag[1] = op;
        flag[2] = (int)index;
        flag[3] = (int)size;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum / max; blockDim.x must be a multiple of 32. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float sh[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : NEG_INF;
        v = warp_max(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// Half-precision conversions without cuda_fp16.h (round to nearest even, like the `half` crate).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// The float element types a kernel template takes, each computed in f32: f32 itself and the two 16-bit storage
// types (distinct structs, so that overloads tell bf16 from f16). to_f32 / from_f32 convert one element, load4 /
// store4 move four (a float4, or 8 bytes of a 16-bit type: the caller checks alignment).
struct bf16_t { u16 bits; };
struct f16_t { u16 bits; };
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return bf16_to_f32(v.bits); }
__device__ __forceinline__ float to_f32(f16_t v) { return f16_to_f32(v.bits); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) { return bf16_t{f32_to_bf16(v)}; }
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float v) { return f16_t{f32_to_f16(v)}; }

__device__ __forceinline__ float4 load4(const float* p, u64 i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 load4(const bf16_t* p, u64 i) {
    const uint2 v = reinterpret_cast<const uint2*>(p)[i];
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}
__device__ __forceinline__ float4 load4(const f16_t* p, u64 i) {
    const uint2 v = reinterpret_cast<const uint2*>(p)[i];
    return make_float4(f16_to_f32(v.x & 0xffffu), f16_to_f32(v.x >> 16), f16_to_f32(v.y & 0xffffu),
                       f16_to_f32(v.y >> 16));
}
__device__ __forceinline__ void store4(float* p, u64 i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ void store4(bf16_t* p, u64 i, float4 v) {
    reinterpret_cast<uint2*>(p)[i] = make_uint2((u32)f32_to_bf16(v.x) | (u32)f32_to_bf16(v.y) << 16,
                                                (u32)f32_to_bf16(v.z) | (u32)f32_to_bf16(v.w) << 16);
}
__device__ __forceinline__ void store4(f16_t* p, u64 i, float4 v) {
    reinterpret_cast<uint2*>(p)[i] = make_uint2((u32)f32_to_f16(v.x) | (u32)f32_to_f16(v.y) << 16,
                                                (u32)f32_to_f16(v.z) | (u32)f32_to_f16(v.w) << 16);
}
