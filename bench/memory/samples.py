"""Reads the samples of bench/memory/limits.sh: the most each process held, and when a finished member's memory left."""
import glob, json, sys

w = sys.argv[1]
def samples(path):
    out = []
    for line in open(path):
        parts = line.split(" ", 2)
        if len(parts) < 3:
            continue
        t, hb = float(parts[0]), int(parts[1].split("=")[1])
        procs = {}
        for e in parts[2].strip().strip(";").split(";"):
            if "," in e:
                pid, mib = e.split(",")
                procs[pid.strip()] = int(mib)
        out.append((t, hb, procs))
    return out

for name in ["nolimit", "pool1g", "process1g", "process1500m", "two40"]:
    s = samples(f"{w}/smi-{name}.txt")
    peaks = {}
    for _, _, procs in s:
        for pid, mib in procs.items():
            peaks[pid] = max(peaks.get(pid, 0), mib)
    rc = [l.strip() for f in glob.glob(f"{w}/{name}*.txt") for l in open(f) if "rc=" in l]
    print(f"{name}: {len(s)} samples, peak MiB per process (nvidia-smi) {sorted(peaks.values())}, {rc}")
    for summ in sorted(glob.glob(f"{w}/runs/{name}/**/summary.json", recursive=True)):
        j = json.load(open(summ))
        p = j.get("process_memory") or {}
        big = [m for m in j["members"] if m["name"] == "big"][0]
        print(f"  summary: peak_process {j.get('peak_process_bytes', 0) / 2**20:.0f} MiB, pool limit "
              f"{p.get('pool_limit', 0) / 2**20:.0f} MiB, big batch {big['batch']} OOMs {big['oom_events']}, "
              f"steps {big['steps']}")
    # The first sample after the first hand-back event, against the samples before it.
    first = next((i for i, x in enumerate(s) if x[1] > 0), None)
    if first is not None and name != "two40":
        before = [max(x[2].values(), default=0) for x in s[max(0, first - 5):first]]
        after = [max(x[2].values(), default=0) for x in s[first:first + 5]]
        print(f"  hand-back event at sample {first}: MiB before {before}, from it on {after}")
    for m in glob.glob(f"{w}/runs/{name}/**/big/metrics.jsonl", recursive=True):
        recs = [json.loads(l) for l in open(m)]
        steps = [r for r in recs if not r.get("event")]
        hb = [r for r in recs if r.get("event") and "handed back" in r["event"]]
        if steps and hb:
            print(f"  big: last step record at {steps[-1]['time']:.3f} s, '{hb[0]['event']}' at {hb[0]['time']:.3f} s")
