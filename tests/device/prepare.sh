#!/bin/bash
# Rebuild, on this machine (network, no GPU needed), what tests/device/check.sh needs on the GPU machine:
#   bash tests/device/prepare.sh
# into the folder .gpu/ at the repository root (ignored through .git/info/exclude; it travels with the
# device tool's carry [".gpu"]):
#   .gpu/whl/*.whl        cp312 manylinux wheels of what the device's Python 3.12 + torch lacks, at the
#                         versions of the 2026-12-04 run; emoji and wget built from their sdists; the
#                         data_juicer_elastic wheel built from `git archive $REF` (default HEAD: commit first,
#                         uncommitted changes are not in it)
#   .gpu/ray-slim.tar.xz  ray 2.60.0 (cp312) unpacked for site-packages, without ray/jars and the dashboard's
#                         .map files (the full wheel is 79 MB; the working tree that travels is 64 MiB at most)
#   .gpu/SOURCE.txt       the commit the wheel was built from (check.sh prints it)
# Only .gpu/whl, .gpu/ray-slim.tar.xz and .gpu/SOURCE.txt are replaced; anything else in .gpu/ is left alone
# (and travels too). Environment: PYTHON (a Python with pip, any version; default .venv/bin/python, else
# python3), REF (default HEAD), XZ_THREADS (default 0: all cores).
set -euo pipefail
ROOT=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
cd "$ROOT"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
REF=${REF:-HEAD}
COMMIT=$(git rev-parse --verify "$REF^{commit}")
G=$ROOT/.gpu

EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >>"$EXCLUDE"
git check-ignore -q .gpu/ || { echo "prepare.sh: .gpu/ is not ignored by git" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dje-device-prepare.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
W=$TMP/whl
mkdir -p "$W" "$TMP/sdist" "$TMP/ray" "$TMP/rayx" "$TMP/src"

# the device README's flags: binary wheels for CPython 3.12 on x86-64 manylinux, whatever runs pip here
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# py-data-juicer's and this package's needs that the device image lacks (or has older: fsspec, typing-extensions),
# as the 2026-12-04 run carried them; everything else (numpy, pandas, pyarrow, aiohttp, pyyaml, ...) is there.
WHEELS=(
  annotated-types==0.8.0
  beautifulsoup4==4.15.0
  datasets==5.2.0
  dep-logic==0.7.2
  dill==0.3.8
  docstring-parser==0.18.0
  fsspec==2026.9.0
  gitdb==4.0.12
  gitpython==3.2.1
  jsonargparse==4.53.0
  jsonlines==4.0.0
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  loguru==0.7.3
  lz4==4.4.5
  multiprocess==0.70.16
  mwparserfromhell==0.7.2
  orjson==3.13.0
  py-data-juicer==1.6.1
  pydantic==2.14.4
  pydantic-core==2.50.5
  referencing==0.37.0
  rpds-py==2026.9.1
  smmap==5.0.3
  soupsieve==4.1.4
  tomli==2.5.0
  tomli-w==1.2.0
  typeshed-client==2.15.0
  typing-extensions==4.16.0
  typing-inspection==0.4.5
  zstandard==0.25.0
)
SDISTS=(emoji==2.2.0 wget==3.2) # published as sdists only: built into py3-none-any wheels here
RAY=ray==2.60.0

echo "== wheels (${#WHEELS[@]})"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$W" "${WHEELS[@]}"

echo "== ${SDISTS[*]} from sdists"
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$TMP/sdist" "${SDISTS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$W" "$TMP"/sdist/*

echo "== data_juicer_elastic from git archive $REF ($COMMIT)"
git archive --format=tar "$COMMIT" | tar -x -C "$TMP/src"
"$PY" -m pip wheel -q --no-deps -w "$W" "$TMP/src"

echo "== $RAY, slimmed"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$TMP/ray" "$RAY"
unzip -q "$TMP"/ray/ray-*.whl -d "$TMP/rayx" # unzip keeps the executables' mode bits (raylet, gcs_server)
rm -rf "$TMP/rayx/ray/jars"
find "$TMP/rayx/ray/dashboard" -name '*.map' -delete
(cd "$TMP/rayx" && tar --sort=name --owner=0 --group=0 --numeric-owner -cf - ray ray-*.dist-info) \
  | xz -T"${XZ_THREADS:-0}" -6 >"$TMP/ray-slim.tar.xz"

# one version of each package, and all of them
n=$(ls "$W"/*.whl | wc -l)
want=$((${#WHEELS[@]} + ${#SDISTS[@]} + 1))
[ "$n" -eq "$want" ] || { echo "prepare.sh: $n wheels, expected $want" >&2; ls "$W" >&2; exit 1; }
dups=$(ls "$W" | cut -d- -f1 | tr 'A-Z' 'a-z' | sort | uniq -d)
[ -z "$dups" ] || { echo "prepare.sh: two versions of $dups" >&2; exit 1; }

mkdir -p "$G"
rm -rf "$G/whl" "$G/ray-slim.tar.xz"
mv "$W" "$G/whl"
mv "$TMP/ray-slim.tar.xz" "$G/ray-slim.tar.xz"
{
  echo "data_juicer_elastic wheel built from $COMMIT ($(git log -1 --format='%cd %s' --date=iso "$COMMIT" | cut -c1-100))"
  echo "prepared $(date -u '+%Y-%m-%d %H:%M UTC') by tests/device/prepare.sh; $n wheels, $RAY slimmed"
} >"$G/SOURCE.txt"

echo "== .gpu/"
ls -l "$G/whl" "$G/ray-slim.tar.xz"
cat "$G/SOURCE.txt"
others=$(ls -A "$G" | grep -v -x -E 'whl|ray-slim.tar.xz|SOURCE.txt' || true)
[ -z "$others" ] || echo "also in .gpu/ (travels too): $(echo $others)"
kb=$(du -sk "$G" | cut -f1)
echo ".gpu/: $((kb / 1024)) MB in $(find "$G" -type f | wc -l) files"
[ "$kb" -lt $((60 * 1024)) ] || echo "WARNING: .gpu/ is over 60 MB: with the working tree it may pass the 64 MiB that travels" >&2
