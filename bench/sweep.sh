#!/usr/bin/env bash
# The sweep benchmark's device run, from the repository root on the GPU machine: `cohort train bench/sweep-64.toml`
# (64 trials trained at once, ASHA at epochs 1 and 3 of 9), timed, then the same search as users run it today,
# bench/optuna_sweep.py (Optuna's TPE and successive-halving pruner, one PyTorch trial after another), then one
# table of both: wall time to best, total wall, best validation accuracy, trials completed / pruned, optuna / cohort.
#
#   bench/sweep.sh [COHORT_BINARY]        default gpu-bundle/bin/cohort (unpacked from gpu-bundle.tar.xz if absent)
#
# Carry `.whl` (optuna 5.0.0, alembic 1.20.1, sqlalchemy 2.1.9, colorlog 6.12.0, Mako 1.4.3 wheels for Python 3.12,
# 5.4 MiB; ignored by git through .git/info/exclude, fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 colorlog==6.12.0 mako==1.4.3
# ) and gpu-bundle.tar.xz or the
# built binary. COHORT_DEVICE is left as it is. Extra arguments for the Optuna script: OPTUNA_ARGS (for example
# "--sampler random"); time limits: COHORT_TIMEOUT (300 s), OPTUNA_TIMEOUT (240 s). Logs, cohort's summary, its
# run directory without checkpoints (cohort-run.tgz), Optuna's JSON line and the table go to $OUT (or
# /tmp/sweep-out). SWEEP_RUNS names the directory cohort's run goes under (default: a new temporary one).
set -u
cd "$(dirname "$0")/.."
BIN=${1:-gpu-bundle/bin/cohort}
O=${OUT:-/tmp/sweep-out}
mkdir -p "$O"
if [ ! -x "$BIN" ] && [ "$BIN" = gpu-bundle/bin/cohort ] && [ -f gpu-bundle.tar.xz ]; then
  tar xJf gpu-bundle.tar.xz
fi
[ -x "$BIN" ] || { echo "no cohort binary at $BIN"; exit 1; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
python3 -c 'import optuna, torch; print(f"optuna {optuna.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")' \
  || { echo "optuna or torch cannot be imported: carry .whl (see bench/optuna_sweep.py)"; exit 1; }
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

now() { date +%s.%N; }

echo "== cohort: $BIN train bench/sweep-64.toml"
RUNS=${SWEEP_RUNS:-$(mktemp -d /tmp/sweep-runs.XXXXXX)}
t=$(now)
timeout "${COHORT_TIMEOUT:-300}" "$BIN" train bench/sweep-64.toml --dir "$RUNS" --quiet > "$O/cohort.log" 2>&1
rc=$?
cohort_s=$(python3 -c "print(f'{$(now) - $t:.2f}')")
echo "cohort rc=$rc in $cohort_s s"
RUN=$RUNS/sweep-64
[ -d "$RUN" ] || RUN=$(find "$RUNS" -mindepth 1 -maxdepth 1 -type d | head -1)
if [ "$rc" != 0 ] || [ ! -f "$RUN/summary.json" ]; then
  tail -30 "$O/cohort.log"
fi
[ -f "$RUN/summary.json" ] && cp "$RUN/summary.json" "$O/cohort-summary.json"
[ -n "$RUN" ] && tar czf "$O/cohort-run.tgz" -C "$RUNS" --exclude=checkpoints --exclude='*.safetensors' .

echo "== optuna: bench/optuna_sweep.py --trials 64 --epochs 9 ${OPTUNA_ARGS:-}"
t=$(now)
# shellcheck disable=SC2086
timeout "${OPTUNA_TIMEOUT:-240}" python3 bench/optuna_sweep.py --trials 64 --epochs 9 ${OPTUNA_ARGS:-} \
  > "$O/optuna.json" 2> "$O/optuna.log"
orc=$?
optuna_s=$(python3 -c "print(f'{$(now) - $t:.2f}')")
echo "optuna rc=$orc in $optuna_s s"
[ "$orc" = 0 ] || tail -20 "$O/optuna.log"

echo "== comparison"
if [ -f "$RUN/summary.json" ] && [ "$orc" = 0 ]; then
  python3 bench/sweep_compare.py "$RUN" "$O/optuna.json" --cohort-process-s "$cohort_s" --optuna-process-s "$optuna_s" \
    > "$O/compare.txt"
  cat "$O/compare.txt"
else
  echo "no comparison: cohort rc=$rc (summary: $([ -f "$RUN/summary.json" ] && echo yes || echo no)), optuna rc=$orc"
  exit 1
fi
