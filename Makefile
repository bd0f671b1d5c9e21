# Two commands for a newcomer: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.amflow-installed
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup system-deps docs docs-check docs-samples quickstart demo test test-fast test-exhaustive test-corpus-ui test-backfill bench-daily airflow bench serve bench-serve rehearsal clean image test-image

# Setup says what it does, phase by phase (docs/how-to/installation.md): the venv, then
# amflow's pinned dependencies with a line per large download (scripts/pip_progress.py:
# a few dozen lines, not pip's thousand), then the system packages (scripts/system-deps.sh).
$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  command -v $(PYTHON) >/dev/null || { echo "setup: $(PYTHON) not found: amflow needs Python 3.11 (docs/how-to/installation.md), or name one: make setup PYTHON=/path/to/python3.11" >&2; exit 1; }; \
	  echo "setup: creating $(VENV) with $$($(PYTHON) -V 2>&1) ($(PYTHON))"; \
	  $(PYTHON) -m venv $(VENV); \
	fi
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "setup: $(VENV) has $$($(PY) -V 2>&1); amflow needs Python 3.11: rm -rf $(VENV), then make setup PYTHON=/path/to/python3.11 (docs/how-to/installation.md)" >&2; exit 1; }
	@echo "setup: upgrading pip in $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@echo "setup: installing amflow and its pinned Python dependencies into $(VENV) (~2.7 GB: torch, Ray, Airflow, pyarrow, the k2-fsa decoders, the test, bench and docs extras; several minutes, mostly downloads)"
	@$(PY) scripts/pip_progress.py install -e '.[test,bench,docs]'
	@echo "setup: $(VENV) holds $$(du -sh $(VENV)/ | cut -f1)"
	@touch $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

setup: $(STAMP) system-deps

# The ssl recipe on configs/tiny.yaml through the CLI alone (no Airflow), in one process:
# corpus -> ... -> decode, a WER table (docs/tutorial/quickstart.md). RUN_ID=<id> goes on
# with that run (finished steps kept); ARGS adds arguments (--from STEP, --set k=v, ...).
quickstart: setup
	$(VENV)/bin/amflow run ssl --config configs/tiny.yaml $(if $(RUN_ID),--run-id $(RUN_ID)) $(ARGS)

demo: setup
	bash scripts/demo.sh

# The docs site (mkdocs.yml, docs/), built strictly into site/: a broken link or a missing
# page fails. The CLI and config references are generated (scripts/docs_reference.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The guides' commands that need make demo's runs, as written, on them (after `make demo`;
# not in CI: the demo takes tens of minutes): every block marked `# run by make docs-check` or
# `# run by tests/test_doc_pages.py` (scripts/docs_check.py; the test runs the latter on the
# quickstart's runs).
docs-check: $(STAMP)
	$(PY) scripts/docs_check.py

# The sample output the guides show, made by a run, not typed (scripts/docs_samples.py): the
# quickstart with --run-id qs (its finished steps kept), its WER table into docs/samples/,
# then each page's sample region rewritten from the file (tests/test_docs.py compares them).
docs-samples: setup
	$(PY) scripts/docs_samples.py

# Tests marked `isolated` need a process in which no in-process Ray ever ran.
# Tests marked `cluster` (the rehearsal, ~20 min) run with `make rehearsal` only.
# Tests marked `exhaustive` sweep a whole input space (minutes): make test-exhaustive.
# Tests marked `waits` (Airflow runs, mostly idle) run beside the others, which run at
# nice 10 (scripts/test.sh): ~9 min of waiting no longer adds to the time. Each pass
# lists its slowest tests (where make test's time goes).
test: setup
	bash scripts/test.sh

# The daily_data DAG backfilled over a live Airflow alone (4-9 min on a loaded 2-core
# machine; make test runs it too, among the tests marked waits).
test-backfill: setup
	$(VENV)/bin/pytest -q -rs -m "backfill and not benchmark" tests

# Every day of a corpus backfilled through a live Airflow against one run of all of them:
# wall, task and step time side by side (AMFLOW_BENCH_CORPUS=data/corpus: the demo's).
bench-daily: setup
	$(VENV)/bin/pytest -q -rs -s -m benchmark tests/test_airflow_daily.py | grep -E "AMFLOW_BENCH|passed|failed"

# The teacher DAG triggered from its form on the own-corpus how-to's YAML, the student it
# starts, real steps (~10 min): Airflow on your corpus (docs/how-to/own-corpus.md).
test-corpus-ui: setup
	$(VENV)/bin/pytest -q -rs -m corpus_ui tests/test_airflow_own_corpus.py

test-exhaustive: setup
	$(VENV)/bin/pytest -q -rs -m exhaustive tests

test-fast: setup
	$(VENV)/bin/pytest -q -rs -m "not slow and not isolated and not cluster and not exhaustive and not benchmark and not corpus_ui" tests

# Both DAGs the cluster way on this machine: local S3 (moto) with injected faults, a Ray
# head + pool nodes, Ray jobs, nodes killed mid-step; checks and per-step overhead vs local
# (docs/how-to/rehearsal.md). Holds /work/bench.lock when it exists (timings on a shared machine);
# after 10 min waiting for it, runs without it.
rehearsal: setup
	@if [ -e /work/bench.lock ] && command -v flock >/dev/null; then \
	  flock -w 600 -E 75 /work/bench.lock $(PY) scripts/rehearsal.py; rc=$$?; \
	  if [ $$rc = 75 ]; then echo "bench.lock busy: running unlocked"; $(PY) scripts/rehearsal.py; \
	  else exit $$rc; fi; \
	else $(PY) scripts/rehearsal.py; fi

# The CPU image from Debian packages + PyPI, no registry (docs/how-to/containers.md):
# localhost/amflow:<version>; inputs cached under build/image, so a rebuild takes seconds.
# Needs no venv (the host's python3 and pip do); podman, buildah, runc, mmdebstrap.
image:
	@bash scripts/system-deps.sh image
	nice -n 10 bash infra/image/build.sh

# Steps run through the job runner in the image (runner.mode container), compared with local
# (tests marked `container` live in tests/test_container*.py: collecting all tests is slow).
test-image: $(STAMP) image
	$(VENV)/bin/pytest -q -rs -m container tests/test_container*.py

airflow: setup
	bash scripts/airflow.sh

bench: setup
	$(VENV)/bin/amflow bench features --run-id bench

# The demo's SSL student as a streaming recognizer: the page at http://127.0.0.1:8000/,
# the WebSocket API at ws://127.0.0.1:8000/ws (serving/protocol.py). Ctrl-C stops it.
serve: setup
	$(VENV)/bin/amflow serve --config configs/local.yaml --run-id demo-ssl

# Against a running `make serve`: latency vs concurrent real-time streams.
bench-serve: setup
	$(VENV)/bin/amflow bench serve --config configs/local.yaml --run-id demo-ssl

clean:
	rm -rf data/runs data/quickstart/runs .pytest_cache site
