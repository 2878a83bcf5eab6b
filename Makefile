# The two commands a user needs: `make demo` and `make test`. Both set up first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

demo: setup
	rm -rf results/demo
	$(PY) jobs/bigLSTM.py --preset tiny --max-trials 2 --storage results/demo

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis results
