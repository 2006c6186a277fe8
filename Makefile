# benchlab: `make demo` starts the dashboard with its embedded worker; `make test` runs the CPU test suite.
PYTHON ?= python3
# a PYTHON inside a virtual environment or conda env that already has torch (a GPU host's CUDA
# build): benchlab goes into that environment; otherwise into .venv (scripts/install.sh says which)
HOST_ENV := $(shell $(PYTHON) -c "import sys, torch; print(sys.prefix if sys.prefix != sys.base_prefix or 'conda' in sys.version.lower() else '')" 2>/dev/null)
VENV ?= $(if $(HOST_ENV),$(HOST_ENV),.venv)
EXTRAS ?= dev
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BENCHLAB_HOST ?= 127.0.0.1
BENCHLAB_PORT ?= 8000
BENCHLAB_DATA_DIR ?= ./benchlab-data
export BENCHLAB_HOST BENCHLAB_PORT BENCHLAB_DATA_DIR

.PHONY: install demo test lint test-gpu clean

# A host whose PYTHON has torch keeps it (and its Triton); a machine without torch takes the CPU
# pins of constraints-cpu.txt. scripts/install.sh says what it did.
$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh $(PYTHON) $(VENV) "$(EXTRAS)"
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

clean:  # never removes a host environment benchlab was installed into
	rm -rf .venv benchlab-data .pytest_cache
