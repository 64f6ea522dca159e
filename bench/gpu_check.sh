#!/usr/bin/env bash
# The prepared GPU check: one call on an NVIDIA H200, well under 8 minutes. Runs the `-m gpu` tests, the paged
# decode-attention microbenchmark, the engine-vs-transformers rollout benchmark and the LoRA sync benchmark,
# prints one table and writes each step's log and JSON line under $OUT (default /tmp/gpu_check).
#   bash bench/gpu_check.sh
# The GPU machine has torch, triton and transformers but may lack the other dependencies: wheels placed in .whl/
# are installed into /tmp/site first. The engine decode tokens/s, eager against CUDA graphs, is not measured yet:
# CUDA-graph capture is not built.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: run one part, keep its log and its last JSON line
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name exit=$?" >>"$OUT/status.txt"
  tail -n 15 "$OUT/$name.log"
  grep '^{' "$OUT/$name.log" | tail -n 1 >"$OUT/$name.json"
}

step gpu_tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests
step paged_attention 90 python3 bench/paged_attention.py
step rollout 150 python3 bench/rollout.py --threads 16
step weight_sync 60 python3 bench/weight_sync.py --repeats 10

echo "== summary"
cat "$OUT/status.txt"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in sorted(out.glob("*.json")):
    text = path.read_text().strip()
    if text:
        figures = {k: v for k, v in json.loads(text).items() if isinstance(v, (int, float))}
        print(f"{path.stem:16} " + "  ".join(f"{k}={v:.4g}" for k, v in list(figures.items())[:8]))
PY
