# The two commands a user needs: `make demo` and `make test`. Both set up first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done

.PHONY: setup test demo bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

# PYTHONFAULTHANDLER: a crash after the last test (interpreter shutdown, where pytest's
# own handler is off again) still prints every thread's stack, in pytest-xdist's worker
# processes too. Two processes, each taking whole files: most of the suite's time is Ray
# starting and polling (one core's worth of waiting), and a file's fixtures (a Ray head,
# a fake cluster) then serve all its tests in one process.
test: setup
	PYTHONFAULTHANDLER=1 $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

demo: setup
	rm -rf results/demo
	$(PY) jobs/bigLSTM.py --preset tiny --max-trials 4 --trial-steps 60 --storage results/demo

bench: setup
	$(PY) -m benchmarks

# On a GPU machine: torch and numpy are all it needs (no Ray, no solver, no setup), so
# it runs with whatever python has them, e.g. `make gpu-check PYTHON=python3`.
PYTHON ?= $(PY)
gpu-check:
	$(PYTHON) scripts/gpu_check.py --device cuda

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis results
