#!/bin/bash
# On a GPU machine, from the repository root with gpu-bundle.tar.xz beside it (`cargo xtask gpu-bundle --archive`):
#   bash bench/memory/limits.sh        (TESTS=0 skips the test binaries, BENCH=1 adds `xtask bench --quick --reference`)
# Trains bench/memory/heavy.toml with nvidia-smi's per-process figure sampled every 100 ms: without a limit, with a
# 1 GiB pool limit, with 1 GiB and 1500 MiB process-wide limits, then two processes at 40 % each side by side; a
# process limit below what the CUDA context holds (an error), and `cohort memory`. bench/memory/samples.py prints
# each run's peak beside its limit and when a finished member's memory left the card. Everything lands in
# $OUT/out.tgz.
set -u
cd "$(dirname "$0")/../.."
tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=gpu-bundle/bin
W=/tmp/w; mkdir -p $W/runs
sample() { # sample FILE RUNDIR: every 100 ms, nvidia-smi's per-process memory and how many hand-back events are written
  while :; do
    hb=$(cat $(find "$2" -name metrics.jsonl 2>/dev/null) /dev/null 2>/dev/null | grep -c "handed back")
    echo "$(date +%s.%N) hb=$hb $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr '\n' ';')"
    sleep 0.1
  done > "$1"
}
job() { # job NAME ENV... : one cohort run of heavy.toml with nvidia-smi sampled
  local name=$1; shift
  mkdir -p $W/runs/$name
  sample $W/smi-$name.txt $W/runs/$name & local s=$!
  env "$@" $B/cohort train bench/memory/heavy.toml --dir $W/runs/$name > $W/$name.txt 2>&1; echo "rc=$?" >> $W/$name.txt
  kill $s
}
job nolimit
job pool1g COHORT_MEMORY_LIMIT=1GiB
job process1g COHORT_MEMORY_SCOPE=process COHORT_MEMORY_LIMIT=1GiB
job process1500m COHORT_MEMORY_SCOPE=process COHORT_MEMORY_LIMIT=1500MiB
COHORT_MEMORY_SCOPE=process COHORT_MEMORY_LIMIT=300MiB $B/cohort train --dir $W/runs/p300 > $W/process300m.txt 2>&1; echo "rc=$?" >> $W/process300m.txt
COHORT_MEMORY_SCOPE=process COHORT_MEMORY_LIMIT=2GiB $B/cohort memory --device cuda > $W/memory-cmd.txt 2>&1
# Two processes at 40 % each, preallocating (each pool takes 90 % of its share at once), side by side.
mkdir -p $W/runs/two40; sample $W/smi-two40.txt $W/runs/two40 & S=$!
P=()
for k in 1 2; do
  COHORT_MEMORY_SCOPE=process COHORT_MEMORY_LIMIT=40% COHORT_MEMORY_GROWTH=false $B/cohort train bench/memory/heavy.toml --dir $W/runs/two40/$k > $W/two40-$k.txt 2>&1 &
  P+=($!)
done
for p in "${P[@]}"; do wait $p; echo "two40 pid $p rc=$?" >> $W/two40.txt; done
kill $S
find $W/runs -name "*.safetensors" -delete; find $W/runs -name "events.out*" -delete; find $W/runs -name "*.png" -delete
python3 bench/memory/samples.py $W | tee $W/analysis.txt
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TEST_LIMIT:-420} bash gpu-bundle/run-tests.sh $W/logs "--skip soak" > $W/tests.txt 2>&1; echo "tests rc=$?" >> $W/tests.txt
  grep -v "rc=0" $W/tests.txt | tail -20
  python3 - $W/tests.txt <<'PY'
import re,sys
p=f=0
for l in open(sys.argv[1]):
    m=re.search(r"(\d+) passed; (\d+) failed",l)
    if m: p+=int(m[1]); f+=int(m[2])
print(f"tests: {sum(1 for l in open(sys.argv[1]) if 'rc=' in l and ':' in l)} binaries, {p} passed, {f} failed")
PY
fi
if [ "${BENCH:-0}" = 1 ]; then
  timeout ${BENCH_LIMIT:-200} $B/xtask bench --bundle gpu-bundle --quick --reference > $W/bench.txt 2>&1; echo "bench rc=$?" >> $W/bench.txt
  grep -E "×|x |ratio|rc=" $W/bench.txt | tail -30
fi
tar czf $OUT/out.tgz -C $W .
