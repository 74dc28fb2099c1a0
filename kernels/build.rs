//! Builds the common kernel modules and batch norm's into the crate as cubins (`src/cuda/sources.rs`), so that a
//! machine's first run compiles nothing, as PyTorch's and candle's precompiled kernels do. With the `cuda` feature,
//! for each architecture `COHORT_CUDA_ARCH` names (`sm_90`, or a list: `sm_80,sm_90`), else each GPU `nvidia-smi`
//! lists, where NVRTC loads. Elsewhere none are built in, and NVRTC makes each module at run time as it did (kept in
//! the disk cache); a built-in cubin the driver refuses is compiled again there too.

use std::path::{Path, PathBuf};

#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "src/cuda/sources.rs"]
mod sources;

const ARCH: &str = "COHORT_CUDA_ARCH";

fn main() {
    println!("cargo:rerun-if-env-changed={ARCH}");
    println!("cargo:rerun-if-changed=build.rs");
    for file in kernel_files(Path::new("src")) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let images = built_in(&out);
    let entries: String = images
        .iter()
        .map(|(sm, name, path)| {
            format!(
                "    (\"{sm}\", \"{name}\", include_bytes!({:?})),\n",
                path.display()
            )
        })
        .collect();
    let text = format!(
        "/// Cubins built in by build.rs: (architecture, module, image).\n\
         pub(crate) static BUILT_IN: &[(&str, &str, &[u8])] = &[\n{entries}];\n"
    );
    std::fs::write(out.join("built_in.rs"), text).expect("OUT_DIR is writable");
}

/// The `.cu` and `.cuh` files of the op families, and the module list, whose changes rebuild the cubins.
fn kernel_files(src: &Path) -> Vec<PathBuf> {
    let mut files = vec![src.join("cuda").join("sources.rs")];
    for dir in std::fs::read_dir(src).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = file.path();
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("cu" | "cuh")
            ) {
                files.push(path);
            }
        }
    }
    files
}

/// The architectures asked for: `COHORT_CUDA_ARCH`'s (explicit: true), else the GPUs `nvidia-smi` lists.
#[cfg(feature = "cuda")]
fn architectures() -> (Vec<String>, bool) {
    if let Some(v) = std::env::var_os(ARCH) {
        let v = v.to_string_lossy();
        let archs: Vec<String> = v
            .split([',', ';', ' '])
            .filter(|a| !a.is_empty())
            .map(|a| {
                let digits = a.strip_prefix("sm_").unwrap_or(a);
                assert!(
                    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()),
                    "{ARCH}={v}: `{a}` is not an architecture; name them like sm_90 (H100), or sm_80,sm_90"
                );
                format!("sm_{digits}")
            })
            .collect();
        return (archs, true);
    }
    let smi = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output();
    let mut archs: Vec<String> = match smi {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| format!("sm_{}", l.replace('.', "")))
            .collect(),
        _ => Vec::new(),
    };
    archs.sort();
    archs.dedup();
    (archs, false)
}

/// The modules built in: the common ones, the pooled convolution's, and batch norm's (1.6-1.9 s on an H100 machine's CPU: the first CNN step's
/// wait where it is compiled). Attention's take seconds to minutes per operand type and width on a small machine, and
/// are compiled when first used.
#[cfg(feature = "cuda")]
fn built_ahead() -> impl Iterator<Item = &'static sources::KernelSource> {
    sources::COMMON_SOURCES
        .into_iter()
        .chain([&sources::BATCHNORM, &sources::CONV_POOLED])
}

#[cfg(not(feature = "cuda"))]
fn built_in(_out: &Path) -> Vec<(String, &'static str, PathBuf)> {
    Vec::new()
}

/// Compiles the modules built ahead for each architecture asked for, side by side, into `out`.
#[cfg(feature = "cuda")]
fn built_in(out: &Path) -> Vec<(String, &'static str, PathBuf)> {
    let (archs, explicit) = architectures();
    if archs.is_empty() {
        return Vec::new();
    }
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!(
            "cargo:warning=NVRTC (libnvrtc.so.13) was not found, so no kernels are built in for {} (from {}): they \
             are compiled on first use. Put the CUDA 13 toolkit's lib folder on LD_LIBRARY_PATH to build them in.",
            archs.join(", "),
            if explicit {
                ARCH
            } else {
                "the GPUs nvidia-smi lists"
            }
        );
        return Vec::new();
    }
    let jobs: Vec<(String, &'static sources::KernelSource)> = archs
        .iter()
        .flat_map(|sm| built_ahead().map(move |src| (sm.clone(), src)))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(sm, src)| {
                s.spawn(move || {
                    let cubin = src.cubin(&sm).unwrap_or_else(|log| {
                        panic!("NVRTC could not compile {}.cu for {sm}:\n{log}", src.name)
                    });
                    let path = out.join(format!("{sm}-{}.cubin", src.name));
                    std::fs::write(&path, cubin).expect("OUT_DIR is writable");
                    (sm, src.name, path)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a compile thread panicked"))
            .collect()
    })
}
