//! Developer tasks for the cohort workspace.
//!
//! - `cargo xtask gpu-bundle`: stripped release binaries (the `cohort` binary, test binaries, bench binaries, this
//!   tool) plus the reference scripts and traces, in a git-ignored `gpu-bundle/` ready to carry to a GPU machine.
//! - `cargo xtask bench [--quick] [--reference]`: the allocator trace replays, the criterion benchmarks and the cohort
//!   throughput benchmark on the best device, with the reference framework run in the same call; one table of ratios
//!   and JSON under `target/bench/`. On a GPU machine without cargo, run the carried tool as
//!   `gpu-bundle/xtask bench --bundle gpu-bundle` and it uses the carried binaries instead of cargo.
//!   On a GPU it also trains realistic workloads in fp32, tf32 and bf16 beside PyTorch's eager and CUDA-graph steps:
//!   an image CNN (`cnn`), a small ResNet of N members, loop and fused, also beside `torch.func` vmap (`resnet`), a
//!   grid of Transformer language models (`transformer`), the CNN co-trained with a text classifier (`cotrain`), and
//!   the fused attention kernel alone beside PyTorch's `scaled_dot_product_attention` (`attention`). On the CPU it also times the machine's FMA peak beside our matrix products. `cargo run --release -p
//!   xtask --no-default-features -- bench` measures the AVX2 paths (and JAX capped at AVX2) on a CPU with AVX-512.
//! - `cargo xtask profile [--n 1,128]`: one fused training step's time per phase, and per kernel on a GPU
//!   (`COHORT_CUDA_PROFILE=1`).
//! - `cargo xtask cuda-check [--cxx g++]`: every CUDA kernel source checked for syntax and types by the host's C++
//!   compiler, without nvcc or a GPU.

mod attention;
mod bench;
mod bundle;
mod cnn;
mod cohort;
mod cotrain;
mod cuda_check;
mod input_bound;
mod input_reference;
mod peak;
mod profile;
mod resnet;
mod transformer;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "cohort developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build stripped release binaries for a GPU machine into a folder (default `gpu-bundle/`).
    GpuBundle(bundle::Args),
    /// Run the benchmarks and print one table of our figures against the reference frameworks.
    Bench(bench::Args),
    /// Where one fused training step's time goes: per phase, and per kernel on a GPU (`COHORT_CUDA_PROFILE=1`).
    Profile(profile::Args),
    /// Check every CUDA kernel source with the host C++ compiler (syntax and types; no nvcc or GPU needed).
    CudaCheck(cuda_check::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::GpuBundle(args) => bundle::run(&args),
        Task::Bench(args) => {
            timed_in_release("bench")?;
            bench::run(&args)
        }
        Task::Profile(args) => {
            timed_in_release("profile")?;
            profile::run(&args)
        }
        Task::CudaCheck(args) => cuda_check::run(&args),
    }
}

/// The cohort benchmark and the profile time training steps inside this binary: a debug build runs them about 100x
/// slower, and its figures would read as ours.
fn timed_in_release(task: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !cfg!(debug_assertions),
        "`xtask {task}` times code inside this binary, which is a debug build: run it as `cargo xtask {task}` \
         (the alias builds in release) or `cargo run --release -p xtask -- {task}`"
    );
    Ok(())
}
