//! Kernel modules: built into the crate (`build.rs`), or compiled by NVRTC once per machine, not once per process.
//!
//! The modules the build script built in for the device's architecture load as they are. Any other source is
//! compiled to a cubin for the device's own architecture (`sm_90`), which the driver loads as it is,
//! with no JIT of PTX. The cubin is kept on disk, so that a later process loads it without compiling anything, and
//! in memory, so that every device of one process shares it. Where the architecture is one this build does not
//! know, the source is compiled to PTX for NVRTC's default target and the driver JIT-compiles it.
//!
//! The disk cache lives in the folder the application names ([`set_kernel_cache`]; none by default). A file is
//! found by a hash of its key (the full source, the options, the architecture, NVRTC's and the driver's versions)
//! and holds the key itself, which is compared in full before its cubin is used: a collision, a stale file or a
//! file from another toolkit is a miss, never a wrong kernel. Files are written whole and renamed into place, so a
//! writer that dies leaves nothing half-written, and one that does not load is compiled again and replaced.

use std::collections::HashMap;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock, PoisonError};

use cudarc::driver::sys;
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

use super::gpu::cuda_err;
use super::sources::{COMMON_SOURCES, KernelSource, OPTIONS};
use crate::{Error, Result};

/// Magic line of a cache file (its format's version).
const MAGIC: &[u8] = b"cohort-kernel-cache 1\n";

mod built {
    include!(concat!(env!("OUT_DIR"), "/built_in.rs"));
}

/// Whether the built-in cubins are used ([`set_built_in_kernels`]).
static BUILT_IN_ON: AtomicBool = AtomicBool::new(true);

/// Uses the cubins built into the crate from now on (`true`, the default), or not: then every module comes from the
/// disk cache or NVRTC, as in a build without them (how tests and measurements reach that path).
pub fn set_built_in_kernels(on: bool) {
    BUILT_IN_ON.store(on, Ordering::Relaxed);
}

/// The cubins built into the crate, as (architecture, module): `sm_90`, `unary`.
pub fn built_in_kernels() -> impl Iterator<Item = (&'static str, &'static str)> {
    built::BUILT_IN.iter().map(|&(sm, name, _)| (sm, name))
}

/// The cubin of `src` for `sm` built into the crate, if there is one and they are used.
fn built_in(src: &KernelSource, sm: &str) -> Option<Vec<u8>> {
    if !BUILT_IN_ON.load(Ordering::Relaxed) {
        return None;
    }
    let found = built::BUILT_IN
        .iter()
        .find(|&&(s, name, _)| s == sm && name == src.name);
    found.map(|&(_, _, image)| image.to_vec())
}

impl KernelSource {
    /// Compiles the source to PTX for `arch` (`compute_90`, ...; `None`: NVRTC's default).
    pub(crate) fn compile(&self, arch: Option<&'static str>) -> Result<Ptx> {
        nvrtc_present()?;
        let opts = CompileOptions {
            arch,
            name: Some(format!("{}.cu", self.name)),
            options: OPTIONS.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        };
        nvrtc::compile_ptx_with_opts(self.full_source(), opts).map_err(|e| match e {
            CompileError::CompileError { log, .. } => self.log_error(&log.to_string_lossy()),
            other => cuda_err(&format!("NVRTC on {}.cu", self.name), other),
        })
    }

    /// Compiles the source to a cubin for `sm` (`sm_90`, ...).
    fn compile_cubin(&self, sm: &str) -> Result<Vec<u8>> {
        nvrtc_present()?;
        self.cubin(sm).map_err(|log| self.log_error(&log))
    }

    fn log_error(&self, log: &str) -> Error {
        Error::Cuda(format!("NVRTC could not compile {}.cu:\n{log}", self.name))
    }
}

fn nvrtc_present() -> Result<()> {
    // SAFETY: only tries to open the shared library.
    if unsafe { nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::Cuda(
        "NVRTC (libnvrtc.so.13) was not found: install the CUDA 13 toolkit's runtime compiler or put its lib \
         folder on LD_LIBRARY_PATH"
            .to_string(),
    ))
}

/// What a device compiles for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Target {
    /// The real architecture for a cubin (`sm_90`); `None`: one this build does not know (PTX then).
    sm: Option<&'static str>,
    /// The virtual architecture for PTX (`compute_90`).
    arch: Option<&'static str>,
}

impl Target {
    /// The target of a device of compute capability `cc`.
    pub(crate) fn of(cc: (i32, i32)) -> Target {
        let (sm, arch) = match cc {
            (7, 5) => ("sm_75", "compute_75"),
            (8, 0) => ("sm_80", "compute_80"),
            (8, 6) => ("sm_86", "compute_86"),
            (8, 7) => ("sm_87", "compute_87"),
            (8, 9) => ("sm_89", "compute_89"),
            (9, 0) => ("sm_90", "compute_90"),
            (10, 0) => ("sm_100", "compute_100"),
            (10, 3) => ("sm_103", "compute_103"),
            (11, 0) => ("sm_110", "compute_110"),
            (12, 0) => ("sm_120", "compute_120"),
            (12, 1) => ("sm_121", "compute_121"),
            _ => {
                return Target {
                    sm: None,
                    arch: None,
                };
            }
        };
        Target {
            sm: Some(sm),
            arch: Some(arch),
        }
    }
}

/// Where a module's image came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Compiled by NVRTC in this process.
    Compiled,
    /// Read from the disk cache.
    Disk,
    /// Built into the crate.
    BuiltIn,
}

/// A module's image once made (or why it could not be), shared by every device of the process.
type Slot = Arc<OnceLock<std::result::Result<(Ptx, Origin), String>>>;

fn slot(name: &'static str, target: Target) -> Slot {
    static SLOTS: OnceLock<Mutex<HashMap<(&'static str, Target), Slot>>> = OnceLock::new();
    let slots = SLOTS.get_or_init(Default::default);
    let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
    slots.entry((name, target)).or_default().clone()
}

/// Makes `src`'s image for `target`: the disk cache's cubin, the built-in one, or NVRTC's.
fn make(src: &KernelSource, target: Target) -> Result<(Ptx, Origin)> {
    match target.sm {
        Some(sm) => {
            let dir = cache_dir();
            let (cubin, origin) = match ready(src, sm, dir.as_deref()) {
                Some(found) => found,
                None => (compiled(src, sm, dir.as_deref())?, Origin::Compiled),
            };
            Ok((Ptx::from_binary(cubin), origin))
        }
        None => Ok((src.compile(target.arch)?, Origin::Compiled)),
    }
}

/// The cubin of `src` for `sm` that needs no compiling: the built-in one, else the disk cache's. A built-in module
/// thus costs no key (whose NVRTC version loads NVRTC) and no file read as a process starts.
fn ready(src: &KernelSource, sm: &str, dir: Option<&Path>) -> Option<(Vec<u8>, Origin)> {
    let built = built_in(src, sm).map(|c| (c, Origin::BuiltIn));
    built.or_else(|| Some((cached(src, sm, dir?)?, Origin::Disk)))
}

/// The module image of `src` for `target`, and where it came from: the disk cache, the crate, or NVRTC (made once
/// per process). A common module is most often made already, or being made, by [`prefetch`]; then this waits for it
/// alone. The others (batch norm's, attention's) are made here, when first asked for.
pub(crate) fn image(src: &'static KernelSource, target: Target) -> Result<(Ptx, Origin)> {
    slot(src.name, target)
        .get_or_init(|| make(src, target).map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Cuda)
}

/// Starts making the common modules' images for `target`, once per target (cubin targets only: a PTX one is
/// compiled where it is used). A device calls it as it opens, so that NVRTC works while the process sets up (cuBLAS,
/// cuDNN, its models and data) and a kernel waits for its own module only, not for the slowest. Cubins on disk or
/// built in are taken here; the rest are compiled side by side, each on a thread of its own, which exit waits for.
pub(crate) fn prefetch(target: Target) {
    static STARTED: Mutex<Vec<Target>> = Mutex::new(Vec::new());
    let Some(sm) = target.sm else { return };
    {
        let mut started = STARTED.lock().unwrap_or_else(PoisonError::into_inner);
        if started.contains(&target) {
            return;
        }
        started.push(target);
    }
    let dir = cache_dir();
    let mut missing = Vec::new();
    for src in COMMON_SOURCES {
        let s = slot(src.name, target);
        match ready(src, sm, dir.as_deref()) {
            Some((cubin, origin)) => {
                let _ = s.set(Ok((Ptx::from_binary(cubin), origin)));
            }
            None => missing.push((src, s)),
        }
    }
    if missing.is_empty() {
        return;
    }
    wait_at_exit();
    for (src, s) in missing {
        let flight = Flight::start();
        std::thread::spawn(move || {
            let _landed = flight;
            s.get_or_init(|| make(src, target).map_err(|e| e.to_string()));
        });
    }
}

/// Modules being made on [`prefetch`]'s threads.
static IN_FLIGHT: Mutex<usize> = Mutex::new(0);
static LANDED: Condvar = Condvar::new();

/// One module in flight, from before its thread starts (so that exit cannot miss it) until the thread ends.
struct Flight;

impl Flight {
    fn start() -> Flight {
        *IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Flight
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        *IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        LANDED.notify_all();
    }
}

extern "C" fn wait_for_flights() {
    let mut n = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
    while *n > 0 {
        n = LANDED.wait(n).unwrap_or_else(PoisonError::into_inner);
    }
}

/// Makes exit wait for the modules in flight (once per process). NVRTC's libraries crash if their destructors run
/// under a compile, and exit runs the handlers registered last first: so both are loaded before the wait is
/// registered (compiling an empty program loads NVRTC's builtins), and it runs before their destructors.
fn wait_at_exit() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if nvrtc_present().is_ok() {
            let _ = nvrtc::compile_ptx("");
        }
        // SAFETY: registers a function of no arguments that only waits on a condition variable.
        unsafe { libc::atexit(wait_for_flights) };
    });
}

/// An image of `src` for `target` in place of one from `refused` that the driver did not load.
pub(crate) fn replacement(
    src: &'static KernelSource,
    target: Target,
    refused: Origin,
) -> Result<Ptx> {
    match target.sm {
        Some(sm) => Ok(Ptx::from_binary(replacement_cubin(
            src,
            sm,
            cache_dir().as_deref(),
            refused,
        )?)),
        None => src.compile(target.arch),
    }
}

/// For a refused built-in cubin, the one an earlier process compiled in its stead on disk; else (or where there is
/// none) NVRTC's, stored on disk in place of what the cache held.
fn replacement_cubin(
    src: &KernelSource,
    sm: &str,
    dir: Option<&Path>,
    refused: Origin,
) -> Result<Vec<u8>> {
    let earlier = (refused == Origin::BuiltIn)
        .then(|| cached(src, sm, dir?))
        .flatten();
    earlier.map_or_else(|| compiled(src, sm, dir), Ok)
}

/// The cubin of `src` for `sm`, compiled by NVRTC and stored in `dir` (replacing what it held).
fn compiled(src: &KernelSource, sm: &str, dir: Option<&Path>) -> Result<Vec<u8>> {
    let Some(dir) = dir else {
        return src.compile_cubin(sm);
    };
    let key = key(src, sm);
    let path = cache_file(dir, src.name, &key);
    let cubin = src.compile_cubin(sm)?;
    if let Err(e) = store(&path, &key, &cubin) {
        tracing::warn!(
            "kernel cache: could not write {} ({e}); kernels are compiled in every process",
            path.display()
        );
    }
    Ok(cubin)
}

/// The cubin of `src` for `sm` that `dir` holds, if one was made from the same key.
fn cached(src: &KernelSource, sm: &str, dir: &Path) -> Option<Vec<u8>> {
    let key = key(src, sm);
    let file = std::fs::read(cache_file(dir, src.name, &key)).ok()?;
    unwrap_entry(&file, &key)
}

/// Everything that decides a cubin's bytes.
fn key(src: &KernelSource, sm: &str) -> Vec<u8> {
    let mut k = format!(
        "arch {sm}\noptions {}\nnvrtc {}\ndriver {}\nsource {}\n",
        OPTIONS.join(" "),
        nvrtc_version(),
        driver_version(),
        src.name
    )
    .into_bytes();
    k.extend_from_slice(src.full_source().as_bytes());
    k
}

fn cache_file(dir: &Path, name: &str, key: &[u8]) -> PathBuf {
    dir.join(format!("{name}-{:08x}.cubin", crc32c::crc32c(key)))
}

/// A cache file: the magic line, the key's length (8 bytes, little-endian), the key, the cubin.
fn entry(key: &[u8], cubin: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(MAGIC.len() + 8 + key.len() + cubin.len());
    f.extend_from_slice(MAGIC);
    f.extend_from_slice(&(key.len() as u64).to_le_bytes());
    f.extend_from_slice(key);
    f.extend_from_slice(cubin);
    f
}

/// The cubin of a cache file made from `key`; `None` for another key, another format or a damaged file.
fn unwrap_entry(file: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let rest = file.strip_prefix(MAGIC)?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    let (stored, cubin) = (rest.get(..len)?, rest.get(len..)?);
    (stored == key && !cubin.is_empty()).then(|| cubin.to_vec())
}

/// Writes the entry to a temporary file beside `path` and renames it into place.
fn store(path: &Path, key: &[u8], cubin: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kernel"),
        std::process::id()
    ));
    std::fs::write(&tmp, entry(key, cubin))?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The disk cache's folder ([`set_kernel_cache`]); `None`: no disk cache.
static CACHE_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

fn cache_dir() -> Option<PathBuf> {
    CACHE_DIR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Keeps compiled kernels in `dir` from now on (`None`: in this process's memory only, the default). The
/// application decides where: the `cohort` trainer uses `COHORT_KERNEL_CACHE`, else the user's cache folder.
pub fn set_kernel_cache(dir: Option<PathBuf>) {
    *CACHE_DIR.lock().unwrap_or_else(PoisonError::into_inner) = dir;
}

fn nvrtc_version() -> String {
    if nvrtc_present().is_err() {
        return "absent".into();
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers; the library is loaded.
    let r = unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r.result().is_ok() {
        format!("{major}.{minor}")
    } else {
        "unknown".into()
    }
}

fn driver_version() -> String {
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer; the driver was initialised before any device compiles.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r == sys::CUresult::CUDA_SUCCESS {
        v.to_string()
    } else {
        "unknown".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that set whether built-in cubins are used (one flag for the process).
    static BUILT_IN_FLAG: Mutex<()> = Mutex::new(());

    /// Prefetching returns with the modules still compiling on their threads; a kernel then waits for its own
    /// module, while the others go on; the process exits with any still in flight, where it must wait for them: a
    /// crash in NVRTC's destructors would fail this test binary. (Whether others are still compiling when the first
    /// is ready depends on the machine's cores: a 16-core one made them all within 1.2 s.)
    #[test]
    #[ignore = "needs libnvrtc.so.13 on the library path"]
    fn prefetched_modules_are_made_in_the_background() {
        let _flag = BUILT_IN_FLAG.lock().unwrap_or_else(PoisonError::into_inner);
        set_built_in_kernels(false);
        let target = Target::of((9, 0));
        let started = std::time::Instant::now();
        prefetch(target);
        let in_flight = *IN_FLIGHT.lock().unwrap();
        assert!(
            in_flight > 0,
            "prefetch returned after {:?} with no module compiling",
            started.elapsed()
        );
        let (_, origin) = image(&super::super::sources::CAST, target).unwrap();
        assert_eq!(origin, Origin::Compiled);
    }

    /// A module built into the crate is taken before the disk cache (no key, which loads NVRTC, and no file read as
    /// a process starts); where the driver refused it, the cubin an earlier process compiled in its stead is found on
    /// disk. Built without the module, the disk cache's cubin is taken.
    #[test]
    #[ignore = "needs a CUDA GPU (the cache key reads the driver's version)"]
    fn a_built_in_module_comes_before_the_disk_cache() {
        let _flag = BUILT_IN_FLAG.lock().unwrap_or_else(PoisonError::into_inner);
        set_built_in_kernels(true);
        let src = &super::super::sources::UNARY;
        let sm = built_in_kernels()
            .find(|&(_, module)| module == src.name)
            .map_or("sm_90", |(sm, _)| sm);
        let dir = std::env::temp_dir().join(format!("cohort-kc-built-{}", std::process::id()));
        let key = key(src, sm);
        store(
            &cache_file(&dir, src.name, &key),
            &key,
            b"compiled in its stead",
        )
        .unwrap();
        let (_, origin) = ready(src, sm, Some(&dir)).unwrap();
        if built_in(src, sm).is_some() {
            assert_eq!(origin, Origin::BuiltIn);
            let instead = replacement_cubin(src, sm, Some(&dir), Origin::BuiltIn).unwrap();
            assert_eq!(instead, b"compiled in its stead");
        } else {
            assert_eq!(
                origin,
                Origin::Disk,
                "nothing built in for {sm}: the disk cache's cubin"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_reads_back_only_under_its_own_key() {
        let key = b"arch sm_90\nsource x".to_vec();
        let f = entry(&key, b"\x7fELF cubin");
        assert_eq!(
            unwrap_entry(&f, &key).as_deref(),
            Some(&b"\x7fELF cubin"[..])
        );
        assert_eq!(unwrap_entry(&f, b"arch sm_80\nsource x"), None);
        // Truncated anywhere, or of another format: a miss, never a short cubin.
        for cut in [0, MAGIC.len(), MAGIC.len() + 8, MAGIC.len() + 8 + key.len()] {
            assert_eq!(unwrap_entry(&f[..cut], &key), None, "cut at {cut}");
        }
        let mut other = f.clone();
        other[MAGIC.len() - 2] = b'2';
        assert_eq!(unwrap_entry(&other, &key), None);
    }

    #[test]
    fn a_stored_entry_replaces_the_old_one_whole() {
        let dir = std::env::temp_dir().join(format!("cohort-kc-{}", std::process::id()));
        let path = dir.join("m-0.cubin");
        store(&path, b"k1", b"old").unwrap();
        store(&path, b"k2", b"new").unwrap();
        let f = std::fs::read(&path).unwrap();
        assert_eq!(unwrap_entry(&f, b"k2").as_deref(), Some(&b"new"[..]));
        assert_eq!(unwrap_entry(&f, b"k1"), None);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_known_capability_has_a_real_and_a_virtual_architecture() {
        let hopper = Target::of((9, 0));
        assert_eq!(
            (hopper.sm, hopper.arch),
            (Some("sm_90"), Some("compute_90"))
        );
        let unknown = Target::of((6, 1));
        assert_eq!((unknown.sm, unknown.arch), (None, None));
    }
}
