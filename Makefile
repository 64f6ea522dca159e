# Two commands for a new machine:
#   make train   installs everything into .venv, then runs the default job
#   make test    installs everything into .venv, then runs the CPU test suite
PY := .venv/bin/python
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup train test lint
setup: .venv/.installed

.venv/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

train: setup
	$(PY) train.py $(ARGS)

test: setup
	$(PY) -m pytest $(ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
