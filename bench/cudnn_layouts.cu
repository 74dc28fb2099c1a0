// cuDNN's legacy convolution algorithms timed on the CNN and ResNet bench geometries, NCHW beside NHWC, in each
// precision: which layout lets the tuner in kernels/src/conv/cudnn.rs reach the tensor-core kernels (#16).
// H100, cuDNN 9.14: NHWC runs the bf16 passes 1.2-2.4x faster than NCHW's best, but transposing the operands
// there and back costs about that much, except on the fused ResNet's grouped TF32 convolutions (NCHW: SIMT
// kernels, 1.75-4 ms; NHWC with its transposes 0.7 ms). Hence channels last as a timed candidate, not a default.
//   nvcc -O2 -o /tmp/cudnn_layouts bench/cudnn_layouts.cu -I$CUDNN/include -L$CUDNN/lib -lcudnn && /tmp/cudnn_layouts
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <cstdlib>

#define DNN(x)                                                                                   \
  do {                                                                                           \
    cudnnStatus_t s_ = (x);                                                                      \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                            \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudnnGetErrorString(s_));                 \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

struct Geo {
  const char* name;
  int n, c, h, w, o, groups;
};

__global__ void fill(unsigned short* p, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  // Small values of either sign, in bf16 and (read as pairs) harmless in f32 too.
  if (i < n) p[i] = (unsigned short)(0x3c00 | ((i * 2654435761u) >> 24 & 0xff)) ^ ((i & 1) << 15);
}

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms;
  cudaEventSynchronize(b);
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

int main() {
  const Geo geos[] = {
      {"cnn1 3->64 @64", 128, 3, 64, 64, 64, 1},
      {"cnn2 64->128 @32", 128, 64, 32, 32, 128, 1},
      {"cnn3 128->128 @16", 128, 128, 16, 16, 128, 1},
      // The fused ResNet at N = 16: one convolution of 16 channel groups.
      {"res 16x32 @32 g16", 128, 16 * 32, 32, 32, 16 * 32, 16},
      {"res 16x128 @8 g16", 128, 16 * 128, 8, 8, 16 * 128, 16},
      {"res 32->32 @32", 128, 32, 32, 32, 32, 1},
  };
  cudnnHandle_t h;
  DNN(cudnnCreate(&h));
  size_t big = 512 << 20;
  void *x, *w, *y, *ws;
  cudaMalloc(&x, big);
  cudaMalloc(&w, 64 << 20);
  cudaMalloc(&y, big);
  cudaMalloc(&ws, big);
  fill<<<(big / 2 + 255) / 256, 256>>>((unsigned short*)x, big / 2);
  fill<<<(big / 2 + 255) / 256, 256>>>((unsigned short*)y, big / 2);
  fill<<<(32 << 20) / 256, 256>>>((unsigned short*)w, 32 << 20);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  struct Prec {
    const char* name;
    cudnnDataType_t dt;
    cudnnMathType_t math;
  } precs[] = {{"bf16", CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH},
               {"tf32", CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH}};
  for (const Geo& g : geos)
    for (const Prec& p : precs)
      for (cudnnTensorFormat_t fmt : {CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC}) {
        cudnnTensorDescriptor_t xd, yd;
        cudnnFilterDescriptor_t wd;
        cudnnConvolutionDescriptor_t cd;
        DNN(cudnnCreateTensorDescriptor(&xd));
        DNN(cudnnCreateTensorDescriptor(&yd));
        DNN(cudnnCreateFilterDescriptor(&wd));
        DNN(cudnnCreateConvolutionDescriptor(&cd));
        DNN(cudnnSetTensor4dDescriptor(xd, fmt, p.dt, g.n, g.c, g.h, g.w));
        DNN(cudnnSetTensor4dDescriptor(yd, fmt, p.dt, g.n, g.o, g.h, g.w));
        DNN(cudnnSetFilter4dDescriptor(wd, p.dt, fmt, g.o, g.c / g.groups, 3, 3));
        DNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        DNN(cudnnSetConvolutionMathType(cd, p.math));
        DNN(cudnnSetConvolutionGroupCount(cd, g.groups));
        const char* layout = fmt == CUDNN_TENSOR_NCHW ? "NCHW" : "NHWC";
        float one = 1, zero = 0;
        if (fmt == CUDNN_TENSOR_NHWC) {
          // What the NHWC algorithms cost on NCHW tensors: the input's and the output's transposes.
          cudnnTensorDescriptor_t xn, yn;
          DNN(cudnnCreateTensorDescriptor(&xn));
          DNN(cudnnCreateTensorDescriptor(&yn));
          DNN(cudnnSetTensor4dDescriptor(xn, CUDNN_TENSOR_NCHW, p.dt, g.n, g.c, g.h, g.w));
          DNN(cudnnSetTensor4dDescriptor(yn, CUDNN_TENSOR_NCHW, p.dt, g.n, g.o, g.h, g.w));
          DNN(cudnnTransformTensor(h, &one, xn, x, &zero, xd, ws));
          cudaEventRecord(e0);
          for (int r = 0; r < 10; r++) cudnnTransformTensor(h, &one, xn, x, &zero, xd, ws);
          cudaEventRecord(e1);
          float tx = time_ms(e0, e1) * 100;
          cudaEventRecord(e0);
          for (int r = 0; r < 10; r++) cudnnTransformTensor(h, &one, yd, y, &zero, yn, ws);
          cudaEventRecord(e1);
          printf("%-20s %s transposes: x to NHWC %.0f us, y to NCHW %.0f us\n", g.name, p.name, tx, time_ms(e0, e1) * 100);
          cudnnDestroyTensorDescriptor(xn);
          cudnnDestroyTensorDescriptor(yn);
        }
        for (int pass = 0; pass < 3; pass++) {
          int n = 0;
          cudnnConvolutionFwdAlgoPerf_t pf[16];
          cudnnConvolutionBwdDataAlgoPerf_t pd[16];
          cudnnConvolutionBwdFilterAlgoPerf_t pw[16];
          if (pass == 0) DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 16, &n, pf));
          if (pass == 1) DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, wd, yd, cd, xd, 16, &n, pd));
          if (pass == 2) DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, xd, yd, cd, wd, 16, &n, pw));
          printf("%-20s %s %s %s:", g.name, p.name, layout, pass == 0 ? "fwd " : pass == 1 ? "data" : "filt");
          float best = 1e9;
          int best_algo = -1;
          for (int i = 0; i < n; i++) {
            cudnnStatus_t st = pass == 0 ? pf[i].status : pass == 1 ? pd[i].status : pw[i].status;
            int algo = pass == 0 ? (int)pf[i].algo : pass == 1 ? (int)pd[i].algo : (int)pw[i].algo;
            int math = pass == 0 ? (int)pf[i].mathType : pass == 1 ? (int)pd[i].mathType : (int)pw[i].mathType;
            if (st != CUDNN_STATUS_SUCCESS) continue;
            size_t need = 0;
            cudnnStatus_t s;
            if (pass == 0)
              s = cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, (cudnnConvolutionFwdAlgo_t)algo, &need);
            else if (pass == 1)
              s = cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd, (cudnnConvolutionBwdDataAlgo_t)algo,
                                                               &need);
            else
              s = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd,
                                                                 (cudnnConvolutionBwdFilterAlgo_t)algo, &need);
            if (s != CUDNN_STATUS_SUCCESS || need > big) continue;
            auto run = [&]() {
              if (pass == 0)
                return cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, (cudnnConvolutionFwdAlgo_t)algo, ws, need,
                                               &zero, yd, y);
              if (pass == 1)
                return cudnnConvolutionBackwardData(h, &one, wd, w, yd, y, cd, (cudnnConvolutionBwdDataAlgo_t)algo,
                                                    ws, need, &zero, xd, x);
              return cudnnConvolutionBackwardFilter(h, &one, xd, x, yd, y, cd, (cudnnConvolutionBwdFilterAlgo_t)algo,
                                                    ws, need, &zero, wd, w);
            };
            if (run() != CUDNN_STATUS_SUCCESS) {
              printf(" a%d:fail", algo);
              continue;
            }
            cudaEventRecord(e0);
            for (int r = 0; r < 10; r++) run();
            cudaEventRecord(e1);
            float us = time_ms(e0, e1) * 100;
            printf(" a%d%s:%.0f", algo, math ? "T" : "", us);
            if (us < best) best = us, best_algo = algo;
          }
          printf("  | best a%d %.0f us\n", best_algo, best);
        }
        cudnnDestroyTensorDescriptor(xd);
        cudnnDestroyTensorDescriptor(yd);
        cudnnDestroyFilterDescriptor(wd);
        cudnnDestroyConvolutionDescriptor(cd);
      }
  printf("cuda error state: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
