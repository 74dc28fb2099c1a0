"""Per-kernel CUDA time of bench/torch_cnn.py's eager training step (torch.profiler over 20 steps after warm-up), to
set beside an ncu profile of cohort's same step (bench/gpu-conv-profile.sh).

    python3 bench/torch_cnn_kernels.py [fp32|tf32|bf16]

`TORCH_CUDNN_V8_API_DISABLED=1` makes PyTorch call cuDNN's legacy convolution API, the one cohort's
kernels/src/conv/cudnn.rs calls, so the two runs say what the graph API's engines are worth."""
import sys

import torch
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from torch_cnn import model
from torch_timing import adam, autocast, set_precision

precision = sys.argv[1] if len(sys.argv) > 1 else "tf32"
torch.backends.cudnn.benchmark = True
set_precision(precision)
dev = torch.device("cuda")
x = torch.rand(128, 3, 64, 64, device=dev)
y = torch.randint(0, 10, (128,), device=dev)
net = model().to(dev)
opt = adam(net.parameters(), capturable=False)


def step():
    with autocast(dev, precision):
        loss = F.cross_entropy(net(x), y)
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
print(f"{precision}: {sum(r[0] for r in rows):.0f} us of kernels a step")
for t, n, k in rows[:18]:
    print(f"{t:8.1f} us x{n:2d}  {k[:110]}")
