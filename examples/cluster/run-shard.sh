#!/bin/sh
# Trains share I of N of a grid or sweep, or resumes it where a run of that share already started: the one step the
# Slurm script (slurm.sh) and the Kubernetes Job (cohort-job.yaml) run on each host. Every host gets the same config
# and the same N; each trains the members `cohort train --shard I/N` picks, every member in exactly one share.
#
#   run-shard.sh CONFIG NAME I N [RUNS_DIR]
#
# The share's run directory is RUNS_DIR/NAME-shardIofN (RUNS_DIR: default runs). On a shared file system the shards
# never meet: each has its own directory, and `cohort report RUNS_DIR/NAME-shard*of$N` merges them into one
# leaderboard once all have finished. A share whose directory holds a config already was started before (a
# preempted or requeued task): it is resumed from its members' checkpoints instead of started again.
set -eu

if [ "$#" -lt 4 ]; then
  echo "usage: $0 CONFIG NAME I N [RUNS_DIR]" >&2
  exit 2
fi
config=$1
name=$2
i=$3
n=$4
runs=${5:-runs}
cohort=${COHORT:-cohort}

run="$runs/$name-shard${i}of$n"
if [ -f "$run/config.toml" ]; then
  exec "$cohort" resume "$run" --quiet
fi
exec "$cohort" train "$config" --name "$name" --dir "$runs" --shard "$i/$n" --quiet
