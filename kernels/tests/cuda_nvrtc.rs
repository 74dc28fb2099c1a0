//! Every `.cu` source compiles with NVRTC. NVRTC is a host library, so this runs without a GPU
//! wherever `libnvrtc.so.13` can be loaded (e.g. `pip install nvidia-cuda-nvrtc` and its lib
//! folder on `LD_LIBRARY_PATH`); CI has none, hence ignored there.
#![cfg(feature = "cuda")]

#[test]
#[ignore = "needs libnvrtc.so.13 on the library path"]
fn every_kernel_source_compiles_for_hopper() {
    let n =
        cohort_kernels::cuda::compile_kernels(Some("compute_90")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 31);
}

#[test]
#[ignore = "needs libnvrtc.so.13 on the library path"]
fn every_kernel_source_compiles_for_turing() {
    let n =
        cohort_kernels::cuda::compile_kernels(Some("compute_75")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, 31);
}
