# The README's two commands are `make run` (the main job) and `make test` (all tests).
# Both install what they need into $(VENV) first. To use an existing environment that already
# has your vendor's torch (XPU/HPU/NPU builds), run e.g. `make test PYTHON=python`: nothing
# reinstalls torch there.

VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
# The main environment's torch when none is importable: the CPU build at hand on the project's
# machines (about 30 s to install). The newest release (2.15.0) is not the default: PyPI has only its
# CUDA build (with its nvidia-* libraries about 4.5 GB to download and unpack into every fresh
# environment), and on a CUDA build torch refuses the emulated xpu/hpu of `make test` next to CUDA
# (docs/emulator.md): the newest release runs as the torch-newest end of test-compat, below.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-$(notdir $(PYTHON))
# The dev/CI tools and the package's dependencies, pinned with hashes (`make lock` regenerates it).
LOCK := requirements/dev.lock

.PHONY: install run check lint test-quick test test-suite test-emulated typecheck test-snippets emulator bench docs lab clean lock test-compat records records-parity notebook-times vendor-suites

$(VENV)/bin/python:
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml $(LOCK) | $(VENV)/bin/python
	@# torch stays outside the lock: never replace one that is already importable (vendor builds)
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	@# Everything else exactly as locked, every file's hash checked, installed by uv (the locked one,
	@# installed first by pip: about half the time pip takes for the whole lock; --compile-bytecode as pip
	@# does, so that no test process compiles them). --no-deps: the lock is
	@# complete without torch, so nothing resolves (or can ever swap) torch. DeepSpeed is in the lock
	@# and builds without ops (they compile at first use).
	@mkdir -p $(dir $@)
	awk '/^uv==/ {p = 1; print; next} p && /^[^ ]/ {p = 0} p' $(LOCK) > $(dir $@).uv-requirement.txt
	$(PYTHON) -m pip install -q --require-hashes --no-deps -r $(dir $@).uv-requirement.txt
	DS_BUILD_OPS=0 $(PYTHON) -m uv pip install -q --compile-bytecode --python $(PYTHON) --require-hashes --no-deps -r $(LOCK)
	@# the package itself, built by the locked setuptools
	$(PYTHON) -m uv pip install -q --python $(PYTHON) --no-deps --no-build-isolation -e .
	@# the project's environment is consistent, or the install fails; a vendor environment (PYTHON=python)
	@# may carry unrelated conflicts: reported, not failed on
	$(PYTHON) -m pip check || { [ "$(PYTHON)" != "$(VENV)/bin/python" ] \
		&& echo "warning: pip check found conflicts (above) in $(PYTHON)'s environment, left as they are"; }
	@mkdir -p $(dir $@) && touch $@

install: $(STAMP)

run: install
	$(PYTHON) -m lightning_anyaccel.verify
	$(PYTHON) examples/train.py --devices 2 --max-epochs 3
	$(MAKE) --no-print-directory docs

# The emulated accelerator (src/lightning_anyaccel/kit/emulator): compiled once per torch version and source
# into _build/emulator/ (the cache the tests and every process they start use), so a second `make test`
# compiles nothing.
export LIGHTNING_ANYACCEL_EMULATOR_CACHE ?= $(CURDIR)/_build/emulator
emulator: install
	MAX_JOBS=2 $(PYTHON) -m lightning_anyaccel.kit.emulator.build

# pytest's testpaths: tests/, then the code blocks of README.md and docs/ (conftest.py). The
# notebooks run in JupyterLab there (tests/test_lab.py, needs Chromium); without Chromium, nbmake
# runs them instead. Then the device-generic tests again, on the emulated accelerator loaded as
# `acme`, a name in no table and no code of the package: zero configuration (docs/emulator.md).
# TEST_WORKERS pytest-xdist workers share the tests of the first run: most of them wait on child
# processes, so 3 keep 2 cores busy (conftest.py sends the tests that must share a worker to one
# worker); the device-generic runs keep the cores busy with DEVICE_TEST_WORKERS, where a third
# worker would only add its start-up. `make test TEST_WORKERS=0 DEVICE_TEST_WORKERS=0` runs
# everything in one process (an emulated xpu/hpu pass starts its pytest again once, the device loaded at start).
TEST_WORKERS ?= 3
DEVICE_TEST_WORKERS ?= 2
# Which test runs on which device level, and why, is data: the passes of tests/device_passes.toml, each
# run as `pytest --device-pass=NAME` (its device, marker, files, workloads and what it leaves out; the
# seeds' own device types xpu and hpu are emulated on torch's XPU/HPU dispatch keys by the same build,
# docs/emulator.md). `pytest --device-pass=xpu --collect-only -q` lists a pass. Each code path runs once:
# what would run it a second time is a repeat, left out unless ANYACCEL_RUN_REPEATS=1
# (`ANYACCEL_RUN_REPEATS=1 make test`; docs/contributing.md, "Repeats").

# Each run writes its validation record (lightning_anyaccel/kit/tools/records.py) into RECORDS as <type>-<level>.toml:
# `make test` into _build/records (CI's evidence, not committed); `make records` into docs/records, the
# records the support matrix shows (commit them; docs/contributing.md, "Validation records").
# The options take their value after `=`: written apart, an existing PATH reads as a test path to pytest,
# which then never loads tests/conftest.py, where the options are registered ("unrecognized arguments").
RECORDS ?= _build/records
# tests/lean_imports on PYTHONPATH from the start: pytest's own process, not only the processes it
# starts (tests/conftest.py), skips the imports no test needs (tests/lean_imports/lean_imports.py).
LEAN_IMPORTS := PYTHONPATH=$(CURDIR)/tests/lean_imports$${PYTHONPATH:+:$$PYTHONPATH}
PYTEST := $(LEAN_IMPORTS) $(PYTHON) -m pytest
# Every pytest run of make (test, test-compat) fails on a skip this file does not list with its reason
# (tests/skip_check.py, docs/contributing.md); `make test ANYACCEL_EXPECTED_SKIPS=` turns the check off.
export ANYACCEL_EXPECTED_SKIPS ?= $(CURDIR)/tests/expected_skips.toml
# The quick tier, for every edit: lint (ruff, configured in pyproject.toml), types (mypy) and the fast unit
# tests (pass `quick` of tests/device_passes.toml: in the test process, seconds each), side by side.
RUFF ?= $(PYTHON) -m ruff
check: install
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck test-quick

lint: install
	$(RUFF) check src tests conftest.py notebooks

test-quick: install
	$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q --device-pass=quick

# The main run mostly waits on child processes, launchers and a browser; the emulated runs mostly
# compute. So they run side by side (test-suite and test-emulated, each its output in one piece when
# it ends), mypy beside them; `make test-suite` or `make test-emulated` runs one half.
test: install
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-emulated test-suite typecheck

test-suite: emulator litgpt-env
	$(PYTEST) -n $(TEST_WORKERS) --device-pass=cpu --validation-record=$(RECORDS)/cpu-hardware.toml --simulated-records=$(RECORDS)
	@[ -x /usr/bin/chromium ] || $(PYTHON) -m pytest --nbmake notebooks/ --timeout 600

test-emulated: emulator
	$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q --device-pass=acme --validation-record=$(RECORDS)/acme-emulated.toml
	$(PYTEST) -p no:xdist -q --device-pass=acme-one-device
	$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q --device-pass=xpu --validation-record=$(RECORDS)/xpu-emulated.toml
	$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q --device-pass=hpu --validation-record=$(RECORDS)/hpu-emulated.toml

# The committed records (docs/records), each written by its run: CPU (the device-generic tests and every
# test credited with a feature), the emulated xpu and hpu as `make test` runs them, and npu, sdaa, mlu and
# musa, which CI does not run (its time budget): the device-generic tests under their own names, without
# what `make test` runs on the emulated device under one name only (DDP's spawn/fork start methods,
# notebook 2, the workloads). A failing test does not stop the others: its record says it failed.
# `simulated`: the records of the device types tests/test_simulated.py fakes (xpu, hpu, cuda, mps).
# DEVICE_RECORDS picks some: `make records DEVICE_RECORDS="sdaa mlu"`.
DEVICE_RECORDS ?= cpu xpu hpu npu sdaa mlu musa simulated
# Passes record-cpu, record-xpu and record-hpu of tests/device_passes.toml, record-seed for the others.
RECORD_PASS = $(if $(filter cpu xpu hpu,$*),--device-pass=record-$*,--device-pass=record-seed --device emulated:$*)
records: $(addprefix record-,$(DEVICE_RECORDS))
record-simulated: install
	-$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q tests/test_simulated.py --simulated-records=docs/records
record-%: emulator litgpt-env
	-$(PYTEST) -n $(DEVICE_TEST_WORKERS) -q \
		$(RECORD_PASS) \
		--validation-record=docs/records/$*-$(if $(filter cpu,$*),hardware,emulated).toml

# Parity alone (tests/test_parity.py: one 2-process launch per device name, a few minutes each, instead of
# the whole suite): what it measured replaces the [parity] section of each committed record, with the
# provenance of this run; the rest of the record stays as its run wrote it (docs/evidence.md).
# PARITY_RECORDS picks some: `make records-parity PARITY_RECORDS="npu musa"`. As for `make records`, a failing
# run does not stop the others: its section lists the parity tests that failed.
PARITY_RECORDS ?= cpu xpu hpu npu sdaa mlu musa
records-parity: $(addprefix record-parity-,$(PARITY_RECORDS))
record-parity-%: emulator
	-$(PYTEST) -p no:xdist -q -m device_generic tests/test_parity.py --device $(if $(filter cpu,$*),cpu,emulated:$*) \
		--parity-record=docs/records/$*-$(if $(filter cpu,$*),hardware,emulated).toml

# The vendor plugins' own test files against the package, on the emulated hpu and sdaa, through the migration
# shim (scripts/vendor_suites): not part of `make test`. HABANA and TECO are git checkouts of lightning-habana and
# lightning-teco at the commits docs/evidence.md names (nothing is fetched); the run writes
# docs/records/vendor/suites.toml, which docs/evidence.md shows. ONLY=<part of a path> runs some files.
vendor-suites: emulator
	@[ -n "$(HABANA)" ] && [ -n "$(TECO)" ] || { echo "usage: make vendor-suites HABANA=<lightning-habana checkout> TECO=<lightning-teco checkout>"; exit 2; }
	$(PYTHON) scripts/vendor_suites/run.py --habana "$(HABANA)" --teco "$(TECO)" $(if $(ONLY),--only "$(ONLY)")

# mypy on src/ (configured in pyproject.toml: `@override` on every overriding method is checked). Its
# cache (.mypy_cache/) makes a second run take seconds; the first analyses torch and Lightning too.
typecheck: install
	$(PYTHON) -m mypy

# Only the code blocks of README.md and docs/*.md, and the examples the docs show from files.
test-snippets: install
	$(PYTHON) -m pytest README.md docs tests/test_snippets.py

# The documentation site, every warning an error (-W). The notebooks are executed, or taken from
# the run of `make test` when it executed them from the same sources (docs/publishing.md).
docs: install
	$(PYTHON) -m sphinx -W --keep-going -E -b html . _build/html
	@echo "site: _build/html/index.html"

# The run time each notebook's header shows (lightning_anyaccel.kit.tutorial.session): every notebook alone,
# one after the other, with nbmake; its last cell writes the time it measured into RUN_TIMES (commit it).
RUN_TIMES := src/lightning_anyaccel/kit/tutorial/run_times.json
notebook-times: install
	for notebook in notebooks/*.ipynb; do \
		LIGHTNING_ANYACCEL_RECORD_RUN_TIMES=$(CURDIR)/$(RUN_TIMES) $(PYTHON) -m pytest -p no:xdist -p no:cacheprovider \
			-q --nbmake --timeout 600 $$notebook || exit 1; \
	done
	@cat $(RUN_TIMES)

# JupyterLab on the notebooks, with this environment registered as the kernel "lightning-anyaccel".
KERNEL ?= lightning-anyaccel
lab: install
	$(PYTHON) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python ($(KERNEL))"
	$(PYTHON) -m jupyter lab --notebook-dir=notebooks --MappingKernelManager.default_kernel_name=$(KERNEL) \
		$(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf $(VENV) _build lightning_logs .pytest_cache .mypy_cache notebooks/runs $(COMPAT_DIR)

# Benchmarks (benchmarks/, docs/benchmarks.md): `make bench` (9 min on 2 otherwise idle cores, 22 min
# when shared at load 9-16), `make bench BENCH_ARGS=--quick`;
# BENCH_ARGS="--device emulated:npu" runs them on the emulated device (lightning_anyaccel.kit.emulator).
BENCH_ARGS ?=
bench: install
	$(PYTHON) -c "import matplotlib, jinja2, scipy, tabulate" 2>/dev/null || $(PYTHON) -m pip install -e ".[bench]"
	$(PYTHON) -m benchmarks $(BENCH_ARGS)

# Regenerate the locks from pyproject.toml and requirements/*.in (hashes of every file; torch
# overridden out, see requirements/no-torch.txt). `make lock LOCK_ARGS=--upgrade` moves to newer
# releases; without it, versions already in the lock are kept.
LOCK_ARGS ?=
UV_COMPILE = $(PYTHON) -m uv pip compile -q --generate-hashes --universal --python-version 3.10 \
	--overrides requirements/no-torch.txt --custom-compile-command "make lock" $(LOCK_ARGS)
UV_TORCH_COMPILE = $(PYTHON) -m uv pip compile -q --generate-hashes --universal -c $(LOCK) \
	--custom-compile-command "make lock" $(LOCK_ARGS)
lock: install
	$(UV_COMPILE) pyproject.toml requirements/dev.in --extra test --extra docs --extra bench --extra deepspeed --extra workloads -o $(LOCK)
	$(UV_COMPILE) requirements/compat-oldest.in -o requirements/compat-oldest.lock
	$(UV_COMPILE) pyproject.toml requirements/litgpt.in -o $(LITGPT_LOCK)
	$(PYTHON) requirements/drop_unreachable.py $(LOCK) requirements/compat-oldest.lock $(LITGPT_LOCK)
	@# the torch ends: that torch and what it needs, the packages shared with $(LOCK) at its versions
	@# (torch >= 2.15 needs Python >= 3.11)
	$(UV_TORCH_COMPILE) --python-version 3.10 requirements/torch-oldest.in -o requirements/torch-oldest.lock
	$(UV_TORCH_COMPILE) --python-version 3.11 requirements/torch-newest.in -o requirements/torch-newest.lock

# The ends of the supported ranges, each in its own environment:
# - Lightning: `newest` is this environment ($(LOCK)); `oldest` is a cached venv in $(COMPAT_DIR) built
#   from requirements/compat-oldest.lock and the same torch. Both run $(COMPAT_TESTS): the contract
#   tests and a short real fit (both front ends).
# - torch: `torch-oldest` (the floor the package claims: pyproject.toml, _compat.py) and `torch-newest`
#   (the newest release), each a cached venv in $(COMPAT_DIR) built from requirements/torch-<end>.lock
#   (that torch as the index has it: the CUDA build, which runs on CPU but imports only with its
#   nvidia-* libraries; uv keeps them in $(UV_CACHE_DIR)) and $(LOCK). They run $(COMPAT_TESTS) and
#   $(COMPAT_TORCH_TESTS) on CPU, then (the ends in $(COMPAT_EMULATED_ENDS)) the device-generic tests
#   on the emulated accelerator compiled for that torch.
# `make test` already runs these files on the main environment. CI (.ci/run) runs the end `oldest`
# beside it; the torch ends, a CUDA build of 6.5 GB each, run outside CI's time budget.
COMPAT_DIR ?= .compat
COMPAT_ENDS ?= newest oldest torch-oldest torch-newest
COMPAT_TESTS ?= $(wildcard tests/test_lightning_contract.py) tests/test_compat_fit.py
COMPAT_TORCH_TESTS ?= tests/test_compat_torch.py
COMPAT_EMULATED ?= emulated:npu
# The torch ends that also run the device-generic tests on the emulated accelerator (compiled for that
# torch first, into _build/emulator/torch-<version>-...); `COMPAT_EMULATED_ENDS=` runs none.
COMPAT_EMULATED_ENDS ?= torch-oldest torch-newest
# On the torch ends, the device-generic tests of pass `compat` (tests/device_passes.toml): each DDP start
# method and the two-process checkpoint with one front end, and not notebook 2, the workloads, verify or
# the validation kit, which differ by Lightning's code, transformers' or ours, not torch's (`make test`
# runs them all on the main environment's torch).
COMPAT_OLDEST := $(COMPAT_DIR)/oldest
COMPAT_PYTHON_oldest = $(COMPAT_OLDEST)/bin/python
COMPAT_PYTHON_torch-oldest = $(COMPAT_DIR)/torch-oldest/bin/python
COMPAT_PYTHON_torch-newest = $(COMPAT_DIR)/torch-newest/bin/python
export UV_CACHE_DIR ?= $(abspath $(COMPAT_DIR))/uv-cache

# --compile-bytecode: like pip, so that no process pays for compiling torch and Lightning (not even
# where PYTHONDONTWRITEBYTECODE is set); the DDP test starts two of them.
$(COMPAT_OLDEST)/.installed: requirements/compat-oldest.lock | install
	rm -rf $(COMPAT_OLDEST) && mkdir -p $(COMPAT_DIR)/wheels
	$(PYTHON) -m pip download -q --no-deps "$(TORCH_SPEC)" -d $(COMPAT_DIR)/wheels
	$(PYTHON) -m uv venv -q --python $(PYTHON) $(COMPAT_OLDEST)
	$(PYTHON) -m uv pip install -q --compile-bytecode --python $(COMPAT_PYTHON_oldest) $$(ls $(COMPAT_DIR)/wheels/torch-*.whl | tail -n1)
	$(PYTHON) -m uv pip install -q --compile-bytecode --python $(COMPAT_PYTHON_oldest) --require-hashes --no-deps -r requirements/compat-oldest.lock
	@touch $@

# A torch end: the lock of that torch and $(LOCK), every hash checked, nothing resolved; then the
# package (editable, so the tests import this checkout). Triton is left out (requirements/torch-ends-excludes.txt says why).
$(COMPAT_DIR)/torch-%/.installed: requirements/torch-%.lock $(LOCK) requirements/torch-ends-excludes.txt pyproject.toml | install
	rm -rf $(COMPAT_DIR)/torch-$*
	$(PYTHON) -m uv venv -q --python $(PYTHON) $(COMPAT_DIR)/torch-$*
	DS_BUILD_OPS=0 $(PYTHON) -m uv pip install -q --compile-bytecode --python $(COMPAT_PYTHON_torch-$*) \
		--require-hashes --no-deps -r $(LOCK) -r requirements/torch-$*.lock --excludes requirements/torch-ends-excludes.txt
	$(PYTHON) -m uv pip install -q --python $(COMPAT_PYTHON_torch-$*) --no-deps --no-build-isolation -e .
	@touch $@

# LitGPT's own command line (tests/test_programs.py) runs in an environment of its own: LitGPT caps
# huggingface-hub below 1.4, the transformers of $(LOCK) needs a newer one (requirements/litgpt.in).
# Built like the oldest end: $(TORCH_SPEC) (the main environment's torch where make installed it; the test
# trains on the emulated device, which needs a CPU build), $(LITGPT_LOCK) with every hash checked, then the
# package (editable, with its start-up hook); it must be consistent (uv pip check).
LITGPT_LOCK := requirements/litgpt.lock
LITGPT_ENV := $(COMPAT_DIR)/litgpt
export ANYACCEL_LITGPT_PYTHON ?= $(abspath $(LITGPT_ENV))/bin/python
$(LITGPT_ENV)/.installed: $(LITGPT_LOCK) pyproject.toml | install
	rm -rf $(LITGPT_ENV) && mkdir -p $(COMPAT_DIR)/litgpt-wheels
	$(PYTHON) -m pip download -q --no-deps "$(TORCH_SPEC)" -d $(COMPAT_DIR)/litgpt-wheels
	$(PYTHON) -m uv venv -q --python $(PYTHON) $(LITGPT_ENV)
	$(PYTHON) -m uv pip install -q --compile-bytecode --python $(LITGPT_ENV)/bin/python $$(ls $(COMPAT_DIR)/litgpt-wheels/torch-*.whl | tail -n1)
	$(PYTHON) -m uv pip install -q --compile-bytecode --python $(LITGPT_ENV)/bin/python --require-hashes --no-deps -r $(LITGPT_LOCK)
	$(PYTHON) -m uv pip install -q --python $(LITGPT_ENV)/bin/python --no-deps --no-build-isolation -e .
	$(PYTHON) -m uv pip check --python $(LITGPT_ENV)/bin/python
	@touch $@
litgpt-env: $(LITGPT_ENV)/.installed
.PHONY: litgpt-env

compat-env-newest: install
compat-env-oldest: $(COMPAT_OLDEST)/.installed
compat-env-torch-oldest: $(COMPAT_DIR)/torch-oldest/.installed
compat-env-torch-newest: $(COMPAT_DIR)/torch-newest/.installed
.PHONY: compat-env-newest compat-env-oldest compat-env-torch-oldest compat-env-torch-newest

test-compat: $(addprefix compat-env-,$(COMPAT_ENDS))
	@set -e; for end in $(COMPAT_ENDS); do \
	  case $$end in \
	    oldest) py=$(COMPAT_PYTHON_oldest);; torch-oldest) py=$(COMPAT_PYTHON_torch-oldest);; \
	    torch-newest) py=$(COMPAT_PYTHON_torch-newest);; *) py=$(PYTHON);; \
	  esac; \
	  echo "== $$end end: $$($$py -c 'import lightning, pytorch_lightning, torch; print("lightning", lightning.__version__, "pytorch_lightning", pytorch_lightning.__version__, "torch", torch.__version__)')"; \
	  case $$end in \
	    torch-*) $(LEAN_IMPORTS) $$py -m pytest -q -p no:cacheprovider -p no:xdist $(COMPAT_TESTS) $(COMPAT_TORCH_TESTS) \
	               --validation-record=$(RECORDS)/$$end/cpu-hardware.toml; \
	             case " $(COMPAT_EMULATED_ENDS) " in *" $$end "*) \
	               MAX_JOBS=2 $$py -m lightning_anyaccel.kit.emulator.build; \
	               $(LEAN_IMPORTS) $$py -m pytest -q -p no:cacheprovider -n $(DEVICE_TEST_WORKERS) --device-pass=compat --device $(COMPAT_EMULATED) \
	                 tests --validation-record=$(RECORDS)/$$end/$(word 2,$(subst :, ,$(COMPAT_EMULATED)))-emulated.toml;; \
	             esac;; \
	    *) $(LEAN_IMPORTS) $$py -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) --validation-record=$(RECORDS)/$$end/cpu-hardware.toml;; \
	  esac; \
	done
