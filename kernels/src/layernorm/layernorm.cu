// Layer normalization over the last dimension of [members, rows, dim] (see layernorm/mod.rs), f32.
//
// A warp per row for the statistics, the output and the input's gradient: lane c takes columns c, c + 32, ...,
// and the row is read again from the cache for each of its passes (mean, variance, output) rather than kept in
// registers, so any width runs. The parameters' gradients are column sums over rows: a block sums 64 rows of 32
// columns into a partial, and a last kernel adds the partials in order, so results are the same from run to run.

#define ROWS_PER_BLOCK 8   // warps of a 256-thread block
#define PARAM_ROWS 64      // rows one block of grad_params sums

// Grid-stride over rows, a warp each: out = (x - mean) * invstd * w + b.
extern "C" __global__ void layer_norm_forward_f32(u64 total, u64 rows, u64 dim, float eps, const float* x,
                                                  const float* w, const float* b, float* y, float* mean,
                                                  float* invstd) {
    const u64 lane = threadIdx.x % 32;
    for (u64 row = (u64)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32; row < total;
         row += (u64)gridDim.x * ROWS_PER_BLOCK) {
        const float* xr = x + row * dim;
        float s = 0.0f;
        for (u64 c = lane; c < dim; c += 32) s += xr[c];
        const float mu = warp_sum(s) / (float)dim;
        float v = 0.0f;
        for (u64 c = lane; c < dim; c += 32) {
            const float d = xr[c] - mu;
            v = fmaf(d, d, v);
        }
        const float inv = rsqrtf(warp_sum(v) / (float)dim + eps);
        const u64 g = row / rows;
        const float* wr = w + g * dim;
        const float* br = b + g * dim;
        float* yr = y + row * dim;
        for (u64 c = lane; c < dim; c += 32) yr[c] = fmaf((xr[c] - mu) * inv, wr[c], br[c]);
        if (lane == 0) mean[row] = mu, invstd[row] = inv;
    }
}

// dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, a warp per row.
extern "C" __global__ void layer_norm_grad_input_f32(u64 total, u64 rows, u64 dim, const float* x, const float* dy,
                                                     const float* mean, const float* invstd, const float* w,
                                                     float* dx) {
    const u64 lane = threadIdx.x % 32;
    for (u64 row = (u64)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32; row < total;
         row += (u64)gridDim.x * ROWS_PER_BLOCK) {
        const float* xr = x + row * dim;
        const float* dyr = dy + row * dim;
        const float* wr = w + (row / rows) * dim;
        const float mu = mean[row], inv = invstd[row];
        float sg = 0.0f, sgx = 0.0f;
        for (u64 c = lane; c < dim; c += 32) {
            const float g = dyr[c] * wr[c];
            sg += g;
            sgx = fmaf(g, (xr[c] - mu) * inv, sgx);
        }
        const float mg = warp_sum(sg) / (float)dim, mgx = warp_sum(sgx) / (float)dim;
        float* dxr = dx + row * dim;
        for (u64 c = lane; c < dim; c += 32)
            dxr[c] = inv * (dyr[c] * wr[c] - mg - (xr[c] - mu) * inv * mgx);
    }
}

// Grid (column tiles of 32, blocks of PARAM_ROWS rows, members); 256 threads: column tx of the tile, every 8th
// row from ty. partial[member][block][column] = (Σ dy * xhat, Σ dy) over the block's rows.
extern "C" __global__ void layer_norm_grad_params_f32(u64 rows, u64 dim, const float* x, const float* dy,
                                                      const float* mean, const float* invstd, float* partial) {
    __shared__ float sw[ROWS_PER_BLOCK][32], sb[ROWS_PER_BLOCK][32];
    const u64 tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const u64 c = (u64)blockIdx.x * 32 + tx, g = blockIdx.z, blk = blockIdx.y;
    const u64 r0 = blk * PARAM_ROWS, r1 = min(rows, r0 + PARAM_ROWS);
    float aw = 0.0f, ab = 0.0f;
    if (c < dim)
        for (u64 r = r0 + ty; r < r1; r += ROWS_PER_BLOCK) {
            const u64 row = g * rows + r;
            const float d = dy[row * dim + c];
            aw = fmaf(d, (x[row * dim + c] - mean[row]) * invstd[row], aw);
            ab += d;
        }
    sw[ty][tx] = aw, sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < dim) {
        for (int k = 1; k < ROWS_PER_BLOCK; ++k) aw += sw[k][tx], ab += sb[k][tx];
        float* p = partial + ((g * gridDim.y + blk) * dim + c) * 2;
        p[0] = aw, p[1] = ab;
    }
}

// dw, db [members, dim]: a warp per (member, column) adds the partials of the member's blocks, its lanes taking
// every 32nd block, in a fixed order (the same sums from run to run). A thread per column, walking all the blocks
// alone, waited on one load after another: 15 us for 64 blocks of a 256-wide norm on an H200.
extern "C" __global__ void layer_norm_grad_finish_f32(u64 members, u64 dim, u64 blocks, const float* partial,
                                                      float* dw, float* db) {
    const u64 lane = threadIdx.x % 32;
    for (u64 i = (u64)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32; i < members * dim;
         i += (u64)gridDim.x * ROWS_PER_BLOCK) {
        const u64 g = i / dim, c = i % dim;
        float aw = 0.0f, ab = 0.0f;
        for (u64 k = lane; k < blocks; k += 32) {
            const float* p = partial + ((g * blocks + k) * dim + c) * 2;
            aw += p[0], ab += p[1];
        }
        aw = warp_sum(aw), ab = warp_sum(ab);
        if (lane == 0) dw[i] = aw, db[i] = ab;
    }
}
