"""Per-kernel CUDA time of a reference model's eager training step (torch.profiler over 20 steps after warm-up): the
CNN of bench/torch_cnn.py, the ResNet of bench/torch_resnet.py or the h4-d256 language model of
bench/torch_transformer.py, to set beside an ncu profile of cohort's same step (bench/gpu-conv-profile.sh).

    python3 bench/torch_kernels.py [cnn|resnet|transformer] [fp32|tf32|bf16]

`TORCH_CUDNN_V8_API_DISABLED=1` makes PyTorch call cuDNN's legacy convolution API, the one cohort's
kernels/src/conv/cudnn.rs calls, so the two runs say what the graph API's engines are worth."""
import sys

import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

import torch_cnn
import torch_resnet
import torch_transformer
from torch_timing import adam, autocast, set_precision

which = sys.argv[1] if len(sys.argv) > 1 else "cnn"
precision = sys.argv[2] if len(sys.argv) > 2 else "tf32"
torch.backends.cudnn.benchmark = True
set_precision(precision)
dev = torch.device("cuda")
if which == "transformer":  # xtask/src/transformer.rs's h4-d256: batch 32, sequence 128, vocabulary 256
    x = torch.randint(0, 256, (32, 128), device=dev)
    y = torch.randint(0, 256, (32 * 128,), device=dev)
    net = torch_transformer.LM(256, 128, 256, 4, 4).to(dev)
else:
    side, net = {"cnn": (64, torch_cnn.model), "resnet": (32, torch_resnet.resnet)}[which]
    x = torch.rand(128, 3, side, side, device=dev)
    y = torch.randint(0, 10, (128,), device=dev)
    net = net().to(dev)
opt = adam(net.parameters(), capturable=False)


def step():
    with autocast(dev, precision):
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(30):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        step()
    torch.cuda.synchronize()
rows = [(e.device_time_total / 20, e.count // 20, e.key) for e in prof.key_averages() if e.device_time_total > 0]
rows.sort(reverse=True)
print(f"{which} {precision}: {sum(r[0] for r in rows):.0f} us of kernels a step")
for t, n, k in rows[:18]:
    print(f"{t:8.1f} us x{n:2d}  {k[:110]}")
