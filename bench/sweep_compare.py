"""The sweep benchmark's table: a cohort sweep run (bench/sweep-64.toml) beside bench/optuna_sweep.py's JSON line.

cohort's figures come from its run directory: `summary.json` (`wall_seconds`, `sweep.best` naming the best trial,
`sweep.completed` / `sweep.pruned`, the best trial's `members[].best_metric`) and the best trial's
`<member>/metrics.jsonl`, whose records carry `time` (seconds since the run started) and `val.accuracy`: its time
to best is the `time` of the first record where that trial's validation accuracy equals its best. Where the
summary names no best trial, the member with the highest best metric (or validation accuracy) stands in, and the
table says so.

    python3 bench/sweep_compare.py RUN_DIR OPTUNA_JSON [--cohort-process-s S] [--optuna-process-s S]

The process seconds, measured around each command by bench/sweep.sh, add a row of whole-process wall time
(start-up and the end's reports included). Prints the table, then one JSON line of the same figures.
"""

import argparse
import json
import math
import os
import sys


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def val_accuracy(record):
    val = record.get("val") or {}
    return val.get("accuracy")


def cohort_figures(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    members = summary.get("members", [])
    sweep = summary.get("sweep") or {}
    notes = []
    by_name = {m["name"]: m for m in members}
    best_name = sweep.get("best")
    if best_name not in by_name:
        stand_in = "the member with the highest best_metric (or val_accuracy) stands in"
        notes.append(
            f"summary.json names no best trial: {stand_in}"
            if best_name is None
            else f"summary.json's best trial {best_name!r} is not among its members: {stand_in}"
        )
        scored = [m for m in members if (m.get("best_metric") or m.get("val_accuracy")) is not None]
        if not scored:
            raise SystemExit(f"{run_dir}/summary.json: no member has a best metric or a validation accuracy")
        best_name = max(scored, key=lambda m: m.get("best_metric") or m.get("val_accuracy"))["name"]
    best = by_name[best_name]
    records = read_jsonl(os.path.join(run_dir, best_name, "metrics.jsonl"))
    accs = [(r["time"], val_accuracy(r)) for r in records if val_accuracy(r) is not None]
    if not accs:
        raise SystemExit(f"{run_dir}/{best_name}/metrics.jsonl: no record with val.accuracy")
    best_metric = best.get("best_metric")
    if best_metric is None:
        notes.append(f"{best_name} has no best_metric: its highest val.accuracy in metrics.jsonl stands in")
        best_metric = max(a for _, a in accs)
    hit = next((t for t, a in accs if math.isclose(a, best_metric, rel_tol=0, abs_tol=1e-9)), None)
    if hit is None:
        notes.append(
            f"no record of {best_name} has val.accuracy {best_metric}: the first at its highest "
            f"({max(a for _, a in accs)}) stands in"
        )
        top = max(a for _, a in accs)
        hit = next(t for t, a in accs if a == top)
    statuses = [m.get("status", "completed") for m in members]
    return {
        "wall_s": summary.get("wall_seconds"),
        "time_to_best_s": hit,
        "best_val_accuracy": best_metric,
        "best_trial": best_name,
        "best_params": best.get("hyperparameters", {}),
        "completed": sweep.get("completed", statuses.count("completed")),
        "pruned": sweep.get("pruned", statuses.count("pruned")),
        "failed": sweep.get("failed", statuses.count("failed")),
        "trials": len(members),
        "device": summary.get("device"),
        "notes": notes,
    }


def optuna_figures(path):
    with open(path) as f:
        lines = [line for line in f if line.strip().startswith("{")]
    if not lines:
        raise SystemExit(f"{path}: no JSON line (did bench/optuna_sweep.py finish?)")
    o = json.loads(lines[-1])
    params = dict(o.get("best_params", {}))
    return {
        "wall_s": o.get("wall_s"),
        "time_to_best_s": o.get("time_to_best_s"),
        "best_val_accuracy": o.get("best_val_accuracy"),
        "best_trial": f"trial {o.get('best_trial')}",
        "best_params": params,
        "completed": o.get("completed"),
        "pruned": o.get("pruned"),
        "failed": o.get("failed", 0),
        "trials": o.get("trials"),
        "device": o.get("device"),
        "notes": [],
    }


def ratio(o, c):
    if o is None or c is None or c == 0:
        return "—"
    return f"{o / c:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="the cohort run directory (runs/sweep-64)")
    ap.add_argument("optuna_json", help="bench/optuna_sweep.py's output (its last JSON line is read)")
    ap.add_argument("--cohort-process-s", type=float, help="cohort's whole process, measured around it")
    ap.add_argument("--optuna-process-s", type=float, help="the Optuna script's whole process, measured around it")
    args = ap.parse_args()

    c = cohort_figures(args.run_dir)
    o = optuna_figures(args.optuna_json)
    c["process_s"], o["process_s"] = args.cohort_process_s, args.optuna_process_s
    # cohort's record times count from its training start (after loading data and the warm-up), Optuna's from its
    # script's first line: the start-up cohort's process spent before its run (process less the run's wall) is
    # added, so that both times to best count from the command's start.
    if c["process_s"] is not None and c["wall_s"] is not None and c["time_to_best_s"] is not None:
        c["startup_s"] = max(0.0, c["process_s"] - c["wall_s"])
        c["time_to_best_s"] += c["startup_s"]

    def secs(v):
        return "—" if v is None else f"{v:.1f}"

    def acc(v):
        return "—" if v is None else f"{v:.4f}"

    rows = [
        ("wall time to best (s)", secs(c["time_to_best_s"]), secs(o["time_to_best_s"]),
         ratio(o["time_to_best_s"], c["time_to_best_s"])),
        ("total wall (s)", secs(c["wall_s"]), secs(o["wall_s"]), ratio(o["wall_s"], c["wall_s"])),
        ("whole process (s)", secs(c["process_s"]), secs(o["process_s"]), ratio(o["process_s"], c["process_s"])),
        ("best val accuracy", acc(c["best_val_accuracy"]), acc(o["best_val_accuracy"]),
         ratio(o["best_val_accuracy"], c["best_val_accuracy"])),
        ("trials completed / pruned", f"{c['completed']} / {c['pruned']}", f"{o['completed']} / {o['pruned']}", "—"),
        ("best trial", c["best_trial"], o["best_trial"], "—"),
    ]  # fmt: skip
    if c["process_s"] is None and o["process_s"] is None:
        rows = [r for r in rows if r[0] != "whole process (s)"]
    head = ("", "cohort", "optuna", "optuna / cohort")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]

    def line(r):
        return "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))

    print(f"sweep benchmark: cohort on {c['device']}, optuna on {o['device']}")
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    print(f"cohort best: {c['best_trial']} {json.dumps(c['best_params'])}")
    print(f"optuna best: {o['best_trial']} {json.dumps(o['best_params'])}")
    for n in c["notes"]:
        print(f"note: {n}", file=sys.stderr)
    print(json.dumps({"cohort": c, "optuna": o}))


if __name__ == "__main__":
    main()
