# minattn — `make test` and `make train` set up a virtual environment in .venv on first use, unless the
# Python they would use already has what they need (PY, below).
#   make demo                                   a model that learns in ~2-4 min on 2 CPU cores, and its pictures
#   make test [DEVICE=gpu] [ARGS=...]           the test suite (DEVICE=gpu: GPU cases must run, not skip)
#   make test-slow                              the slow training checks
#   make golden                                 rewrite tests/golden/* after an intended change, then check them
#   make mutation [ARGS="--only NAME"]          plant the mutant catalogue (tests/mutants.py) into a copy; not CI
#   make mutation ARGS="--section definitions"  only the definitions section (attention, models, data, checker)
#   make mutation ARGS="--section core"         only the core section (engine, ops, nn, optim, the annex fast/)
#   make train TASK=ctl MODEL=ndr DEVICE=cpu ARGS="--steps 1000"
#   make plot RUN=runs/ctl-ndr-cpu-s0 [TASK=ctl MODEL=ndr]  pictures of a checkpoint into RUN/plots
#   make bench                                  launches per step (minattn/tools/counting.py), engine/model speed (not a test)
#   make gpu-check                              on a GPU machine: kernels, NDR step times, resume-exact run, GPU tests
PYTHON ?= python3
comma  := ,
VENV   := .venv
VPY    := $(VENV)/bin/python
DEVICE ?= cpu
ARGS   ?=
# $(call given,VAR,--flag): "--flag $(VAR)" when VAR was given (command line or environment), else nothing
given = $(if $(filter command line environment,$(origin $(1))),$(2) $($(1)))
RUN    ?=
# The CuPy wheel for DEVICE=gpu: cupy-cuda12x or cupy-cuda13x, matching the CUDA version nvidia-smi shows.
# Its [ctk] extra installs the CUDA libraries CuPy loads (NVRTC, cuBLAS, cuRAND) from PyPI, so a machine
# with only the NVIDIA driver works; CUPY_EXTRA= (empty) uses a system CUDA toolkit instead.
CUPY   ?= cupy-cuda12x
CUPY_EXTRA ?= [ctk]
# BLAS threads: 1 was faster for these small models on a shared 2-core machine (see README).
export OPENBLAS_NUM_THREADS ?= 1

# PY, the Python that runs everything below: PY=... given on the command line, as it is; else .venv once
# built; else $(PYTHON) itself when it already has what the goals need (NEEDS: NumPy 2 and tqdm, pytest for
# the tests, matplotlib for make plot, a CuPy that sees a GPU for DEVICE=gpu), so that a cluster or a GPU
# machine without network runs the same commands; else a new .venv, installed from PyPI.
NEEDS := numpy tqdm $(if $(filter test test-slow golden mutation gpu-check,$(MAKECMDGOALS)),pytest) \
	$(if $(filter plot,$(MAKECMDGOALS)),matplotlib) \
	$(if $(filter gpu,$(DEVICE))$(filter gpu-check,$(MAKECMDGOALS)),cupy)
HAS_NEEDS = $(shell $(PYTHON) -c 'import sys; [__import__(m) for m in sys.argv[1:]]; import numpy; \
	assert int(numpy.__version__.split(".")[0]) >= 2; \
	assert "cupy" not in sys.argv or __import__("cupy").cuda.runtime.getDeviceCount() > 0; print("yes")' \
	$(NEEDS) 2>/dev/null)
ifeq ($(origin PY),command line)
else ifneq ($(wildcard $(VENV)/.installed),)
PY := $(VPY)
else ifeq ($(HAS_NEEDS),yes)
PY := $(PYTHON)
else
PY := $(VPY)
endif
# what each target that runs $(PY) needs first: the venv, or nothing (as-is says which Python runs)
SETUP := $(if $(filter $(VPY),$(PY)),venv,as-is)

.PHONY: venv as-is demo test test-slow golden mutation train plot bench gpu-check clean

# DEVICE=gpu installs CuPy once per choice of wheel (recorded in .venv/.cupy). The two wheels share the
# `cupy` package directory, so the other one is removed first. It first looks for the NVIDIA driver
# (nvidia-smi, /proc/driver/nvidia or libcuda), before the venv is built, so a machine without one is told
# so before anything (~2.7 GB of CuPy and CUDA libraries) is downloaded; GPU_DRIVER_CHECK=0 skips the check.
GPU_DRIVER_CHECK ?= 1
DRIVER_CHECK := test '$(GPU_DRIVER_CHECK)' = 0 || command -v nvidia-smi >/dev/null 2>&1 || \
	test -e /proc/driver/nvidia/version || { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | \
	grep -q 'libcuda\.so' || { echo "error: DEVICE=gpu needs the NVIDIA driver, and this machine has none (no \
	nvidia-smi, /proc/driver/nvidia or libcuda), so $(CUPY) was not downloaded; install the driver, or use \
	DEVICE=cpu (GPU_DRIVER_CHECK=0 skips this check)" >&2; exit 2; }
$(VENV)/.installed: pyproject.toml
	@$(if $(filter gpu,$(DEVICE)),$(DRIVER_CHECK))
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -e '.[test]'
	@touch $@

as-is:
	@$(if $(filter command line,$(origin PY)),,echo "make: $(PY) has $(strip $(NEEDS)): running it as it is \
	(no .venv, nothing downloaded; make venv builds one)" >&2)

venv: $(VENV)/.installed
	@$(if $(filter gpu,$(DEVICE)),grep -qxF '$(CUPY)$(CUPY_EXTRA)' $(VENV)/.cupy 2>/dev/null || { \
		{ $(DRIVER_CHECK); } && \
		$(VPY) -m pip uninstall -q -y $(filter-out $(CUPY),cupy-cuda12x cupy-cuda13x) 2>/dev/null; \
		$(VPY) -m pip install -q '$(CUPY)$(CUPY_EXTRA)' && echo '$(CUPY)$(CUPY_EXTRA)' > $(VENV)/.cupy; })

# The first thing to run: seq2attn learns the lookup tables (paper Table 1) at the cpu preset, 100 epochs in
# ~2-4 min on 2 cores, then --plot draws its learning curves and attention traces into $(DEMO)/plots. Run again,
# it redraws (a finished run is not retrained; an interrupted one continues). DEMO_ARGS: more flags for
# train.py (tests/lab/test_demo.py shrinks the run with them). Without matplotlib it trains and skips the pictures.
DEMO      ?= runs/demo
DEMO_ARGS ?=
DEMO_RUN  := --task lookup --model seq2attn --out $(DEMO) $(if $(wildcard $(DEMO)/checkpoint.npz),--resume)
# (= , not :=, so that it is asked when the recipe runs, after the venv is built)
DEMO_PNG   = $(shell $(PY) -c 'import matplotlib' 2>/dev/null && echo yes)
demo: $(SETUP)
	@$(if $(DEMO_PNG),,echo "matplotlib is not installed: training anyway, without the pictures (for them: \
	$(PY) -m pip install matplotlib, then make demo again)")
	$(PY) train.py $(DEMO_RUN) $(DEMO_ARGS)
	$(if $(DEMO_PNG),$(PY) train.py --plot --out $(DEMO))
	@echo "the demo's run is $(DEMO): $(if $(DEMO_PNG),open $(DEMO)/plots/learning-curves.png first (the \
	loss falls$(comma) the held-out accuracies rise to 1)$(comma) then the attention traces beside it (each \
	output step reads one input: one table at a time); docs/glossary.md says what each curve counts,its \
	evaluations are the lines of $(DEMO)/metrics.jsonl; docs/glossary.md says what each number counts)"

# ARGS: pytest's (files, -k ...)
test: $(SETUP)
	MINATTN_REQUIRE_GPU=$(if $(filter gpu,$(DEVICE)),1,0) $(PY) -m pytest -q $(ARGS)

test-slow: $(SETUP)
	$(PY) -m pytest -q -m slow

# The update run fails by design (a run that rewrote its snapshots never passes); the plain run after it must pass.
golden: $(SETUP)
	-MINATTN_UPDATE_GOLDEN=1 MINATTN_REGEN_GOLDEN=1 $(PY) -m pytest -q tests/lab/test_golden_runs.py tests/papers/test_split_checksums.py
	$(PY) -m pytest -q tests/lab/test_golden_runs.py tests/papers/test_split_checksums.py
	git diff --stat -- tests/golden

# Semantic mutants planted one at a time in a temporary copy of the tree (issue 31 item 5); ~13 min on 2 cores.
mutation: $(SETUP)
	$(PY) tests/mutation.py $(ARGS)

# TASK, MODEL and DEVICE go to train.py only when given (its defaults: ctl, ndr, cpu), so that
# `ARGS="--resume DIR"` continues the run saved there: its task, model, settings and device.
train: $(SETUP)
	$(PY) train.py $(call given,TASK,--task) $(call given,MODEL,--model) $(call given,DEVICE,--device) $(ARGS)

# The checkpoint names its task and model: TASK and MODEL are passed (and checked against it) only when
# given on the command line. PNGs need matplotlib (pip install matplotlib).
plot: $(SETUP)
	$(if $(RUN),,$(error make plot needs RUN=DIR, a run directory with a checkpoint))
	$(PY) train.py --plot --out $(RUN) --device $(DEVICE) $(if $(filter command line,$(origin TASK)),--task $(TASK)) \
		$(if $(filter command line,$(origin MODEL)),--model $(MODEL)) $(ARGS)

bench: $(SETUP)
	$(PY) -m minattn.tools.counting
	$(PY) -m minattn.tools.bench --device $(DEVICE) $(ARGS)

# With a Python that already has numpy, tqdm, pytest and a CuPy that sees a GPU: no venv, no network.
gpu-check: DEVICE = gpu
gpu-check: $(SETUP)
	$(PY) -m minattn.tools.gpucheck $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
