# Shortcuts for developers (a fresh machine needs only Python: see README).
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: install run test lint ci bench

$(BIN)/curator:
	python3 -m venv $(VENV)
	$(BIN)/pip install -e '.[dev]'

install: $(BIN)/curator

run: install
	$(BIN)/curator serve

test: install
	$(BIN)/pytest -q -n auto

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy && $(BIN)/lint-imports

ci:
	.ci/run
