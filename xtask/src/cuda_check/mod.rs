//! `cargo xtask cuda-check`: every kernel source checked for syntax and types by the host's C++ compiler, as NVRTC
//! will see it (`common.cuh`, then the `.cuh` files of its folder, then the `.cu` file), behind `host.h`'s stand-ins
//! for CUDA's built-ins. It needs no nvcc and no GPU, so a typo in a kernel is found here, not on a lent device;
//! NVRTC on the GPU remains the judge of device code (intrinsics, inline PTX).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bundle::workspace_root;

#[derive(clap::Args)]
pub struct Args {
    /// The host C++ compiler (C++17).
    #[arg(long, default_value = "g++")]
    cxx: String,
}

const HOST: &str = include_str!("host.h");

/// The files of `dir` whose names end in `ext`, sorted.
fn files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == ext) {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// One translation unit for `cu`: the stand-ins, then each part under a `#line` that names its file, so that the
/// compiler's messages point into the sources.
fn unit(common: &Path, cu: &Path) -> Result<String> {
    let dir = cu.parent().context("a kernel source without a folder")?;
    let mut parts = vec![common.to_path_buf()];
    parts.extend(files(dir, "cuh")?);
    parts.push(cu.to_path_buf());
    let mut text = String::from(HOST);
    for p in parts {
        let code = fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        text.push_str(&format!("#line 1 \"{}\"\n{code}\n", p.display()));
    }
    Ok(text)
}

pub fn run(args: &Args) -> Result<()> {
    let src = workspace_root().join("kernels/src");
    let common = src.join("cuda/common.cuh");
    let out = workspace_root().join("target/cuda-check");
    fs::create_dir_all(&out)?;
    let mut sources = Vec::new();
    for e in fs::read_dir(&src)? {
        let dir = e?.path();
        if dir.is_dir() {
            sources.extend(files(&dir, "cu")?);
        }
    }
    sources.sort();
    let mut failed = Vec::new();
    for cu in &sources {
        let name = cu.strip_prefix(&src).unwrap_or(cu).display().to_string();
        let file = out.join(name.replace('/', "-") + ".cpp");
        fs::write(&file, unit(&common, cu)?)?;
        let run = Command::new(&args.cxx)
            .args(["-std=c++17", "-fsyntax-only", "-Wno-attributes"])
            .arg(&file)
            .output()
            .with_context(|| {
                format!(
                    "running `{}`: install a C++17 compiler or name one with --cxx",
                    args.cxx
                )
            })?;
        if run.status.success() {
            println!("{name}: ok");
        } else {
            println!("{name}: errors");
            eprint!("{}", String::from_utf8_lossy(&run.stderr));
            failed.push(name);
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} kernel sources fail the host check: {}",
            failed.len(),
            sources.len(),
            failed.join(", ")
        );
    }
    println!(
        "{} kernel sources pass the host check ({}); NVRTC on a GPU remains the judge of device code",
        sources.len(),
        args.cxx
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_common_cuh_then_its_folders_headers_then_the_source_each_under_its_line_marker() {
        let src = workspace_root().join("kernels/src");
        let common = src.join("cuda/common.cuh");
        let cu = src.join("attention/attention.cu");
        let text = unit(&common, &cu).unwrap();
        let at = |p: &Path| {
            text.find(&format!("#line 1 \"{}\"\n", p.display()))
                .unwrap_or_else(|| panic!("{} is not in the unit", p.display()))
        };
        let (c, h, s) = (
            at(&common),
            at(&src.join("attention/attention.cuh")),
            at(&cu),
        );
        assert!(text.starts_with(HOST) && HOST.len() <= c && c < h && h < s);
        assert!(text[s..].contains(&fs::read_to_string(&cu).unwrap()));
    }
}
