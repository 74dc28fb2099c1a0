"""PyTorch's side of `cargo xtask bench`'s `attention` part (xtask/src/attention.rs): causal self-attention of a
packed projection `[n, L, 3, heads, d]`, forward and backward, in fp32, in tf32 (the TF32 flags on) and in bf16
(autocast over f32 inputs), at
several sequence lengths with the same number of tokens. Forms: `sdpa`, `F.scaled_dot_product_attention(is_causal=True)`
on views of the packed tensor (PyTorch picks its fused kernel: in fp32 the memory-efficient one, in bf16 flash or
cuDNN's), and `math`, the same call restricted to its
unfused math backend (scores stored whole). A call is one forward and one backward with a fixed output gradient;
the figure is calls per second, timed as bench/torch_timing.py says; the peak is `max_memory_allocated()` over the
timed calls, the inputs included.
"""

import torch_timing as tt
from torch_timing import torch

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = tt.parser(__doc__)
    ap.add_argument("--tokens", type=int, default=16384, help="sequences x length, the same at every length")
    ap.add_argument("--lens", default="128,512,2048")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    dev = tt.device(args, "torch_attention.py")
    rows = []
    h, d = args.heads, args.head_dim
    for precision, length in ((p, int(x)) for p in tt.precisions(args) for x in args.lens.split(",") if x):
        tt.set_precision(precision)
        n = max(1, args.tokens // length)
        qkv = torch.randn(n, length, 3, h, d, device=dev, requires_grad=True)
        dout = torch.randn(n, h, length, d, device=dev)

        def call(backend):
            def step():
                q, k, v = qkv.unbind(2)  # [n, L, h, d] views
                with sdpa_kernel(backend), tt.autocast(dev, precision):
                    out = F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                    )
                qkv.grad = None
                out.backward(dout)
            return step

        for form, backends in [("sdpa", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                          SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]),
                               ("math", [SDPBackend.MATH])]:
            tt.measure(rows, {"precision": precision, "len": length, "form": form, "seqs": n}, dev,
                       lambda: tt.eager(dev, call(backends), args),
                       lambda rate, peak: {"calls_per_s": rate, "peak_bytes": peak},
                       f"attention {precision} L={length} {form}")
        del qkv, dout
    tt.emit(dev, rows, heads=h, head_dim=d, tokens=args.tokens)


if __name__ == "__main__":
    main()
