// Products with a short side, where cuBLAS's batched kernels (wide tiles, split-K pairs) leave the GPU mostly idle:
// C[b] (m x n, row-major, contiguous) = A[b] · B[b] with A(i, p) = a[b·sab + i·sai + p·sap] and
// B(p, j) = bm[b·sbb + p·sbp + j·sbj], so either operand may be stored transposed.

// Short k: one thread per output.
extern "C" __global__ void matmul_short_k_f32(u64 batch, u64 m, u64 n, u64 k, const float* a, u64 sab, u64 sai,
                                              u64 sap, const float* bm, u64 sbb, u64 sbp, u64 sbj, float* c) {
    GRID_STRIDE(t, batch * m * n) {
        const u64 j = t % n, i = (t / n) % m, b = t / (m * n);
        const float* ar = a + b * sab + i * sai;
        const float* bc = bm + b * sbb + j * sbj;
        float acc = 0.0f;
        for (u64 p = 0; p < k; ++p) acc = fmaf(ar[p * sap], bc[p * sbp], acc);
        c[t] = acc;
    }
}

// Few outputs over a long k: one warp per output, its lanes splitting k.
extern "C" __global__ void matmul_warp_f32(u64 batch, u64 m, u64 n, u64 k, const float* a, u64 sab, u64 sai,
                                           u64 sap, const float* bm, u64 sbb, u64 sbp, u64 sbj, float* c) {
    const u64 warps = (u64)gridDim.x * blockDim.x / 32;
    const u64 lane = threadIdx.x % 32;
    // w is the same for every lane of a warp, so the whole warp stays in the loop for the shuffles.
    for (u64 w = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < batch * m * n; w += warps) {
        const u64 j = w % n, i = (w / n) % m, b = w / (m * n);
        const float* ar = a + b * sab + i * sai;
        const float* bc = bm + b * sbb + j * sbj;
        float acc = 0.0f;
        for (u64 p = lane; p < k; p += 32) acc = fmaf(ar[p * sap], bc[p * sbp], acc);
        acc = warp_sum(acc);
        if (lane == 0) c[w] = acc;
    }
}
