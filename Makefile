.PHONY: install test lint format bench quickstart

install:
	pip install "torch==2.13.0" -e ".[test,zoo]"

test:
	python -m pytest -q

lint:
	ruff check sb3_worldmodels tests benchmarks examples

format:
	ruff format sb3_worldmodels tests benchmarks examples
	ruff check --fix sb3_worldmodels tests benchmarks examples

quickstart:
	python examples/quickstart.py

bench:
	python benchmarks/dreamerv3_speed.py
