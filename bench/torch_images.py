"""PyTorch's side of `data/benches/images.rs`: the same image folder through torchvision and a DataLoader.

2,000 JPEGs of 64x64 RGB in 10 class folders (written by the Rust benchmark), decoded by
torchvision.datasets.ImageFolder (PIL), then either RandomCrop(64, padding=4) + RandomHorizontalFlip + ToTensor
("crop_flip") or Resize((56, 56)) + ToTensor ("resize56"), batched by 64 in a DataLoader with 1 and 2 worker
processes. Prints per row, as the Rust benchmark's figures do, images/s (the median of 7 timed epochs after a
warm-up epoch; persistent workers, so process start-up is not counted) and images per CPU second (the 7 epochs,
the main process and its workers together: the work done, which a loaded host does not inflate).

Run:

    cargo bench -p cohort-data --bench images          # writes the folder and prints its path
    python -m venv /work/venv-bench
    /work/venv-bench/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu
    /work/venv-bench/bin/python bench/torch_images.py /tmp/cohort-bench-images [--workers 1 2] [--epochs 7]
"""

import argparse
import os
import statistics
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

WORK = {
    "crop_flip": transforms.Compose(
        [
            transforms.RandomCrop(64, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]
    ),
    "resize56": transforms.Compose([transforms.Resize((56, 56)), transforms.ToTensor()]),
}


def epoch(loader):
    n = 0
    for x, _ in loader:
        n += x.shape[0]
    return n


def cpu_seconds(pids):
    """CPU seconds (user + system) of this process and of the worker processes `pids`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the image folder written by data/benches/images.rs")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--work", nargs="+", default=list(WORK), choices=list(WORK))
    args = ap.parse_args()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {args.folder}")
    print(f"{'work':<12} {'workers':>8} {'images/s':>12} {'images/cpu-s':>16}")
    for work in args.work:
        ds = datasets.ImageFolder(args.folder, transform=WORK[work])
        for w in args.workers:
            loader = DataLoader(ds, batch_size=64, shuffle=False, num_workers=w, persistent_workers=True)
            epoch(loader)
            pids = [p.pid for p in loader._iterator._workers]
            cpu0, images, rates = cpu_seconds(pids), 0, []
            for _ in range(args.epochs):
                t = time.perf_counter()
                n = epoch(loader)
                images += n
                rates.append(n / (time.perf_counter() - t))
            per_cpu = images / (cpu_seconds(pids) - cpu0)
            print(f"{work:<12} {w:>8} {statistics.median(rates):>12.0f} {per_cpu:>16.0f}", flush=True)
            del loader


if __name__ == "__main__":
    main()
