//! The on-disk kernel cache, across processes: a cold process compiles and writes cubins (the common modules, neither
//! batch norm's nor attention's; an attention kernel then adds only its own module), a warm one loads them untouched, and a
//! damaged one is compiled again and replaced; with the modules built into the crate (`build.rs`) for the device, a
//! cold process compiles none of them. Each phase is this test binary run again, so that it starts with an empty
//! in-memory cache, as a new `cohort train` does.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use cohort_kernels::attention::{
    AttentionShape,
    cuda::{self as attention, AttentionMath},
};
use cohort_kernels::cuda::{CudaType, Gpu};
use cohort_kernels::unary::{UnaryOp, cuda as un_cuda};

const PHASE: &str = "COHORT_KERNEL_CACHE_TEST_PHASE";
const DIR: &str = "COHORT_KERNEL_CACHE_TEST_DIR";

/// In a child: runs one kernel and checks its result.
fn run_a_kernel() {
    let g = Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"));
    let x: Vec<f32> = (0..1000).map(|i| i as f32 - 500.0).collect();
    let buf = g.alloc(4000).unwrap();
    let mut out = vec![0f32; 1000];
    // SAFETY: the buffer holds 1000 f32, in place.
    unsafe {
        g.htod(buf.ptr(), bytemuck::cast_slice(&x)).unwrap();
        un_cuda::unary(&g, UnaryOp::Relu, CudaType::F32, buf.ptr(), buf.ptr(), 1000).unwrap();
        g.dtoh(buf.ptr(), bytemuck::cast_slice_mut(&mut out))
            .unwrap();
    }
    let want: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(out, want);
}

/// In a child: runs a bf16 attention forward pass, and checks that its output is finite and not all zero.
fn run_attention() {
    let g = Gpu::get(0).unwrap_or_else(|e| panic!("no GPU: {e}"));
    let shape = AttentionShape {
        seqs: 2,
        len: 16,
        heads: 2,
        head_dim: 8,
        scale: 8f64.powf(-0.5),
        causal: true,
        mask_rows: 0,
    };
    let qkv: Vec<f32> = (0..shape.qkv_len())
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
        .collect();
    let math = AttentionMath::Bf16;
    let (x, out, lse, packed) = (
        g.alloc(4 * qkv.len()).unwrap(),
        g.alloc(4 * shape.out_len()).unwrap(),
        g.alloc(4 * shape.lse_len()).unwrap(),
        g.alloc(attention::packed_bytes(&g, &shape, math, false).unwrap())
            .unwrap(),
    );
    let mut y = vec![0f32; shape.out_len()];
    // SAFETY: each buffer holds the f32 count `shape` gives it, packed its bytes; no mask (mask_rows 0).
    unsafe {
        g.htod(x.ptr(), bytemuck::cast_slice(&qkv)).unwrap();
        let (inputs, outputs) = ((x.ptr(), 0), (out.ptr(), lse.ptr()));
        attention::forward(&g, &shape, math, inputs, packed.ptr(), outputs).unwrap();
        g.dtoh(out.ptr(), bytemuck::cast_slice_mut(&mut y)).unwrap();
    }
    assert!(y.iter().all(|v| v.is_finite()) && y.iter().any(|&v| v != 0.0));
}

fn phase(dir: &Path, name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "the_kernel_cache_survives_processes",
            "--include-ignored",
        ])
        .env(PHASE, name)
        .env(DIR, dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "phase {name}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The modules with a cubin in `dir` (files `<module>-<hash>.cubin`), sorted.
fn modules(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| Some(n.strip_suffix(".cubin")?.rsplit_once('-')?.0.to_string()))
        .collect();
    v.sort();
    v
}

/// The cached cubins of the unary module (the one [`run_a_kernel`] needs), with their times and bytes.
fn cubins(dir: &Path) -> Vec<(PathBuf, SystemTime, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_else(|_| Vec::new())
        .into_iter()
        .filter(|p: &PathBuf| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("unary-") && name.ends_with(".cubin")
        })
        .map(|p| {
            let t = std::fs::metadata(&p).and_then(|m| m.modified()).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            (p, t, bytes)
        })
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_kernel_cache_survives_processes() {
    if std::env::var_os(PHASE).is_some() {
        cohort_kernels::cuda::set_kernel_cache(std::env::var_os(DIR).map(PathBuf::from));
        let phase = std::env::var(PHASE).unwrap_or_default();
        // the disk cache's phases as a build without built-in modules runs them
        cohort_kernels::cuda::set_built_in_kernels(phase == "built-in");
        match phase.as_str() {
            "attention" => run_attention(),
            _ => run_a_kernel(),
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("cohort-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    phase(&dir, "cold");
    let cold = cubins(&dir);
    assert_eq!(cold.len(), 1, "the unary module compiled and stored once");
    let elf = |b: &[u8]| b.windows(4).any(|w| w == b"\x7fELF");
    assert!(elf(&cold[0].2), "the file holds a cubin (an ELF image)");
    let made = modules(&dir);
    let first_use = |m: &String| m.starts_with("attention") || m == "batchnorm";
    assert!(
        made.len() > 1 && !made.iter().any(first_use),
        "the first kernel makes the common modules together, and neither batch norm's nor attention's: {made:?}"
    );

    std::thread::sleep(std::time::Duration::from_millis(20));
    phase(&dir, "warm");
    let warm = cubins(&dir);
    assert_eq!(warm.len(), 1);
    assert_eq!(
        (&warm[0].0, warm[0].1),
        (&cold[0].0, cold[0].1),
        "a warm process rewrites nothing"
    );

    // The key intact and the cubin garbled: the driver refuses it, and it is compiled again.
    let (path, _, bytes) = &cold[0];
    let start = bytes.windows(4).position(|w| w == b"\x7fELF").unwrap();
    let mut broken = bytes.clone();
    broken[start..].iter_mut().for_each(|b| *b = 0x5a);
    std::fs::write(path, &broken).unwrap();
    phase(&dir, "damaged");
    let mended = cubins(&dir);
    assert_eq!(mended.len(), 1);
    assert!(
        mended[0].2 != broken && elf(&mended[0].2),
        "the damaged file is replaced by a cubin"
    );

    // The first attention kernel makes its module alone: on tensor cores (sm_80 on), its operand type at its width.
    phase(&dir, "attention");
    let new: Vec<String> = modules(&dir)
        .into_iter()
        .filter(|m| !made.contains(m))
        .collect();
    let tensor_cores = Gpu::get(0).unwrap().compute_capability() >= (8, 0);
    assert_eq!(
        new,
        [if tensor_cores {
            "attention_bf16_32"
        } else {
            "attention"
        }]
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Built in for this device's architecture, a module is neither compiled nor written; else it is, as above.
    std::fs::create_dir_all(&dir).unwrap();
    phase(&dir, "built-in");
    let (major, minor) = Gpu::get(0).unwrap().compute_capability();
    let sm = format!("sm_{major}{minor}");
    let built_in: Vec<&str> = cohort_kernels::cuda::built_in_kernels()
        .filter(|&(arch, _)| arch == sm)
        .map(|(_, module)| module)
        .collect();
    let written = modules(&dir);
    if built_in.contains(&"unary") {
        assert!(
            built_in.len() > 1 && !written.iter().any(|m| built_in.contains(&m.as_str())),
            "modules built in for {sm} ({built_in:?}) are not compiled again: {written:?}"
        );
    } else {
        assert_eq!(
            written, made,
            "nothing built in for {sm}: the common modules are compiled"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
