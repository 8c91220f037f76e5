# The README's two commands are `make run` (the main job) and `make test` (all tests).
# Both install what they need into $(VENV) first. To use an existing environment that already
# has your vendor's torch (XPU/HPU/NPU builds), run e.g. `make test PYTHON=python`: nothing
# reinstalls torch there.

VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-$(notdir $(PYTHON))

.PHONY: install run test bench lab clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	@# never replace a torch that is already importable (vendor builds)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	$(PYTHON) -m pip install -e ".[test]"
	@mkdir -p $(dir $@) && touch $@

install: $(STAMP)

run: install
	$(PYTHON) -m lightning_anyaccel.verify
	$(PYTHON) examples/train.py --devices 2 --max-epochs 3

test: install
	$(PYTHON) -m pytest

clean:
	rm -rf $(VENV) _build lightning_logs .pytest_cache

# Benchmarks (benchmarks/, docs/benchmarks.md): `make bench` (~10 min on 2 cores), `make bench BENCH_ARGS=--quick`.
BENCH_ARGS ?=
bench: install
	$(PYTHON) -c "import matplotlib" 2>/dev/null || $(PYTHON) -m pip install -e ".[bench]"
	$(PYTHON) -m benchmarks $(BENCH_ARGS)
