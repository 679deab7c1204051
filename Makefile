PY ?= .venv/bin/python
VENV := .venv/bin/fusee

.PHONY: fmt lint type test bench venv

fmt: $(VENV)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

lint: $(VENV)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

type: $(VENV)
	$(PY) -m mypy

# The whole suite, then the server-backed tests again with actors evicted after every
# step, so each run resumes by replay. Two processes (pytest-xdist), a module's tests on
# one: the tests mostly wait, and 2 cores then finish the suite in about half the time.
XDIST := -n 2 --dist loadfile

test: $(VENV)
	$(PY) -m pytest -q $(XDIST)
	FUSEE_ALWAYS_REPLAY=1 $(PY) -m pytest -q $(XDIST) tests/integration tests/chaos

bench: $(VENV)
	$(PY) -m bench
	$(PY) -m bench.streams
	$(PY) -m bench.step_cpu
	$(PY) -m bench.objects
	$(PY) -m bench.parked
	$(PY) -m bench.bulk
	$(PY) -m bench.minimums
	$(PY) -m bench.agent_loop
	$(PY) -m bench.pydantic_ai
	$(PY) -m bench.openai_agents

venv: $(VENV)

# A file target: the venv is built once, when its `fusee` script is missing.
$(VENV):
	python3 -m venv .venv
	.venv/bin/python -m pip install -e '.[dev]'
