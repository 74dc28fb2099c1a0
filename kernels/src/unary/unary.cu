// Element-wise unary float ops: <op>_<type>(n, vec, p, x, out), p the op's scalar (0 when it has none); f32 for
// every op, bf16 and f16 (activations kept in the low type under a mixed policy) for ReLU. Flag `vec` (host: x and
// out aligned for four elements, n % 4 == 0) moves four elements per access.

template <typename T, typename F>
__device__ __forceinline__ void unary_apply(u64 n, u32 vec, const T* x, T* out, F f) {
    if (vec) {
        GRID_STRIDE(i, n / 4) {
            const float4 v = load4(x, i);
            store4(out, i, make_float4(f(v.x), f(v.y), f(v.z), f(v.w)));
        }
    } else {
        GRID_STRIDE(i, n) { out[i] = from_f32<T>(f(to_f32(x[i]))); }
    }
}

#define UNARY_AS(NAME, SUFFIX, T, EXPR)                                                            \
    extern "C" __global__ void NAME##_##SUFFIX(u64 n, u32 vec, float p, const T* x, T* out) {     \
        unary_apply<T>(n, vec, x, out, [=](float v) -> float { return (EXPR); });                  \
    }
#define UNARY(NAME, EXPR) UNARY_AS(NAME, f32, float, EXPR)

__device__ __forceinline__ float gelu_tanh(float v) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

UNARY(neg, -v)
UNARY(relu, v > 0.0f ? v : 0.0f)
UNARY(gelu, gelu_tanh(v))
UNARY(tanh, tanhf(v))
UNARY(sigmoid, 1.0f / (1.0f + expf(-v)))
UNARY(exp, expf(v))
UNARY(log, logf(v))
UNARY(sqrt, sqrtf(v))
UNARY(abs, fabsf(v))
UNARY(square, v * v)
UNARY(add_scalar, v + p)
UNARY(mul_scalar, v * p)
UNARY(powf, powf(v, p))
UNARY(gt_scalar, v > p ? 1.0f : 0.0f)
UNARY(lt_scalar, v < p ? 1.0f : 0.0f)
UNARY_AS(relu, bf16, bf16_t, v > 0.0f ? v : 0.0f)
UNARY_AS(relu, f16, f16_t, v > 0.0f ? v : 0.0f)

// Linear's bias, and a ReLU, in one pass: y = x + b (then max(y, 0)), with b [groups, cols] and x [groups, rows,
// cols] (element i takes b[(i / group) * cols + i % cols], group = rows * cols). The x4 forms, for cols a multiple
// of 4 and 16-byte aligned buffers, move four elements per load, which share a bias row.
template <bool RELU>
__device__ __forceinline__ float bias_act(float v) { return RELU && !(v > 0.0f) ? 0.0f : v; }

template <bool RELU>
__device__ __forceinline__ void bias_rows(u64 n, u64 cols, u64 group, const float* x, const float* b, float* y) {
    GRID_STRIDE(i, n) y[i] = bias_act<RELU>(x[i] + b[(i / group) * cols + i % cols]);
}

template <bool RELU>
__device__ __forceinline__ void bias_rows4(u64 n, u64 cols, u64 group, const float* x, const float* b, float* y) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    GRID_STRIDE(k, n / 4) {
        const u64 i = 4 * k;
        const float4 v = x4[k], c = *reinterpret_cast<const float4*>(b + (i / group) * cols + i % cols);
        y4[k] = make_float4(bias_act<RELU>(v.x + c.x), bias_act<RELU>(v.y + c.y), bias_act<RELU>(v.z + c.z),
                            bias_act<RELU>(v.w + c.w));
    }
}

#define BIAS_KERNELS(NAME, RELU)                                                                                  \
    extern "C" __global__ void NAME##_f32(u64 n, u64 cols, u64 group, const float* x, const float* b, float* y) { \
        bias_rows<RELU>(n, cols, group, x, b, y);                                                                 \
    }                                                                                                             \
    extern "C" __global__ void NAME##_f32x4(u64 n, u64 cols, u64 group, const float* x, const float* b,           \
                                            float* y) {                                                           \
        bias_rows4<RELU>(n, cols, group, x, b, y);                                                                \
    }
BIAS_KERNELS(bias_relu, true)
BIAS_KERNELS(bias_add, false)

// GELU's (tanh form) backward from its input, in one pass: dx = dy * d/dx 0.5 x (1 + tanh(u)), u = c (x + k x^3).
extern "C" __global__ void gelu_backward_f32(u64 n, const float* dy, const float* x, float* dx) {
    const float c = 0.7978845608028654f, k = 0.044715f;  // sqrt(2 / pi)
    GRID_STRIDE(i, n) {
        const float v = x[i], v2 = v * v, t = tanhf(c * v * (1.0f + k * v2));
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * c * (1.0f + 3.0f * k * v2));
    }
}

// ReLU's backward from its output: dx = y > 0 ? dy : 0 (for the 16-bit types, on their bits: a positive value has
// the sign bit clear and is not zero, and NaN's bits are above infinity's).
extern "C" __global__ void relu_backward_f32(u64 n, const float* dy, const float* y, float* dx) {
    GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}
template <u16 INF>
__device__ __forceinline__ void relu_backward_16(u64 n, const u16* dy, const u16* y, u16* dx) {
    GRID_STRIDE(i, n) {
        const u16 v = y[i];
        dx[i] = v != 0 && v <= INF ? dy[i] : (u16)0;
    }
}
extern "C" __global__ void relu_backward_bf16(u64 n, const u16* dy, const u16* y, u16* dx) {
    relu_backward_16<0x7f80>(n, dy, y, dx);
}
extern "C" __global__ void relu_backward_f16(u64 n, const u16* dy, const u16* y, u16* dx) {
    relu_backward_16<0x7c00>(n, dy, y, dx);
}

// ReLU's backward and its bias's gradient in one pass, for dy and y [groups, rows, cols]:
// dx = y > 0 ? dy : 0 and db[g][c] = sum over rows of dx. A block of 32 x 32 threads covers 32
// columns of one group (blockIdx.y); each thread sums every 32nd row, then the block adds up.
extern "C" __global__ void relu_backward_bias_f32(u64 rows, u64 cols, const float* dy, const float* y, float* dx,
                                                  float* db) {
    __shared__ float part[32][33];
    const u64 c = blockIdx.x * 32 + threadIdx.x;
    const u64 base = (u64)blockIdx.y * rows * cols + c;
    float acc = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (u64 r = threadIdx.y; r < rows; r += 32) {
            const u64 i = base + r * cols;
            const float v = y[i] > 0.0f ? dy[i] : 0.0f;
            dx[i] = v;
            acc += v;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float s = 0.0f;
        for (int k = 0; k < 32; ++k) s += part[k][threadIdx.x];
        db[(u64)blockIdx.y * cols + c] = s;
    }
}

// relu_backward_bias_f32 four columns at a time, for groups with enough blocks to fill the GPU:
// a block of 32 x 8 threads covers 128 columns of one group, each thread a float4 of every 8th
// row. Needs cols % 4 == 0 and 16-byte aligned buffers.
extern "C" __global__ void relu_backward_bias_f32x4(u64 rows, u64 cols, const float* dy, const float* y, float* dx,
                                                    float* db) {
    __shared__ float4 part[8][32];
    const u64 c = (blockIdx.x * 32 + threadIdx.x) * 4;
    const u64 base = (u64)blockIdx.y * rows * cols + c;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < cols) {
#pragma unroll 8
        for (u64 r = threadIdx.y; r < rows; r += 8) {
            const u64 i = base + r * cols;
            const float4 g = *(const float4*)(dy + i);
            const float4 v = *(const float4*)(y + i);
            const float4 o = make_float4(v.x > 0.0f ? g.x : 0.0f, v.y > 0.0f ? g.y : 0.0f, v.z > 0.0f ? g.z : 0.0f,
                                         v.w > 0.0f ? g.w : 0.0f);
            *(float4*)(dx + i) = o;
            acc.x += o.x;
            acc.y += o.y;
            acc.z += o.z;
            acc.w += o.w;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float4 s = part[0][threadIdx.x];
        for (int k = 1; k < 8; ++k) {
            const float4 p = part[k][threadIdx.x];
            s.x += p.x;
            s.y += p.y;
            s.z += p.z;
            s.w += p.w;
        }
        *(float4*)(db + (u64)blockIdx.y * cols + c) = s;
    }
}
