#!/usr/bin/env bash
# Kubeflow MPIJob Launcher: prepare, one worker per node over mpirun, merge.
#   bash launcher.sh RECIPE JOB_DIR EXPORT_PATH
set -euo pipefail
recipe=${1:?usage: launcher.sh RECIPE JOB_DIR EXPORT_PATH}
job_dir=${2:?job dir}
export_path=${3:?export path}
hostfile=${HOSTFILE:-/etc/mpi/hostfile}
nodes=$(grep -cv '^\s*\(#\|$\)' "$hostfile")

# 1. Split the input into shards (a no-op when this job dir is already prepared).
dj-elastic prepare --config "$recipe" --job-dir "$job_dir"

# 2. One claim loop per node; each exits 0 once every shard is done.
mpirun --allow-run-as-root -np "$nodes" -npernode 1 --hostfile "$hostfile" \
  -x PATH \
  dj-elastic worker --job-dir "$job_dir"

# 3. Check every output, then write them in input order.
dj-elastic verify --job-dir "$job_dir" --expect-nodes "$nodes"
dj-elastic merge --job-dir "$job_dir" --output "$export_path" --overwrite
