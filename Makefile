# Every target works from a fresh clone on its own.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint bench demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0" -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The venv's bin on PATH: the tests (like users) find uv and envbisect there.
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The layers (.importlinter: one way down, no cycles inside a layer, function-level and
# TYPE_CHECKING imports counted) and tools/structure.py (no reaching into another module's
# privates, no module over 600 lines) keep the shape docs/ARCHITECTURE.md draws.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python tools/structure.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

demo: $(STAMP)
	$(BIN)/envbisect demo

clean:
	rm -rf $(VENV) .envbisect .pytest_cache
