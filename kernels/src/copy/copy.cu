// Data movement by element width: strided copies (narrow, cat, slice assignment, broadcast,
// permutes), tiled transposes, arange.

// dst[offsets in s[1]] = src[offsets in s[0]] over the iteration shape.
template <typename T>
__device__ void strided_copy(u64 n, const Strided& st, const T* src, T* dst) {
    GRID_STRIDE(i, n) {
        u64 os, od, unused;
        strided_offsets(st, i, &os, &od, &unused);
        dst[od] = src[os];
    }
}
#define STRIDED_COPY(TNAME, T)                                                                        \
    extern "C" __global__ void strided_copy_##TNAME(u64 n, Strided st, const T* src, T* dst) {       \
        strided_copy<T>(n, st, src, dst);                                                             \
    }
STRIDED_COPY(u64, u64)
STRIDED_COPY(u32, u32)
STRIDED_COPY(u16, u16)
STRIDED_COPY(u8, u8)

// rows blocks of cols elements: dst[r * dst_stride + c] = src[r * src_stride + c].
template <typename T>
__device__ void copy2d(u64 rows, u64 cols, u64 src_stride, u64 dst_stride, const T* src, T* dst) {
    const u64 n = rows * cols;
    GRID_STRIDE(i, n) {
        const u64 r = i / cols, c = i % cols;
        dst[r * dst_stride + c] = src[r * src_stride + c];
    }
}
#define COPY2D(TNAME, T)                                                                              \
    extern "C" __global__ void copy2d_##TNAME(u64 rows, u64 cols, u64 src_stride, u64 dst_stride,    \
                                              const T* src, T* dst) {                                 \
        copy2d<T>(rows, cols, src_stride, dst_stride, src, dst);                                      \
    }
COPY2D(u64, u64)
COPY2D(u32, u32)
COPY2D(u16, u16)
COPY2D(u8, u8)

// [batch, rows, cols] -> [batch, cols, rows] through 32x32 shared-memory tiles.
// grid (ceil(cols/32), ceil(rows/32), batch), block (32, 8).
template <typename T>
__device__ void transpose(u64 rows, u64 cols, const T* src, T* dst) {
    __shared__ T tile[32][33];
    const u64 b = blockIdx.z;
    const T* s = src + b * rows * cols;
    T* d = dst + b * rows * cols;
    const u64 c0 = (u64)blockIdx.x * 32, r0 = (u64)blockIdx.y * 32;
    for (int k = threadIdx.y; k < 32; k += 8) {
        const u64 r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[k][threadIdx.x] = s[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += 8) {
        const u64 c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols) d[c * rows + r] = tile[threadIdx.x][k];
    }
}
#define TRANSPOSE(TNAME, T)                                                                           \
    extern "C" __global__ void transpose_##TNAME(u64 rows, u64 cols, const T* src, T* dst) {         \
        transpose<T>(rows, cols, src, dst);                                                           \
    }
TRANSPOSE(u64, u64)
TRANSPOSE(u32, u32)
TRANSPOSE(u16, u16)
TRANSPOSE(u8, u8)

extern "C" __global__ void arange_f32(u64 n, float* out) {
    GRID_STRIDE(i, n) { out[i] = (float)i; }
}
extern "C" __global__ void arange_i32(u64 n, int* out) {
    GRID_STRIDE(i, n) { out[i] = (int)i; }
}
