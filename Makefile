# Every target builds its own virtual environment (.venv) when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test processes (pytest-xdist; each test file stays in one process, so its subprocesses, Ray
# cluster and ports are its own). 3 on the 2-core, 24 GiB machines: the third fills the cores while
# the others wait on their subprocesses, Ray actors and sleeps (default suite 8:07 at 2, 7:28 at 3,
# 14 GiB at its peak); 0: one process.
TEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
JUPYTER_ARGS ?=   # e.g. --allow-root in a container, --port 8890

.PHONY: lint docs test test-all reproduce notebook notebook-outputs venv clean machine-code machine-code-peer

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The machine-code check's own environment (.venv-triton): the triton package of the GPU machine
# (it ships ptxas and cuobjdump), never in one interpreter with jaxlib (each embeds its own MLIR).
TRITON_VENV    := .venv-triton
TRITON_STAMP   := $(TRITON_VENV)/.installed-stamp
TRITON_VERSION ?= 3.6.0

$(TRITON_STAMP):
	test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install -q triton==$(TRITON_VERSION)
	touch $(TRITON_STAMP)

# Every fused kernel compiled to an H100's machine code (sm_90a) on this machine, no GPU needed:
# writes experiments/results/gpu/machine_code.{md,json}; exits 1 on a spill, on more shared memory
# than a block may have, or on a kernel that does not compile (experiments/gpu/README.md).
machine-code: $(STAMP) $(TRITON_STAMP)
	$(BIN)/python -m experiments.gpu.machine_code --triton-python $(TRITON_VENV)/bin/python $(MACHINE_CODE_ARGS)

# pararnn-torch's fused Newton step by the same model, beside ours (after machine-code: it reads
# machine_code.json): writes experiments/results/gpu/pararnn_machine_code.{md,json}. PARARNN_PYTHON=PY
# (a venv with CPU torch and the pararnn wheel) adds pararnn's own CPU iterations (experiments/gpu/README.md).
machine-code-peer: $(STAMP) $(TRITON_STAMP)
	$(BIN)/python -m experiments.gpu.peer_machine_code --triton-python $(TRITON_VENV)/bin/python \
		$(if $(PARARNN_PYTHON),--pararnn-python $(PARARNN_PYTHON))

# Lint and types over bppsa/, experiments/ and the command's entry (config in pyproject.toml): zero
# findings, warnings included.
lint: $(STAMP)
	@$(BIN)/ruff check bppsa experiments bppsa_cli.py; rc=$$?; \
	$(BIN)/basedpyright --warnings bppsa experiments bppsa_cli.py || rc=1; exit $$rc

# The documentation site (docs/: Sphinx, MyST, autodoc) into docs/_build/html; any warning is an error.
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html

# The default suite (slow tests deselected). pytest's exit code 5 (nothing collected) is a failure.
test: $(STAMP)
	@$(BIN)/python -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# Everything, slow tests included.
test-all: $(STAMP)
	@$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# The main job on the built-in default data: the IRMAS grid and training on the synthetic stand-in
# (writes runs/irmas-quick/irmas_grid.* and irmas_train.*; 9 to 25 minutes on a shared 2-core machine).
reproduce: $(STAMP)
	$(BIN)/bppsa reproduce irmas --quick

# The notebooks import the harness (experiments/, not an installed package): the clone on PYTHONPATH.
notebook: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[notebook]'
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(BIN)/jupyter lab notebooks/ $(JUPYTER_ARGS)

# Run every notebook in place at full size, for the outputs that are committed and that the site shows
# (notebooks/execute.py; about 17 minutes on a shared 2-core machine, 06_parallel_step 10 of them).
notebook-outputs: $(STAMP)
	$(BIN)/python notebooks/execute.py

clean:
	rm -rf $(VENV) $(TRITON_VENV) build *.egg-info .pytest_cache .hypothesis
