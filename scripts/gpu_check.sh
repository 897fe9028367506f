#!/usr/bin/env bash
# The device ladder is scripts/gpu_ladder.py (rungs 1 / 2 / 8 / ascend, docs/operations.md); this script is the
# issue-6 measurement study of the backends on one GPU.
# The GPU check (issue 6): one run on a lent GPU (about 5 minutes on one H200) that prints ONE JSON report
# and writes it to $OUT/gpu_check.json when $OUT is set, else benchmarks/results/gpu_check.json.
#
#   scripts/gpu_check.sh               # on the GPU machine (python3 with torch + transformers there)
#   scripts/gpu_check.sh --cpu-smoke   # the same code paths with tiny models on a CPU (tests the script)
#
# The device has no registry access: wheels carried in .whl/ (megatron-core for its python) are installed
# into a private target dir first. vLLM cannot be carried (>300 MB) and is reported as not measurable.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=$(mktemp -d /tmp/gpu_check_site.XXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl >&2 \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" \
    || echo "gpu_check: installing the carried wheels failed; continuing without them" >&2
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec "$PY" scripts/gpu_check.py --out "${OUT:-benchmarks/results}/gpu_check.json" "$@"
