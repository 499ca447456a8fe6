# The two commands of the README: `make course` opens the course, `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
JOBS ?= 2
# serve the learner's working copy (my-course/, git-ignored; labkit.teaching.grading.course_copy): its index links to the
# released labs (no solutions), and running a chapter saves outputs there, never into the tracked notebooks.
# The printed URL (LabApp.default_url: JupyterLab overrides ServerApp.default_url with its own) opens the course
# index; kernels idle for 30 min with no tab attached are shut down (closed tabs free their memory);
# root in a container needs --allow-root
LAB_FLAGS := --ServerApp.root_dir=my-course --LabApp.default_url=/lab/tree/chapters/index.ipynb \
	--MappingKernelManager.cull_idle_timeout=1800 --MappingKernelManager.cull_interval=300 \
	$(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: course test unit notebooks lint bench refresh clean

# calibrates this machine's peaks the first time (≈ 30 s on a 2-core CPU), so every chapter's MFU and
# roofline divide by the same figures rather than by a measurement taken under the minute's load; then makes
# or updates your working copy (files you edited are kept, the course's new version goes beside them as
# NAME.update.ipynb): `git pull && make course` takes the course's updates
course:
	./scripts/bootstrap.sh lab
	$(PY) -m labkit calibrate --if-missing
	$(PY) -m labkit release --course my-course
	$(VENV)/bin/jupyter lab $(LAB_FLAGS)

# every notebook is executed once, inside pytest: under nbval (its checked cells compared with the committed outputs)
# when it has checked cells, else under papermill (tests/test_notebooks.py); a lab by `labkit grade` in its grading
# test (tests/_executed.py)
test:
	./scripts/bootstrap.sh dev
	$(PY) -m ruff check labkit tests benchmarks conftest.py
	$(PY) -m pytest -n $(JOBS) --durations=30 tests

unit:
	$(PY) -m pytest -n $(JOBS) -m "not notebook" tests

notebooks:
	$(PY) -m pytest -n $(JOBS) -m notebook tests

bench:
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-execute notebooks with the CI parameters and store their outputs in the sources
# (only outputs change; cells are never rewritten). Usage: make refresh NB=chapters/...ipynb
# Calibrates this machine's peaks first (once), so every stored MFU divides by the same peak; refuses to
# store outputs whose checked claims (labkit.measure.claims) do not hold. Run it on an idle machine.
refresh:
	$(PY) -m labkit calibrate --if-missing
	$(PY) -m labkit.teaching.notebooks refresh $(NB)

clean:
	rm -rf build
