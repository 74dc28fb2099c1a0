"""NVRTC's time over each kernel module, on this machine's CPU (#16 item 4: a fresh machine's first run waits for
the slowest module of those made together). Each module is assembled as kernels/src/cuda/modules.rs does
(common.cuh, the folder's .cuh files, the .cu file) and compiled to a cubin for ARCH (sm_90).

    python3 bench/nvrtc_times.py [LIBNVRTC] [ARCH]

LIBNVRTC defaults to CUDA's (/usr/local/cuda/lib64/libnvrtc.so); `pip install nvidia-cuda-nvrtc` gives one
without a GPU."""
import ctypes
import glob
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "src")
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda/lib64/libnvrtc.so")
ARCH = sys.argv[2] if len(sys.argv) > 2 else "sm_90"
# tensor_core.cu is one module per operand type and padded head width (attention/cuda.rs)
TENSOR_CORE = {"bf16": ("Bf16", "PACKED_KERNELS"), "f16": ("F16", "PACKED_KERNELS"),
               "tf32": ("Tf32", "TENSOR_CORE_KERNELS"), "tf32x3": ("Tf32x3", "TENSOR_CORE_KERNELS")}


def compile_cubin(name, src):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) == 0
    opts = [b"--std=c++17", ("--gpu-architecture=" + ARCH).encode()]
    t = time.time()
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    took = time.time() - t
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return name, took, size.value if rc == 0 else None


def modules():
    common = open(os.path.join(ROOT, "cuda", "common.cuh")).read()
    for cu in sorted(glob.glob(os.path.join(ROOT, "*", "*.cu"))):
        folder = os.path.dirname(cu)
        headers = "".join(open(h).read() for h in sorted(glob.glob(os.path.join(folder, "*.cuh"))))
        body = headers + open(cu).read()
        name = os.path.relpath(cu, ROOT)
        if name.endswith("tensor_core.cu"):
            for ty, (t, kernels) in TENSOR_CORE.items():
                for dp in (32, 64, 128):
                    defines = f"#define TC_KERNELS {kernels}\n#define TC_TY {ty}\n#define TC_T {t}\n#define TC_DP {dp}\n"
                    yield f"attention_{ty}_{dp}", common + defines + body
        else:
            yield name, common + body


def side_by_side(jobs, what):
    t0 = time.time()
    with ThreadPoolExecutor(len(jobs)) as pool:  # as a process makes them
        done = list(pool.map(lambda j: compile_cubin(*j), jobs))
    for name, took, size in sorted(done, key=lambda d: -d[1]):
        print(f"{name:24} {took:6.2f} s  {'failed' if size is None else f'{size} bytes'}")
    print(f"{what}: {time.time() - t0:.2f} s side by side on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    jobs = list(modules())
    # the common modules are made together as a device opens; batch norm's and attention's each when first used
    first_use = lambda j: j[0].startswith("attention") or j[0] == "batchnorm/batchnorm.cu"
    side_by_side([j for j in jobs if not first_use(j)], "common modules")
    side_by_side([j for j in jobs if first_use(j)], "modules made on first use")
