.PHONY: install test test-extended test-durations lint format bench quickstart docs postgres

install:
	pip install "torch==2.13.0" -e ".[test,zoo]"

test:
	python -m pytest -q

test-extended:  # CI's second tier (tests/conftest.py)
	python -m pytest -q -m extended

test-durations:  # both tiers, recording each test's time (tests/slowest_first.py orders files by them)
	python -m pytest -q --store-durations && python -m pytest -q -m extended --store-durations

lint:
	ruff check sb3_worldmodels tests benchmarks examples tools
	ruff format --check sb3_worldmodels tests benchmarks examples tools
	mypy

format:
	ruff format sb3_worldmodels tests benchmarks examples tools
	ruff check --fix sb3_worldmodels tests benchmarks examples tools

quickstart:
	python examples/quickstart.py

docs:  # the documentation site, into site/ (warnings are errors)
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict

bench:
	python benchmarks/dreamerv3_speed.py

postgres:  # a local PostgreSQL server for Optuna studies in a new /tmp folder; prints its --storage URL
	scripts/postgres.sh start "$$(mktemp -d /tmp/sb3wm-pg-XXXXXX)"
