# Goblin: `make demo`, `make test`, `make ui`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export GOBLIN_HOME ?= $(CURDIR)/.goblin
export DAGSTER_HOME ?= $(GOBLIN_HOME)/dagster
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-test system-deps compiler demo test ui stack clean lock check-lock

# The exact version of every installed package (pip constraints), used by every install step;
# `make lock` refreshes it, `make test` checks .venv against it (goblin_assets/lockcheck.py).
LOCK := requirements.lock
TORCH := torch==2.13.0
LOCK_VENV := $(GOBLIN_HOME)/lock-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)

# A C compiler builds the fused sketch kernels (goblin_assets/opscope/_sketch.c) at install;
# without one the install still succeeds and the sketches run on torch ops (slower).
compiler:
	@command -v cc >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq gcc libc6-dev >/dev/null; }

# The install steps into venv $(1), pip options $(2): `-c $(LOCK)`, or nothing for `make lock`.
# torch first, pinned to the CPU wheel: a plain `torch` requirement would pull a
# multi-GB CUDA build on a CPU machine.  An existing torch of the locked release is kept.
define install-steps
	$(1)/bin/pip install -qq $(2) --upgrade pip
	$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/pip install -qq $(2) "$(TORCH)"
	$(1)/bin/pip install -qq $(2) -e .
endef
# Holistic Trace Analysis checks that our GPU traces keep the profiler's schema
# (tests/test_gpu_trace.py); 0.5.0 is the last release under this name.
define install-test-steps
	$(1)/bin/pip install --quiet $(2) -e ".[test]"
	$(1)/bin/pip install --quiet $(2) --no-deps "HolisticTraceAnalysis==0.5.0"
endef

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py goblin_assets/opscope/_sketch.c $(LOCK) | compiler
	$(call install-steps,$(VENV),-c $(LOCK))
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(call install-test-steps,$(VENV),-c $(LOCK))
	touch $@

# Refresh the lock deliberately: a throwaway venv, the same steps without constraints.
lock: | compiler
	rm -rf $(LOCK_VENV)
	$(PY) -m venv $(LOCK_VENV)
	$(call install-steps,$(LOCK_VENV),)
	$(call install-test-steps,$(LOCK_VENV),)
	$(LOCK_VENV)/bin/python -m goblin_assets.lockcheck --write $(LOCK)
	rm -rf $(LOCK_VENV)

# Fails, naming each package, when .venv and the lock disagree.
check-lock: install-test
	$(BIN)/python -m goblin_assets.lockcheck --lock $(LOCK)

# The browser test drives Debian's Chromium (Playwright never downloads a browser here);
# the scaled-out stack (tests/test_scale_out.py, make stack) runs Debian's PostgreSQL and Redis.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }
	@{ ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1; } || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql redis-server >/dev/null; }

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

$(DAGSTER_HOME)/dagster.yaml:
	@mkdir -p $(DAGSTER_HOME)
	@printf 'telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n' > $@

# The demo keeps runs short: fewer profiled steps, short benchmark repeats and a 30 s benchmark budget per
# workload (each can be set as usual: GOBLIN_RUNNER_* in goblin_assets/settings.py). DEMO_ARGS=--verbose shows
# Dagster's event log.
demo: install $(DAGSTER_HOME)/dagster.yaml
	GOBLIN_RUNNER_PROFILED_STEPS=$${GOBLIN_RUNNER_PROFILED_STEPS:-5} \
	GOBLIN_RUNNER_BENCH_STEPS=$${GOBLIN_RUNNER_BENCH_STEPS:-10} \
	GOBLIN_RUNNER_BENCH_REPEATS=$${GOBLIN_RUNNER_BENCH_REPEATS:-2} \
	GOBLIN_RUNNER_BENCH_BUDGET_S=$${GOBLIN_RUNNER_BENCH_BUDGET_S:-30} \
	GOBLIN_RUNNER_SKETCH_STEPS=$${GOBLIN_RUNNER_SKETCH_STEPS:-1} \
	$(BIN)/python -m goblin_assets.demo $(DEMO_ARGS)

# The project's bytecode first: the suite starts hundreds of processes that import goblin_assets (Dagster
# steps, CLI runs, workers), and with PYTHONDONTWRITEBYTECODE set none of them would keep what it compiled.
# TEST_WORKERS pytest-xdist processes, each taking whole test files (`--dist loadfile`: a module's shared
# fixture, such as the MiniLM audit, runs once): alone the suite keeps about one core busy, since many tests
# wait on a browser, a server or a stall watch.  TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: check-lock system-deps
	$(BIN)/python -m compileall -q goblin_assets
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

# `dagster dev` in a process group of its own, behind a launcher that stops the whole group on one Ctrl-C
# or SIGTERM (goblin_assets/ui.py); `exec`: the launcher is the process make runs.
UI_HOST ?= 127.0.0.1
UI_PORT ?= 3000
ui: install $(DAGSTER_HOME)/dagster.yaml
	exec $(BIN)/python -m goblin_assets.ui --host $(UI_HOST) --port $(UI_PORT)

# The scaled-out stack on this machine (deploy/README.md): PostgreSQL, Redis and WORKERS Celery
# workers in a temporary directory on loopback; prints the variables to export; Ctrl-C stops it all.
WORKERS ?= 2
stack: install-test system-deps
	$(BIN)/python -m goblin_assets.stack --workers $(WORKERS)

clean:
	rm -rf $(VENV) .goblin
