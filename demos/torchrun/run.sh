#!/usr/bin/env bash
# Run on every node:  bash run.sh RECIPE NNODES HEAD_HOST SUBMISSION_ID
# torchrun only starts the processes here; the nodes coordinate through the job directory.
set -euo pipefail
recipe=${1:?usage: run.sh RECIPE NNODES HEAD_HOST SUBMISSION_ID}
nnodes=${2:?nnodes}
head=${3:?head host}
submission=${4:?a new id for each submission, the same on every node}

exec torchrun --nnodes="$nnodes" --nproc-per-node=1 \
  --rdzv-backend=c10d --rdzv-endpoint="$head:29400" --rdzv-id="$submission" \
  --no-python dj-process --config "$recipe"
