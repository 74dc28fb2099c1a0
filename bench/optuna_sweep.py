"""Optuna's side of the sweep benchmark: bench/sweep-64.toml's search, one PyTorch trial after another.

What users run today: an Optuna study (TPE sampler seeded, or `--sampler random`) with its successive-halving
pruner, SuccessiveHalvingPruner(min_resource=1, reduction_factor=3, min_early_stopping_rate=0): rungs at epochs
1, 3 and 9, a third of the trials at each rung going on. Each trial first picks the family (`mlp` or `cnn`), then
its width, dropout, batch and learning rate from the space of bench/sweep-64.toml:

    mlp: flatten, Linear(784, width) + ReLU, Dropout(p), Linear(width, 10)             width in {64, 128, 256}
    cnn: Conv2d(1, width, 3) + ReLU, MaxPool2d(2), Conv2d(width, 32, 3) + ReLU, MaxPool2d(2),
         flatten (32 x 5 x 5 = 800), Dropout(p), Linear(800, 10)                       width in {8, 16, 32}
    dropout in {0.0, 0.1, 0.2}, batch in {64, 128}, Adam (betas 0.9/0.999, eps 1e-8) lr log-uniform in [1e-4, 1e-1]

cohort's layer defaults are PyTorch's: a conv has stride 1 and no padding, a max pool's stride is its window.
Weights start as PyTorch's defaults (`--init cohort`: N(0, sqrt(gain / fan_in)) with gain 2 before a ReLU, 1
otherwise, zero biases, as cohort draws them).

Data: the bundled digits (data/mnist, IDX files read with numpy), pixels scaled by 1/255 into [0, 1] with no
normalisation, as cohort's idx source does. The validation split is cohort's own, recomputed here bit for bit
(cohort_data::split::hold_out with its PCG generator, stratified, seed `[data] seed` 0 ^ 0x0FA1): 800 of the 8,000
training digits held out, 7,200 trained on. Loading is the fast form users write for a small data set: every
tensor already on the device, each epoch a fresh random permutation cut into index batches (the last one partial,
as cohort's), no DataLoader and no workers. Validation accuracy is scored after every epoch and reported to the
pruner; a trial's value is its best validation accuracy (cohort's `best_metric`).

Prints one progress line per trial on stderr and, at the end, one JSON line on stdout: `wall_s` (seconds since
this script started, imports of torch and optuna included), `time_to_best_s` (since the same start, until the
best completed trial first reached its best validation accuracy), `best_val_accuracy`, `best_trial`,
`best_params`, `completed`, `pruned`, and the epochs trained in all.

Run (on the GPU machine, after the wheels of optuna and its dependencies: see bench/sweep.sh):

    python3 bench/optuna_sweep.py [--trials 64] [--epochs 9] [--sampler tpe|random] [--device auto|cuda|cpu]
"""

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

# ---- the bundled digits, read as cohort reads them ---------------------------------------------------------------

IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(folder, name):
    """The IDX array `name` in `folder`, gzip-compressed (`name.gz`, preferred, as cohort's `find`) or not."""
    path = os.path.join(folder, name + ".gz")
    opener = gzip.open
    if not os.path.exists(path):
        path, opener = os.path.join(folder, name), open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise SystemExit(f"{path}: not an IDX file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=IDX_TYPES[raw[2]], offset=4 + 4 * ndim, count=math.prod(dims))
    return data.reshape(dims)


# ---- cohort's validation split (cohort-data: rng.rs and split.rs), ported exactly ---------------------------------

MASK = (1 << 64) - 1
VAL_SALT = 0x0FA1  # trainer/src/dataset.rs


def splitmix64(x):
    z = (x + 0x9E37_79B9_7F4A_7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK
    return z ^ (z >> 31)


def mix(a, b):
    return splitmix64(a ^ splitmix64((b + 0x9E37_79B9_7F4A_7C15) & MASK))


class Pcg:
    """cohort_data::Rng: PCG-XSH-RR 64/32."""

    MUL = 6_364_136_223_846_793_005

    def __init__(self, seed):
        self.state = 0
        self.inc = ((splitmix64(seed ^ 0xDA3E_39CB_94B9_5BDB) << 1) | 1) & MASK
        self.next_u32()
        self.state = (self.state + splitmix64(seed)) & MASK
        self.next_u32()

    def next_u32(self):
        old = self.state
        self.state = (old * self.MUL + self.inc) & MASK
        x = (((old >> 18) ^ old) >> 27) & 0xFFFF_FFFF
        r = old >> 59
        return ((x >> r) | (x << ((32 - r) & 31))) & 0xFFFF_FFFF

    def next_u64(self):
        return (self.next_u32() << 32) | self.next_u32()

    def below(self, n):
        m = self.next_u64() * n
        if (m & MASK) < n:
            threshold = ((-n) & MASK) % n
            while (m & MASK) < threshold:
                m = self.next_u64() * n
        return m >> 64

    def shuffle(self, items):
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def hold_out(labels, fraction, seed):
    """`(kept, held)` ascending: cohort_data::split::hold_out, stratified by `labels` (Hamilton's rounding)."""
    n = len(labels)
    classes = {}
    for i in sorted(range(n), key=lambda i: (int(labels[i]), i)):
        classes.setdefault(int(labels[i]), []).append(i)
    groups = sorted(classes.items())
    shares = [len(m) * fraction for _, m in groups]
    take = [math.floor(s) for s in shares]
    short = max(0, math.floor(n * fraction + 0.5) - sum(take))  # Rust's round: half away from zero
    for c in sorted(range(len(groups)), key=lambda c: -(shares[c] - math.floor(shares[c])))[:short]:
        take[c] += 1
    held = []
    for (cls, members), k in zip(groups, take):
        k = min(k, max(len(members) - 1, 0))
        Pcg(mix(seed, cls)).shuffle(members)
        held.extend(members[:k])
    held.sort()
    is_held = np.zeros(n, dtype=bool)
    is_held[held] = True
    return np.flatnonzero(~is_held), np.asarray(held)


# ---- the search space of bench/sweep-64.toml ----------------------------------------------------------------------

WIDTHS = {"mlp": [64, 128, 256], "cnn": [8, 16, 32]}


def build(family, width, dropout):
    if family == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, 10)
        )
    return nn.Sequential(
        nn.Conv2d(1, width, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(dropout), nn.Linear(32 * 5 * 5, 10),
    )  # fmt: skip


def init_as_cohort(model):
    """N(0, sqrt(gain / fan_in)) weights (gain 2 when a ReLU follows), zero biases."""
    layers = list(model)
    for i, m in enumerate(layers):
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            relu = i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU)
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, 0.0, math.sqrt((2.0 if relu else 1.0) / fan_in))
            nn.init.zeros_(m.bias)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--sampler", choices=["tpe", "random"], default="tpe")
    ap.add_argument("--seed", type=int, default=1, help="the sampler's seed ([search] seed)")
    ap.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cuda, cuda:N or cpu")
    ap.add_argument("--data", default="data/mnist", help="the folder of IDX files")
    ap.add_argument("--val", type=float, default=0.1, help="validation fraction ([data] val)")
    ap.add_argument("--data-seed", type=int, default=0, help="[data] seed")
    ap.add_argument("--init", choices=["torch", "cohort"], default="torch")
    args = ap.parse_args()

    dev = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    images = read_idx(args.data, "train-images-idx3-ubyte")
    labels = read_idx(args.data, "train-labels-idx1-ubyte")
    train_idx, val_idx = hold_out(labels, args.val, args.data_seed ^ VAL_SALT)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)  # [n, 1, 28, 28] in [0, 1]
    y = torch.from_numpy(labels.astype(np.int64))
    xt, yt = x[train_idx].to(dev), y[train_idx].to(dev)
    xv, yv = x[val_idx].to(dev), y[val_idx].to(dev)
    n = len(train_idx)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    setup_s = time.perf_counter() - T0
    print(
        f"optuna {optuna.__version__}, torch {torch.__version__}, device {dev}"
        f"{' (' + torch.cuda.get_device_name(dev) + ')' if dev.type == 'cuda' else ''}; "
        f"{n} train / {len(val_idx)} val digits; set up in {setup_s:.1f} s",
        file=sys.stderr,
    )

    history = {}  # trial number -> [(seconds since T0, val accuracy)] per epoch
    epochs_trained = [0]

    def objective(trial):
        family = trial.suggest_categorical("family", ["mlp", "cnn"])
        width = trial.suggest_categorical(f"{family}_width", WIDTHS[family])
        dropout = trial.suggest_categorical("dropout", [0.0, 0.1, 0.2])
        batch = trial.suggest_categorical("batch", [64, 128])
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        torch.manual_seed(args.seed * 1_000_003 + trial.number)
        model = build(family, width, dropout)
        if args.init == "cohort":
            init_as_cohort(model)
        model.to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        gen = torch.Generator(device=dev)
        gen.manual_seed(trial.number)
        seen = history.setdefault(trial.number, [])
        best = 0.0
        for epoch in range(1, args.epochs + 1):
            model.train()
            perm = torch.randperm(n, device=dev, generator=gen)
            for i in range(0, n, batch):
                b = perm[i : i + batch]
                loss = F.cross_entropy(model(xt[b]), yt[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                # Right answers over examples as a float64 fraction, as cohort scores it; .item() waits for the device.
                acc = (model(xv).argmax(1) == yv).sum().item() / len(val_idx)
            epochs_trained[0] += 1
            seen.append((time.perf_counter() - T0, acc))
            best = max(best, acc)
            trial.report(acc, epoch)
            if epoch < args.epochs and trial.should_prune():
                raise optuna.TrialPruned()
        return best

    def log(study, trial):
        accs = [a for _, a in history.get(trial.number, [])]
        print(
            f"trial {trial.number:3d} {trial.state.name.lower():9s} epochs {len(accs)} "
            f"best {max(accs, default=float('nan')):.4f} at {time.perf_counter() - T0:7.1f} s  {trial.params}",
            file=sys.stderr,
        )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (
        optuna.samplers.TPESampler(seed=args.seed)
        if args.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=args.seed)
    )
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=1, reduction_factor=3, min_early_stopping_rate=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    study.optimize(objective, n_trials=args.trials, callbacks=[log])
    wall_s = time.perf_counter() - T0

    states = [t.state for t in study.trials]
    best = study.best_trial  # among completed trials, as Optuna ranks them
    time_to_best = next(t for t, a in history[best.number] if a == best.value)
    print(
        json.dumps(
            {
                "tool": "optuna",
                "optuna": optuna.__version__,
                "torch": torch.__version__,
                "device": str(dev),
                "sampler": args.sampler,
                "pruner": "SuccessiveHalvingPruner(min_resource=1, reduction_factor=3, min_early_stopping_rate=0)",
                "init": args.init,
                "trials": args.trials,
                "epochs": args.epochs,
                "train": n,
                "val": len(val_idx),
                "setup_s": round(setup_s, 3),
                "wall_s": round(wall_s, 3),
                "time_to_best_s": round(time_to_best, 3),
                "best_val_accuracy": best.value,
                "best_trial": best.number,
                "best_params": best.params,
                "completed": states.count(optuna.trial.TrialState.COMPLETE),
                "pruned": states.count(optuna.trial.TrialState.PRUNED),
                "failed": states.count(optuna.trial.TrialState.FAIL),
                "epochs_trained": epochs_trained[0],
            }
        )
    )


if __name__ == "__main__":
    main()
