"""PyTorch's side of `kernels/benches/cuda.rs`'s `cuda_conv` group: the CNN's 64 -> 128 channel 3x3 convolution on
32x32 images, batch 128, padding 1, in f32: forward with its bias, the input's gradient and the weight's gradient,
each timed alone with CUDA events (the median of 50 runs after 10 untimed), with cuDNN's own algorithm search
(`cudnn.benchmark = True`, the strongest plain form) and TF32 off, the same precision as cohort's, then with TF32
on (PyTorch's default for convolutions) for reference.

Run on the GPU machine:

    python3 bench/torch_conv.py
"""

import statistics

import torch
import torch.nn.functional as F

N, C_IN, C_OUT, H, W, K = 128, 64, 128, 32, 32, 3


def timed(fn, runs=50, warm=10):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main():
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    x = torch.full((N, C_IN, H, W), 0.5, device=dev)
    w = torch.full((C_OUT, C_IN, K, K), 0.25, device=dev)
    b = torch.full((C_OUT,), 0.1, device=dev)
    gy = torch.ones((N, C_OUT, H, W), device=dev)
    flops = 2 * N * C_OUT * H * W * C_IN * K * K
    for tf32 in (False, True):
        torch.backends.cudnn.allow_tf32 = tf32
        rows = {
            "fwd": lambda: F.conv2d(x, w, b, padding=1),
            "bwd_data": lambda: torch.nn.grad.conv2d_input(x.shape, w, gy, padding=1),
            "bwd_filter": lambda: torch.nn.grad.conv2d_weight(x, w.shape, gy, padding=1),
        }
        for name, fn in rows.items():
            us = timed(fn)
            print(f"torch {'tf32' if tf32 else 'fp32'} {name:<10} {us:9.1f} us  {flops / us / 1e6:8.1f} TFLOP/s")


if __name__ == "__main__":
    main()
