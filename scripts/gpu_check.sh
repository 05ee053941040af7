#!/usr/bin/env bash
# The GPU validation kit in one call (`make gpu-check`). Prepare it once where pip works with
# scripts/gpu_kit/download.sh, carry .gpu-kit to the GPU machine, then run from the repo root:
#   scripts/gpu_check.sh                 # CUDA when torch sees it, else the small CPU fallback
#   scripts/gpu_check.sh --mode cpu      # force the CPU fallback (what CI-less checks run here)
# Its last step runs both verl presets' `trainer/run.py --check-config` for the GPU count found
# (where verl is installed). Writes gpu_check.json, gpu_check.md (the table), pytest.xml and
# gpu_check.log to $OUT (default ./gpu-check-out). Where pydantic, grpc health/reflection,
# pytest-asyncio or a new enough grpcio is missing, installs .gpu-kit/wheels with --no-deps into
# a private folder first. The whole run is bounded by GPU_CHECK_TIMEOUT seconds (default 470:
# inside 8 minutes).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
KIT=${GPU_KIT:-$ROOT/.gpu-kit}
OUT=${OUT:-$ROOT/gpu-check-out}
SITE=${GPU_KIT_SITE:-/tmp/gpu-kit-site}
mkdir -p "$OUT"
have_deps() {
  "$PY" - <<'PYEOF' 2>/dev/null
import grpc, grpc_health, grpc_reflection, pydantic, pysbd, pytest_asyncio
assert tuple(int(x) for x in grpc.__version__.split(".")[:2]) >= (1, 85)
PYEOF
}
if have_deps; then
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  if ! ls "$KIT"/wheels/*.whl >/dev/null 2>&1; then
    echo "gpu_check: packages missing and no wheels in $KIT/wheels: run scripts/gpu_kit/download.sh" \
         "where pip works and carry .gpu-kit along" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$KIT"/wheels/*.whl || exit 2
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout -k 10 "${GPU_CHECK_TIMEOUT:-470}" "$PY" scripts/gpu_check.py --kit "$KIT" --out "$OUT" "$@" \
  2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
