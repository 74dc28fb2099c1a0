"""PyTorch's side of `cargo xtask bench`'s `transformer` part (xtask/src/transformer.rs trains the same models in
cohort): causal Transformer language models as a grid of attention heads x width, on one fixed batch of token ids
resident on the GPU, in fp32, TF32 and bf16 autocast: each member alone and the whole grid in one loop (each model
a step in turn), each eagerly and with the whole step (of the grid: the whole loop) captured as one CUDA graph.

The model, defined here and, once, in xtask/src/transformer.rs as a cohort model spec: token ids [B, L] of a
`--vocab` vocabulary; an embedding of width D; learned positions [L, D]; `--layers` pre-norm blocks (LayerNorm;
causal multi-head self-attention: one fused qkv Linear(D, 3D), `scaled_dot_product_attention(is_causal=True)`, an
output Linear(D, D); LayerNorm; Linear(D, 4D), GELU (tanh), Linear(4D, D); each added to its input), a final
LayerNorm and a Linear(D, vocab) scoring the next token at every position; cross-entropy over all B x L positions;
Adam lr 1e-3 (fused). No dropout.

Precisions, timing, peak memory and the CUDA-graph recipe are bench/torch_timing.py's. A row per precision, model
(`h4-d256`: 4 heads, width 256; `grid`: every member) and form (`eager`, `graph`): `{"precision", "model", "form",
"members", "model_steps_per_s", "tokens_per_s", "steps_per_s", "windows", "peak_bytes", "peak_bytes_per_member"}`
(or the keys and `"error"`); a grid step of M members counts M model-steps. xtask runs it with `--reference`:

    python3 bench/torch_transformer.py [--batch 32 --seq 128 --vocab 256 --layers 4 --heads 2,4 --widths 128,256
        --warmup 10 --windows 5 --window-s 1]

A CPU smoke run (eager only, no peak): `--device cpu --batch 2 --seq 8 --vocab 16 --layers 2 --heads 1,2
--widths 8,16 --warmup 1 --windows 1 --window-s 0`.
"""

import sys

from torch_timing import (
    adam, autocast, device, device_name, eager, emit, graphed, measure, parser, precisions, set_precision,
)

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """A pre-norm encoder block with causal attention: cohort's `{ transformer = HEADS, causal = true }`."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        b, l, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, l, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, l, d))
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    """The benchmark's language model (cohort's is `Workload::spec` of xtask/src/transformer.rs)."""

    def __init__(self, vocab, seq, width, heads, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        h = self.embed(ids) + self.pos[: ids.shape[1]]
        return self.head(self.norm(self.blocks(h)))


def name(heads, width):
    """`h4-d256`, as xtask/src/transformer.rs names a member."""
    return f"h{heads}-d{width}"


def run(form, dev, precision, members, x, y, args):
    """The windows' rates (steps of all `members` per second) of one form."""
    graph = form == "graph"
    nets = [LM(args.vocab, args.seq, w, h, args.layers).to(dev) for h, w in members]
    opts = [adam(net.parameters(), capturable=graph) for net in nets]

    def step():
        for net, opt in zip(nets, opts):
            with autocast(dev, precision, cache_enabled=not graph):
                logits = net(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
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


def integers(text, flag):
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        sys.exit(f"torch_transformer.py: {flag} {text!r}: expected comma-separated integers")


def main():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", default="2,4", help="comma-separated head counts of the grid")
    ap.add_argument("--widths", default="128,256", help="comma-separated widths of the grid")
    args = ap.parse_args()
    dev = device(args, "torch_transformer.py")
    heads, widths = integers(args.heads, "--heads"), integers(args.widths, "--widths")
    bad = [(h, w) for w in widths for h in heads if w % h]
    if bad:
        sys.exit(f"torch_transformer.py: heads must divide the width; they do not in {bad}")
    # the grid in xtask's order: widths outer, heads inner
    grid = [(h, w) for w in widths for h in heads]
    models = [(name(h, w), [(h, w)]) for h, w in grid] + [("grid", grid)]
    tokens = args.batch * args.seq
    x = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    y = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    forms = ("eager", "graph") if dev.type == "cuda" else ("eager",)
    print(f"torch {torch.__version__} on {device_name(dev)}: {args.layers}-layer causal LM, batch {args.batch} x "
          f"{args.seq} tokens, vocabulary {args.vocab}, grid {[m for m, _ in models[:-1]]}", file=sys.stderr)
    rows = []
    for precision in precisions(args):
        set_precision(precision)
        for model, members in models:
            for form in forms:
                def figures(rate, peak, m=len(members)):
                    return {"members": m, "model_steps_per_s": rate * m, "tokens_per_s": rate * m * tokens,
                            "steps_per_s": rate, "peak_bytes": peak,
                            "peak_bytes_per_member": None if peak is None else peak / m}

                measure(rows, {"precision": precision, "model": model, "form": form}, dev,
                        lambda: run(form, dev, precision, members, x, y, args), figures,
                        f"{precision} {model:8} {form:5}")
    emit(dev, rows, batch=args.batch, seq=args.seq, vocab=args.vocab, layers=args.layers,
         grid=[m for m, _ in models[:-1]])


if __name__ == "__main__":
    main()
