# The README's two commands are `make demo` (the main job) and `make test` (the suite).
.PHONY: setup demo test lint bench wheel

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/amq demo

test: setup
	.venv/bin/python -m pytest -m "not soak" $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check amqtransport bridge chaos tests benchmarks examples scripts
	.venv/bin/mypy
	.venv/bin/python scripts/async_to_sync.py --check

bench: setup
	.venv/bin/python benchmarks/run_all.py

# The wheel to install on cluster nodes or ship to executors (docs/spark.md): dist/amqtransport-<version>-py3-none-any.whl
wheel: setup
	.venv/bin/python -m pip wheel --no-deps --wheel-dir dist .
