"""pandas' side of `data/benches/csv.rs`: the same CSV table read into a feature matrix and a label vector.

500,000 rows of 12 float features and an integer label, written by the Rust benchmark. Prints, per engine, the
median wall time of 5 reads and MB/s: pandas' C parser (one thread, what `pd.read_csv` does by default) and, where
pyarrow is installed, its multi-threaded pyarrow engine.

Run:

    cargo bench -p cohort-data --bench csv             # writes the table and prints its path
    /work/venv-bench/bin/pip install pandas pyarrow
    /work/venv-bench/bin/python bench/pandas_csv.py /tmp/cohort-bench.csv
"""

import argparse
import os
import statistics
import time

import numpy as np
import pandas as pd


def read(path, engine):
    frame = pd.read_csv(path, engine=engine)
    y = frame.pop("label").to_numpy(np.int32)
    x = frame.to_numpy(np.float32)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    size = os.path.getsize(args.path) / 1e6
    engines = ["c"]
    try:
        import pyarrow  # noqa: F401

        engines.append("pyarrow")
    except ImportError:
        pass
    for engine in engines:
        read(args.path, engine)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            x, y = read(args.path, engine)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        print(f"pandas_{engine}: {t:.3f} s  {size / t:.1f} MB/s  rows {len(y)}")


if __name__ == "__main__":
    main()
