# The README's two commands, `make book` and `make test`, and the tools behind them.
# Each sets up .venv from requirements.txt first (again only when requirements change).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: book test venv chromium lab stamp refresh bench seeds mutants clean

## book: set up .venv and build the HTML book into _build/html, executing every chapter
## (two at a time, one per core, into a fresh cache that the strict build then reads)
book: $(STAMP)
	$(BIN)/python tools/execute.py
	PAPERNOTES_QUIET=1 PAPERNOTES_EXECUTE=cache $(BIN)/jupyter-book build --all -W -n --keep-going .

## test: lint, unit tests and nbval over every chapter (each chapter executes once, on both
## cores), then the strict book build from the outputs nbval checked, and the browser checks
test: $(STAMP) chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf _build/records
	$(BIN)/python -m pytest -n 2 --dist loadfile
	$(BIN)/python -m pytest -m book

## venv: only set up the environment
venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --editable .
	touch $@

## chromium: Debian's Chromium for the browser check (playwright cannot download a browser here)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

## lab: JupyterLab on the chapters, knobs live (as root too, as in containers)
lab: $(STAMP)
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) chapters/

## stamp: write the README's links and CITATION.cff from _config.yml's repository.url
stamp: $(STAMP)
	$(BIN)/python tools/book.py

## refresh: re-execute chapters and save their outputs (CHAPTERS="chapters/x.ipynb" for some)
refresh: $(STAMP)
	$(BIN)/python tools/refresh.py $(CHAPTERS)

## seeds: execute chapters under seeds 0-4; record per claim how many seeds it holds on
seeds: $(STAMP)
	$(BIN)/python tools/robustness.py seeds $(CHAPTERS)

## mutants: execute chapters with each broken mechanism of tests/mutants/; each must fail a claim
mutants: $(STAMP)
	$(BIN)/python tools/robustness.py mutants $(CHAPTERS)

## bench: time each chapter cold, and the whole book
bench: $(STAMP)
	$(BIN)/python tools/benchmark.py

clean:
	rm -rf _build
