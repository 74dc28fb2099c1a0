"""What PyTorch's side of `cargo xtask bench`'s workload parts shares (bench/torch_cnn.py, torch_resnet.py,
torch_transformer.py; xtask/src/workload.rs is cohort's side of the same): the precision policies, the timing, the
CUDA-graph recipe, the peak memory and the JSON the Rust side reads.

Precisions as cohort's policies: fp32 (TF32 off for matmuls and cuDNN), tf32 (both on), bf16 (autocast around the
forward and the loss, fp32 weights, TF32 off). `cudnn.benchmark = True` lets cuDNN time its algorithms in the
warm-up steps. Timing mirrors cohort's (xtask/src/cohort.rs `rate`): untimed warm-up steps, then `--windows`
windows of at least `--window-s` seconds and 3 steps, the device synchronized every 16 steps and at a window's end;
the figure is the median window's rate. The peak is `torch.cuda.max_memory_allocated()` after
`reset_peak_memory_stats()`, which counts the parameters, Adam's state and the batch beside the step's own tensors,
as cohort's tenant peak does: eagerly over the timed steps; for a graph over its capture and replays (replays
allocate nothing; the capture holds the step's tensors).

The graph form follows PyTorch's whole-network capture recipe (torch.cuda.graphs docs): Adam with
`capturable=True`, warm-up steps on a side stream, grads set to None before the capture so that backward allocates
them from the graph's pool, static inputs; autocast with `cache_enabled=False` inside it.

Each script prints progress to stderr and one JSON object on stdout, `{"torch": ..., "device": ..., "rows": [...]}`,
a row per measurement with its keys (`precision`, `form`, ...) and figures, or its keys and `error`.
"""

import argparse
import gc
import json
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # the Rust side shows stderr and says the script needs torch
    sys.exit(f"{sys.argv[0]}: cannot import torch ({e}); run it with a Python that has torch with CUDA")

PRECISIONS = ("fp32", "tf32", "bf16")


def parser(description):
    """The arguments every script takes: the device and the timing."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated subset of fp32,tf32,bf16")
    return ap


def device(args, script):
    """The device asked for, with cuDNN's autotuning on; exits with a message where it is a GPU torch cannot see."""
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{script}: this torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    return dev


def device_name(dev):
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def precisions(args):
    chosen = [p for p in args.precisions.split(",") if p]
    bad = [p for p in chosen if p not in PRECISIONS]
    if bad:
        sys.exit(f"unknown precision {bad}: pick from {PRECISIONS}")
    return chosen


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


def eager(dev, step, args):
    """`step` timed eagerly: the warm-up, the peak reset, the windows' rates."""
    for _ in range(args.warmup):
        step()
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    return [window_rate(dev, step, args.window_s) for _ in range(args.windows)]


def graphed(dev, step, zero_grad, args):
    """`step` (which must not zero the grads itself) captured as one CUDA graph after warm-up steps on a side
    stream, each after `zero_grad()` (grads set to None); the replays timed."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(max(args.warmup, 3)):
            zero_grad()
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    sync(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    g = torch.cuda.CUDAGraph()
    zero_grad()
    with torch.cuda.graph(g):
        step()
    return [window_rate(dev, g.replay, args.window_s) for _ in range(args.windows)]


def measure(rows, keys, dev, run, figures, label):
    """Runs `run()` (the windows' rates, or those and a dict of notes for the row) and appends a row of `keys`,
    `figures(rate, peak)` and the notes, or of `keys` and the error: one form failing (a capture refused, memory run
    out) leaves the others' figures."""
    row = dict(keys)
    try:
        windows = run()
        if isinstance(windows, tuple):
            windows, notes = windows
            row.update(notes)
        rate = statistics.median(windows)
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
        row.update(figures(rate, peak), windows=windows)
        mib = f"  peak {peak / 2**20:.1f} MiB" if peak is not None else ""
        shown = ", ".join(f"{k} {v:.1f}" for k, v in figures(rate, peak).items()
                          if isinstance(v, float) and not k.startswith("peak"))
        print(f"torch {label}: {shown}{mib}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - every failure becomes the row's error
        row["error"] = f"{type(e).__name__}: {e}"
        print(f"torch {label}: failed: {row['error']}", file=sys.stderr)
    rows.append(row)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def emit(dev, rows, **meta):
    """The one JSON line the Rust side reads."""
    print(json.dumps({"torch": torch.__version__, "device": device_name(dev), **meta, "rows": rows}))
