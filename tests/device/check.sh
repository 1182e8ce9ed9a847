#!/bin/bash
# Device check, on the GPU machine, from the repository root (see tests/device/README.md):
#   here:       bash tests/device/prepare.sh          (fills the ignored folder .gpu/)
#   device run: command "bash tests/device/check.sh", carry [".gpu"], timeout_s 440
# Installs .gpu/whl/*.whl and .gpu/ray-slim.tar.xz offline into the machine's Python (3.12 with torch),
# runs tests/device/check.py (a real CUDA model op in actor mode: A elastic_shard, B plain ray, A2
# elastic_shard again), then B7 (tests/benchmarks/bench_warm.py b7 --rounds 1) if time is left.
# The code measured is the installed data_juicer_elastic wheel (built by prepare.sh from a commit),
# not the working tree's package. Results under $OUT: results.txt, check.log, logs.tgz.
# Environment: OUT (default /tmp/out), WORK (default /tmp/gc), LIMIT (seconds for the whole script,
# default 400), A2_DEADLINE (check.py starts its third run only before this many seconds, default 190).
set -x
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 UV_OFFLINE=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAY_USAGE_STATS_ENABLED=0 PIP_DISABLE_PIP_VERSION_CHECK=1
unset DJ_ELASTIC_DISABLE # the wheel's .pth hook must load: it is what makes the installed package the one measured
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
D=$ROOT/tests/device
G=$ROOT/.gpu
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/gc}
LIMIT=${LIMIT:-400}
A2_DEADLINE=${A2_DEADLINE:-190}
mkdir -p "$OUT" "$WORK"
if ! ls "$G"/whl/data_juicer_elastic-*.whl >/dev/null 2>&1 || [ ! -f "$G/ray-slim.tar.xz" ]; then
  echo "$G/whl or $G/ray-slim.tar.xz is missing: run 'bash tests/device/prepare.sh' before, and carry [\".gpu\"]" \
    | tee "$OUT/check.log"
  exit 2
fi
cd "$WORK" || exit 2 # not the repository root: its data_juicer_elastic/ must not shadow the installed wheel
{
  date
  uname -a
  cat "$G/SOURCE.txt"
  nvidia-smi
  which python3
  python3 --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
  nproc
  free -g
  df -h /dev/shm /tmp
  python3 -m pip list 2>/dev/null | grep -i -E "^(fsspec|pyarrow|pandas|numpy|huggingface.hub|typing.extensions|protobuf|psutil|aiohttp|grpcio|pydantic|jsonschema|click|msgpack|pillow|regex) "
  SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "site-packages: $SP"
  if time python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$G"/whl/*.whl \
    && time tar -xJf "$G/ray-slim.tar.xz" -C "$SP"; then
    echo "installed into the venv"
  else
    echo "venv install failed; falling back to /tmp/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$G"/whl/*.whl
    tar -xJf "$G/ray-slim.tar.xz" -C /tmp/site
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  fi
  which dj-process dj-elastic
  python3 -c "import ray, data_juicer, data_juicer_elastic, datasets, fsspec; print('ray', ray.__version__, 'dj', data_juicer.__version__, 'dje', data_juicer_elastic.__version__, data_juicer_elastic.__file__, 'datasets', datasets.__version__, 'fsspec', fsspec.__version__)" || exit 3
  python3 -c "import sys, data_juicer_elastic as d; sys.exit(d.__file__.startswith(sys.argv[1]))" "$ROOT/" \
    || { echo "data_juicer_elastic comes from the working tree, not the installed wheel"; exit 3; }
  python3 -c "import importlib.metadata as m; print([e for e in m.entry_points(group='data_juicer.executors')])"
  echo "setup done at ${SECONDS}s"

  timeout $((LIMIT - SECONDS - 60)) python3 "$D/check.py" --work "$WORK" --out "$OUT" --deadline "$A2_DEADLINE"
  rc=$?
  echo "check.py exit $rc at ${SECONDS}s"
  nvidia-smi
  # logs: recipes, console logs, loads, attempt logs (no row data)
  (cd "$WORK" && find . -not -path "*/out.jsonl/*" \( -name "*.log" -o -name "log.txt" -o -name "loads.jsonl" -o -name "recipe.yaml" -o -name "*.json" \) -size -2M -print0 | tar -czf "$OUT/logs.tgz" --null -T -) 2>/dev/null
  ls -la "$OUT"

  LEFT=$((LIMIT - SECONDS - 5))
  if [ "$LEFT" -gt 60 ]; then
    echo "B7 with ${LEFT}s left"
    timeout "$LEFT" python3 "$ROOT/tests/benchmarks/bench_warm.py" b7 --rounds 1 2>&1 | tee -a "$OUT/results.txt"
    b7=${PIPESTATUS[0]}
    echo "bench_warm exit $b7 at ${SECONDS}s"
    grep -q "^code: $ROOT/" "$OUT/results.txt" && echo "WARNING: B7 measured the working tree's package, not the wheel"
    [ "$rc" = 0 ] && rc=$b7
  else
    echo "B7 skipped: ${LEFT}s left" | tee -a "$OUT/results.txt"
  fi
  date
  exit "$rc"
} 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
