#!/usr/bin/env bash
# Where the bench CNN's step goes, cohort beside PyTorch (#16 item 1): PyTorch's kernels per step through cuDNN's
# graph API (its default) and its legacy API, then cohort's steady-state kernels under ncu, for fp32 and tf32.
set -u
[ -d gpu-bundle ] || tar xJf gpu-bundle.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/gpu-bundle; R=$PWD
for p in ${1:-fp32 tf32}; do
  (cd bench && python3 torch_cnn_kernels.py $p)
  (cd bench && TORCH_CUDNN_V8_API_DISABLED=1 python3 torch_cnn_kernels.py $p | sed 's/^/v7 /' | head -12)
  sed "s/precision = \"tf32\"/precision = \"$p\"/; s/steps = 40/steps = 60/" bench/profile-cnn-tf32.toml > /tmp/cnn-$p.toml
  (cd /tmp && timeout 240 ncu --launch-skip ${SKIP:-3000} --launch-count ${COUNT:-400} --print-summary per-kernel \
     --metrics gpu__time_duration.sum $B/bin/cohort train /tmp/cnn-$p.toml > /tmp/ncu-$p.txt 2>&1)
  echo "cohort $p under ncu (launches ${SKIP:-3000}+${COUNT:-400}):"; python3 bench/ncu_summary.py /tmp/ncu-$p.txt 22
  grep -iE "error|panick" /tmp/ncu-$p.txt | head -5
done
