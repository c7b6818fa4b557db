# Two commands for a new user: `make demo` and `make test` (the fast tier); `make test-all` runs
# everything, as CI does. Each creates .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOCK := requirements/dev.lock
LOCK_HASH := $(shell cat $(LOCK) | sha256sum | cut -c1-16)
DEPS_STAMP := $(VENV)/.deps-$(LOCK_HASH)
SRC_STAMP := $(VENV)/.src-$(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)
HTML_MANAGER := tests/browser/node_modules/@jupyter-widgets/html-manager/dist/embed.js

.PHONY: install test test-all test-fast lint demo browser-deps bench clean lock install-xla test-xla lock-xla corpus tpu-env
.PHONY: install-torch test-torch lock-torch
.PHONY: _test-fast-main _test-fast-torchax _test-all-main _test-all-torchax _test-all-older-torch

# Tests run with their bytecode cached: where the shell sets PYTHONDONTWRITEBYTECODE, every run
# (and every xdist worker) would compile the tests' assertion rewrites and gpu2tpu anew.
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist workers for the parallel runs ("auto": one per core).
JOBS ?= auto
PYTEST := $(BIN)/python -m pytest -q
# The slowest tests of each full run, printed at its end (where CI's time goes).
DURATIONS ?= --durations=12 --cpu-durations=15

$(DEPS_STAMP): $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r $(LOCK)
	@rm -f $(VENV)/.deps-*
	@touch $@

# The package itself is installed editable; re-done when the checkout moves (CI clones anew).
$(SRC_STAMP): $(DEPS_STAMP) pyproject.toml
	$(BIN)/python -m pip install -q --no-deps -e .
	@rm -f $(VENV)/.src-*
	@touch $@

install: $(SRC_STAMP)

# The PyTorch/XLA environment (requirements/xla-cpu.lock): real torch_xla on the CPU for the
# tests marked `xla` (tests/xla). torch_xla pins torch exactly, so it is a venv of its own.
XLA_VENV ?= .venv-xla
XLA_BIN := $(XLA_VENV)/bin
XLA_LOCK := requirements/xla-cpu.lock
XLA_STAMP := $(XLA_VENV)/.deps-$(shell cat $(XLA_LOCK) | sha256sum | cut -c1-16)
XLA_SRC_STAMP := $(XLA_VENV)/.src-$(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)

$(XLA_STAMP): $(XLA_LOCK)
	@test -x $(XLA_BIN)/python || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_BIN)/python -m pip install -q --upgrade pip
	$(XLA_BIN)/python -m pip install -q -r $(XLA_LOCK)
	@rm -f $(XLA_VENV)/.deps-*
	@touch $@

$(XLA_SRC_STAMP): $(XLA_STAMP) pyproject.toml
	$(XLA_BIN)/python -m pip install -q --no-deps -e .
	@rm -f $(XLA_VENV)/.src-*
	@touch $@

install-xla: $(XLA_SRC_STAMP)

# Only the `xla` tests run here (the main run deselects them with -m "not xla").
test-xla: install-xla
	PJRT_DEVICE=CPU $(XLA_BIN)/python -m pytest -q -m xla -n $(JOBS) --dist loadgroup $(DURATIONS) tests/xla

lock-xla:
	rm -rf /tmp/gpu2tpu-lock-xla && $(PYTHON) -m venv /tmp/gpu2tpu-lock-xla
	/tmp/gpu2tpu-lock-xla/bin/pip install -q -r requirements/xla-cpu.in
	/tmp/gpu2tpu-lock-xla/bin/pip freeze --exclude gpu2tpu > $(XLA_LOCK)

# The torch matrix: the codemod's output checks (the tests marked `torch_matrix`: every call a
# rewrite emits for the installed torch binds, the simulated accelerator, the PyPI corpus) on
# each torch minor the rules write for (docs/torch-versions.md): 2.6 and 2.12 in environments
# of their own (requirements/torch-<minor>.lock: torch and what those tests need), 2.9 in the
# XLA environment, the newest in .venv (the main run). CONTRIBUTING.md says what they cost.
MATRIX_TORCH := 2.6 2.12
TORCH_VENV ?= .venv-torch
torch_deps = $(TORCH_VENV)$(1)/.deps-$(shell cat requirements/torch-$(1).lock | sha256sum | cut -c1-16)
torch_src = $(TORCH_VENV)$(1)/.src-$(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)
TORCH_ENVS := $(foreach v,$(MATRIX_TORCH),$(call torch_src,$(v)))

# One pair of rules per environment, as for .venv: the deps stamp names its lock's hash, so a
# changed lock rebuilds the environment; the package is installed editable once per checkout.
define torch_env
$(call torch_deps,$(1)): requirements/torch-$(1).lock
	@rm -rf $(TORCH_VENV)$(1) && $(PYTHON) -m venv $(TORCH_VENV)$(1)
	$(TORCH_VENV)$(1)/bin/python -m pip install -q --upgrade pip
	$(TORCH_VENV)$(1)/bin/python -m pip install -q --no-compile -r requirements/torch-$(1).lock
	@touch $$@
$(call torch_src,$(1)): $(call torch_deps,$(1)) pyproject.toml
	$(TORCH_VENV)$(1)/bin/python -m pip install -q --no-deps -e .
	@rm -f $(TORCH_VENV)$(1)/.src-*
	@touch $$@
endef
$(foreach v,$(MATRIX_TORCH),$(eval $(call torch_env,$(v))))

install-torch: $(TORCH_ENVS)

# `-m torch_matrix` in each older torch's environment, one after another (the corpus's
# packages for each torch are installed once, by the corpus harness, into the corpus cache).
# ruff for the corpus's F821 check is .venv's; torch_xla is not loaded in .venv-xla's run
# (TORCH_DEVICE_BACKEND_AUTOLOAD=0): these tests are about torch 2.9's own API.
MATRIX_TESTS := tests/test_rule_fixtures.py tests/test_other_accelerators.py tests/test_corpus.py
test-torch: install install-torch install-xla
	@for py in $(foreach v,$(MATRIX_TORCH),$(TORCH_VENV)$(v)/bin/python) $(XLA_BIN)/python; do \
	  echo "torch matrix: torch $$($$py -c 'import importlib.metadata as m; print(m.version("torch"))')"; \
	  PATH="$(abspath $(BIN)):$$PATH" TORCH_DEVICE_BACKEND_AUTOLOAD=0 \
	    $$py -m pytest -q -m torch_matrix -p no:cacheprovider $(DURATIONS) $(MATRIX_TESTS) || exit 1; \
	done

lock-torch:
	for v in $(MATRIX_TORCH); do \
	  rm -rf /tmp/gpu2tpu-lock-torch && $(PYTHON) -m venv /tmp/gpu2tpu-lock-torch && \
	  /tmp/gpu2tpu-lock-torch/bin/pip install -q -r requirements/torch-$$v.in && \
	  /tmp/gpu2tpu-lock-torch/bin/pip freeze --exclude gpu2tpu > requirements/torch-$$v.lock || exit 1; \
	done

# The released TorchTPU for tests/test_torchtpu_contract.py (requirements/tpu.lock), in a
# folder only those tests' subprocesses see: an installed torch_tpu loads at `import torch`.
TPU_SITE ?= $(VENV)-tpu
export GPU2TPU_TPU_SITE := $(abspath $(TPU_SITE))

tpu-env: install
	$(BIN)/python tests/torchtpu_env.py $(TPU_SITE)

# Headless Chromium (Debian) and the widget HTML manager (npm) for the widget browser test.
browser-deps: $(HTML_MANAGER)
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: run 'sudo apt-get install chromium' for the widget browser test"; fi; }

$(HTML_MANAGER): tests/browser/package.json tests/browser/package-lock.json
	cd tests/browser && npm ci --silent --no-audit --no-fund
	@touch $@

# The real-world regression corpus (tests/test_corpus.py): pinned PyPI sdists and what they
# need to import, downloaded once into GPU2TPU_CORPUS_CACHE, outside the checkout.
GPU2TPU_CORPUS_CACHE ?= $(HOME)/.cache/gpu2tpu-corpus
export GPU2TPU_CORPUS_CACHE

corpus: install
	$(BIN)/python scripts/corpus.py fetch

# mypy: strict on the codemod and the models' pure cores, lenient elsewhere ([tool.mypy] in
# pyproject.toml); about 12 s from nothing here, a second with its cache.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The two tiers. Tests marked `torchax` import torchax's environment, which makes "jax" torch's
# accelerator for the rest of their process: they run in a pytest process of their own, beside
# the parallel (xdist) run of the others. `-O` prints each run's output whole when it ends.

# The fast tier: lint and every test not marked `slow`, in parallel (about 5 min here).
test: install lint
	@$(MAKE) --no-print-directory -j2 -O _test-fast-main _test-fast-torchax

_test-fast-main:
	$(PYTEST) -m "not slow and not torchax" -n $(JOBS) --dist loadgroup

_test-fast-torchax:
	$(PYTEST) -m "not slow and torchax"

# Everything: the fast tier, the slow tests (real environments built from the registries, the
# PyPI corpus, torch's sources, Jupyter kernels, the browser, TPU compiles), the TorchTPU
# contract and the XLA environment's tests, the three runs side by side.
test-all: install lint browser-deps tpu-env corpus install-xla install-torch
	@$(MAKE) --no-print-directory -j3 -O _test-all-main _test-all-torchax _test-all-older-torch

# The XLA run ends well before the other two: the torch matrix follows it in its lane.
_test-all-older-torch:
	@$(MAKE) --no-print-directory test-xla && $(MAKE) --no-print-directory test-torch

_test-all-main:
	$(PYTEST) -m "not torchax" -n $(JOBS) --dist loadgroup $(DURATIONS)

_test-all-torchax:
	$(PYTEST) -m torchax -n $(JOBS) --dist loadgroup $(DURATIONS)

# A developer's inner loop (CONTRIBUTING.md): the codemod's tests that need no subprocess.
test-fast: install
	$(PYTEST) -n $(JOBS) --dist loadgroup tests/test_rule_fixtures.py tests/test_analysis.py tests/test_verify.py tests/test_statement_level.py -m "not slow"

demo: install
	$(BIN)/python -m gpu2tpu.demo

bench: install
	$(BIN)/python benchmarks/rewrite_speed.py

# Re-resolve the development lock from requirements/dev.in (needs the registries).
lock:
	rm -rf /tmp/gpu2tpu-lock && $(PYTHON) -m venv /tmp/gpu2tpu-lock
	/tmp/gpu2tpu-lock/bin/pip install -q -r requirements/dev.in
	/tmp/gpu2tpu-lock/bin/pip freeze --exclude gpu2tpu > $(LOCK)

clean:
	rm -rf $(VENV) $(foreach v,$(MATRIX_TORCH),$(TORCH_VENV)$(v)) .pytest_cache .ruff_cache build *.egg-info
