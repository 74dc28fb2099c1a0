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

// Softmax cross-entropy, one warp per row: loss[r] = logsumexp(x_r) - x_r[label] and
// grad[r] = (softmax(x_r) - onehot(label)) * scale, in one pass. Row r takes labels[r % label_rows]
// (label_rows = rows, or the batch when every member shares the labels).
extern "C" __global__ void cross_entropy_f32(u64 rows, u64 cols, u64 label_rows, float scale, const int* labels,
                                             const float* x, float* loss, float* grad, int* flag) {
    const u64 r = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const unsigned lane = threadIdx.x % 32;
    if (r >= rows) return;  // whole warps only: the shuffles below stay full
    const float* xr = x + r * cols;
    float* gr = grad + r * cols;
    const int l = labels[r % label_rows];
    const bool ok = l >= 0 && (u64)l < cols;
    if (!ok && lane == 0) report_index_error(flag, OP_CROSS_ENTROPY, l, (i64)cols);
    float m = NEG_INF;
    for (u64 j = lane; j < cols; j += 32) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    float s = 0.0f;
    for (u64 j = lane; j < cols; j += 32) s += expf(xr[j] - m);
    s = warp_sum(s);
    const float inv = 1.0f / s;
    for (u64 j = lane; j < cols; j += 32) {
        const float hot = (ok && (u64)l == j) ? 1.0f : 0.0f;
        gr[j] = (expf(xr[j] - m) * inv - hot) * scale;
    }
    if (lane == 0) loss[r] = ok ? m + logf(s) - xr[l] : 0.0f;
}

// One row of a narrow head, by one thread: writes the row's gradient (softmax - onehot) * scale and
// returns its loss (0 for a bad label, which is reported through the flag).
__device__ float cross_entropy_row(u64 cols, int l, float scale, const float* xr, float* gr, int* flag) {
    const bool ok = l >= 0 && (u64)l < cols;
    if (!ok) report_index_error(flag, OP_CROSS_ENTROPY, l, (i64)cols);
    float m = NEG_INF;
    for (u64 j = 0; j < cols; ++j) m = fmaxf(m, xr[j]);
    float s = 0.0f;
    for (u64 j = 0; j < cols; ++j) s += expf(xr[j] - m);
    const float inv = 1.0f / s;
    for (u64 j = 0; j < cols; ++j) {
        const float hot = (ok && (u64)l == j) ? 1.0f : 0.0f;
        gr[j] = (expf(xr[j] - m) * inv - hot) * scale;
    }
    return ok ? m + logf(s) - xr[l] : 0.0f;
}

// cross_entropy_f32 for rows of at most 32 columns (classifier heads): one thread per row, so
// no lane of a warp idles on a short row.
extern "C" __global__ void cross_entropy_narrow_f32(u64 rows, u64 cols, u64 label_rows, float scale,
                                                    const int* labels, const float* x, float* loss, float* grad,
                                                    int* flag) {
    const u64 r = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    loss[r] = cross_entropy_row(cols, labels[r % label_rows], scale, x + r * cols, grad + r * cols, flag);
}

// cross_entropy_narrow_f32 averaged over each group of `batch` rows (a member's batch): one block
// per group (blockDim a multiple of 32, at least batch), a thread per row; loss[g] is the group's
// mean loss and grad uses scale = 1 / batch. Saves the separate mean of the rows' losses.
extern "C" __global__ void cross_entropy_mean_narrow_f32(u64 batch, u64 cols, u64 label_rows, const int* labels,
                                                         const float* x, float* loss, float* grad, int* flag) {
    const u64 r = (u64)blockIdx.x * batch + threadIdx.x;
    const float scale = 1.0f / (float)batch;
    const float lr = threadIdx.x < batch
                         ? cross_entropy_row(cols, labels[r % label_rows], scale, x + r * cols, grad + r * cols, flag)
                         : 0.0f;
    const float total = block_sum(lr);
    if (threadIdx.x == 0) loss[blockIdx.x] = total * scale;
}
