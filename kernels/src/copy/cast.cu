// Casts between f32, f16, bf16, i32 and u8: cast_<from>_<to>(n, src, dst).
// Every value goes through double, like the CPU's to_f64 / from_f64: float to integer truncates
// toward zero and saturates, NaN gives 0; to f16 / bf16 rounds to nearest even.
// Between the float types, cast4_<from>_<to>(n4, src, dst) moves four elements per load and store (one 16-byte
// f32 or 8-byte 16-bit access): a mixed policy casts every activation and weight, and the one-element form
// reached a quarter of the memory bandwidth.

__device__ __forceinline__ double load_f32(const float* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double load_f16(const u16* p, u64 i) { return (double)f16_to_f32(p[i]); }
__device__ __forceinline__ double load_bf16(const u16* p, u64 i) { return (double)bf16_to_f32(p[i]); }
__device__ __forceinline__ double load_i32(const int* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double load_u8(const u8* p, u64 i) { return (double)p[i]; }

__device__ __forceinline__ void store_f32(float* p, u64 i, double v) { p[i] = (float)v; }
__device__ __forceinline__ void store_f16(u16* p, u64 i, double v) { p[i] = f32_to_f16((float)v); }
__device__ __forceinline__ void store_bf16(u16* p, u64 i, double v) { p[i] = f32_to_bf16((float)v); }
__device__ __forceinline__ void store_i32(int* p, u64 i, double v) {
    p[i] = v != v ? 0 : (v <= -2147483648.0 ? (int)0x80000000 : (v >= 2147483647.0 ? 0x7fffffff : (int)v));
}
__device__ __forceinline__ void store_u8(u8* p, u64 i, double v) {
    p[i] = v != v ? 0 : (v <= 0.0 ? 0 : (v >= 255.0 ? 255 : (u8)v));
}

#define CAST(FROM, FT, TO, TT)                                                                        \
    extern "C" __global__ void cast_##FROM##_##TO(u64 n, const FT* src, TT* dst) {                   \
        GRID_STRIDE(i, n) { store_##TO(dst, i, load_##FROM(src, i)); }                                \
    }
#define CAST_FROM(FROM, FT)                                                                           \
    CAST(FROM, FT, f32, float)                                                                        \
    CAST(FROM, FT, f16, u16)                                                                          \
    CAST(FROM, FT, bf16, u16)                                                                         \
    CAST(FROM, FT, i32, int)                                                                          \
    CAST(FROM, FT, u8, u8)
CAST_FROM(f32, float)
CAST_FROM(f16, u16)
CAST_FROM(bf16, u16)
CAST_FROM(i32, int)
CAST_FROM(u8, u8)

// Four elements through float (common.cuh's ld4 / st4), exact for the float types: f16 and bf16 widen to f32
// without rounding.
#define CAST4(FROM, FT, TO, TT)                                                                       \
    extern "C" __global__ void cast4_##FROM##_##TO(u64 n4, const FT* src, TT* dst) {                 \
        GRID_STRIDE(i, n4) { store4(dst, i, load4(src, i)); }                                              \
    }
CAST4(f32, float, f16, f16_t)
CAST4(f32, float, bf16, bf16_t)
CAST4(f16, f16_t, f32, float)
CAST4(bf16, bf16_t, f32, float)
CAST4(f16, f16_t, bf16, bf16_t)
CAST4(bf16, bf16_t, f16, f16_t)
