#!/usr/bin/env bash
# The device run of stop 27 (issues #17 and #16 part 1), from the repository root on the GPU machine with
# gpu-bundle.tar.xz carried: every test binary with its GPU tests (but the allocator's 200-s fragmentation replay),
# the two CUDA resume tests 10 times in new processes, the cuda_conv bench beside bench/torch_conv.py, then the
# cuDNN paths again with libcudnn hidden (moved out of the system library path and restored).
set -u
tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle; L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
# Every test binary with its GPU tests, but the allocator's 200-second fragmentation replay (alloc is unchanged
# since the earlier call of this session, where it passed).
python3 -c 'import json; [print(t["file"]+"\t"+t["package_dir"]) for t in json.load(open("gpu-bundle/MANIFEST.json"))["tests"] if "fragmentation" not in t["file"]]' > /tmp/tests.tsv
runbin() { # file dir label
  local n=$(basename $1)
  (cd $2 && CARGO_MANIFEST_DIR=$PWD CARGO_BIN_EXE_cohort=$B/bin/cohort timeout 200 $B/$1 --include-ignored) > $L/$n$3.log 2>&1; local rc=$?
  echo "$n$3 rc=$rc $(grep -E '^test result' $L/$n$3.log | tail -1 | cut -c1-70)"
  [ $rc = 0 ] || grep -E "panicked|FAILED|differ" -A2 $L/$n$3.log | cut -c1-300 | head -24
}
while IFS=$'\t' read -r file dir; do runbin $file $dir ""; done < /tmp/tests.tsv
echo "tests done in $(( $(date +%s)-t0 )) s"
cd trainer
for i in $(seq 10); do
  r1=$(CARGO_MANIFEST_DIR=$PWD CARGO_BIN_EXE_cohort=$B/bin/cohort timeout 60 $B/tests/trainer-test-determinism --include-ignored under_deterministic 2>&1 | grep -E "^test result|differ" | cut -c1-160)
  r2=$(CARGO_MANIFEST_DIR=$PWD timeout 60 $B/tests/trainer-test-cohort --include-ignored an_interrupted_and_resumed_run_on_cuda 2>&1 | grep "^test result" | cut -c1-40)
  echo "round $i: deterministic: $r1 | resume: $r2"
done
cd ..
echo "== conv: cohort (criterion), then PyTorch"
timeout 150 $B/benches/kernels-bench-cuda --bench cuda_conv 2>&1 | grep -E "^cuda_conv|time:|thrpt:" | head -30
timeout 60 python3 bench/torch_conv.py 2>&1 | tail -6
echo "== cuDNN hidden"
mkdir -p /tmp/hidden
if mv /usr/lib/x86_64-linux-gnu/libcudnn* /tmp/hidden/ 2>/dev/null && ldconfig; then
  echo "cudnn entries in ldconfig now: $(ldconfig -p | grep -c cudnn)"
  for p in "tests/kernels-test-cuda_conv_own kernels" "tests/kernels-test-cuda_ops kernels" "tests/tensor-test-cuda_vs_cpu tensor" "tests/trainer-test-cohort trainer" "tests/trainer-test-determinism trainer" "tests/kernels-test-cuda_conv kernels"; do runbin $p "-hidden"; done
  grep -h -i "cudnn" $L/*-hidden.log | sort | uniq -c | head -5
  mv /tmp/hidden/* /usr/lib/x86_64-linux-gnu/ && ldconfig
else echo "could not hide libcudnn (not root?)"; fi
echo "total $(( $(date +%s)-t0 )) s"
