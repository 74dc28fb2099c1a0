// Products too thin for a tiled GEMM to fill the GPU: few contracted terms, or few rows or columns
// of D. A thread per element of D, column-major as cuBLAS sees it:
// D[i + j·ldc] = Σ_p op(A)(i, p)·op(B)(p, j), then + bias[i] and a ReLU when asked.

// Must match ThinGeometry in matmul/thin.rs.
struct ThinGeometry {
    int m, n, k, lda, ldb, ldc;
    int trans_a, trans_b, batch, relu;
    long long stride_a, stride_b, stride_c, bias_stride;
};

extern "C" __global__ void gemm_thin_f32(const float* a, const float* b, float* d, const float* bias,
                                         ThinGeometry g) {
    const long long mn = (long long)g.m * g.n;
    const long long total = mn * g.batch;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long e = t / mn;
        const long long r = t - e * mn;
        // Consecutive threads take consecutive rows of D: its writes coalesce.
        const long long i = r % g.m, j = r / g.m;
        const float* ab = a + e * g.stride_a;
        const float* bb = b + e * g.stride_b;
        float s = 0.0f;
        for (int p = 0; p < g.k; ++p) {
            const float av = g.trans_a ? ab[p + i * g.lda] : ab[i + (long long)p * g.lda];
            const float bv = g.trans_b ? bb[j + (long long)p * g.ldb] : bb[p + j * g.ldb];
            s = fmaf(av, bv, s);
        }
        if (bias) {
            s += bias[e * g.bias_stride + i];
            if (g.relu) s = fmaxf(s, 0.0f);
        }
        d[e * g.stride_c + i + j * g.ldc] = s;
    }
}
