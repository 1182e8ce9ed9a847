#!/usr/bin/env bash
# PAI-DLC startup command: the same script runs on every worker.
#   bash /mnt/shared/code/demos/pai_dlc/start.sh /mnt/shared/code/demos/recipe.yaml
set -euo pipefail
recipe=${1:?usage: start.sh RECIPE}

# All workers of one job need the same run id, and each new job a new one.
# PAI_JOB_ID / DLC_JOB_ID are used when DLC sets them; otherwise take the
# job's name from the pod name (<job>-worker-<i>, <job>-master-0).
if [ -z "${PAI_JOB_ID:-}${DLC_JOB_ID:-}${DJ_ELASTIC_RUN_ID:-}" ]; then
  pod=$(hostname)
  export DJ_ELASTIC_RUN_ID=${pod%-*-*}
fi

exec dj-process --config "$recipe"
