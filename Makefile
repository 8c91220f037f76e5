# The README's two commands are `make run` (the main job) and `make test` (all tests).
# Both install what they need into $(VENV) first. To use an existing environment that already
# has your vendor's torch (XPU/HPU/NPU builds), run e.g. `make test PYTHON=python`: nothing
# reinstalls torch there.

VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
DEEPSPEED_SPEC ?= deepspeed==0.19.8
STAMP := $(VENV)/.installed-$(notdir $(PYTHON))

.PHONY: install run test test-snippets bench docs lab clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	@# never replace a torch that is already importable (vendor builds)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	$(PYTHON) -m pip install -e ".[test,docs]"
	@# DeepSpeed for the sharding tests, built without ops (they compile at first use): its
	@# requirements other than torch first, then DeepSpeed itself with `--no-deps`, so pip can
	@# never swap the torch build.
	$(PYTHON) -m pip install hjson msgpack ninja py-cpuinfo "pydantic>=2" einops tqdm packaging numpy psutil
	DS_BUILD_OPS=0 $(PYTHON) -m pip install --no-deps "$(DEEPSPEED_SPEC)"
	@mkdir -p $(dir $@) && touch $@

install: $(STAMP)

run: install
	$(PYTHON) -m lightning_anyaccel.verify
	$(PYTHON) examples/train.py --devices 2 --max-epochs 3
	$(MAKE) --no-print-directory docs

# pytest's testpaths: tests/, then the code blocks of README.md and docs/ (conftest.py). The
# notebooks run in JupyterLab there (tests/test_lab.py, needs Chromium); without Chromium, nbmake
# runs them instead.
test: install
	$(PYTHON) -m pytest
	@[ -x /usr/bin/chromium ] || $(PYTHON) -m pytest --nbmake notebooks/ --timeout 600

# Only the code blocks of README.md and docs/*.md, and the examples the docs show from files.
test-snippets: install
	$(PYTHON) -m pytest README.md docs tests/test_snippets.py

# The documentation site, every warning an error (-W). The notebooks are executed, or taken from
# the run of `make test` when it executed them from the same sources (docs/publishing.md).
docs: install
	$(PYTHON) -m sphinx -W --keep-going -E -b html . _build/html
	@echo "site: _build/html/index.html"

# JupyterLab on the notebooks, with this environment registered as the kernel "lightning-anyaccel".
KERNEL ?= lightning-anyaccel
lab: install
	$(PYTHON) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python ($(KERNEL))"
	$(PYTHON) -m jupyter lab --notebook-dir=notebooks --MappingKernelManager.default_kernel_name=$(KERNEL) \
		$(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf $(VENV) _build lightning_logs .pytest_cache notebooks/runs

# Benchmarks (benchmarks/, docs/benchmarks.md): `make bench` (~10 min on 2 cores), `make bench BENCH_ARGS=--quick`.
BENCH_ARGS ?=
bench: install
	$(PYTHON) -c "import matplotlib" 2>/dev/null || $(PYTHON) -m pip install -e ".[bench]"
	$(PYTHON) -m benchmarks $(BENCH_ARGS)
