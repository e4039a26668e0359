# Everything a developer runs. `make test` installs into .venv and runs the suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch for the trainer's tests; on a GPU machine install your CUDA build first.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,redis,trainer,loadtest

.PHONY: install test lint serve bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

serve: install
	$(VENV)/bin/sandbox-service serve

bench: install
	$(PY) -m loadtests.bench_executor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
