#!/bin/bash
# A sweep (or grid) shared among hosts as a Slurm job array: one array task per share, each one cohort on one GPU.
#
#   sbatch examples/cluster/slurm.sh examples/sweep.toml sweep
#
# then, once every task has ended (or as a job that waits for them):
#
#   sbatch --dependency=afterany:<JOBID> --wrap 'cohort report runs/sweep-shard*of4'
#
# The array's size is the number of shares: change --array (and nothing else) to use more or fewer hosts; the
# config and its seed decide the members, so every task computes the same list and trains its share of it. Run from
# a directory on a file system every node sees (the runs are written under ./runs, the config's data paths are
# read relative to the config). `cohort` must be on the PATH (or set COHORT=/path/to/cohort).
#
# A requeued or preempted task resumes its share from the last checkpoints (run-shard.sh); `--requeue` lets Slurm do
# that on node failure. With several GPUs per node, run one array task per GPU (--gpus-per-task=1, as here): each
# process sees the one card Slurm granted it through CUDA_VISIBLE_DEVICES, and `device = "auto"` or `"cuda"` trains
# on it.
#
#SBATCH --job-name=cohort-sweep
#SBATCH --array=1-4
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=runs/slurm-%A_%a.out
set -euo pipefail

config=${1:?usage: sbatch slurm.sh CONFIG NAME}
name=${2:?usage: sbatch slurm.sh CONFIG NAME}
# Shares are numbered from 1, whatever the array's first index.
i=$((SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN + 1))
n=$SLURM_ARRAY_TASK_COUNT

# sbatch runs a copy of this script from its spool: run-shard.sh is found from where the job was submitted.
exec "$SLURM_SUBMIT_DIR/examples/cluster/run-shard.sh" "$config" "$name" "$i" "$n" runs
