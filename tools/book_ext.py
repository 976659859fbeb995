"""A small Sphinx extension for the papernotes book, loaded from _config.yml.

While the book builds it executes every chapter in a kernel that inherits this process's
environment; this extension sets that environment:

- PAPERNOTES_QUIET=1: progress bars stay off (nobody watches them; their rates would show on
  the page);
- PAPERNOTES_RECORD_DIR=_build/records: each chapter's claims and run time land beside the build.

PAPERNOTES_EXECUTE, when set, overrides _config.yml's execute_notebooks for this build:
`make book` executes the chapters in parallel first (tools/execute.py) and builds with "cache";
the test command builds with "off", from the outputs that nbval has just checked against a fresh
run, so that each chapter executes once per test run.

It writes the scoreboard's overview and tables (tools/scoreboard.py) into scoreboard.md as that
page is read, where the page marks them.

It also drops repeated inline scripts from the pages: under jupyter-book 1.0.4 sphinx-thebe adds
its configuration script twice, and the second copy throws "THEBE_JS_URL has already been
declared" in every reader's console.

And it mends what an accessibility audit (axe-core, in tests/test_browser.py) finds in the
theme's markup, on every page once the build is done (`accessible_pages`):

- the search field's button and the colour-mode button are named by an aria-label that leaves
  out their visible text ("Search" for "Search Ctrl+K"; icons titled Light, Dark, System
  Settings): the label goes, so the name is the text a reader sees (axe's
  label-content-name-mismatch, serious);
- the fold of a hidden cell's input (`<summary aria-label="Toggle hidden content">`) hides its
  visible "Show code cell source" the same way;
- a bibliography's `<div role="list" class="citation-list">` holds entries that are not list
  items (aria-required-children, critical): the role goes.

The sidebar's second search field is left out in _config.yml (html_sidebars): one search box.
"""

import os
import re
from pathlib import Path

# (pattern, replacement) applied to every built page; each is idempotent.
ACCESSIBLE_MARKUP = [
    (
        re.compile(
            r'(<button class="btn search-button-field search-button__button[^"]*" '
            r'title="Search") aria-label="Search"'
        ),
        r"\1",
    ),
    (re.compile(r'(<i class="theme-switch [^"]*" data-mode="\w+")\s+title="[^"]*"'), r"\1"),
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>"),
    (re.compile(r'<div role="list" class="citation-list">'), '<div class="citation-list">'),
]


def accessible_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        text = original = page.read_text()
        for pattern, replacement in ACCESSIBLE_MARKUP:
            text = pattern.sub(replacement, text)
        if text != original:
            page.write_text(text)


def drop_repeated_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # An inline script's filename is None in one copy and "" in the other.
        key = (
            str(getattr(script, "filename", script) or ""),
            tuple(sorted(getattr(script, "attributes", {}).items())),
        )
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def execution_mode_from_environment(app, config):
    mode = os.environ.get("PAPERNOTES_EXECUTE")
    if mode:
        allowed = ("force", "cache", "off", "auto", "inline")
        if mode not in allowed:
            raise ValueError(
                f"PAPERNOTES_EXECUTE must be one of {', '.join(allowed)}; got {mode!r}"
            )
        config.nb_execution_mode = mode


SCOREBOARD = "scoreboard"


def read_the_scoreboard_last(app, env, docnames):
    # Its tables summarise the chapters' claim records: when the build executes the chapters
    # itself (execute_notebooks "force"), they are written while the chapters are read.
    if SCOREBOARD in docnames:
        docnames.remove(SCOREBOARD)
        docnames.append(SCOREBOARD)


def the_scoreboard_is_always_outdated(app, env, added, changed, removed):
    # Its source rarely changes, the records it summarises do (an incremental build re-reads a
    # chapter whose outputs tools/execute.py renewed; the scoreboard must follow).
    return [SCOREBOARD] if SCOREBOARD in env.found_docs else []


OVERVIEW_HERE = "% the book at a glance goes here"
CHAPTERS_HERE = "% the chapters' sections go here"


def append_the_scoreboard(app, docname, source):
    # The page's summary and overview go where scoreboard.md marks them (right under its title,
    # so that the whole book is on the first screen), the chapters' sections after its legend.
    if docname == SCOREBOARD:
        import scoreboard

        top, chapters = scoreboard.parts(Path(os.environ["PAPERNOTES_RECORD_DIR"]))
        text = source[0]
        if OVERVIEW_HERE not in text or CHAPTERS_HERE not in text:
            raise ValueError(
                f"scoreboard.md must hold the lines {OVERVIEW_HERE!r} and {CHAPTERS_HERE!r}"
            )
        source[0] = text.replace(OVERVIEW_HERE, top).replace(CHAPTERS_HERE, chapters)


def setup(app):
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(Path(app.srcdir) / "_build" / "records"))
    app.connect("config-inited", execution_mode_from_environment)
    app.connect("env-before-read-docs", read_the_scoreboard_last)
    app.connect("env-get-outdated", the_scoreboard_is_always_outdated)
    app.connect("source-read", append_the_scoreboard)
    app.connect("html-page-context", drop_repeated_scripts)
    app.connect("build-finished", accessible_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
