# `make test` and `make demo` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned in the same pip command as everything else: a CPU build lies
# on disk, and an unpinned torch resolves to a CUDA build of several GB.
PINS := torch==2.13.0 "transformers>=5.19,<6" "trl>=1.0,<2" "peft>=0.18" "accelerate>=1.10" datasets wandb gguf
STAMP := $(VENV)/.installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

.PHONY: test demo install clean

$(STAMP): setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(PINS) "pytest>=8" matplotlib
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
