// What the f32 and tensor-core kernels of fused attention share.

#define LOG2E 1.4426950408889634f

// Does query i see key j? keep: the sequence's row of the key-padding mask, or null.
__device__ __forceinline__ bool visible(u64 i, u64 j, u64 len, int causal, const float* keep) {
    return i < len && j < len && !(causal && j > i) && !(keep && keep[j] == 0.0f);
}
