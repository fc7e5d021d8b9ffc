# roq — the two commands a newcomer runs are `make run` and `make test`; both install what is
# missing first (system packages through apt, then a venv with the Python packages).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ROQ := $(VENV)/bin/roq
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get
# System packages: ZooKeeper (pulls Java) for the cluster and the tests; packer and systemd for the
# appliance's checks (`packer validate`, `systemd-analyze verify`); iproute2 (`ip`, `tc`) for the
# fault tests' machines in network namespaces (tests/faults); curl for the README's HTTP tour, which
# tests/integration/test_http.py runs as written; gcc and Python's headers for mypyc (`make native`).
SYSTEM_PACKAGES := zookeeper packer systemd python3-venv iproute2 curl gcc python3-dev
PYTEST_ARGS ?=
# Every Python package, pinned with its hashes (`make lock` writes it from pyproject.toml's ranges,
# for every platform and Python >= 3.11); `make setup` installs exactly these; `make lint` audits.
LOCK := requirements.lock

.PHONY: setup system-deps native run test test-unit test-appliance lint type dist bench clean lock

setup: system-deps $(STAMP) native

# The batch format's hot loops compiled by mypyc (roq.log._native, issue 35): rebuilt when its
# source changed, else a check of two timestamps. roq runs without it (pure Python, slower).
native: $(STAMP)
	$(PY) packaging/build_native.py

system-deps:
	@missing=""; \
	[ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null || missing="$$missing zookeeper"; \
	command -v packer >/dev/null || missing="$$missing packer"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v ip >/dev/null && command -v tc >/dev/null || missing="$$missing iproute2"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	$(PYTHON) -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null || missing="$$missing python3-dev"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing system packages:$$missing"; \
	  $(APT) update -q && $(APT) install -y -q --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

# After a change of pyproject.toml's dependencies; a pin moves only when its range or the lock
# asks it to (`--upgrade-package NAME` to move one on purpose).
lock:
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --extra analytics --generate-hashes \
	  --universal --python-version 3.11 --no-header -o $(LOCK)

run: setup
	$(ROQ) up

# The lint gates (ruff, format, mypy, layers) run first: a change that breaks one fails `make test`.
# loadgroup: the fault tests (xdist_group "faults") run one after another on one worker, each
# building a cluster of its own across namespaces; every other test is spread as before. The
# Spark jobs run last, alone: a JVM with local[2] beside the other worker's tests took both
# cores (its spark-submit timed out at 200 s, and `roq up` resumed in 17-19 s against 6 s
# alone). Exit 5 (nothing collected: PYTEST_ARGS chose no Spark test) is no failure. The 30
# slowest tests are listed at the end: where CI's time goes.
# ROQ_NATIVE_REQUIRED: the batch-format tests run on the compiled loops and on pure Python
# (tests/unit/conftest.py `batch_code`); here the compiled side fails, not skips, if it is absent.
test: setup lint
	ROQ_NATIVE_REQUIRED=1 $(VENV)/bin/pytest -n 2 --dist loadgroup -m "not spark" --durations=30 $(PYTEST_ARGS)
	$(VENV)/bin/pytest -m spark $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-unit: setup
	ROQ_NATIVE_REQUIRED=1 $(VENV)/bin/pytest -n 2 tests/unit $(PYTEST_ARGS)

# The frozen executable, units and image (builds dist/roq first if the sources changed).
test-appliance: setup
	$(VENV)/bin/pytest -n 2 tests/appliance $(PYTEST_ARGS)

# The audit fails on a known vulnerability of a locked package, and says it skipped (exit 0) when
# its database cannot be reached: CI may have no network to it.
lint: setup
	$(VENV)/bin/ruff check appliance tests benchmarks
	$(VENV)/bin/ruff format --check appliance tests benchmarks
	$(VENV)/bin/mypy
	$(PY) tests/check_layers.py
	$(PY) tests/audit_dependencies.py $(LOCK)

type: setup
	$(VENV)/bin/mypy

dist: setup
	$(VENV)/bin/pyinstaller --noconfirm --clean --distpath dist --workpath build packaging/roq.spec

bench: setup
	$(ROQ) bench

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
	$(PYTHON) packaging/build_native.py --clean
