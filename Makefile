# The README's two commands, `make book` and `make test`, and the tools behind them.
# Each sets up .venv from requirements.txt first (again only when requirements change).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: book test check new venv chromium lab links refresh portable bench seeds mutants sweep mutate rules clean

# How many chapters execute at once, in every target that executes chapters (one
# single-threaded kernel each): `make sweep JOBS=4`. Unset, each tool picks its default: two
# (one per core), and one for `make bench` (timings of an otherwise idle machine).
JOBS ?=
export JOBS
WORKERS := $(or $(JOBS),2)

## book: set up .venv and build the HTML book into _build/html, executing the chapters whose
## code changed (two at a time, one per core) into the cache that the strict build then reads;
## `make clean book` starts from nothing
book: $(INSTALLED)
	$(BIN)/python tools/execute.py
	PAPERNOTES_QUIET=1 PAPERNOTES_EXECUTE=cache $(BIN)/jupyter-book build -W -n --keep-going -q .

## test: lint, unit tests and nbval over every chapter (each chapter executes once, on both
## cores), then the strict book build from the outputs nbval checked, and the browser checks
test: $(INSTALLED) chromium
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf _build/records
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile --nbval tests chapters
	$(BIN)/python -m pytest -m "book or slow"

## check: the fast loop, lint and the unit tests, no chapter executed (bare `pytest` does the same).
## check CHAPTERS="chapters/x.ipynb ...": one chapter's loop: its unit tests and hygiene, nbval on
## it, its seeds and mutants where they are stale (a sweep just run is not run again), then the
## strict build and the browser checks on its page and the scoreboard (the whole-book tests skip:
## the other chapters did not run; `make test` visits every page)
SLUGS := $(basename $(notdir $(CHAPTERS)))
check: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
ifeq ($(strip $(CHAPTERS)),)
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile
else
	$(BIN)/python -m pytest $(foreach s,$(SLUGS),tests/test_$(s).py)
	$(BIN)/python -m pytest tests/test_book.py -k "$(subst $(eval) , or ,$(SLUGS)) or not chapter"
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile --nbval $(CHAPTERS)
	$(BIN)/python tools/seeds_and_mutants.py sweep --stale $(CHAPTERS)
	$(BIN)/python -m pytest tests/test_seeds_and_mutants.py -k "$(subst $(eval) , or ,$(SLUGS))"
	PAPERNOTES_PAGES="$(SLUGS)" $(BIN)/python -m pytest -m book
endif

## new: lay out a chapter's four files and list it in the book (SLUG=mixup PART="..."; and, to
## fill the title and the intro's line: TITLE="..." AUTHORS="Zhang et al." YEAR=2018 ARXIV=1710.09412)
new: $(INSTALLED)
	$(BIN)/python tools/new_chapter.py $(SLUG) $(if $(PART),--part "$(PART)") \
		$(if $(TITLE),--title "$(TITLE)") $(if $(AUTHORS),--authors "$(AUTHORS)") \
		$(if $(YEAR),--year "$(YEAR)") $(if $(ARXIV),--arxiv "$(ARXIV)")

## rules: pad the house style's section rules (`# -- title ---`) to the line limit, in FILES (by
## default every Python file of papernotes/, tools/ and tests/): nobody pads one by hand
rules: $(INSTALLED)
	$(BIN)/python tools/section_rules.py $(FILES)

## venv: only set up the environment
venv: $(INSTALLED)

$(INSTALLED): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --editable .
	touch $@

## chromium: a Chromium for the browser checks: one already installed, else Debian's package
## where apt-get exists; elsewhere (macOS, a Linux without apt) the browser tests skip and say how
## to run them (tests/test_browser.py). `make book` and `make lab` never need it.
chromium:
	@$(BIN)/python tests/browser_path.py >/dev/null 2>&1 || \
	if command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "No Chromium or Chrome found and no apt-get: the browser tests will be skipped."; \
		echo "Install one (macOS: brew install --cask chromium) or set PAPERNOTES_CHROMIUM."; \
	fi

## lab: JupyterLab on the chapters, knobs live (as root too, as in containers)
lab: $(INSTALLED)
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) chapters/

## links: write the README's links and CITATION.cff from _config.yml's repository.url
links: $(INSTALLED)
	$(BIN)/python tools/book.py

## refresh: re-execute chapters and save their outputs (CHAPTERS="chapters/x.ipynb" for some)
refresh: $(INSTALLED)
	$(BIN)/python tools/refresh.py $(CHAPTERS)

## portable: run chapters on another CPU's kernels and another seed; tag the cells that hold on
## any CPU nbval-check-output (what nbval compares on other machines)
portable: $(INSTALLED)
	$(BIN)/python tools/portable.py $(CHAPTERS)

## seeds: execute chapters under the held-out seeds 1000-1004; record per claim how many it holds on
seeds: $(INSTALLED)
	$(BIN)/python tools/seeds_and_mutants.py seeds $(CHAPTERS)

## mutants: execute chapters unbroken and with each broken mechanism of tests/mutants/; each
## must fail a claim and leave every null where the unbroken run put it
mutants: $(INSTALLED)
	$(BIN)/python tools/seeds_and_mutants.py mutants $(CHAPTERS)

## sweep: seeds and mutants in one pool of JOBS workers, one record file a chapter
## (tests/seeds_and_mutants/<slug>.json)
sweep: $(INSTALLED)
	$(BIN)/python tools/seeds_and_mutants.py sweep $(CHAPTERS)

## mutate: mutation testing of each chapter's paper (papernotes/<slug>/__init__.py and its
## experiment.py, argument checks left out) against its unit tests, JOBS mutants at a time; one
## record a paper, tests/mutation/<slug>.json, read with its triage tests/mutation/<slug>.yml, and
## the scores in BENCHMARK.md (OUT=dir writes the records there instead, as the sweep workflow
## does). MUTANTS="id ..." (one chapter) runs those mutants only, writing nothing; SURVIVORS=1
## runs again only the record's survivors (after unit tests were added) and updates the record
mutate: $(INSTALLED)
	$(BIN)/python tools/mutate.py run $(CHAPTERS) $(if $(OUT),--out $(OUT)) \
		$(if $(MUTANTS),--only $(MUTANTS)) $(if $(SURVIVORS),--survivors)

## bench: time each chapter cold, and the whole book
bench: $(INSTALLED)
	$(BIN)/python tools/benchmark.py $(CHAPTERS)

clean:
	rm -rf _build
