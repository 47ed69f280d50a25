# Shortcuts; each target does its own set-up through scripts/setup.sh.
.PHONY: setup test report lab notebook

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh

report:
	bash scripts/report.sh -o parity-report.html

lab: setup
	.venv/bin/jupyter lab notebooks/

notebook: setup
	.venv/bin/python scripts/make_notebook.py
