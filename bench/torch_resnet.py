"""PyTorch's side of `cargo xtask bench`'s `resnet` part (xtask/src/resnet.rs trains the same models in cohort): N
small ResNets on CIFAR-shaped data (one fixed batch resident on the GPU, shared by the N models), for each N of
`--ns`, in fp32, TF32 and bf16 autocast, four ways:

- `loop`: N separate models, each with its own fused Adam, stepped one after another (forward, backward, update);
- `loop-graph`: that whole loop of N steps captured as one CUDA graph and replayed;
- `vmap`: the N models as one `torch.func` model: parameters stacked by `stack_module_state`, the loss of
  `functional_call` on a meta-device copy, `vmap(grad(loss))` over the stacks (the batch shared), one fused Adam
  over the stacked parameters (the gradients assigned as their `.grad`);
- `vmap-graph`: that step captured as one CUDA graph and replayed.

The model, defined here and, once, in xtask/src/resnet.rs as a cohort model spec: input [B, 3, 32, 32]; stem conv
3x3 3->32 pad 1 no bias, BatchNorm, ReLU; three residual blocks (conv 3x3 no bias, BatchNorm, ReLU, conv 3x3 no
bias, BatchNorm; plus the shortcut; ReLU): 32->32, 32->64 stride 2, 64->128 stride 2, the strided ones with a 1x1
strided conv with bias as the shortcut; global average pool; linear 128->10; cross-entropy; Adam lr 1e-3.

BatchNorm trains on the batch's statistics and updates its running ones, as cohort's does, except in the vmap
forms: `torch.func` transforms cannot update a module's buffers in place, and its documentation ("Patching Batch
Norm") has the models built with `track_running_stats=False` instead; the step is the same less the running
statistics' update.

Precisions, timing, peak memory and the CUDA-graph recipe are bench/torch_timing.py's. A row per precision, N and
form: `{"precision", "n", "form", "model_steps_per_s", "steps_per_s", "windows", "peak_bytes",
"peak_bytes_per_member"}` (or the keys and `"error"`); rates in model-steps/s (a loop step of N models counts N).
xtask runs it with `--reference`:

    python3 bench/torch_resnet.py [--batch 128 --side 32 --ns 1,4,16 --warmup 10 --windows 5 --window-s 1]

A CPU smoke run (eager forms only, no peak): `--device cpu --batch 2 --side 8 --ns 1,2 --warmup 1 --windows 1
--window-s 0`.
"""

import copy
import sys

from torch_timing import (
    adam, autocast, device, device_name, eager, emit, graphed, measure, parser, precisions, set_precision,
)

import torch
from torch import nn
from torch.nn import functional as F

CLASSES = 10


class BatchNormFp32(nn.BatchNorm2d):
    """Batch norm of the input cast to fp32, its output cast back: the vmap forms' fallback where `torch.func`'s
    batch rule refuses a bf16 input beside fp32 weights under autocast (on the CPU its forward, on CUDA its
    backward)."""

    def forward(self, x):
        return super().forward(x.float()).to(x.dtype)


def batch_norm(channels, track, fp32=False):
    return (BatchNormFp32 if fp32 else nn.BatchNorm2d)(channels, track_running_stats=track)


class Residual(nn.Module):
    """relu(inner(x) + shortcut(x)): cohort's `{ residual = [...], act = "relu" }`."""

    def __init__(self, cin, cout, stride, track, fp32_norm=False):
        super().__init__()
        self.inner = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            batch_norm(cout, track, fp32_norm),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            batch_norm(cout, track, fp32_norm),
        )
        projected = cin != cout or stride != 1
        self.projection = nn.Conv2d(cin, cout, 1, stride=stride) if projected else None

    def forward(self, x):
        shortcut = x if self.projection is None else self.projection(x)
        return F.relu(self.inner(x) + shortcut)


def resnet(track=True, fp32_norm=False):
    """The benchmark's ResNet (cohort's is the spec `RESNET` of xtask/src/resnet.rs); `track`: whether batch norm
    keeps running statistics; `fp32_norm`: batch norm in fp32 (see `BatchNormFp32`)."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1, bias=False),
        batch_norm(32, track, fp32_norm),
        nn.ReLU(),
        Residual(32, 32, 1, track, fp32_norm),
        Residual(32, 64, 2, track, fp32_norm),
        Residual(64, 128, 2, track, fp32_norm),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, CLASSES),
    )


def loop(dev, precision, n, x, y, graph):
    """N models, each with its fused Adam: the step of all N, how to set their grads to None, and notes for the
    row (none)."""
    nets = [resnet().to(dev) for _ in range(n)]
    opts = [adam(net.parameters(), capturable=graph) for net in nets]

    def step():
        for net, opt in zip(nets, opts):
            with autocast(dev, precision, cache_enabled=not graph):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            if not graph:
                opt.zero_grad(set_to_none=True)

    def zero_grad():
        for opt in opts:
            opt.zero_grad(set_to_none=True)

    return step, zero_grad, {}


def vmapped(dev, precision, n, x, y, graph):
    """N models as stacked parameters, trained by `vmap(grad(loss))` and one fused Adam over the stacks. Where bf16
    batch norm is refused under the transforms, the models are built again with batch norm in fp32, and the row's
    notes say so."""
    try:
        step, zero_grad = stacked(dev, precision, n, x, y, graph, fp32_norm=False)
        step()  # one untimed step: does this torch's batch rule take bf16 batch norm?
        zero_grad()
        return step, zero_grad, {}
    except RuntimeError as e:
        # the CPU's batch rule refuses the bf16 input ("expected scalar type"), CUDA's backward its fp32 gradient
        # ("Expected grad_output to have type BFloat16")
        refused = ("expected scalar type" in str(e).lower() or "to have type" in str(e))
        if precision != "bf16" or not refused:
            raise
        print(f"torch bf16 n={n} vmap: batch norm refused bf16 under torch.func ({e}); batch norm in fp32",
              file=sys.stderr)
    step, zero_grad = stacked(dev, precision, n, x, y, graph, fp32_norm=True)
    return step, zero_grad, {"note": "batch norm in fp32: torch.func refused bf16 batch norm under autocast"}


def stacked(dev, precision, n, x, y, graph, fp32_norm):
    """The vmap form's step and how to set its grads to None."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    nets = [resnet(track=False, fp32_norm=fp32_norm).to(dev) for _ in range(n)]
    params, buffers = stack_module_state(nets)
    if buffers:
        raise RuntimeError(f"unexpected buffers {sorted(buffers)}: the vmap model keeps no running statistics")
    base = copy.deepcopy(nets[0]).to("meta")
    del nets
    names = list(params)
    stacks = [params[k] for k in names]
    opt = adam(stacks, capturable=graph)
    # the transforms' inputs: the same storage, which Adam updates in place, but outside autograd's regular level,
    # which would otherwise record the whole step again around torch.func's
    inputs = {k: v.detach() for k, v in params.items()}

    def loss_of(p, xb, yb):
        with autocast(dev, precision, cache_enabled=not graph):
            return F.cross_entropy(functional_call(base, p, (xb,)), yb)

    grads_of = vmap(grad(loss_of), in_dims=(0, None, None))

    def step():
        grads = grads_of(inputs, x, y)
        for p, k in zip(stacks, names):
            p.grad = grads[k]
        opt.step()
        if not graph:
            opt.zero_grad(set_to_none=True)

    return step, lambda: opt.zero_grad(set_to_none=True)


FORMS = {
    "loop": (loop, False),
    "loop-graph": (loop, True),
    "vmap": (vmapped, False),
    "vmap-graph": (vmapped, True),
}


def run(form, dev, precision, n, x, y, args):
    """The windows' rates (steps of all N per second) of one form, and the row's notes."""
    build, graph = FORMS[form]
    step, zero_grad, notes = build(dev, precision, n, x, y, graph)
    if graph:
        return graphed(dev, step, zero_grad, args), notes
    return eager(dev, step, args), notes


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--side", type=int, default=32)
    ap.add_argument("--ns", default="1,4,16", help="comma-separated numbers of models")
    ap.add_argument("--forms", default=",".join(FORMS), help="comma-separated subset of " + ",".join(FORMS))
    args = ap.parse_args()
    dev = device(args, "torch_resnet.py")
    try:
        ns = [int(n) for n in args.ns.split(",") if n]
    except ValueError:
        sys.exit(f"torch_resnet.py: --ns {args.ns!r}: expected comma-separated integers such as 1,4,16")
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in FORMS]
    if unknown:
        sys.exit(f"torch_resnet.py: unknown forms {unknown}: pick from {list(FORMS)}")
    if dev.type != "cuda":
        forms = [f for f in forms if not f.endswith("graph")]
    x = torch.rand(args.batch, 3, args.side, args.side, device=dev)
    y = torch.randint(0, CLASSES, (args.batch,), device=dev)
    print(f"torch {torch.__version__} on {device_name(dev)}: ResNet, batch {args.batch} of 3x{args.side}x"
          f"{args.side}, N = {ns}, forms {forms}", file=sys.stderr)
    rows = []
    for precision in precisions(args):
        set_precision(precision)
        for n in ns:
            for form in forms:
                def figures(rate, peak, n=n):
                    return {"model_steps_per_s": rate * n, "steps_per_s": rate, "peak_bytes": peak,
                            "peak_bytes_per_member": None if peak is None else peak / n}

                measure(rows, {"precision": precision, "n": n, "form": form}, dev,
                        lambda: run(form, dev, precision, n, x, y, args), figures,
                        f"{precision} n={n:2} {form:10}")
    emit(dev, rows, batch=args.batch, side=args.side, ns=ns)


if __name__ == "__main__":
    main()
