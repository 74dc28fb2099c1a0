"""PyTorch's side of `cargo xtask bench`'s `cnn` part (xtask/src/cnn.rs trains the same model in cohort): an image
CNN trained on one fixed batch resident on the GPU, in fp32, TF32 and bf16 autocast, each eagerly and with the
whole step (forward, backward, Adam) captured as one CUDA graph; steps/s, images/s and the step's peak memory.

The model, defined here and, once, in xtask/src/cnn.rs as a cohort model spec: input [B, 3, 64, 64]; conv 3x3
3->64 pad 1 + ReLU; maxpool 2; conv 3x3 64->128 pad 1 + ReLU; maxpool 2; conv 3x3 128->128 pad 1 + ReLU; global
average pool; linear 128->10; cross-entropy; Adam lr 1e-3 (fused where this PyTorch has it).

Precisions as cohort's policies: fp32 (TF32 off for matmuls and cuDNN), tf32 (both on), bf16 (autocast around the
forward and the loss, fp32 weights, TF32 off). `cudnn.benchmark = True` lets cuDNN time its algorithms in the
warm-up steps. Timing mirrors cohort's (xtask/src/cohort.rs `rate`): untimed warm-up steps, then `--windows`
windows of at least `--window-s` seconds and 3 steps, the device synchronized every 16 steps and at a window's
end; the figure is the median window's rate. The peak is `torch.cuda.max_memory_allocated()` after
`reset_peak_memory_stats()`, which counts the parameters, Adam's state and the batch beside the step's own
tensors, as cohort's tenant peak does: eagerly over the timed steps; for a graph over its capture and replays
(replays allocate nothing; the capture holds the step's tensors).

The graph form follows PyTorch's whole-network capture recipe (torch.cuda.graphs docs): Adam with
`capturable=True`, warm-up steps on a side stream, grads set to None before the capture so that backward
allocates them from the graph's pool, static input and labels; autocast with `cache_enabled=False` inside it.

Prints progress to stderr and one JSON object on stdout:
`{"torch": ..., "device": ..., "rows": [{"precision", "form", "steps_per_s", "images_per_s", "windows",
"peak_bytes"} or {"precision", "form", "error"}]}`. Needs torch with CUDA; xtask runs it with `--reference`:

    python3 bench/torch_cnn.py [--batch 128 --side 64 --warmup 10 --windows 5 --window-s 1]

A CPU smoke run (eager only, no peak): `--device cpu --batch 2 --side 16 --warmup 1 --windows 1 --window-s 0`.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

PRECISIONS = ("fp32", "tf32", "bf16")


def model():
    """The benchmark's CNN (cohort's is the spec `CNN` of xtask/src/cnn.rs)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(128, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def adam(params, capturable):
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True, capturable=capturable)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=1e-3, capturable=capturable)


def set_precision(precision):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(dev, precision, cache_enabled=True):
    return torch.autocast(
        dev.type, dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=cache_enabled
    )


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def window_rate(dev, step, seconds):
    """Steps per second over at least `seconds` and 3 steps, synchronized every 16 steps and at the end."""
    sync(dev)
    start = time.perf_counter()
    done = 0
    while done < 3 or time.perf_counter() - start < seconds:
        step()
        done += 1
        if done % 16 == 0:
            sync(dev)
    sync(dev)
    return done / (time.perf_counter() - start)


def eager(dev, precision, x, y, args):
    net = model().to(dev)
    opt = adam(net.parameters(), capturable=False)

    def step():
        with autocast(dev, precision):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    return [window_rate(dev, step, args.window_s) for _ in range(args.windows)]


def graph(dev, precision, x, y, args):
    net = model().to(dev)
    opt = adam(net.parameters(), capturable=True)

    def step():
        with autocast(dev, precision, cache_enabled=False):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(max(args.warmup, 3)):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    sync(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        step()
    return [window_rate(dev, g.replay, args.window_s) for _ in range(args.windows)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-s", type=float, default=1.0)
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_cnn.py: this torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.rand(args.batch, 3, args.side, args.side, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    forms = {"eager": eager, "graph": graph} if dev.type == "cuda" else {"eager": eager}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}, batch {args.batch} of 3x{args.side}x{args.side}", file=sys.stderr)
    rows = []
    for precision in PRECISIONS:
        set_precision(precision)
        for form, run in forms.items():
            row = {"precision": precision, "form": form}
            try:
                windows = run(dev, precision, x, y, args)
                rate = statistics.median(windows)
                peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
                row.update(steps_per_s=rate, images_per_s=rate * args.batch, windows=windows, peak_bytes=peak)
                mib = f"  peak {peak / 2**20:.1f} MiB" if peak is not None else ""
                print(f"torch {precision} {form:5}: {rate:8.1f} steps/s {rate * args.batch:9.0f} images/s{mib}",
                      file=sys.stderr)
            except Exception as e:  # one form failing (a capture refused) leaves the others' figures
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"torch {precision} {form}: failed: {row['error']}", file=sys.stderr)
            rows.append(row)
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps({"torch": torch.__version__, "device": name, "batch": args.batch, "side": args.side,
                      "rows": rows}))


if __name__ == "__main__":
    main()
