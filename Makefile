# The two README commands. Each brings .venv up to date with pyproject.toml first:
# the stamp is keyed on the file's hash, so an unchanged project skips installation.
PYTHON ?= python3.11
VENV := .venv
HASH := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP := $(VENV)/.installed-$(HASH)
# torch is pinned here (the CPU wheel on the development machine's disk); the package itself
# keeps a range so that GPU users get their build.
TORCH_VERSION ?= 2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export RAY_DATA_PARQUET_FOOTER_NUM_ACTORS ?= 1

.PHONY: run test test-system venv lint docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@echo "installing offmeta into $(VENV) (pyproject.toml changed)"
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(VENV)/bin/python -m pip install --quiet -e '.[train,test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

run: venv
	$(VENV)/bin/offmeta run --config flows/configs/point_robot.yaml

# Two tiers (docs/development.md#tiers): the quick one, then the system tests. Exit status 5
# (nothing selected: PYTEST_ARGS named files of the other tier only) counts as passed.
# TEST_WORKERS test processes (pytest-xdist) share each tier file by file; each process has
# its own session Ray, Prefect server, S3 and MLflow servers. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test: venv
	$(VENV)/bin/python -m pytest -m 'not system' $(XDIST) $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-system: venv
	$(VENV)/bin/python -m pytest -m system $(XDIST) $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The docs site at http://127.0.0.1:8000, rebuilt on every save (tests/docs/test_site.py
# builds it with --strict).
docs: venv
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(VENV)/bin/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache
