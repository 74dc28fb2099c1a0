// Index ops. Indices are i32; an index outside its dim is skipped and reported through `flag`.

// out[o, i, r] = src[o, idx[i], r]; src is [outer, dim, inner], out [outer, nidx, inner].
template <typename T>
__device__ void index_select(u64 outer, u64 dim, u64 nidx, u64 inner, const T* src, const int* idx, T* out, int* flag) {
    const u64 n = outer * nidx * inner;
    GRID_STRIDE(t, n) {
        const u64 r = t % inner;
        const u64 i = (t / inner) % nidx;
        const u64 o = t / (inner * nidx);
        const int k = idx[i];
        if (k < 0 || (u64)k >= dim) {
            report_index_error(flag, OP_INDEX_SELECT, k, (i64)dim);
            out[t] = (T)0;
        } else {
            out[t] = src[(o * dim + (u64)k) * inner + r];
        }
    }
}
#define INDEX_SELECT(TNAME, T)                                                                       \
    extern "C" __global__ void index_select_##TNAME(u64 outer, u64 dim, u64 nidx, u64 inner,         \
                                                    const T* src, const int* idx, T* out, int* flag) { \
        index_select<T>(outer, dim, nidx, inner, src, idx, out, flag);                               \
    }
INDEX_SELECT(u32, u32)
INDEX_SELECT(u16, u16)
INDEX_SELECT(u8, u8)

// An embedding bag's lookup in one pass: out[b, c] = (sum over t < bag of table[idx[b * bag + t], c]) * scale, for
// a table [rows, cols] (f32) and bags of `bag` consecutive ids, where an index_select and a mean write and read every
// looked-up row. A block covers 64·W columns of one bag (grid (bags, column blocks)) with 4 rows of threads, row y
// summing the bag's ids y, y + 4, ..., W columns at a time (4: float4 loads, where cols is a multiple of 4); the
// rows' sums meet in shared memory in a fixed order, so the bits do not vary from run to run. An id outside the
// table adds nothing and is reported.
template <u32 W>
__device__ void bag_mean(u64 bag, u64 rows, u64 cols, float scale, const float* table, const int* idx, float* out,
                         int* flag) {
    __shared__ float part[3][64 * W];
    const u64 b = blockIdx.x, c = ((u64)blockIdx.y * 64 + threadIdx.x) * W;
    const bool live = c < cols;
    float acc[W];
#pragma unroll
    for (u32 w = 0; w < W; ++w) acc[w] = 0.0f;
#pragma unroll 4
    for (u64 t = threadIdx.y; t < bag; t += 4) {
        const int k = idx[b * bag + t];
        if (k < 0 || (u64)k >= rows) {
            if (threadIdx.x == 0 && blockIdx.y == 0) report_index_error(flag, OP_BAG_MEAN, k, (i64)rows);
        } else if (live) {
            const float* row = table + (u64)k * cols + c;
            if constexpr (W == 4) {
                const float4 v = *reinterpret_cast<const float4*>(row);
                acc[0] += v.x;
                acc[1] += v.y;
                acc[2] += v.z;
                acc[3] += v.w;
            } else {
                acc[0] += *row;
            }
        }
    }
    if (threadIdx.y > 0) {
#pragma unroll
        for (u32 w = 0; w < W; ++w) part[threadIdx.y - 1][threadIdx.x * W + w] = acc[w];
    }
    __syncthreads();
    if (threadIdx.y == 0 && live) {
#pragma unroll
        for (u32 w = 0; w < W; ++w) {
            const u32 j = threadIdx.x * W + w;
            out[b * cols + c + w] = (((acc[w] + part[0][j]) + part[1][j]) + part[2][j]) * scale;
        }
    }
}
extern "C" __global__ void bag_mean_f32(u64 bag, u64 rows, u64 cols, float scale, const float* table, const int* idx,
                                        float* out, int* flag) {
    bag_mean<1>(bag, rows, cols, scale, table, idx, out, flag);
}
extern "C" __global__ void bag_mean4_f32(u64 bag, u64 rows, u64 cols, float scale, const float* table,
                                         const int* idx, float* out, int* flag) {
    bag_mean<4>(bag, rows, cols, scale, table, idx, out, flag);
}

// dst[o, idx[i], r] += src[o, i / repeat, r]; dst is [outer, dim, inner], src [outer, nidx / repeat, inner]
// (`repeat` consecutive indices share a row of src: the ids of a bag its gradient). Repeated indices add into one
// element in whatever order their threads arrive: f32 bits vary from run to run (i32 sums do not).
template <typename T>
__device__ void index_add(u64 outer, u64 dim, u64 nidx, u64 inner, u64 repeat, T* dst, const int* idx, const T* src,
                          int* flag) {
    const u64 n = outer * nidx * inner;
    GRID_STRIDE(t, n) {
        const u64 r = t % inner;
        const u64 i = (t / inner) % nidx;
        const u64 o = t / (inner * nidx);
        const int k = idx[i];
        if (k < 0 || (u64)k >= dim) {
            report_index_error(flag, OP_INDEX_ADD, k, (i64)dim);
        } else {
            atomicAdd(&dst[(o * dim + (u64)k) * inner + r], src[(o * (nidx / repeat) + i / repeat) * inner + r]);
        }
    }
}
extern "C" __global__ void index_add_f32(u64 outer, u64 dim, u64 nidx, u64 inner, u64 repeat, float* dst,
                                         const int* idx, const float* src, int* flag) {
    index_add<float>(outer, dim, nidx, inner, repeat, dst, idx, src, flag);
}
extern "C" __global__ void index_add_i32(u64 outer, u64 dim, u64 nidx, u64 inner, u64 repeat, int* dst,
                                         const int* idx, const int* src, int* flag) {
    index_add<int>(outer, dim, nidx, inner, repeat, dst, idx, src, flag);
}

// The f32 one in a fixed order (deterministic mode): a block of 256 threads per row (o, d) of dst scans the indices
// 256 at a time, lists those equal to d in order in shared memory, and each thread adds the listed rows of src into
// its elements of the row one after another. Every element sums in index order, as the CPU kernel does: the CPU's
// bits, whatever the scheduling.
extern "C" __global__ void index_add_ordered_f32(u64 outer, u64 dim, u64 nidx, u64 inner, u64 repeat, float* dst,
                                                 const int* idx, const float* src, int* flag) {
    __shared__ u32 hits[256];  // offsets in this round of the indices equal to d, in order
    __shared__ u32 warp_hits[8];
    const unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (u64 row = blockIdx.x; row < outer * dim; row += gridDim.x) {
        const u64 o = row / dim, d = row % dim;
        float* out = dst + row * inner;
        for (u64 base = 0; base < nidx; base += 256) {
            const u64 i = base + threadIdx.x;
            const int k = i < nidx ? idx[i] : -1;
            // The block of row 0 sees every index: it alone reports.
            if (row == 0 && i < nidx && (k < 0 || (u64)k >= dim)) report_index_error(flag, OP_INDEX_ADD, k, (i64)dim);
            const bool hit = i < nidx && k >= 0 && (u64)k == d;
            const unsigned ballot = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) warp_hits[w] = __popc(ballot);
            __syncthreads();
            u32 before = 0, total = 0;
            for (unsigned j = 0; j < 8; ++j) {
                const u32 c = warp_hits[j];
                if (j < w) before += c;
                total += c;
            }
            if (hit) hits[before + __popc(ballot & ((1u << lane) - 1u))] = threadIdx.x;
            __syncthreads();
            for (u32 j = 0; j < total; ++j) {
                const float* s = src + (o * (nidx / repeat) + (base + hits[j]) / repeat) * inner;
                for (u64 r = threadIdx.x; r < inner; r += blockDim.x) out[r] += s[r];
            }
            __syncthreads();  // the next round rewrites hits and warp_hits
        }
    }
}

// out[r] = src[r, idx[r]]; src is [rows, cols].
template <typename T>
__device__ void gather_last(u64 rows, u64 cols, const T* src, const int* idx, T* out, int* flag) {
    GRID_STRIDE(r, rows) {
        const int k = idx[r];
        if (k < 0 || (u64)k >= cols) {
            report_index_error(flag, OP_GATHER_LAST, k, (i64)cols);
            out[r] = (T)0;
        } else {
            out[r] = src[r * cols + (u64)k];
        }
    }
}
extern "C" __global__ void gather_last_u32(u64 rows, u64 cols, const u32* src, const int* idx, u32* out, int* flag) {
    gather_last<u32>(rows, cols, src, idx, out, flag);
}

// dst[r, idx[r]] += src[r]. Row r adds into row r of dst alone: each element gets at most one value per launch, so
// the result does not depend on the order of threads (deterministic mode needs no other variant).
extern "C" __global__ void scatter_add_last_f32(u64 rows, u64 cols, float* dst, const int* idx, const float* src,
                                                int* flag) {
    GRID_STRIDE(r, rows) {
        const int k = idx[r];
        if (k < 0 || (u64)k >= cols) {
            report_index_error(flag, OP_SCATTER_ADD_LAST, k, (i64)cols);
        } else {
            atomicAdd(&dst[r * cols + (u64)k], src[r]);
        }
    }
}

// out[r, c] = labels[r] == c; out is [rows, classes].
template <typename T>
__device__ void one_hot(u64 rows, u64 classes, const int* labels, T* out, int* flag) {
    const u64 n = rows * classes;
    GRID_STRIDE(t, n) {
        const u64 r = t / classes, c = t % classes;
        const int l = labels[r];
        if (c == 0 && (l < 0 || (u64)l >= classes)) report_index_error(flag, OP_ONE_HOT, l, (i64)classes);
        out[t] = (l >= 0 && (u64)l == c) ? (T)1 : (T)0;
    }
}
extern "C" __global__ void one_hot_f32(u64 rows, u64 classes, const int* labels, float* out, int* flag) {
    one_hot<float>(rows, classes, labels, out, flag);
}
extern "C" __global__ void one_hot_i32(u64 rows, u64 classes, const int* labels, int* out, int* flag) {
    one_hot<int>(rows, classes, labels, out, flag);
}
extern "C" __global__ void one_hot_u8(u64 rows, u64 classes, const int* labels, u8* out, int* flag) {
    one_hot<u8>(rows, classes, labels, out, flag);
}
