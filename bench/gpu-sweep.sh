#!/usr/bin/env bash
# The device run of issue #18 (sweeps), from the repository root on the GPU machine with gpu-bundle.tar.xz and .whl
# carried: the 64-trial sweep in cohort beside Optuna + PyTorch (bench/sweep.sh), TensorBoard's own HParams reader
# on cohort's run, the same sweep in cohort one trial at a time (max_concurrent = 1, fuse = false), and the sweep
# tests with their GPU test.
set -u
tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle; mkdir -p $OUT/logs
t0=$(date +%s)
echo "== sweep: cohort beside Optuna"
SWEEP_RUNS=/tmp/sweep-runs OUT=$OUT/sweep bash bench/sweep.sh $B/bin/cohort
export PYTHONPATH=/tmp/site
echo "== TensorBoard's HParams reader on cohort's run"
timeout 120 python3 bench/tb_hparams_check.py /tmp/sweep-runs/sweep-64 2>&1 | tail -8
echo "== cohort, one trial at a time"
sed 's/^\[search\]/[search]\nmax_concurrent = 1/; s/^\[run\]/[run]\nfuse = false/; s/name = "sweep-64"/name = "sweep-64-sequential"/' \
  bench/sweep-64.toml > /tmp/sequential.toml
s=$(date +%s.%N)
timeout 240 $B/bin/cohort train /tmp/sequential.toml --dir /tmp/sweep-runs --quiet > $OUT/logs/sequential.log 2>&1
echo "sequential rc=$? in $(python3 -c "print(f'{$(date +%s.%N) - $s:.1f}')") s"
grep -E "trials:|^trial|best$" $OUT/logs/sequential.log | head -4
cp /tmp/sweep-runs/sweep-64-sequential/summary.json $OUT/sequential-summary.json 2>/dev/null
echo "== sweep tests"
(cd trainer && CARGO_MANIFEST_DIR=$PWD CARGO_BIN_EXE_cohort=$B/bin/cohort timeout 200 $B/tests/trainer-test-sweep --include-ignored) > $OUT/logs/sweep-tests.log 2>&1
echo "trainer-test-sweep rc=$? $(grep -E '^test result' $OUT/logs/sweep-tests.log)"
grep -E "panicked|FAILED" -A3 $OUT/logs/sweep-tests.log | head -20
echo "total $(( $(date +%s)-t0 )) s"
