"""PyTorch's side of `cargo xtask bench`'s `cotrain` part (xtask/src/cotrain.rs trains the same models in cohort):
bench/torch_cnn.py's image CNN and a text classifier, each alone and the two as a pair in the alternating loop (a
step of one, then of the other), on fixed batches resident on the GPU, in fp32, TF32 and bf16 autocast, each
eagerly and with the whole step (of the pair: both steps) captured as one CUDA graph.

The text classifier, defined here and, once, in xtask/src/cotrain.rs as a cohort model spec: token ids [B, doc]
(documents of `--doc` tokens) of a `--vocab` vocabulary; `nn.EmbeddingBag(vocab, dim, mode="mean")` (each
document the mean of its tokens' vectors; dense gradients); Linear(dim, 10); cross-entropy; Adam lr 1e-3 (fused).
The CNN is `model()` of bench/torch_cnn.py on images [B, 3, side, side].

Precisions, timing, peak memory and the CUDA-graph recipe are bench/torch_timing.py's. A row per precision, model
(`cnn`, `text`, `pair`) and form (`eager`, `graph`): `{"precision", "model", "form", "members",
"model_steps_per_s", "steps_per_s", "windows", "peak_bytes", "peak_bytes_per_member"}` (or the keys and
`"error"`); a pair step counts two model-steps. xtask runs it with `--reference`:

    python3 bench/torch_cotrain.py [--batch 128 --side 64 --doc 200 --vocab 30000 --dim 256 --warmup 10
        --windows 5 --window-s 1]

A CPU smoke run (eager only, no peak): `--device cpu --batch 2 --side 8 --doc 5 --vocab 50 --dim 4 --warmup 1
--windows 1 --window-s 0`.
"""

import sys

from torch_cnn import model as cnn
from torch_timing import (
    adam, autocast, device, device_name, eager, emit, graphed, measure, parser, precisions, set_precision,
)

import torch
from torch import nn
from torch.nn import functional as F

CLASSES = 10


def text(vocab, dim):
    """The benchmark's text classifier (cohort's is `Workload::text_spec` of xtask/src/cotrain.rs)."""
    return nn.Sequential(nn.EmbeddingBag(vocab, dim, mode="mean"), nn.Linear(dim, CLASSES))


def run(form, dev, precision, jobs, args):
    """The windows' rates (steps of all `jobs` per second) of one form; a job is (model, input, labels)."""
    graph = form == "graph"
    opts = [adam(net.parameters(), capturable=graph) for net, _, _ in jobs]

    def step():
        for (net, x, y), opt in zip(jobs, opts):
            with autocast(dev, precision, cache_enabled=not graph):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            if not graph:
                opt.zero_grad(set_to_none=True)

    def zero_grad():
        for opt in opts:
            opt.zero_grad(set_to_none=True)

    if graph:
        return graphed(dev, step, zero_grad, args)
    return eager(dev, step, args)


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--side", type=int, default=64)
    ap.add_argument("--doc", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=30000)
    ap.add_argument("--dim", type=int, default=256)
    args = ap.parse_args()
    dev = device(args, "torch_cotrain.py")
    images = torch.rand(args.batch, 3, args.side, args.side, device=dev)
    docs = torch.randint(0, args.vocab, (args.batch, args.doc), device=dev)
    y_images = torch.randint(0, CLASSES, (args.batch,), device=dev)
    y_docs = torch.randint(0, CLASSES, (args.batch,), device=dev)
    forms = ("eager", "graph") if dev.type == "cuda" else ("eager",)
    print(f"torch {torch.__version__} on {device_name(dev)}: CNN (batch {args.batch} of 3x{args.side}x{args.side})"
          f" and text ({args.vocab} x {args.dim} bag over {args.doc}-token documents)", file=sys.stderr)
    models = {"cnn": ("cnn",), "text": ("text",), "pair": ("cnn", "text")}
    rows = []
    for precision in precisions(args):
        set_precision(precision)
        for model, names in models.items():
            for form in forms:
                def jobs(names=names):
                    made = {"cnn": lambda: (cnn().to(dev), images, y_images),
                            "text": lambda: (text(args.vocab, args.dim).to(dev), docs, y_docs)}
                    return [made[n]() for n in names]

                def figures(rate, peak, m=len(names)):
                    return {"members": m, "model_steps_per_s": rate * m, "steps_per_s": rate, "peak_bytes": peak,
                            "peak_bytes_per_member": None if peak is None else peak / m}

                measure(rows, {"precision": precision, "model": model, "form": form}, dev,
                        lambda: run(form, dev, precision, jobs(), args), figures, f"{precision} {model:4} {form:5}")
    emit(dev, rows, batch=args.batch, side=args.side, doc=args.doc, vocab=args.vocab, dim=args.dim)


if __name__ == "__main__":
    main()
