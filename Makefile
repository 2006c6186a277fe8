# benchlab: `make demo` starts the dashboard with its embedded worker; `make test` runs the CPU test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BENCHLAB_HOST ?= 127.0.0.1
BENCHLAB_PORT ?= 8000
BENCHLAB_DATA_DIR ?= ./benchlab-data
export BENCHLAB_HOST BENCHLAB_PORT BENCHLAB_DATA_DIR

.PHONY: install demo test lint test-gpu clean

# On a machine without a GPU, take the CPU build of torch (on local disk here) and the Triton
# version whose CPU interpreter runs the kernels; a GPU host keeps the torch and Triton it has.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU host: installing with its CUDA torch"; \
	else \
		$(PIP) install -q -c constraints-cpu.txt torch triton; \
	fi
	$(PIP) install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/benchlab up

lint: install
	$(PY) -m ruff check .

test: install lint
	$(PY) -m pytest -q

test-gpu: install
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf $(VENV) benchlab-data .pytest_cache
