#!/usr/bin/env bash
# The device runs of #16 items 3, 5 and 7, from the repository root on the GPU machine with gpu-bundle.tar.xz
# carried. `bash bench/gpu-workloads.sh tests` runs every test binary with its GPU tests (the fragmentation soak
# left out) and the fused-attention test again with libcudnn hidden; `bash bench/gpu-workloads.sh bench PARTS`
# runs `xtask bench` parts (comma-separated, e.g. transformer,attention) beside PyTorch in the same call;
# `bash bench/gpu-workloads.sh profile MODEL PRECISIONS` runs `xtask profile` of one member of MODEL (mlp, cnn,
# resnet, text, transformer) in each precision (comma-separated): once plain, for the host's issue time against the
# device's, then with COHORT_CUDA_PROFILE=1 for GPU time per kernel (its events slow the host).
set -u
[ -d gpu-bundle ] || tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle; L=/tmp/logs; mkdir -p $L
t0=$(date +%s); runs=0; bad=0
runbin() { # file dir label
  local n=$(basename $1)
  (cd $2 && CARGO_MANIFEST_DIR=$PWD CARGO_BIN_EXE_cohort=$B/bin/cohort timeout 200 $B/$1 --include-ignored) > $L/$n$3.log 2>&1; local rc=$?
  echo "$n$3 rc=$rc $(grep -E '^test result' $L/$n$3.log | tail -1 | cut -c1-70)"
  runs=$((runs+1)); [ $rc = 0 ] || bad=$((bad+1))
  [ $rc = 0 ] || grep -E "panicked|FAILED|differ" -A3 $L/$n$3.log | cut -c1-300 | head -24
}
case "${1:-tests}" in
tests)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import json; [print(t["file"]+"\t"+t["package_dir"]) for t in json.load(open("gpu-bundle/MANIFEST.json"))["tests"] if "fragmentation" not in t["file"]]' > /tmp/tests.tsv
  while IFS=$'\t' read -r file dir; do runbin $file $dir ""; done < /tmp/tests.tsv
  # One line that survives a cut output tail: runs, those that failed, and the tests' sums.
  echo "tests done in $(( $(date +%s)-t0 )) s: $runs runs, $bad with rc != 0, $(cat $L/*.log \
    | awk '/^test result/ {p+=$4; f+=$6} END {print p" passed, "f" failed"}')"
  mkdir -p /tmp/hidden
  if mv /usr/lib/x86_64-linux-gnu/libcudnn* /tmp/hidden/ 2>/dev/null && ldconfig; then
    echo "cudnn entries in ldconfig now: $(ldconfig -p | grep -c cudnn)"
    runbin $(grep -o "tests/autograd-test-attention[^[:space:]]*" /tmp/tests.tsv | head -1) autograd "-hidden"
    mv /tmp/hidden/* /usr/lib/x86_64-linux-gnu/ && ldconfig
  fi ;;
bench)
  skip=replay,criterion,cohort,input,peak,cnn,resnet,transformer,cotrain,attention
  for p in ${2//,/ }; do skip=$(echo ",$skip," | sed "s/,$p,/,/; s/^,//; s/,$//"); done
  timeout ${3:-560} $B/bin/xtask bench --bundle gpu-bundle --gpu --reference --quick --rounds 1 --skip $skip --out $OUT/bench 2>&1 \
    | grep -vE "^torch .*MiB$|^cohort .*(model-steps/s|calls/s)" ;;
profile)
  for p in ${3//,/ }; do
    for timed in 0 1; do
      COHORT_CUDA_PROFILE=$timed timeout 120 $B/bin/xtask profile --model ${2:-transformer} --n 1 --steps 30 \
        --precision $p > $L/profile-$p-$timed.log 2>&1
      if [ $timed = 0 ]; then grep -E "^profile|host|graph:" $L/profile-$p-$timed.log
      else grep -E "GPU time|µs/step +[0-9.]+/step" $L/profile-$p-$timed.log | head -16; fi
    done
  done ;;
esac
echo "total $(( $(date +%s)-t0 )) s"
