# Two entry points for a fresh machine: `make bench` and `make test`.
# Both create .venv (once) with the pinned dependencies, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: bench test setup clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

bench: $(STAMP)
	$(BIN)/lmperf bench $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
