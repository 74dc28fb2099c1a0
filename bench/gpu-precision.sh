#!/usr/bin/env bash
# The device run of issue #16 part 2 (precision policy), from the repository root on the GPU machine with
# gpu-bundle.tar.xz carried: every test binary with its GPU tests, the precision tests again with libcudnn hidden,
# the default job's CNN under fp32 / tf32 / bf16 / f16 side by side (bench/precision-cnn.toml), and the CNN
# workload of `xtask bench` beside PyTorch (eager and CUDA graphs) in fp32, tf32 and bf16.
set -u
tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle; L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
python3 -c 'import json; [print(t["file"]+"\t"+t["package_dir"]) for t in json.load(open("gpu-bundle/MANIFEST.json"))["tests"] if "fragmentation" not in t["file"]]' > /tmp/tests.tsv
runbin() { # file dir label
  local n=$(basename $1)
  (cd $2 && CARGO_MANIFEST_DIR=$PWD CARGO_BIN_EXE_cohort=$B/bin/cohort timeout 200 $B/$1 --include-ignored) > $L/$n$3.log 2>&1; local rc=$?
  echo "$n$3 rc=$rc $(grep -E '^test result' $L/$n$3.log | tail -1 | cut -c1-70)"
  [ $rc = 0 ] || grep -E "panicked|FAILED|differ" -A3 $L/$n$3.log | cut -c1-300 | head -24
}
if [ "${QUICK:-0}" = 1 ]; then  # only the precision tests
  grep -E "precision|cuda_conv" /tmp/tests.tsv > /tmp/some.tsv; mv /tmp/some.tsv /tmp/tests.tsv
fi
while IFS=$'\t' read -r file dir; do runbin $file $dir ""; done < /tmp/tests.tsv
echo "tests done in $(( $(date +%s)-t0 )) s"
echo "== the default CNN under each precision"
s=$(date +%s)
timeout 240 $B/bin/cohort train bench/precision-cnn.toml --dir /tmp/prec-runs > $L/precision-cnn.log 2>&1
echo "cohort train rc=$? in $(( $(date +%s)-s )) s"
grep -v "^\s*$" $L/precision-cnn.log | grep -iE "cnn-|member|test|precision|skipp" | tail -30
cp /tmp/prec-runs/precision-cnn/summary.json $OUT/precision-summary.json 2>/dev/null
echo "== the CNN workload beside PyTorch"
timeout 300 $B/bin/xtask bench --bundle gpu-bundle --gpu --reference --quick --rounds 1 --skip replay,criterion,cohort,input --out $OUT/bench 2>&1 | tail -30
echo "== cuDNN hidden"
mkdir -p /tmp/hidden
if mv /usr/lib/x86_64-linux-gnu/libcudnn* /tmp/hidden/ 2>/dev/null && ldconfig; then
  echo "cudnn entries in ldconfig now: $(ldconfig -p | grep -c cudnn)"
  for p in "tests/tensor-test-cuda_precision tensor" "tests/autograd-test-precision autograd" "tests/kernels-test-cuda_conv_own kernels"; do runbin $p "-hidden"; done
  mv /tmp/hidden/* /usr/lib/x86_64-linux-gnu/ && ldconfig
else echo "could not hide libcudnn (not root?)"; fi
echo "total $(( $(date +%s)-t0 )) s"
