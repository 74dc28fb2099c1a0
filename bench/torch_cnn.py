"""PyTorch's side of `cargo xtask bench`'s `cnn` part (xtask/src/cnn.rs trains the same model in cohort): an image
CNN trained on one fixed batch resident on the GPU, in fp32, TF32 and bf16 autocast, each eagerly and with the
whole step (forward, backward, Adam) captured as one CUDA graph; steps/s, images/s and the step's peak memory.

The model, defined here and, once, in xtask/src/cnn.rs as a cohort model spec: input [B, 3, 64, 64]; conv 3x3
3->64 pad 1 + ReLU; maxpool 2; conv 3x3 64->128 pad 1 + ReLU; maxpool 2; conv 3x3 128->128 pad 1 + ReLU; global
average pool; linear 128->10; cross-entropy; Adam lr 1e-3 (fused where this PyTorch has it).

Precisions, timing, peak memory and the CUDA-graph recipe are bench/torch_timing.py's, shared with the other
workloads' scripts.

Prints progress to stderr and one JSON object on stdout:
`{"torch": ..., "device": ..., "rows": [{"precision", "form", "steps_per_s", "images_per_s", "windows",
"peak_bytes"} or {"precision", "form", "error"}]}`. Needs torch with CUDA; xtask runs it with `--reference`:

    python3 bench/torch_cnn.py [--batch 128 --side 64 --warmup 10 --windows 5 --window-s 1]

A CPU smoke run (eager only, no peak): `--device cpu --batch 2 --side 16 --warmup 1 --windows 1 --window-s 0`.
"""

import sys

from torch_timing import (
    adam, autocast, device, device_name, eager, emit, graphed, measure, parser, precisions, set_precision,
)

import torch
from torch import nn
from torch.nn import functional as F


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


def run(form, dev, precision, x, y, args):
    """The windows' rates of one form (`eager` or `graph`) of a fresh model's training step."""
    net = model().to(dev)
    graph = form == "graph"
    opt = adam(net.parameters(), capturable=graph)

    def step():
        with autocast(dev, precision, cache_enabled=not graph):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if not graph:
            opt.zero_grad(set_to_none=True)

    if graph:
        return graphed(dev, step, lambda: opt.zero_grad(set_to_none=True), args)
    return eager(dev, step, args)


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--side", type=int, default=64)
    args = ap.parse_args()
    dev = device(args, "torch_cnn.py")
    x = torch.rand(args.batch, 3, args.side, args.side, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    forms = ("eager", "graph") if dev.type == "cuda" else ("eager",)
    print(f"torch {torch.__version__} on {device_name(dev)}, batch {args.batch} of 3x{args.side}x{args.side}",
          file=sys.stderr)
    rows = []
    for precision in precisions(args):
        set_precision(precision)
        for form in forms:
            def figures(rate, peak):
                return {"steps_per_s": rate, "images_per_s": rate * args.batch, "peak_bytes": peak}

            measure(rows, {"precision": precision, "form": form}, dev,
                    lambda: run(form, dev, precision, x, y, args), figures, f"{precision} {form:5}")
    emit(dev, rows, batch=args.batch, side=args.side)


if __name__ == "__main__":
    main()
