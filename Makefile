# Two entry points for a fresh machine: `make bench` and `make test`.
# Both create .venv (once) with the exact versions of constraints.txt (what CI uses), then run.
# pyproject.toml only declares ranges: on a machine with its own torch, `pip install -e .` keeps it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# the suite's workers: 2 (a file's tests stay on one worker, their module fixtures shared);
# WORKERS=0 runs it in this process
WORKERS ?= 2

.PHONY: bench test setup clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

bench: $(STAMP)
	$(BIN)/lmperf bench $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile $(ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
