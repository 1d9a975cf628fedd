# make test: build .venv on a fresh machine (pinned dependencies) and run the test suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The tutorials run under nbval: every cell must run; cells marked `# NBVAL_CHECK_OUTPUT` must
# reproduce their stored output after sanitize.cfg (paths, timings, progress bars, addresses).
TUTORIALS := notebooks/tutorials
NBVAL  := --nbval-lax --nbval-current-env --nbval-sanitize-with $(TUTORIALS)/sanitize.cfg --nbval-cell-timeout=600
LAB_ARGS ?=

.PHONY: install test test-faults test-slow test-tutorials browser lab bench smoke reproduce clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Layers run one way: lint-imports checks pyproject's import contract first (seconds).
test: $(STAMP) browser
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests $(TUTORIALS) $(NBVAL)

# The fault suite (a few minutes on 2 cores): SIGKILLs of training runs and of the runner, a full disk,
# lost gloo ranks, bad input on every command line; it rewrites the tables in docs/reliability.md.
test-faults: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m faults tests/faults/test_faults.py

test-tutorials: $(STAMP)
	$(PY) -m pytest -q $(TUTORIALS) $(NBVAL)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Debian's Chromium and ChromeDriver for tests/notebooks/test_jupyterlab_browser.py (about a minute to
# install). Installed only when missing and apt-get is usable as root; otherwise the browser
# test is skipped with its reason, and nothing here fails.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's chromium and chromium-driver for the JupyterLab browser test"; \
	  (timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq chromium chromium-driver >/dev/null) \
	    || echo "could not install Chromium: the browser test will be skipped"; \
	else echo "no Chromium and no apt-get as root: the browser test will be skipped"; fi

# JupyterLab on the notebooks (tutorials/ first); e.g. make lab LAB_ARGS="--no-browser --port 8890"
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

# The paper's tables and figures on the synthetic world: every artifact at a handful of steps
# (smoke, run by CI after make test), or the frozen mini setup into figures/ (the README's results).
smoke: $(STAMP)
	$(PY) -m reproduce --profile smoke

# With the committed ledger (the default RECORDS) figures/ is rebuilt from its records alone, with the seeds
# each run holds there (--from-records: seconds, nothing executed; the second reference run's ledger: the
# seed plan reproduce/presets/mini-seeds.json, 3 to 8 seeds a run). RECORDS=<a new folder> runs on this
# machine, JOBS at a time, one thread each: SEEDS seeds of every run (about 9 run-hours, 5 hours of wall time,
# per seed on 2 cores at JOBS=2), or SEED_PLAN=<file> the seeds per run of a plan (the power table's:
# python -m reproduce.power --write-plan FILE); neither given, 3 seeds. TIME_BUDGET=<minutes> runs a part: no
# run starts that would not end within it; the same command continues.
SEEDS ?=
TIME_BUDGET ?=
JOBS ?= 2
RECORDS ?= reproduce/records/mini
SEED_PLAN ?=
LEDGER_SEEDS := $(if $(filter reproduce/records/mini,$(RECORDS)),,--seeds 3)
SEEDS_FLAG := $(if $(SEED_PLAN),--seed-plan $(SEED_PLAN),$(if $(SEEDS),--seeds $(SEEDS),$(LEDGER_SEEDS)))
reproduce: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m reproduce --profile mini --jobs $(JOBS) --records $(RECORDS) $(SEEDS_FLAG) \
		$(if $(TIME_BUDGET),--time-budget $(TIME_BUDGET)) $(if $(filter reproduce/records/mini,$(RECORDS)),--from-records)

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
