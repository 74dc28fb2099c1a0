// Element-wise binary ops with broadcasting through strides, comparisons (1/0) and where, in five modules that NVRTC
// makes side by side: f32's arithmetic (binary.cu) and comparisons (compare.cu), bf16's and f16's (half.cu), i32's
// (int.cu), and where (where.cu).
// Kernels: <op>_<dtype>(n, Strided st, a, b, out); st.s[0] = a's strides, st.s[1] = b's.
// st.flags: 1 (every operand contiguous) takes the plain index path; 2 (the float types, aligned, n % 4 == 0) moves
// four elements per access.

template <typename T, typename F>
__device__ __forceinline__ void binary_apply(u64 n, const Strided& st, const T* a, const T* b, T* out, F f) {
    if (st.flags & 1) {
        GRID_STRIDE(i, n) { out[i] = f(a[i], b[i]); }
    } else {
        GRID_STRIDE(i, n) {
            u64 oa, ob, oc;
            strided_offsets(st, i, &oa, &ob, &oc);
            out[i] = f(a[oa], b[ob]);
        }
    }
}

// The float types (f32, and bf16 and f16 for activations kept in the low type), computed in f32; flag bit 1 (host:
// contiguous, aligned for four elements, n % 4 == 0) moves four elements per access.
template <typename T, typename F>
__device__ __forceinline__ void binary_apply_float(u64 n, const Strided& st, const T* a, const T* b, T* out, F f) {
    if (st.flags & 2) {
        GRID_STRIDE(i, n / 4) {
            const float4 x = load4(a, i), y = load4(b, i);
            store4(out, i, make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w)));
        }
    } else {
        binary_apply<T>(n, st, a, b, out, [=](T x, T y) -> T { return from_f32<T>(f(to_f32(x), to_f32(y))); });
    }
}

#define BINARY_AS(NAME, SUFFIX, T, EXPR)                                                             \
    extern "C" __global__ void NAME##_##SUFFIX(u64 n, Strided st, const T* a, const T* b, T* out) {  \
        binary_apply_float<T>(n, st, a, b, out, [](float x, float y) -> float { return (EXPR); });  \
    }
#define BINARY_F32(NAME, EXPR) BINARY_AS(NAME, f32, float, EXPR)
#define BINARY_16(NAME, EXPR) BINARY_AS(NAME, bf16, bf16_t, EXPR) BINARY_AS(NAME, f16, f16_t, EXPR)
#define BINARY_I32(NAME, EXPR)                                                                       \
    extern "C" __global__ void NAME##_i32(u64 n, Strided st, const int* a, const int* b, int* out) {     \
        binary_apply<int>(n, st, a, b, out, [](int x, int y) -> int { return (EXPR); });        \
    }

// where: out[i] = mask != 0 ? t : f, each operand with its own strides (s[0] mask, s[1] t, s[2] f).
#define WHERE(MNAME, M, TNAME, T)                                                                    \
    extern "C" __global__ void where_##MNAME##_##TNAME(u64 n, Strided st, const M* mask, const T* t,  \
                                                       const T* f, T* out) {                           \
        if (st.flags & 1) {                                                                            \
            GRID_STRIDE(i, n) { out[i] = mask[i] != (M)0 ? t[i] : f[i]; }                              \
        } else {                                                                                       \
            GRID_STRIDE(i, n) {                                                                        \
                u64 om, ot, of;                                                                        \
                strided_offsets(st, i, &om, &ot, &of);                                                 \
                out[i] = mask[om] != (M)0 ? t[ot] : f[of];                                             \
            }                                                                                          \
        }                                                                                              \
    }
