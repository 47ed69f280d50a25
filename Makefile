# Shortcuts; each target does its own set-up through scripts/setup.sh.
.PHONY: setup check test report lab notebooks

setup:
	bash scripts/setup.sh

# The fast tier: ruff, mypy, import contracts and the tests not marked slow or engine (under 3 minutes on 2 cores).
check:
	bash scripts/check.sh

# The whole suite: real llama.cpp and vLLM servers, Chromium, the docs build (see docs/development.md).
test:
	bash scripts/test.sh

report:
	bash scripts/report.sh -o parity-report.html

lab: setup
	.venv/bin/jupyter lab notebooks/

# After editing a notebook's .py (its source; see docs/development.md): write the .ipynb beside it.
notebooks: setup
	.venv/bin/jupytext --sync notebooks/*.py
