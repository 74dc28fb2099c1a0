// Fused self-attention on tensor cores: attention.cu's three kernels with their products in a 16-bit type (bf16 or
// f16) or in TF32, summed in fp32, as PyTorch's flash SDPA runs under autocast, or in three TF32 products for fp32
// accuracy (Tf32x3, the fp32 policy). Inputs, outputs, log-sum-exps and the softmax stay f32. For the 16-bit types
// q, k, v (and dO) are first packed in the operand type (attention_pack_*), so that a tile reaches shared memory in
// 16-byte copies with no conversion on the way (cp.async); the TF32 types round rows as they stage them (Tf32x3:
// split as they are read). Probabilities and score gradients are rounded as they become the next product's operand.
//
// A block of 4 warps takes a tile of 64 rows (queries in the forward pass and dq, keys in dk and dv) of one
// (sequence, head), 16 rows a warp, and walks the other side's tiles of 64 rows, 32 columns at a time. Products are
// mma.sync m16n8k16 (16-bit) or m16n8k8 (TF32): lane holds rows lane/4 and lane/4 + 8 and columns 2(lane%4) and +1
// of each block of 8 in the accumulators, and the operand types below read their A operand in that layout, so one
// product's probabilities are the next one's operand without a trip through shared memory. Tiles are [64][DP + 8]
// (DP: d padded with zeros). Where a product needs a tile's rows as its reduced side (v in p · v, k in ds · k, q and
// dO in the key gradients), it reads the same tile transposed (the 16-bit types by ldmatrix.trans, as FlashAttention
// does). The pad of 8 puts a fragment's reads on distinct banks in either element size (the TF32 types' transposed
// reads on two lanes a bank). No atomics: one writer per output element, so results are the same from run to run.
// mma.sync on these types needs sm_80.

#if __CUDA_ARCH__ >= 800

#define TC_ROWS 64
#define TC_CHUNK 32
#define TC_THREADS 128

// A shared-memory address as ldmatrix and cp.async take it.
__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8 x 8 blocks of 16-bit values, the rows of block b at the addresses lanes 8b to 8b + 7 give: a lane gets
// the pair at row lane/4, columns 2(lane%4) and +1 of each, the layout of mma's operands. One instruction where
// 32-bit loads took four.
__device__ __forceinline__ void load_blocks(u32 (&r)[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// The same blocks transposed: a lane gets the pair at rows 2(lane%4) and +1, column lane/4 of each.
__device__ __forceinline__ void load_blocks_t(u32 (&r)[4], const u16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
}

// An operand type: tiles of E, products reducing K columns at a time (mma m16n8kK), and
//   put2(p, lo, hi)              two adjacent values, rounded, at p;
//   operand_a(a, tile, ld, r0, k0)  the lane's share of the A operand (16 x K): rows [r0, r0 + 16), columns
//                                [k0, k0 + K) of a tile `ld` wide;
//   operand_b2(b, tile, ld, n0, k0) the lane's share of two B operands (K x 8) whose columns n are rows n0 + n and
//                                n0 + 8 + n of a tile `ld` wide, over its columns [k0, k0 + K): the first in b[0],
//                                b[1], the second in b[2], b[3];
//   operand_b2_t(b, tile, ld, n0, k0) the same operands with the tile's rows and columns swapped (reduced over rows
//                                [k0, k0 + K), columns n0 + n and n0 + 8 + n), so that one tile serves as either side
//                                of a product;
//   PACKED                       whether tiles are staged from copies packed in the type (pack; half the bytes of
//                                f32, and no conversion as a tile is staged) rather than from the f32 tensors (a
//                                TF32 copy would take as much memory as its tensor);
//   weights(a, w, k)             the A operand of the k-th K columns of a 16 x 32 patch w in the accumulators' layout;
//   mma2(c0, c1, a, b)           c0 += a · the first B operand, c1 += a · the second;
// with A and B2 the types of a lane's share of an A operand and of two B operands.

// The fragments of a type whose product takes one register set per operand: T gives mma(c, a, b0, b1), c += a · b.
template <class T>
struct OneProduct {
    using A = u32[4];
    using B2 = u32[4];
    static __device__ __forceinline__ void mma2(float (&c0)[4], float (&c1)[4], const A& a, const B2& b) {
        T::mma(c0, a, b[0], b[1]);
        T::mma(c1, a, b[2], b[3]);
    }
};

// 16-bit types: pairs of values in one register, operands loaded by ldmatrix. T gives pack (a rounded pair, lo in the
// low half) and mma.
template <class T>
struct SixteenBit : OneProduct<T> {
    using E = u16;
    static constexpr int K = 16;
    static constexpr bool PACKED = true;
    static __device__ __forceinline__ void put2(u16* p, float lo, float hi) {
        *reinterpret_cast<u32*>(p) = T::pack(lo, hi);
    }
    static __device__ __forceinline__ void operand_a(u32 (&a)[4], const u16* tile, int ld, int r0, int k0) {
        const int lane = threadIdx.x % 32, b = lane / 8;  // blocks: rows +0 / +8 (b % 2), columns +0 / +8 (b / 2)
        load_blocks(a, tile + (r0 + lane % 8 + 8 * (b % 2)) * ld + k0 + 8 * (b / 2));
    }
    static __device__ __forceinline__ void operand_b2(u32 (&b)[4], const u16* tile, int ld, int n0, int k0) {
        const int lane = threadIdx.x % 32, m = lane / 8;  // blocks: columns +0 / +8 (m % 2), rows +0 / +8 (m / 2)
        load_blocks(b, tile + (n0 + lane % 8 + 8 * (m / 2)) * ld + k0 + 8 * (m % 2));
    }
    static __device__ __forceinline__ void operand_b2_t(u32 (&b)[4], const u16* tile, int ld, int n0, int k0) {
        const int lane = threadIdx.x % 32, m = lane / 8;  // blocks: rows +0 / +8 (m % 2), columns +0 / +8 (m / 2)
        load_blocks_t(b, tile + (k0 + lane % 8 + 8 * (m % 2)) * ld + n0 + 8 * (m / 2));
    }
    static __device__ __forceinline__ void weights(u32 (&a)[4], const float (&w)[4][4], int k) {
        a[0] = T::pack(w[2 * k][0], w[2 * k][1]), a[1] = T::pack(w[2 * k][2], w[2 * k][3]);
        a[2] = T::pack(w[2 * k + 1][0], w[2 * k + 1][1]), a[3] = T::pack(w[2 * k + 1][2], w[2 * k + 1][3]);
    }
};

// A 16-bit type's conversion and product, `name` as PTX spells it (bf16, f16).
#define SIXTEEN_BIT(T, name)                                                                                      \
    struct T : SixteenBit<T> {                                                                                   \
        static __device__ __forceinline__ u32 pack(float lo, float hi) {                                         \
            u32 d;                                                                                               \
            asm("cvt.rn." name "x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));                             \
            return d;                                                                                            \
        }                                                                                                        \
        static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {          \
            asm("mma.sync.aligned.m16n8k16.row.col.f32." name "." name ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "   \
                "{%8,%9}, {%0,%1,%2,%3};"                                                                        \
                : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                 \
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                 \
        }                                                                                                        \
    };
SIXTEEN_BIT(Bf16, "bf16")
SIXTEEN_BIT(F16, "f16")

// TF32 (fp32's range, 10-bit mantissas): tiles of f32 values rounded to TF32, products m16n8k8. A lane's share of a
// k8 operand is reduced-side slots t and t + 4 (t = lane % 4); both operands of a product place slot t at column 2t
// and slot t + 4 at 2t + 1 (the order of a sum's terms is the product's to choose), so a lane reads each row's pair as
// one 8-byte load, and an accumulator's pair (columns 2t, 2t + 1) is already an A operand.
struct Tf32 : OneProduct<Tf32> {
    using E = float;
    static constexpr int K = 8;
    static constexpr bool PACKED = false;
    static __device__ __forceinline__ u32 round(float x) {
        u32 r;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ void put2(float* p, float lo, float hi) {
        *reinterpret_cast<float2*>(p) = make_float2(__uint_as_float(round(lo)), __uint_as_float(round(hi)));
    }
    // Rows `row` and row + 8 of a tile `ld` wide, columns 2(lane%4) and +1 from k0: {top pair, bottom pair}.
    static __device__ __forceinline__ void pairs(float2& top, float2& bottom, const float* tile, int ld, int row,
                                                 int k0) {
        const float* p = tile + (row + threadIdx.x % 32 / 4) * ld + k0 + 2 * (threadIdx.x % 4);
        top = *reinterpret_cast<const float2*>(p);
        bottom = *reinterpret_cast<const float2*>(p + 8 * ld);
    }
    static __device__ __forceinline__ void operand_a(u32 (&a)[4], const float* tile, int ld, int r0, int k0) {
        float2 top, bottom;
        pairs(top, bottom, tile, ld, r0, k0);
        a[0] = __float_as_uint(top.x), a[1] = __float_as_uint(bottom.x);
        a[2] = __float_as_uint(top.y), a[3] = __float_as_uint(bottom.y);
    }
    static __device__ __forceinline__ void operand_b2(u32 (&b)[4], const float* tile, int ld, int n0, int k0) {
        float2 first, second;
        pairs(first, second, tile, ld, n0, k0);
        b[0] = __float_as_uint(first.x), b[1] = __float_as_uint(first.y);
        b[2] = __float_as_uint(second.x), b[3] = __float_as_uint(second.y);
    }
    // Slots t and t + 4 are rows k0 + 2t and + 1 (the order operand_b2 reads their columns in), column lane/4.
    static __device__ __forceinline__ void operand_b2_t(u32 (&b)[4], const float* tile, int ld, int n0, int k0) {
        const float* p = tile + (k0 + 2 * (threadIdx.x % 4)) * ld + n0 + threadIdx.x % 32 / 4;
        b[0] = __float_as_uint(p[0]), b[1] = __float_as_uint(p[ld]);
        b[2] = __float_as_uint(p[8]), b[3] = __float_as_uint(p[ld + 8]);
    }
    // The k-th 8 columns of w in an A operand's slots, unrounded.
    static __device__ __forceinline__ void slots(u32 (&a)[4], const float (&w)[4][4], int k) {
        a[0] = __float_as_uint(w[k][0]), a[1] = __float_as_uint(w[k][2]);
        a[2] = __float_as_uint(w[k][1]), a[3] = __float_as_uint(w[k][3]);
    }
    static __device__ __forceinline__ void weights(u32 (&a)[4], const float (&w)[4][4], int k) {
        slots(a, w, k);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = round(__uint_as_float(a[i]));
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// fp32 accuracy on TF32 tensor cores (3xTF32, as CUTLASS and PyTorch's fp32 attention run): tiles of unrounded f32,
// each operand value x split into big = tf32(x) and small = tf32(x - big), and a · b taken as small·big + big·small +
// big·big (small·small, 2^-22 of the product, dropped). Three products where TF32 runs one, in Tf32's layout.
struct Tf32x3 {
    using E = float;
    static constexpr int K = 8;
    static constexpr bool PACKED = false;
    struct Split {
        u32 big[4], small[4];
    };
    using A = Split;
    using B2 = Split;
    // big holds unrounded values; both halves afterwards.
    static __device__ __forceinline__ void split(Split& s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float x = __uint_as_float(s.big[i]);
            s.big[i] = Tf32::round(x);
            s.small[i] = Tf32::round(x - __uint_as_float(s.big[i]));
        }
    }
    static __device__ __forceinline__ void put2(float* p, float lo, float hi) {
        *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
    }
    static __device__ __forceinline__ void operand_a(Split& a, const float* tile, int ld, int r0, int k0) {
        Tf32::operand_a(a.big, tile, ld, r0, k0);
        split(a);
    }
    static __device__ __forceinline__ void operand_b2(Split& b, const float* tile, int ld, int n0, int k0) {
        Tf32::operand_b2(b.big, tile, ld, n0, k0);
        split(b);
    }
    static __device__ __forceinline__ void operand_b2_t(Split& b, const float* tile, int ld, int n0, int k0) {
        Tf32::operand_b2_t(b.big, tile, ld, n0, k0);
        split(b);
    }
    static __device__ __forceinline__ void weights(Split& a, const float (&w)[4][4], int k) {
        Tf32::slots(a.big, w, k);
        split(a);
    }
    static __device__ __forceinline__ void mma2(float (&c0)[4], float (&c1)[4], const A& a, const B2& b) {
        // the small terms first, so the big product is added to sums that already hold them
        Tf32::mma(c0, a.small, b.big[0], b.big[1]);
        Tf32::mma(c1, a.small, b.big[2], b.big[3]);
        Tf32::mma(c0, a.big, b.small[0], b.small[1]);
        Tf32::mma(c1, a.big, b.small[2], b.small[3]);
        Tf32::mma(c0, a.big, b.big[0], b.big[1]);
        Tf32::mma(c1, a.big, b.big[2], b.big[3]);
    }
};

// Packs rows of q, k and v (blockIdx.z = 0, 1, 2 of qkv, rows `stride` apart) or of dO (z = 0 of dout) in the
// operand type: [parts][groups][tiles][64][DP], a (sequence, head)'s rows padded to whole tiles and its columns to
// DP with zeros, so that staging a tile needs neither bounds nor conversion. Grid (groups, tiles, parts).
template <class T, int DP>
__device__ void pack(u64 len, u64 heads, u64 d, u64 stride, const float* src, typename T::E* dst) {
    const u64 g = blockIdx.x, tile = blockIdx.y, groups = gridDim.x, tiles = gridDim.y;
    const float* from = src + (g / heads) * len * stride + blockIdx.z * heads * d + (g % heads) * d;
    typename T::E* to = dst + ((blockIdx.z * groups + g) * tiles + tile) * TC_ROWS * DP;
    for (int e = threadIdx.x; e < TC_ROWS * DP / 2; e += TC_THREADS) {
        const int r = e / (DP / 2), c = 2 * (e % (DP / 2));
        const u64 row = tile * TC_ROWS + r;
        const float* p = from + row * stride + c;
        const bool in = row < len;
        T::put2(to + r * DP + c, in && c < d ? p[0] : 0.0f, in && c + 1 < d ? p[1] : 0.0f);
    }
}

// 16 bytes from global to shared memory, not through registers.
__device__ __forceinline__ void copy16(void* shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(shared)), "l"(global) : "memory");
}

// Waits for this thread's copies; a __syncthreads() after it makes every thread's visible.
__device__ __forceinline__ void landed() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// A packed tile (64 rows of DP, see pack) into a tile [64][DP + 8], by copies that have landed after landed().
template <class T, int DP>
__device__ __forceinline__ void copy_tile(typename T::E* tile, const typename T::E* src) {
    // 16-byte pieces a row, elements a piece, rows a round of the block's threads
    constexpr int PIECES = DP * sizeof(typename T::E) / 16, PER = 16 / sizeof(typename T::E), STEP = TC_THREADS / PIECES;
    const int r = threadIdx.x / PIECES, c = threadIdx.x % PIECES * PER;
    tile += r * (DP + 8) + c;
    src += r * DP + c;
#pragma unroll
    for (int i = 0; i < TC_ROWS / STEP; ++i) copy16(tile + i * STEP * (DP + 8), src + i * STEP * DP);
}

// Loads in flight per thread while a tile is staged (pairs of columns).
#define TC_BATCH 8

// Rows [r0, r0 + 64) of a buffer whose rows are `stride` apart, d columns each, in T into a tile [64][DP + 8];
// rows past len and columns past d are zero. Pairs of columns are read as one 8-byte load where d is even (every
// pair is then aligned: strides and head offsets are multiples of d) and src is.
template <class T, int DP>
__device__ __forceinline__ void convert(typename T::E* tile, const float* src, u64 stride, u64 r0, u64 len, u64 d) {
    constexpr int PER = TC_ROWS * DP / 2 / TC_THREADS, BATCH = TC_BATCH;
    const bool pairs = d % 2 == 0 && reinterpret_cast<u64>(src) % 8 == 0;
    for (int b0 = 0; b0 < PER; b0 += BATCH) {
        float2 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int e = (b0 + b) * TC_THREADS + threadIdx.x, r = e / (DP / 2), c = 2 * (e % (DP / 2));
            const bool in = r0 + r < len;
            const float* p = src + (r0 + r) * stride + c;
            if (pairs)
                v[b] = in && c < d ? *reinterpret_cast<const float2*>(p) : make_float2(0.0f, 0.0f);
            else
                v[b] = make_float2(in && c < d ? p[0] : 0.0f, in && c + 1 < d ? p[1] : 0.0f);
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int e = (b0 + b) * TC_THREADS + threadIdx.x, r = e / (DP / 2), c = 2 * (e % (DP / 2));
            T::put2(tile + r * (DP + 8) + c, v[b].x, v[b].y);
        }
    }
}

// A (sequence, head)'s rows of q, k, v and dO: in the f32 tensors (`rows`, `stride` apart, len rows of d columns),
// and where T::PACKED in T's type (`packed`, see pack).
enum Part { Q, K, V, DO };
template <class T>
struct Inputs {
    const float* rows[4];
    u64 stride[4], len, d;
    const typename T::E* packed[4];
};

// The inputs of this block's group (blockIdx.x); dout and, unless T::PACKED, packed may be null.
template <class T, int DP>
__device__ __forceinline__ Inputs<T> inputs(u64 len, u64 heads, u64 d, const float* qkv, const float* dout,
                                            const typename T::E* packed) {
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d;
    const u64 part = (u64)gridDim.x * gridDim.y * TC_ROWS * DP, mine = g * gridDim.y * TC_ROWS * DP;
    Inputs<T> in{};
    for (int p = Q; p <= V; ++p) in.rows[p] = qkv + seq * len * 3 * width + p * width + head * d, in.stride[p] = 3 * width;
    if (dout) in.rows[DO] = dout + seq * len * width + head * d, in.stride[DO] = width;
    if constexpr (T::PACKED)
        for (int p = Q; p <= DO; ++p) in.packed[p] = packed + p * part + mine;
    in.len = len, in.d = d;
    return in;
}

// Rows [r0, r0 + 64) of part p into a tile [64][DP + 8]: copies of the packed rows where T::PACKED (landed after
// landed()), else converted from the f32 tensor.
template <class T, int DP>
__device__ __forceinline__ void stage(typename T::E* tile, const Inputs<T>& in, Part p, u64 r0) {
    if constexpr (T::PACKED)
        copy_tile<T, DP>(tile, in.packed[p] + r0 * DP);
    else
        convert<T, DP>(tile, in.rows[p], in.stride[p], r0, in.len, in.d);
}

// s = rows [r0, r0 + 16) of tile x · rows [n0, n0 + 32) of tile y (both [64][DP + 8]), as four 16 x 8 blocks.
template <class T, int DP>
__device__ __forceinline__ void dots(float (&s)[4][4], const typename T::E* x, int r0, const typename T::E* y,
                                           int n0) {
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < DP; k += T::K) {
        typename T::A a;
        T::operand_a(a, x, DP + 8, r0, k);
#pragma unroll
        for (int n = 0; n < 4; n += 2) {
            typename T::B2 b;
            T::operand_b2(b, y, DP + 8, n0 + 8 * n, k);
            T::mma2(s[n], s[n + 1], a, b);
        }
    }
}

// acc (16 x DP) += w · rows [k0, k0 + 32) of the other side, w the 16 x 32 weights from `dots`' layout and `rows`
// the other side's tile ([64][DP + 8]).
template <class T, int DP>
__device__ __forceinline__ void accumulate(float (&acc)[DP / 8][4], const float (&w)[4][4],
                                           const typename T::E* rows, int k0) {
#pragma unroll
    for (int k = 0; k < TC_CHUNK / T::K; ++k) {
        typename T::A a;
        T::weights(a, w, k);
#pragma unroll
        for (int n = 0; n < DP / 8; n += 2) {
            typename T::B2 b;
            T::operand_b2_t(b, rows, DP + 8, 8 * n, k0 + T::K * k);
            T::mma2(acc[n], acc[n + 1], a, b);
        }
    }
}

// Rows r0 + lane/4 (times f0) and r0 + lane/4 + 8 (times f1) of acc into dst (rows `stride` apart, first len
// rows and d columns only).
template <int DP>
__device__ __forceinline__ void store(float* dst, u64 stride, u64 r0, u64 len, u64 d, const float (&acc)[DP / 8][4],
                                      float f0, float f1) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u64 r = r0 + lane / 4 + 8 * h;
        if (r >= len) continue;
#pragma unroll
        for (int n = 0; n < DP / 8; ++n) {
            const u64 c = 8 * n + 2 * (lane % 4);
            if (c < d) dst[r * stride + c] = acc[n][2 * h] * (h ? f1 : f0);
            if (c + 1 < d) dst[r * stride + c + 1] = acc[n][2 * h + 1] * (h ? f1 : f0);
        }
    }
}

// 2^x by the SFU alone, subnormal results flushed to zero (a weight below 2^-126 is none): exp2f spends three more
// instructions a value keeping them, and the softmax takes one a score.
__device__ __forceinline__ float exp2_sfu(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Max and sum over the 4 lanes that share a row.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Does any of the warp's 16 rows from r0 on meet a column of [c0, c0 + 32), given who sees whom? For the rows as
// queries (`queries`) or as keys.
__device__ __forceinline__ bool meets(u64 r0, u64 c0, u64 len, int causal, bool queries) {
    if (r0 >= len || c0 >= len) return false;
    if (!causal) return true;
    return queries ? c0 <= r0 + 15 : c0 + TC_CHUNK - 1 >= r0;
}

// Does every row of the warp's 16 from r0 on see every column of [c0, c0 + 32)? Then no score needs its mask, which
// took a dozen 64-bit operations a score, most of a chunk's instructions besides the products.
__device__ __forceinline__ bool sees_all(u64 r0, u64 c0, u64 len, int causal, bool queries, const float* keep) {
    if (keep || r0 + 16 > len || c0 + TC_CHUNK > len) return false;
    if (!causal) return true;
    return queries ? c0 + TC_CHUNK - 1 <= r0 : r0 + 15 <= c0;
}

// Sets to v the scores of the warp's 16 x 32 patch that are not seen: rows from r0 and columns from c0 (queries and
// keys, or keys and queries where !queries), in the layout of `dots`.
__device__ __forceinline__ void hide(float (&s)[4][4], float v, u64 r0, u64 c0, u64 len, int causal, const float* keep,
                                     bool queries) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const u64 r = r0 + lane / 4 + 8 * (e / 2), c = c0 + 8 * n + 2 * (lane % 4) + e % 2;
            if (!(queries ? visible(r, c, len, causal, keep) : visible(c, r, len, causal, keep))) s[n][e] = v;
        }
}

extern __shared__ uint4 tc_smem[];

// Grid (groups, query tiles); shared: the q, k and v tiles.
template <class T, int DP>
__device__ void forward(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const typename T::E* packed, const float* mask, float* out, float* lse) {
    using E = typename T::E;
    E* qs = reinterpret_cast<E*>(tc_smem);
    E* ks = qs + TC_ROWS * (DP + 8);
    E* vs = ks + TC_ROWS * (DP + 8);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d;
    const u64 i0 = (u64)(gridDim.y - 1 - blockIdx.y) * TC_ROWS, r0 = i0 + 16 * w;  // causal: longest tiles first
    const Inputs<T> in = inputs<T, DP>(len, heads, d, qkv, nullptr, packed);
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const float c2 = scale * LOG2E;  // scores in base 2
    stage<T, DP>(qs, in, Q, i0);
    float acc[DP / 8][4] = {}, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    const u64 kend = causal ? min(len, i0 + TC_ROWS) : len;
    for (u64 j0 = 0; j0 < kend; j0 += TC_ROWS) {
        __syncthreads();  // the last tiles are read
        stage<T, DP>(ks, in, K, j0);
        stage<T, DP>(vs, in, V, j0);
        landed();
        __syncthreads();
#pragma unroll
        for (int c0 = 0; c0 < TC_ROWS; c0 += TC_CHUNK) {
            if (!meets(r0, j0 + c0, len, causal, true)) continue;
            // scores unscaled (scale > 0 keeps their order), scaled to base 2 inside the exponent: exp2(s c2 - m c2)
            float s[4][4], mx[2] = {NEG_INF, NEG_INF}, mc[2];
            dots<T, DP>(s, qs, 16 * w, ks, c0);
            if (!sees_all(r0, j0 + c0, len, causal, true, keep)) hide(s, NEG_INF, r0, j0 + c0, len, causal, keep, true);
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float mn = fmaxf(m[h], quad_max(mx[h]));
                // nothing seen yet (the same for the row's 4 lanes): no weight, nothing to rescale, and an offset of
                // 0 so that the hidden scores' exp2(-inf) is 0
                const float alpha = mn == NEG_INF ? 1.0f : exp2_sfu((m[h] - mn) * c2);
                m[h] = mn;
                mc[h] = mn == NEG_INF ? 0.0f : mn * c2;
                l[h] *= alpha;
#pragma unroll
                for (int n = 0; n < DP / 8; ++n) acc[n][2 * h] *= alpha, acc[n][2 * h + 1] *= alpha;
            }
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e / 2;
                    s[n][e] = exp2_sfu(fmaf(s[n][e], c2, -mc[h]));
                    l[h] += s[n][e];  // this lane's share; the row's is summed at the end
                }
            accumulate<T, DP>(acc, s, vs, c0);
        }
    }
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float total = quad_sum(l[h]);
        const u64 i = r0 + lane / 4 + 8 * h;
        if (lane % 4 == 0 && i < len) lse[g * len + i] = total > 0.0f ? (m[h] * c2 + log2f(total)) / LOG2E : NEG_INF;
        inv[h] = total > 0.0f ? 1.0f / total : 0.0f;
    }
    store<DP>(out + seq * len * width + head * d, width, r0, len, d, acc, inv[0], inv[1]);
}

// The query gradient, and delta = rowsum(dO ∘ O) for grad_kv. Grid as the forward's; packed: q, k, v, then dO;
// shared: the q, dO, k and v tiles.
template <class T, int DP>
__device__ void grad_q(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                       const typename T::E* packed, const float* mask, const float* out, const float* lse,
                       const float* dout, float* delta, float* dqkv) {
    constexpr int TILE = TC_ROWS * (DP + 8);
    using E = typename T::E;
    E* qs = reinterpret_cast<E*>(tc_smem);
    E* dos = qs + TILE;
    E* ks = dos + TILE;
    E* vs = ks + TILE;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 i0 = (u64)(gridDim.y - 1 - blockIdx.y) * TC_ROWS, r0 = i0 + 16 * w;
    const Inputs<T> in = inputs<T, DP>(len, heads, d, qkv, dout, packed);
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const u64 orow = seq * len * width + head * d;  // this head's column block of out and dout
    const float c2 = scale * LOG2E;
    stage<T, DP>(qs, in, Q, i0);
    stage<T, DP>(dos, in, DO, i0);
    // The lane's rows' deltas in f32: the 4 lanes of a row take every fourth column, all loads in flight at once.
    float dl[2], l2[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u64 i = r0 + lane / 4 + 8 * h;
        const float *o = out + orow + i * width, *dr = dout + orow + i * width;
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < DP / 4; ++k) {
            const int c = 4 * k + lane % 4;
            if (i < len && c < d) part = fmaf(dr[c], o[c], part);
        }
        dl[h] = quad_sum(part);
        if (lane % 4 == 0 && i < len) delta[g * len + i] = dl[h];
        l2[h] = i < len ? lse[g * len + i] * LOG2E : 0.0f;
    }
    float acc[DP / 8][4] = {};
    const u64 kend = causal ? min(len, i0 + TC_ROWS) : len;
    for (u64 j0 = 0; j0 < kend; j0 += TC_ROWS) {
        __syncthreads();
        stage<T, DP>(ks, in, K, j0);
        stage<T, DP>(vs, in, V, j0);
        landed();
        __syncthreads();
#pragma unroll
        for (int c0 = 0; c0 < TC_ROWS; c0 += TC_CHUNK) {
            if (!meets(r0, j0 + c0, len, causal, true)) continue;
            float s[4][4], dp[4][4];
            dots<T, DP>(s, qs, 16 * w, ks, c0);
            dots<T, DP>(dp, dos, 16 * w, vs, c0);
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = exp2_sfu(fmaf(s[n][e], c2, -l2[e / 2])) * (dp[n][e] - dl[e / 2]);
            if (!sees_all(r0, j0 + c0, len, causal, true, keep)) hide(s, 0.0f, r0, j0 + c0, len, causal, keep, true);
            accumulate<T, DP>(acc, s, ks, c0);
        }
    }
    store<DP>(dqkv + seq * len * stride + head * d, stride, r0, len, d, acc, scale, scale);
}

// The key and value gradients. Grid (groups, key tiles); packed as grad_q's; shared: the k, v, q and dO tiles, the
// query tile's lse (base 2) and delta.
template <class T, int DP>
__device__ void grad_kv(u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv,
                        const typename T::E* packed, const float* mask, const float* lse, const float* dout,
                        const float* delta, float* dqkv) {
    constexpr int TILE = TC_ROWS * (DP + 8);
    using E = typename T::E;
    E* ks = reinterpret_cast<E*>(tc_smem);
    E* vs = ks + TILE;
    E* qs = vs + TILE;
    E* dos = qs + TILE;
    float* ls = reinterpret_cast<float*>(dos + TILE);
    float* dls = ls + TC_ROWS;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u64 g = blockIdx.x, seq = g / heads, head = g % heads, width = heads * d, stride = 3 * width;
    const u64 j0 = (u64)blockIdx.y * TC_ROWS, r0 = j0 + 16 * w;  // causal: the first key tiles see the most queries
    const Inputs<T> in = inputs<T, DP>(len, heads, d, qkv, dout, packed);
    const float* keep = mask_rows ? mask + (seq % mask_rows) * len : nullptr;
    const float c2 = scale * LOG2E;
    stage<T, DP>(ks, in, K, j0);
    stage<T, DP>(vs, in, V, j0);
    float ak[DP / 8][4] = {}, av[DP / 8][4] = {};
    for (u64 q0 = causal ? j0 : 0; q0 < len; q0 += TC_ROWS) {
        __syncthreads();
        stage<T, DP>(qs, in, Q, q0);
        stage<T, DP>(dos, in, DO, q0);
        for (int t = threadIdx.x; t < TC_ROWS; t += TC_THREADS) {
            ls[t] = q0 + t < len ? lse[g * len + q0 + t] * LOG2E : 0.0f;
            dls[t] = q0 + t < len ? delta[g * len + q0 + t] : 0.0f;
        }
        landed();
        __syncthreads();
#pragma unroll
        for (int c0 = 0; c0 < TC_ROWS; c0 += TC_CHUNK) {
            if (!meets(r0, q0 + c0, len, causal, false)) continue;
            float s[4][4], dp[4][4];
            dots<T, DP>(s, ks, 16 * w, qs, c0);  // transposed scores: keys as rows
            dots<T, DP>(dp, vs, 16 * w, dos, c0);
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int qi = c0 + 8 * n + 2 * (lane % 4) + e % 2;
                    s[n][e] = exp2_sfu(fmaf(s[n][e], c2, -ls[qi]));
                    dp[n][e] = s[n][e] * (dp[n][e] - dls[qi]);
                }
            if (!sees_all(r0, q0 + c0, len, causal, false, keep)) {
                hide(s, 0.0f, r0, q0 + c0, len, causal, keep, false);
                hide(dp, 0.0f, r0, q0 + c0, len, causal, keep, false);
            }
            accumulate<T, DP>(av, s, dos, c0);
            accumulate<T, DP>(ak, dp, qs, c0);
        }
    }
    float* dk = dqkv + seq * len * stride + width + head * d;
    store<DP>(dk, stride, r0, len, d, ak, scale, scale);
    store<DP>(dk + width, stride, r0, len, d, av, 1.0f, 1.0f);
}

// Entry points per operand type and padded head width DP (32, 64, 128).
#define TENSOR_CORE_KERNELS(TY, T, DP)                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) attention_forward_##TY##_##DP(                      \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const T::E* packed, \
        const float* mask, float* out, float* lse) {                                                             \
        forward<T, DP>(len, heads, d, scale, causal, mask_rows, qkv, packed, mask, out, lse);                    \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) attention_grad_q_##TY##_##DP(                       \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const T::E* packed, \
        const float* mask, const float* out, const float* lse, const float* dout, float* delta, float* dqkv) {   \
        grad_q<T, DP>(len, heads, d, scale, causal, mask_rows, qkv, packed, mask, out, lse, dout, delta, dqkv);  \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) attention_grad_kv_##TY##_##DP(                      \
        u64 len, u64 heads, u64 d, float scale, int causal, u64 mask_rows, const float* qkv, const T::E* packed, \
        const float* mask, const float* lse, const float* dout, const float* delta, float* dqkv) {              \
        grad_kv<T, DP>(len, heads, d, scale, causal, mask_rows, qkv, packed, mask, lse, dout, delta, dqkv);      \
    }

// A PACKED type's kernels, with the one that packs their inputs.
#define PACKED_KERNELS(TY, T, DP)                                                                                   \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) attention_pack_##TY##_##DP(                         \
        u64 len, u64 heads, u64 d, u64 stride, const float* src, T::E* dst) {                                    \
        pack<T, DP>(len, heads, d, stride, src, dst);                                                            \
    }                                                                                                            \
    TENSOR_CORE_KERNELS(TY, T, DP)

#define TENSOR_CORE_WIDTHS(KERNELS, TY, T) KERNELS(TY, T, 32) KERNELS(TY, T, 64) KERNELS(TY, T, 128)
// One module's: a macro between, so that TC_TY and TC_DP are expanded before they are pasted into names.
#define TENSOR_CORE_MODULE(KERNELS, TY, T, DP) KERNELS(TY, T, DP)

// Each operand type at each width is a module of its own (attention/cuda.rs defines TC_KERNELS, TC_TY, TC_T and TC_DP
// before this file), so that a run compiles only what it uses; read alone, as `cargo xtask cuda-check` reads it, the
// file takes them all.
#ifdef TC_T
TENSOR_CORE_MODULE(TC_KERNELS, TC_TY, TC_T, TC_DP)
#else
TENSOR_CORE_WIDTHS(PACKED_KERNELS, bf16, Bf16)
TENSOR_CORE_WIDTHS(PACKED_KERNELS, f16, F16)
TENSOR_CORE_WIDTHS(TENSOR_CORE_KERNELS, tf32, Tf32)
TENSOR_CORE_WIDTHS(TENSOR_CORE_KERNELS, tf32x3, Tf32x3)
#endif

#endif
