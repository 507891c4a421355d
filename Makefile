# gpufleet.serving: set up, test, lint. Run `make help`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
COLLECTION_LINK := collections/ansible_collections/gpufleet/serving
MODULES := systemd_stop_hard gpu_holders_kill gpu_memory_assert engine_ready engine_drain host_lease engine_preflight weights_prewarm display_text engine_cutover haproxy_join engine_version engine_observe engine_files model_stage report_files job_wait node_teardown

.PHONY: mutants chaos chaos-short chaos-down bench-park help setup os-setup demo demo-real demo-modules bench bench-fleet stress test test-all molecule-gate checks lab-image lint sanity unit docs molecule lab-up lab-down clean

help:
	@echo "make setup   Debian packages of requirements-os.txt (as root), $(VENV) with requirements-dev.txt, the collection linked in place"
	@echo "make demo    3 simulated GPU nodes serving vLLM, switched to SGLang by playbooks/switch_engine.yml (again: no change)"
	@echo "make demo-modules  the three modules against 8 simulated GPUs of this machine, no lab"
	@echo "make demo-real  a lab node switched between a real vLLM (PyPI's CPU build, about 900 MB fetched once) and the SGLang double"
	@echo "make test    pytest beside lint + docs + sanity, then the gate's Molecule scenarios (what CI runs: 16 min to 70 min on 2 cores, machine by machine)"
	@echo "make test-all  make test, then the scenarios too long for the gate (DRILL_SCENARIOS: real_vllm, vLLM's real CPU build)"
	@echo "make lint    ruff and ansible-lint (production profile)"
	@echo "make sanity  ansible-test sanity on a copy of the tracked tree, no ignore files"
	@echo "make docs    render every module's documentation with ansible-doc"
	@echo "make unit    pytest only"
	@echo "make mutants [FILES=...]  mutation testing of the kill path, sandboxed, into tests/mutation/ledger.json (not CI)"
	@echo "make stress [ROUNDS=10 LOAD=75]  unit + functional suites ROUNDS times under a CPU load on every core; lists each test that failed once (not CI)"
	@echo "make chaos [CHAOS_NODES=3] [RUNS=20 SEED=1000 | SEEDS=a,b]  a seeded fault campaign, two faults on every node of every run, on a lab of its own; each failing seed replays"
	@echo "make chaos-short  the campaign's short schedule (the gate's chaos_short): every fault kind and operation at least once (5 runs)"
	@echo "make bench   teardown vs the shell recipe, holder scan vs fuser, switch downtime: docs/benchmarks-lab.md (not CI; root, podman)"
	@echo "make bench-fleet [NODES=100]  controller CPU and memory per node of the cleanup, the plan and the rolling switch at 1-NODES lab nodes"
	@echo "make molecule  every Molecule scenario on 2-node simulated labs, two lanes side by side [SCENARIOS=...]"
	@echo "make lab-up [NODES=3 GPUS=8 REAL_VLLM=1] / make lab-down   the simulated GPU fleet (podman, systemd, SSH on 127.0.0.1; REAL_VLLM: vLLM's real CPU build)"

$(BIN)/python: | os-setup
	$(PYTHON) -m venv $(VENV)

# Debian packages first: the virtualenv itself may need python3-venv.
os-setup:
	bash tests/tools/os_setup.sh

setup: os-setup $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	mkdir -p $(dir $(COLLECTION_LINK))
	ln -sfn ../../.. $(COLLECTION_LINK)
	@echo "ready: source $(BIN)/activate"

demo:
	@test -x $(BIN)/ansible-playbook || { echo "make demo needs the tools of make setup: run make setup (as root) first"; exit 1; }
	$(BIN)/python tests/sim/demo/run_fleet_demo.py

demo-real:
	@test -x $(BIN)/ansible-playbook || { echo "make demo-real needs the tools of make setup: run make setup (as root) first"; exit 1; }
	$(BIN)/python tests/sim/demo/run_real_demo.py

demo-modules:
	$(BIN)/python tests/sim/demo/run_modules_demo.py

bench:
	$(BIN)/python tests/bench/run_all.py

# A fleet of NODES lab nodes (root, podman; about 2.3 GiB of memory per 100 nodes): each playbook's controller CPU and
# memory per node at 1, 10, 50 and NODES nodes, forks 5/25/100, pipelining off, Mitogen's strategy (docs/benchmarks.md)
# (make bench-fleet NODES=200; 100 by default - NODES alone is the demo lab's size)
# Switching back to a parked engine against a cold start, side by side on one lab node (about 3 minutes).
bench-park:
	$(BIN)/python tests/bench/bench_park.py > docs/results/park_switch_back.json

bench-fleet:
	$(BIN)/python tests/bench/bench_fleet.py --nodes 1,10,50,$(if $(filter command line environment,$(origin NODES)),$(NODES),100)

# A seeded fault campaign (tests/chaos/campaign.py, docs/testing.md) on a lab of its own (CHAOS_NODES nodes), kept
# between campaigns (make chaos-down removes it): RUNS runs from SEED, or the runs of SEEDS (a replay of the seeds a
# campaign printed, on a lab of the same size). Two faults on each node of every run, and on a third of them the
# controller's: 2-8 minutes a run of 5 nodes on 2 cores. Its JSON: build/chaos-runs/, or OUT=docs/results/...
CHAOS_LAB := GPUFLEET_LAB=chaos GPUFLEET_LAB_PORT=2621
CHAOS_NODES ?= 3
RUNS ?= 20
SEED ?= 1000
chaos:
	$(CHAOS_LAB) $(BIN)/python tests/sim/lab.py up --nodes $(CHAOS_NODES) --gpus 8 --reuse
	$(CHAOS_LAB) $(BIN)/python tests/chaos/campaign.py $(if $(SEEDS),--seeds $(SEEDS),--seed $(SEED) --runs $(RUNS)) $(if $(OUT),--out $(OUT))

# The short schedule (also the gate's Molecule scenario chaos_short): the few seeds from 1000 that together reach every
# fault kind and every operation (schedule.covering).
chaos-short:
	$(CHAOS_LAB) $(BIN)/python tests/sim/lab.py up --nodes 3 --gpus 8 --reuse
	$(CHAOS_LAB) $(BIN)/python tests/chaos/campaign.py --short $(if $(OUT),--out $(OUT))

chaos-down:
	$(CHAOS_LAB) $(BIN)/python tests/sim/lab.py down

# Mutation testing of the kill path (not CI): cosmic-ray's mutants of each file due (its hash not in the ledger) or of
# FILES, each run's tests in a PID and mount namespace of its own, two workers; results in tests/mutation/ledger.json
# (docs/testing.md). `make mutants FILES=plugins/module_utils/_node/lease.py`; `--stale` lists the files due.
mutants:
	$(BIN)/python tests/tools/mutants.py $(FILES)

# Flake hunt (not CI): tests/tools/stress.py, figures in docs/testing.md.
ROUNDS ?= 10
LOAD ?= 75
stress:
	GPUFLEET_TREE_GUARD=1 $(BIN)/python tests/tools/stress.py --rounds $(ROUNDS) --load $(LOAD)

lint:
	$(BIN)/ruff check .
	$(BIN)/ansible-lint

# ansible-test needs the collection under ansible_collections/<namespace>/<name>, outside this checkout (whose git
# would hide an ignored copy from it): it runs on a copy of the tracked tree there.
SANITY_BASE ?= $(or $(TMPDIR),/tmp)/gpufleet-serving-sanity
SANITY_ROOT := $(SANITY_BASE)/ansible_collections/gpufleet/serving
# ansible-test (of the pinned ansible-core) fetches this pip bootstrap script from a host outside the package index;
# where that host cannot be reached, tests/tools/get_pip_standin.py does the same job from ensurepip and the index.
GET_PIP_CACHE := $(HOME)/.ansible/test/cache/get_pip_24_2.py

sanity:
	rm -rf $(SANITY_BASE) && mkdir -p $(SANITY_ROOT)
	git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C $(SANITY_ROOT)
	test -f $(GET_PIP_CACHE) || install -D -m 0644 tests/tools/get_pip_standin.py $(GET_PIP_CACHE)
	cd $(SANITY_ROOT) && PATH="$(CURDIR)/$(BIN):$$PATH" ansible-test sanity --local --requirements \
		--python $$($(CURDIR)/$(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')

docs:
	@for module in $(MODULES); do \
		$(BIN)/ansible-doc gpufleet.serving.$$module > /dev/null || exit 1; \
		echo "ansible-doc gpufleet.serving.$$module: ok"; \
	done

# -rs: every skipped test is listed with its reason; a catalogue case whose every test skipped fails the run (conftest.py)
unit:
	GPUFLEET_TREE_GUARD=1 GPUFLEET_CATALOGUE_DIR=$(CATALOGUE_RUN) $(BIN)/python -m pytest -q -rs tests

NODES ?= 3
GPUS ?= 8

lab-up:
	$(BIN)/python tests/sim/lab.py up --nodes $(NODES) --gpus $(GPUS) $(if $(REAL_VLLM),--real-vllm)

lab-down:
	$(BIN)/python tests/sim/lab.py down

# Every scenario, in two lanes of 2-node labs side by side (tests/tools/run_molecule.py; SCENARIOS=... for some).
molecule:
	$(BIN)/python tests/tools/run_molecule.py $(SCENARIOS)

# CI's gate, 36 minutes on 2 cores (CI's last landing) to 70 on a machine about 4x slower, before chaos_short: pytest
# beside the static checks and the nodes' image build, then the Molecule scenarios in two lanes (starting while the
# checks finish), a switch under load through HAProxy, pinned pip installs
# and switch_faults (an operator's faults: concurrent runs, reboot, Ctrl-C in each phase and a dropped SSH connection,
# a node lost, the rollback's own failures) and chaos_short (the fault campaign's short schedule: 5 runs, two faults on
# each of 3 nodes and on some the controller's, every fault kind) among them. make test-all adds what does not fit the gate's time
# (DRILL_SCENARIOS): real_vllm, vLLM's real CPU build installed, served, drained, refused a broken model and switched
# (about 900 MB of wheels fetched once). Run it before a release.
GATE_SCENARIOS := chaos_short engine_install engine_units fleet_slices real_vllm_switch switch_engine switch_faults switch_metrics switch_park switch_pivot switch_readme switch_traffic teardown_faults teardown_units
DRILL_SCENARIOS := real_vllm

# what this run proved of the reliability catalogue: each test's and Molecule task's outcome (catalogue_map.py --run)
CATALOGUE_RUN := build/catalogue

test:
	rm -rf $(CATALOGUE_RUN)
	$(MAKE) --no-print-directory --output-sync=target -j4 molecule-gate checks unit
	$(BIN)/python tests/tools/catalogue_map.py --run $(CATALOGUE_RUN)

# beside pytest and the checks: most of a scenario's time is waiting on the nodes, and pytest's deadlines hold under a
# load on every core (make stress: 0 failures in 5420 runs at 75 % on both cores, docs/testing.md)
molecule-gate: lab-image
	$(BIN)/python tests/tools/run_molecule.py $(GATE_SCENARIOS)

test-all: test
	$(if $(strip $(DRILL_SCENARIOS)),$(BIN)/python tests/tools/run_molecule.py $(DRILL_SCENARIOS),@echo "make test-all: every scenario ran in make test")

checks: lint docs sanity

lab-image:
	$(BIN)/python tests/sim/lab.py image

clean:
	rm -rf build tests/output .pytest_cache .ruff_cache
