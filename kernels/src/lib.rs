//! cohort-kernels: Compute kernels on raw buffers: CPU (gemm, rayon) and CUDA (cuBLAS, NVRTC).
