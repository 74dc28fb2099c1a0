#!/usr/bin/env bash
# Where a conv model's training step goes, cohort beside PyTorch (#16): PyTorch's kernels per step through cuDNN's
# graph API (its default) and its legacy API, then cohort's steady-state kernels under ncu.
#   bash bench/gpu-conv-profile.sh [cnn|resnet|transformer] [PRECISIONS]     (default: cnn "fp32 tf32")
# The cnn runs bench/profile-cnn-tf32.toml, the resnet bench/profile-resnet.toml, the transformer
# bench/profile-transformer.toml, with the precision swapped in and
# STEPS steps (60); ncu profiles COUNT launches (400) after SKIP (3000): past the first steps' tuning. Where $OUT is
# set (the device tool), each run's tuning.json is copied there.
set -u
[ -d gpu-bundle ] || tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle
model=${1:-cnn}
case $model in
  cnn) toml=bench/profile-cnn-tf32.toml ;; resnet) toml=bench/profile-resnet.toml ;;
  transformer) toml=bench/profile-transformer.toml ;;
esac
for p in ${2:-fp32 tf32}; do
  (cd bench && python3 torch_kernels.py $model $p)
  (cd bench && TORCH_CUDNN_V8_API_DISABLED=1 python3 torch_kernels.py $model $p | sed 's/^/v7 /' | head -12)
  sed -E "s/precision = \"[a-z0-9]+\"/precision = \"$p\"/; s/steps = [0-9]+/steps = ${STEPS:-60}/; s#\"data/#\"$PWD/data/#" \
    $toml > /tmp/$model-$p.toml
  (cd /tmp && timeout 240 ncu --launch-skip ${SKIP:-3000} --launch-count ${COUNT:-400} --print-summary per-kernel \
     --metrics gpu__time_duration.sum $B/bin/cohort train /tmp/$model-$p.toml > /tmp/ncu-$p.txt 2>&1)
  echo "cohort $model $p under ncu (launches ${SKIP:-3000}+${COUNT:-400}):"; python3 bench/ncu_summary.py /tmp/ncu-$p.txt 22
  grep -iE "error|panick" /tmp/ncu-$p.txt | head -5
  # The tuner's choices (which cuDNN algorithm each pass timed fastest), beside the kernels they launched.
  [ -n "${OUT:-}" ] && find /tmp -name tuning.json -newer /tmp/$model-$p.toml -exec cp {} $OUT/tuning-$model-$p.json \;
done
