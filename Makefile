# Two commands for a fresh clone: `make demo` (set up + run the pipeline on the
# bundled TextCraft server and model) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-train test demo

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

# Training env (XTuner pins transformers 4.48): requirements-train.txt. torch is
# pinned first and held by a constraint (torchvision would pull another torch).
# DeepSpeed is rebuilt with its CPU shared-memory op compiled in; otherwise every
# DeepSpeed run on CPU JIT-compiles it (minutes). PyPI's torchvision is a CUDA build
# that cannot import next to the CPU torch: removed (CPU tests use a stub).
TRAIN_VENV ?= .venv-train

setup-train: $(TRAIN_VENV)/.installed

$(TRAIN_VENV)/.installed: requirements-train.txt
	$(PYTHON) -m venv $(TRAIN_VENV)
	$(TRAIN_VENV)/bin/pip install -q --upgrade pip
	$(TRAIN_VENV)/bin/pip install -q torch==2.13.0
	echo torch==2.13.0 > $(TRAIN_VENV)/constraints.txt
	$(TRAIN_VENV)/bin/pip install -q -c $(TRAIN_VENV)/constraints.txt -r requirements-train.txt
	DS_BUILD_SHM_COMM=1 $(TRAIN_VENV)/bin/pip install -q --no-deps --force-reinstall --no-cache-dir \
		--no-build-isolation -c $(TRAIN_VENV)/constraints.txt "$$(grep '^deepspeed==' requirements-train.txt)"
	$(TRAIN_VENV)/bin/pip uninstall -q -y torchvision
	touch $@

test: setup setup-train
	$(PY) -m pytest -q tests

demo: setup
	SKIP_SETUP=1 bash scripts/demo.sh
