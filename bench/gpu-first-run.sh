#!/usr/bin/env bash
# A machine's first run against a warm one (#16 item 4: within 1.3x): the default job with its kernel cache emptied,
# then filled, the driver's JIT cache removed before each run, for 3 rounds. On the GPU machine, from the repository
# root with gpu-bundle.tar.xz carried:
#   bash bench/gpu-first-run.sh [OTHER_COHORT_BINARY ...]
# Other `cohort` binaries (built from other commits, `.xz` allowed) run beside the bundle's in each round, so that
# their times compare on one machine.
set -u
[ -d gpu-bundle ] || tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bins=("$PWD/gpu-bundle/bin/cohort")
for b in "$@"; do
  case $b in *.xz) xz -dc "$b" > "/tmp/$(basename "$b" .xz)"; b=/tmp/$(basename "$b" .xz); chmod +x "$b" ;; esac
  bins+=("$(realpath "$b")")
done
TIMEFORMAT=%R
for r in 1 2 3; do
  for bin in "${bins[@]}"; do
    rm -rf /tmp/kc ~/.nv/ComputeCache; mkdir -p /tmp/kc
    cold=$( { time COHORT_KERNEL_CACHE=/tmp/kc "$bin" > /tmp/first-run.log 2>&1; } 2>&1 )
    rm -rf ~/.nv/ComputeCache
    warm=$( { time COHORT_KERNEL_CACHE=/tmp/kc "$bin" > /tmp/warm-run.log 2>&1; } 2>&1 )
    echo "round $r $bin: first run $cold s, warm $warm s, $(ls /tmp/kc | wc -l) modules cached"
  done
done
