# carbonsched developer entry points. `make demo` and `make test` are the README quick start.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv bytecode demo test test-pg bench bench-planner flake-hunt figures docs clean

# uv installs the dependencies in seconds where pip takes minutes; pip does it where uv
# cannot be had. Both leave every module compiled (uv only with --compile-bytecode): where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), Python never writes a .pyc
# itself, and every process would compile SQLAlchemy, Alembic and OR-Tools' Python again
# (a daemon's start took 5.7 s of CPU instead of 1.7 s).
$(BIN)/carbonsched: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet uv && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]' ) \
	  || ( echo "uv failed; installing with pip" >&2 && $(BIN)/pip install --quiet -e '.[dev]' )
	touch $@

venv: $(BIN)/carbonsched

demo: bytecode
	$(BIN)/python scripts/demo.py

# Most of the suite waits on daemons, agents and databases, not on the CPU: four workers
# (pytest-xdist) finish it in about half the time even on two cores. Work stealing: a
# worker that runs out takes queued tests from the busiest (with plain `load`, one worker
# was left with a queue of daemon tests for 15 minutes while three stood idle).
TEST_WORKERS ?= 4

# The project's own modules, compiled once (the editable install leaves them as sources):
# each daemon, agent and planner process the tests start then loads them, instead of
# compiling them again (see above).
bytecode: venv
	$(BIN)/python -m compileall -q -j 0 scheduler policies telemetry migrations tests bench scripts >/dev/null

test: bytecode
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The whole suite RUNS times with BUSY CPU busy loops beside it; lists every test that failed
# at least once (scripts/flake_hunt.py).
RUNS ?= 3
BUSY ?= 2

flake-hunt: venv
	$(BIN)/python scripts/flake_hunt.py --runs $(RUNS) --busy $(BUSY) --workers $(TEST_WORKERS)

bench: venv
	$(BIN)/python bench/api_bench.py

bench-planner: venv
	$(BIN)/python -m bench.planner --replan 6 --json bench/results/planner.json --plot bench/results/planner.png

# The headline figures against bench/figures_expected.toml (bench/figures.py; reads the shared
# data); exits 1 on a regression.
figures: venv
	$(BIN)/python bench/figures.py

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing
# anchor or a page left out of the nav is an error. The CLI and config reference pages are
# written first from the parser (scripts/cli_reference.py).
docs: venv
	$(BIN)/python scripts/cli_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .demo build site *.egg-info
