# minattn — `make test` and `make train` set up a virtual environment in .venv on first use.
#   make test [DEVICE=gpu]                      the test suite (DEVICE=gpu: GPU cases must run, not skip)
#   make test-slow                              the slow training checks
#   make train TASK=ctl MODEL=ndr DEVICE=cpu ARGS="--steps 1000"
#   make bench                                  engine/model speed (not a test)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEVICE ?= cpu
TASK   ?= ctl
MODEL  ?= ndr
ARGS   ?=
# The CuPy wheel for DEVICE=gpu: cupy-cuda12x or cupy-cuda13x, matching the CUDA driver (nvidia-smi).
CUPY   ?= cupy-cuda12x
# BLAS threads: 1 was faster for these small models on a shared 2-core machine (see README).
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: venv test test-slow train bench clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed
ifeq ($(DEVICE),gpu)
	@$(PY) -c 'import cupy' 2>/dev/null || $(PY) -m pip install -q $(CUPY)
endif

test: venv
	MINATTN_REQUIRE_GPU=$(if $(filter gpu,$(DEVICE)),1,0) $(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

train: venv
	$(PY) train.py --task $(TASK) --model $(MODEL) --device $(DEVICE) $(ARGS)

bench: venv
	$(PY) -m minattn.bench --device $(DEVICE) $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
