// Host stand-ins for what the kernel sources use of CUDA, so that g++ can check their syntax and types without
// nvcc or a GPU (`cargo xtask cuda-check`). Declarations only: nothing here runs. NVRTC remains the judge of
// what compiles for the device (intrinsics, inline PTX).
// The newest architecture the kernels gate code on, so that g++ sees all of it.
#define __CUDA_ARCH__ 900
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define __restrict__
#define __launch_bounds__(...)
struct dim3_ { unsigned x, y, z; };
extern dim3_ threadIdx, blockIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
float __uint_as_float(unsigned);
unsigned __float_as_uint(float);
float __int_as_float(int);
int __float_as_int(float);
template <typename T> T __shfl_xor_sync(unsigned, T, int, int = 32);
template <typename T> T __shfl_sync(unsigned, T, int, int = 32);
template <typename T> T __shfl_down_sync(unsigned, T, unsigned, int = 32);
unsigned __match_any_sync(unsigned, int);
unsigned __ballot_sync(unsigned, int);
int __any_sync(unsigned, int);
int __popc(unsigned);
int __ffs(int);
void __syncthreads();
void __syncwarp(unsigned = 0xffffffffu);
void __threadfence();
int atomicCAS(int*, int, int);
float atomicAdd(float*, float);
int atomicAdd(int*, int);
unsigned atomicAdd(unsigned*, unsigned);
unsigned atomicInc(unsigned*, unsigned);
int atomicMax(int*, int);
template <typename T> T min(T, T);
template <typename T> T max(T, T);
double fmax(double, double);
double sqrt(double);
bool isfinite(float);
double exp(double);
double log(double);
float fmaxf(float, float);
float fminf(float, float);
float fmaf(float, float, float);
float expf(float);
float exp2f(float);
float __expf(float);
float logf(float);
float log2f(float);
float __logf(float);
float sqrtf(float);
float rsqrtf(float);
float tanhf(float);
float fabsf(float);
float powf(float, float);
float __fdividef(float, float);
double __dmul_rn(double, double);
double __dsub_rn(double, double);
double __drcp_rn(double);
double __dsqrt_rn(double);
float __double2float_rn(double);
#define asm(...) ((void)0)
