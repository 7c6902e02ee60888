# Two commands for a fresh clone: `make demo` (set up + run the pipeline on the
# bundled TextCraft server and model) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

test: setup
	$(PY) -m pytest -q tests

demo: setup
	SKIP_SETUP=1 bash scripts/demo.sh
