// 2-D max pooling without padding; idx holds the flat in-plane index (y·w + x) of each max.

extern "C" __global__ void max_pool2d_f32(u64 planes, u64 h, u64 w, u64 k, u64 stride, u64 oh, u64 ow,
                                          const float* x, float* out, int* idx) {
    const u64 n = planes * oh * ow;
    GRID_STRIDE(t, n) {
        const u64 ox = t % ow, oy = (t / ow) % oh, pl = t / (ow * oh);
        const float* src = x + pl * h * w;
        float best = 0.0f;
        int bi = 0;
        bool first = true;
        for (u64 ky = 0; ky < k; ++ky) {
            const u64 y = oy * stride + ky;
            for (u64 kx = 0; kx < k; ++kx) {
                const u64 xx = ox * stride + kx;
                const float v = src[y * w + xx];
                if (first || v > best) {
                    best = v;
                    bi = (int)(y * w + xx);
                    first = false;
                }
            }
        }
        out[t] = best;
        idx[t] = bi;
    }
}

// grad_in (zeroed by the host) [planes, hw_in] += grad_out routed by idx.
extern "C" __global__ void max_pool2d_backward_f32(u64 planes, u64 hw_in, u64 hw_out, const float* g,
                                                   const int* idx, float* gin, int* flag) {
    const u64 n = planes * hw_out;
    GRID_STRIDE(t, n) {
        const int i = idx[t];
        if (i < 0 || (u64)i >= hw_in) {
            report_index_error(flag, OP_MAX_POOL_BACKWARD, i, (i64)hw_in);
        } else {
            atomicAdd(&gin[(t / hw_out) * hw_in + (u64)i], g[t]);
        }
    }
}
