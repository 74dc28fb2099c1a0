//! The crate's kernel modules and how NVRTC compiles them, shared by the library and the build script (`build.rs`,
//! which builds the common modules and batch norm's into the crate where it can). A module is its folder's header,
//! if it has one, then one `.cu` file, compiled after `common.cuh`. Attention's modules (one per operand type and head
//! width) are in `attention/cuda.rs`.

use cudarc::nvrtc;

/// Helpers every module is compiled with (prepended to it).
const COMMON: &str = include_str!("common.cuh");

/// Options every module is compiled with.
pub const OPTIONS: &[&str] = &["--std=c++17"];

/// One `.cu` file of an op family (after its folder's header), compiled by NVRTC or built in.
#[derive(Debug)]
pub struct KernelSource {
    /// Module name; unique across the crate.
    pub name: &'static str,
    /// The header's and the file's text (`include_str!`).
    pub code: &'static str,
}

impl KernelSource {
    /// The text NVRTC compiles.
    pub fn full_source(&self) -> String {
        format!("{COMMON}\n#line 1 \"{}.cu\"\n{}", self.name, self.code)
    }

    /// Compiles the module to a cubin for `sm` (`sm_90`, ...); the error is NVRTC's log, or the call that failed.
    ///
    /// NVRTC must be loadable (`nvrtc::sys::is_culib_present`).
    pub fn cubin(&self, sm: &str) -> Result<Vec<u8>, String> {
        let src = std::ffi::CString::new(self.full_source()).expect("kernel sources hold no NUL");
        let name =
            std::ffi::CString::new(format!("{}.cu", self.name)).expect("module names hold no NUL");
        let prog = nvrtc::result::create_program(&src, Some(&name))
            .map_err(|e| format!("nvrtcCreateProgram: {e}"))?;
        let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
        options.push(format!("--gpu-architecture={sm}"));
        // SAFETY: `prog` was just created; it is destroyed right after, and not used again.
        let cubin = unsafe { cubin_of(prog, &options) };
        // SAFETY: as above. A failed destroy leaks one program; the compiled image is still good.
        let _ = unsafe { nvrtc::result::destroy_program(prog) };
        cubin
    }
}

/// Compiles program `prog` with `options` and returns its cubin.
///
/// # Safety
/// `prog` is a live NVRTC program.
unsafe fn cubin_of(prog: nvrtc::sys::nvrtcProgram, options: &[String]) -> Result<Vec<u8>, String> {
    // SAFETY: `prog` is live (the caller's promise); the size is read first and the buffer made that large, as
    // NVRTC's contract asks.
    unsafe {
        if nvrtc::result::compile_program(prog, options).is_err() {
            let log = nvrtc::result::get_program_log(prog).unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            return Err(String::from_utf8_lossy(&log).into_owned());
        }
        let mut size = 0usize;
        nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| format!("nvrtcGetCUBINSize: {e}"))?;
        let mut cubin = vec![0u8; size];
        nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
            .result()
            .map_err(|e| format!("nvrtcGetCUBIN: {e}"))?;
        Ok(cubin)
    }
}

/// A module of header and file texts, paths relative to this file.
macro_rules! module {
    ($name:literal, $($file:literal),+) => {
        KernelSource { name: $name, code: concat!($(include_str!($file)),+) }
    };
}

pub static BINARY: KernelSource = module!("binary", "../binary/binary.cuh", "../binary/binary.cu");
pub static BINARY_COMPARE: KernelSource = module!(
    "binary_compare",
    "../binary/binary.cuh",
    "../binary/compare.cu"
);
pub static BINARY_16: KernelSource =
    module!("binary_16", "../binary/binary.cuh", "../binary/half.cu");
pub static BINARY_INT: KernelSource =
    module!("binary_int", "../binary/binary.cuh", "../binary/int.cu");
pub static WHERE: KernelSource = module!("where", "../binary/binary.cuh", "../binary/where.cu");
pub static LAYERNORM: KernelSource = module!("layernorm", "../layernorm/layernorm.cu");
pub static UNARY: KernelSource = module!("unary", "../unary/unary.cu");
pub static REDUCE: KernelSource = module!("reduce", "../reduce/reduce.cu");
pub static SOFTMAX: KernelSource = module!("softmax", "../softmax/softmax.cu");
pub static INDEX: KernelSource = module!("index", "../index/index.cu");
pub static COPY: KernelSource = module!("copy", "../copy/copy.cu");
pub static CAST: KernelSource = module!("cast", "../copy/cast.cu");
pub static IM2COL: KernelSource = module!("im2col", "../conv/im2col.cu");
pub static MAX_POOL: KernelSource = module!("max_pool", "../pool/max_pool.cu");
pub static OPTIM: KernelSource = module!("optim", "../optim/optim.cu");
pub static MATMUL_THIN: KernelSource = module!("matmul_thin", "../matmul/thin.cu");
pub static BATCHNORM: KernelSource = module!("batchnorm", "../batchnorm/batchnorm.cu");
pub static CONV_POOLED: KernelSource = module!("conv_pooled", "../conv/pooled.cu");

/// The modules nearly every job uses, small enough for NVRTC to make in about a second each: where none is built in,
/// all are started side by side as a device opens (`modules::prefetch`), so that a machine's first run compiles while
/// it sets up.
pub static COMMON_SOURCES: [&KernelSource; 16] = [
    &BINARY,
    &BINARY_COMPARE,
    &BINARY_16,
    &BINARY_INT,
    &WHERE,
    &LAYERNORM,
    &UNARY,
    &REDUCE,
    &SOFTMAX,
    &INDEX,
    &COPY,
    &CAST,
    &IM2COL,
    &MAX_POOL,
    &OPTIM,
    &MATMUL_THIN,
];
