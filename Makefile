# The README's two commands are `make demo` (the main job) and `make test` (the suite).
.PHONY: setup demo test lint bench

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/amq demo

test: setup
	.venv/bin/python -m pytest -m "not soak" $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check amqtransport bridge chaos tests benchmarks examples
	.venv/bin/mypy

bench: setup
	.venv/bin/python benchmarks/run_all.py
