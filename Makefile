# gpufleet.serving: set up, test, lint. Run `make help`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
COLLECTION_LINK := collections/ansible_collections/gpufleet/serving
MODULES := systemd_stop_hard gpu_holders_kill gpu_memory_assert

.PHONY: help setup demo test lint unit docs clean

help:
	@echo "make setup   create $(VENV), install requirements-dev.txt, link the collection for in-place use"
	@echo "make demo    run the modules against 8 simulated GPUs on this machine"
	@echo "make test    lint + docs + pytest (what CI runs)"
	@echo "make lint    ruff and ansible-lint (production profile)"
	@echo "make docs    render every module's documentation with ansible-doc"
	@echo "make unit    pytest only"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

setup: $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	mkdir -p $(dir $(COLLECTION_LINK))
	ln -sfn ../../.. $(COLLECTION_LINK)
	@echo "ready: source $(BIN)/activate"

demo:
	$(BIN)/python tests/sim/demo/run_modules_demo.py

lint:
	$(BIN)/ruff check .
	$(BIN)/ansible-lint

docs:
	@for module in $(MODULES); do \
		$(BIN)/ansible-doc gpufleet.serving.$$module > /dev/null || exit 1; \
		echo "ansible-doc gpufleet.serving.$$module: ok"; \
	done

unit:
	$(BIN)/python -m pytest -q tests

test: lint docs unit

clean:
	rm -rf build tests/output .pytest_cache .ruff_cache
