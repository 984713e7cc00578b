# The README's commands. `make run` starts Cairn on its embedded defaults; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock
PORT ?= 8000

.PHONY: run cluster test unit integration e2e lint bench bench-capacity bench-recovery eval reembed capacity browser nginx clean install lock upgrade

# Exactly the locked set, every file checked against its hash, then Cairn itself with nothing
# resolved (README: "Installing and upgrading"). Redone only when the lock or pyproject changes.
$(STAMP): $(LOCK) pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# The lock from pyproject.toml (main dependencies and the dev extra), hashed. `make lock` after
# editing pyproject.toml keeps every other pin; `make upgrade` takes the newest releases allowed,
# installs them and runs the pin tests (the Chainlit digests, the lock against pyproject).
COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --all-build-deps \
	--extra dev --strip-extras --no-emit-index-url --no-emit-find-links --output-file $(LOCK)
lock: $(STAMP)
	$(COMPILE) pyproject.toml
	$(MAKE) install

upgrade: $(STAMP)
	$(COMPILE) --upgrade pyproject.toml
	$(MAKE) install
	$(BIN)/python -m pytest tests/unit/test_lock.py tests/unit/test_chainlit_patches.py -q

run: $(STAMP)
	$(BIN)/python -m app --host 127.0.0.1 --port $(PORT)

# N workers on one Postgres behind nginx on this machine (deploy/cluster.py); open
# http://localhost:$(CLUSTER_PORT). CAIRN_DATABASE_URL / CAIRN_AUTH_SECRET are used if set.
N ?= 2
CLUSTER_PORT ?= 8080
cluster: $(STAMP) nginx
	$(BIN)/python -m deploy.cluster --workers $(N) --port $(CLUSTER_PORT)

# Debian's nginx (the cluster and its end-to-end test run behind it).
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq nginx >/dev/null; }

# Debian's Chromium (browsers cannot be downloaded by Playwright here).
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy app.py auth graphs ui
	$(BIN)/lint-imports

test: $(STAMP) browser nginx lint
	$(BIN)/python -m pytest tests

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

e2e: $(STAMP) browser nginx
	$(BIN)/python -m pytest tests/e2e

# Prints figures (time to first token, CPU per turn and its parts, sessions per worker, recall latency,
# checkpoint growth, job throughput). bench-capacity alone takes ~5-10 minutes.
bench: $(STAMP)
	$(BIN)/python -m bench.ttft
	$(BIN)/python -m bench.turn_cpu
	$(BIN)/python -m bench.capacity
	$(BIN)/python -m bench.memory

bench-capacity: $(STAMP)
	$(BIN)/python -m bench.capacity

# Seconds from Postgres coming back (after 10 s and 40 s down) to the pool serving, the first
# chat reply and a memory job run, with no restart of the app (~3 minutes).
bench-recovery: $(STAMP)
	$(BIN)/python -m bench.recovery 10 40

# Memory quality (recall precision/recall, write accuracy, forgotten facts coming back: must be 0)
# and research quality (citation precision, claims removed, critique rounds, tool calls, time).
eval: $(STAMP)
	$(BIN)/python -m evals.memory
	$(BIN)/python -m evals.research

# Re-embed the store with another embedding model (README: "Changing the embedding model"), e.g.
#   make reembed ARGS="run --provider openai --model text-embedding-3-small --dims 1536"
#   make reembed ARGS=status | ARGS=retire | ARGS=abandon
# Ctrl-C stops it after the current batch; the same command resumes.
ARGS ?= status
reembed: $(STAMP)
	$(BIN)/python -m graphs.memory.reembed $(ARGS)

# The capacity and cost model on this deployment's Postgres (README: "Capacity and cost"): what
# was measured, budgets from percentiles, forecasts and the first resource to run out. Inputs as
# variables, e.g. `make capacity DAU=10000,1000000 RUNS_PER_USER=10 RPM=10000 TPM=2000000`
# (also PEAK_FACTOR, RETENTION_DAYS, DISK_GB, PG_WRITES_PER_S, SESSIONS_PER_WORKER; prices from
# CAIRN_MODEL_PRICES); `make capacity CAPACITY_ARGS="--pilot 40"` measures a scripted pilot in a
# throwaway Postgres instead; CAPACITY_ARGS=--help lists every flag.
capacity: $(STAMP)
	$(BIN)/python -m bench.cost_model $(CAPACITY_ARGS)

clean:
	rm -rf $(VENV) .data .files .pytest_cache .mypy_cache .ruff_cache
