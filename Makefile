# The two commands of the README: `make course` opens the course, `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= 2
# serve from the repository root so the index's links to ../labs work; root in a container needs --allow-root
LAB_FLAGS := --ServerApp.root_dir=. $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: course test unit notebooks lint bench refresh clean

course:
	./scripts/bootstrap.sh lab
	$(VENV)/bin/jupyter lab $(LAB_FLAGS) chapters/index.ipynb

test:
	./scripts/bootstrap.sh dev
	$(PY) -m ruff check labkit tests benchmarks
	rm -rf build/nbval
	$(PY) -m pytest -n $(JOBS) tests
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg \
	    --nbval-kernel-name python3 -n $(JOBS) --dist loadfile build/nbval

unit:
	$(PY) -m pytest -n $(JOBS) -m "not notebook" tests

notebooks:
	$(PY) -m pytest -n $(JOBS) -m notebook tests

bench:
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-execute notebooks with the CI parameters and store their outputs in the sources
# (only outputs change; cells are never rewritten). Usage: make refresh NB=chapters/...ipynb
# Calibrates this machine's peaks first (once), so every stored MFU divides by the same peak.
refresh:
	$(PY) -m labkit calibrate --if-missing
	$(PY) -m labkit.notebooks refresh $(NB)

clean:
	rm -rf build
