# Two commands for a new user: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOCK := requirements/dev.lock
LOCK_HASH := $(shell cat $(LOCK) | sha256sum | cut -c1-16)
DEPS_STAMP := $(VENV)/.deps-$(LOCK_HASH)
SRC_STAMP := $(VENV)/.src-$(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)
HTML_MANAGER := tests/browser/node_modules/@jupyter-widgets/html-manager/dist/embed.js

.PHONY: install test lint demo browser-deps bench clean lock install-xla test-xla lock-xla corpus tpu-env

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
	PJRT_DEVICE=CPU $(XLA_BIN)/python -m pytest -q -m xla tests/xla

lock-xla:
	rm -rf /tmp/gpu2tpu-lock-xla && $(PYTHON) -m venv /tmp/gpu2tpu-lock-xla
	/tmp/gpu2tpu-lock-xla/bin/pip install -q -r requirements/xla-cpu.in
	/tmp/gpu2tpu-lock-xla/bin/pip freeze --exclude gpu2tpu > $(XLA_LOCK)

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

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install browser-deps lint test-xla tpu-env corpus
	$(BIN)/python -m pytest -q

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
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
