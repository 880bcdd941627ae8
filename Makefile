# privzo: `make run` runs the main job, `make test` the test suite. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# bash: the test recipe reads the suite's exit status through a pipe (PIPESTATUS)
SHELL := /bin/bash
SPEC ?= specs/examples/digits_dpzero.yaml

.PHONY: install run test validate bench up down ui-check cluster-up cluster-down cluster-check clean

# torch is installed first and pinned: an unpinned torch pulls the newest CUDA build (several GB).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,text,datasets,vision]"
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/privzo run $(SPEC)

validate: install
	$(VENV)/bin/privzo validate $(SPEC)

# the suite in two parts at once: most of it on TEST_WORKERS processes (much of a test's time is waiting on a
# server, a subprocess or Ray's workers: on 2 cores, 3 processes finish in 30.5 min where 2 took 36; the two
# local-stack modules, one stack per checkout, form one xdist group that a worker runs in turn), and beside
# them the `serial` tests in a process of their own, one at a time: the Ray
# cluster's tests, which mostly wait on nodes starting and dying (their output follows the rest's; they
# tolerate a busy machine: a node is declared dead after 5 missed health checks). -r sfE: why each test
# skipped, then each failure and error in one line; those lines and both parts' counts are repeated last, so
# the end of a long log says what broke
TEST_WORKERS ?= 3
SERIAL_LOG ?= .serial-tests.log
MAIN_LOG ?= .main-tests.log
test: install
	status=0; \
	$(PY) -m pytest -v -r sfE -p no:cacheprovider -m serial >$(SERIAL_LOG) 2>&1 & serial=$$!; \
	$(PY) -m pytest -q -r sfE -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadgroup -m "not serial" 2>&1 | tee $(MAIN_LOG); \
	status=$${PIPESTATUS[0]}; \
	wait $$serial || status=$$?; \
	cat $(SERIAL_LOG); \
	echo "== summary"; grep -h -E '^(FAILED|ERROR) |(passed|failed|errors?|skipped|deselected) in [0-9.]+s' $(MAIN_LOG) $(SERIAL_LOG); \
	rm -f $(SERIAL_LOG) $(MAIN_LOG); \
	exit $$status

bench: install
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	PYTHONPATH=. $(PY) bench/step_cost.py
	PYTHONPATH=. $(PY) bench/ray_step.py

# local Prefect server + worker + deployments and an MLflow server, on 127.0.0.1
up: install
	bash infra/local-stack.sh up

down:
	bash infra/local-stack.sh down

# the MLflow and Prefect UIs after the main job and two nightly retrains, checked in headless Chromium
# (Debian's: apt-get install -y chromium); screenshots in docs/screenshots
ui-check: install
	$(PY) infra/ui_check.py --keep-going --screenshots docs/screenshots

# a Ray cluster of separate hosts on this machine: a head, 2 worker nodes and a driver host (network
# namespaces as root, else loopback addresses); `cluster-check` runs three example specs on one and stops it
CLUSTER_STATE ?= .ray-cluster
cluster-up: install
	$(PY) infra/ray/cluster.py up --state $(CLUSTER_STATE)

cluster-down:
	$(PY) infra/ray/cluster.py down --state $(CLUSTER_STATE)

cluster-check: install
	$(PY) infra/ray/cluster.py check --state $(CLUSTER_STATE)-check specs/examples/digits_dpzero.yaml \
	  specs/examples/digits_pazo_m.yaml specs/examples/chatterbot_minilm_dpzero.yaml

clean:
	rm -rf mlflow.db mlruns mlartifacts .pytest_cache
