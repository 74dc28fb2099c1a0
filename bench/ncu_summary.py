"""Sums an `ncu --print-summary per-kernel --metrics gpu__time_duration.sum` report by kernel: total, count, mean."""
import re
import sys

rows, name, inv = [], None, 0
for line in open(sys.argv[1]):
    if "Invocations" in line:
        name, inv = line.strip(), int(re.search(r"Invocations (\d+)", line).group(1))
    elif "gpu__time_duration.sum" in line and name:
        p = line.split()
        avg = float(p[-1].replace(",", "")) * {"ms": 1000, "us": 1, "ns": 1e-3}[p[-4]]
        rows.append((avg * inv, inv, avg, name[:110]))
        name = None
rows.sort(reverse=True)
print(f"total {sum(r[0] for r in rows):.0f} us")
for r in rows[: int(sys.argv[2]) if len(sys.argv) > 2 else 20]:
    print(f"{r[0]:9.1f} us  x{r[1]:3d}  {r[2]:8.1f}  {r[3]}")
