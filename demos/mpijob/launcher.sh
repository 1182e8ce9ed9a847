#!/usr/bin/env bash
# Kubeflow MPIJob Launcher: prepare, one worker per node over mpirun, merge.
#   bash launcher.sh RECIPE JOB_DIR EXPORT_PATH
# Works with Open MPI and with Hydra-based MPIs (MPICH, Intel MPI); the worker pods must run sshd.
# Forwarded to the workers: PATH, HF_HOME and every DJ_* variable set here (but DJ_ELASTIC_HOSTNAME:
# each node must keep its own name), plus the names in FORWARD (space-separated), e.g. FORWARD="HF_ENDPOINT".
set -euo pipefail
recipe=${1:?usage: launcher.sh RECIPE JOB_DIR EXPORT_PATH}
job_dir=${2:?job dir}
export_path=${3:?export path}
hostfile=${HOSTFILE:-/etc/mpi/hostfile}
nodes=$(grep -cv '^\s*\(#\|$\)' "$hostfile")

# The environment the workers get from here.
forward=(PATH)
if [[ -n ${HF_HOME:-} ]]; then forward+=(HF_HOME); fi
while IFS= read -r name; do
  if [[ $name != DJ_ELASTIC_HOSTNAME ]]; then forward+=("$name"); fi
done < <(compgen -e | grep '^DJ_' || true)
for name in ${FORWARD:-}; do
  if [[ -n ${!name+set} ]]; then forward+=("$name"); fi
done

# mpirun's options differ between implementations.
if mpirun --version 2>&1 | grep -qi 'open mpi\|openrte'; then
  mpi=(-np "$nodes" -npernode 1 --hostfile "$hostfile")
  if [[ $(id -u) == 0 ]]; then
    mpi+=(--allow-run-as-root) # Open MPI refuses root without it; other MPIs do not know the option
  fi
  for name in "${forward[@]}"; do mpi+=(-x "$name"); done
else # MPICH, Intel MPI (Hydra)
  mpi=(-n "$nodes" -ppn 1 -f "$hostfile" -genvlist "$(IFS=,; echo "${forward[*]}")")
fi

# 1. Split the input into shards (a no-op when this job dir is already prepared).
dj-elastic prepare --config "$recipe" --job-dir "$job_dir"

# 2. One claim loop per node; each exits 0 once every shard is done.
mpirun "${mpi[@]}" dj-elastic worker --job-dir "$job_dir"

# 3. Check every output, then write them in input order.
dj-elastic verify --job-dir "$job_dir" --expect-nodes "$nodes"
dj-elastic merge --job-dir "$job_dir" --output "$export_path" --overwrite
