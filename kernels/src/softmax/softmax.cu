// Softmax and log-softmax along the last dim: one block per row.

extern "C" __global__ void softmax_f32(u64 cols, const float* x, float* out) {
    const float* r = x + (u64)blockIdx.x * cols;
    float* o = out + (u64)blockIdx.x * cols;
    float m = NEG_INF;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, r[j]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) s += expf(r[j] - m);
    s = block_sum(s);
    const float inv = 1.0f / s;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) o[j] = expf(r[j] - m) * inv;
}

extern "C" __global__ void log_softmax_f32(u64 cols, const float* x, float* out) {
    const float* r = x + (u64)blockIdx.x * cols;
    float* o = out + (u64)blockIdx.x * cols;
    float m = NEG_INF;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, r[j]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) s += expf(r[j] - m);
    s = block_sum(s);
    const float lse = m + logf(s);
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) o[j] = r[j] - lse;
}
