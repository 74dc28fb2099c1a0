//! cohort-tensor: Tensors on the CPU and on CUDA, with storage from the cohort allocator.
