# minattn — `make test` and `make train` set up a virtual environment in .venv on first use.
#   make demo                                   a model that learns in ~2-4 min on 2 CPU cores, and its pictures
#   make test [DEVICE=gpu]                      the test suite (DEVICE=gpu: GPU cases must run, not skip)
#   make test-slow                              the slow training checks
#   make golden                                 rewrite tests/golden/* after an intended change, then check them
#   make mutation [ARGS="--only NAME"]          plant the mutant catalogue (tests/mutants.py) into a copy; not CI
#   make mutation ARGS="--section definitions"  only the definitions section (attention, models, data, checker)
#   make mutation ARGS="--section core"         only the core section (engine, ops, nn, optim, the annex fast/)
#   make train TASK=ctl MODEL=ndr DEVICE=cpu ARGS="--steps 1000"
#   make plot RUN=runs/ctl-ndr-cpu-s0 [TASK=ctl MODEL=ndr]  pictures of a checkpoint into RUN/plots
#   make bench                                  launches per step (minattn/tools/counting.py), engine/model speed (not a test)
#   make gpu-check [PY=python3]                 on a GPU machine: GPU tests, bench, a resume-exact NDR run
PYTHON ?= python3
comma  := ,
VENV   := .venv
PY     := $(VENV)/bin/python
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

.PHONY: venv demo test test-slow golden mutation train plot bench gpu-check clean

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

# DEVICE=gpu installs CuPy once per choice of wheel (recorded in .venv/.cupy). The two wheels share the
# `cupy` package directory, so the other one is removed first. It first looks for the NVIDIA driver
# (nvidia-smi, /proc/driver/nvidia or libcuda), so a machine without one is told so before ~2.7 GB of
# CuPy and CUDA libraries are downloaded; GPU_DRIVER_CHECK=0 skips the check.
GPU_DRIVER_CHECK ?= 1
DRIVER_CHECK := test '$(GPU_DRIVER_CHECK)' = 0 || command -v nvidia-smi >/dev/null 2>&1 || \
	test -e /proc/driver/nvidia/version || { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | \
	grep -q 'libcuda\.so' || { echo "error: DEVICE=gpu needs the NVIDIA driver, and this machine has none (no \
	nvidia-smi, /proc/driver/nvidia or libcuda), so $(CUPY) was not downloaded; install the driver, or use \
	DEVICE=cpu (GPU_DRIVER_CHECK=0 skips this check)" >&2; exit 2; }
venv: $(VENV)/.installed
	@$(if $(filter gpu,$(DEVICE)),grep -qxF '$(CUPY)$(CUPY_EXTRA)' $(VENV)/.cupy 2>/dev/null || { \
		{ $(DRIVER_CHECK); } && \
		$(PY) -m pip uninstall -q -y $(filter-out $(CUPY),cupy-cuda12x cupy-cuda13x) 2>/dev/null; \
		$(PY) -m pip install -q '$(CUPY)$(CUPY_EXTRA)' && echo '$(CUPY)$(CUPY_EXTRA)' > $(VENV)/.cupy; })

# The first thing to run: seq2attn learns the lookup tables (paper Table 1) at the cpu preset, 100 epochs in
# ~2-4 min on 2 cores, then --plot draws its learning curves and attention traces into $(DEMO)/plots. Run again,
# it redraws (a finished run is not retrained; an interrupted one continues). DEMO_ARGS: more flags for
# train.py (tests/test_demo.py shrinks the run with them); PY=python3 uses that Python instead of the venv.
DEMO      ?= runs/demo
DEMO_ARGS ?=
DEMO_RUN  := --task lookup --model seq2attn --out $(DEMO) $(if $(wildcard $(DEMO)/checkpoint.npz),--resume)
# (= , not :=, so that it is asked when the recipe runs, after the venv is built)
DEMO_PNG   = $(shell $(PY) -c 'import matplotlib' 2>/dev/null && echo yes)
demo: $(if $(filter command line,$(origin PY)),,venv)
	@$(if $(DEMO_PNG),,echo "matplotlib is not installed: training anyway; the pictures will be text in this \
	terminal (for PNGs: $(PY) -m pip install matplotlib, then make demo again)")
	$(PY) train.py $(DEMO_RUN) $(DEMO_ARGS)
	$(PY) train.py --plot --out $(DEMO)
	@echo "the demo's run is $(DEMO): $(if $(DEMO_PNG),open $(DEMO)/plots/learning-curves.png first (the \
	loss falls$(comma) the held-out accuracies rise to 1)$(comma) then the attention traces beside it,see \
	the learning curves above first$(comma) then the attention traces) (each output step reads one input: \
	one table at a time); docs/glossary.md says what each curve counts"

test: venv
	MINATTN_REQUIRE_GPU=$(if $(filter gpu,$(DEVICE)),1,0) $(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

# The update run fails by design (a run that rewrote its snapshots never passes); the plain run after it must pass.
golden: venv
	-MINATTN_UPDATE_GOLDEN=1 MINATTN_REGEN_GOLDEN=1 $(PY) -m pytest -q tests/test_golden.py tests/test_split_checksums.py
	$(PY) -m pytest -q tests/test_golden.py tests/test_split_checksums.py
	git diff --stat -- tests/golden

# Semantic mutants planted one at a time in a temporary copy of the tree (issue 31 item 5); ~13 min on 2 cores.
mutation: venv
	$(PY) tests/mutation.py $(ARGS)

# TASK, MODEL and DEVICE go to train.py only when given (its defaults: ctl, ndr, cpu), so that
# `ARGS="--resume DIR"` continues the run saved there: its task, model, settings and device.
train: venv
	$(PY) train.py $(call given,TASK,--task) $(call given,MODEL,--model) $(call given,DEVICE,--device) $(ARGS)

# The checkpoint names its task and model: TASK and MODEL are passed (and checked against it) only when
# given on the command line. PNGs need matplotlib (.venv/bin/pip install -e '.[plot]'); without it the maps
# are printed as text.
plot: venv
	$(if $(RUN),,$(error make plot needs RUN=DIR, a run directory with a checkpoint))
	$(PY) train.py --plot --out $(RUN) --device $(DEVICE) $(if $(filter command line,$(origin TASK)),--task $(TASK)) \
		$(if $(filter command line,$(origin MODEL)),--model $(MODEL)) $(ARGS)

bench: venv
	$(PY) -m minattn.tools.counting
	$(PY) -m minattn.tools.bench --device $(DEVICE) $(ARGS)

# PY=python3 (given on the command line) runs with a Python that already has numpy, cupy, tqdm and
# pytest, without building the venv or reaching the network.
gpu-check: DEVICE = gpu
gpu-check: $(if $(filter command line,$(origin PY)),,venv)
	$(PY) -m minattn.tools.gpucheck $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
