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

It appends the scoreboard's tables (tools/scoreboard.py) to scoreboard.md as that page is read.

It also drops repeated inline scripts from the pages: under jupyter-book 1.0.4 sphinx-thebe adds
its configuration script twice, and the second copy throws "THEBE_JS_URL has already been
declared" in every reader's console.
"""

import os
from pathlib import Path


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


def append_the_scoreboard(app, docname, source):
    if docname == SCOREBOARD:
        import scoreboard

        source[0] += "\n" + scoreboard.markdown(Path(os.environ["PAPERNOTES_RECORD_DIR"]))


def setup(app):
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(Path(app.srcdir) / "_build" / "records"))
    app.connect("config-inited", execution_mode_from_environment)
    app.connect("env-before-read-docs", read_the_scoreboard_last)
    app.connect("env-get-outdated", the_scoreboard_is_always_outdated)
    app.connect("source-read", append_the_scoreboard)
    app.connect("html-page-context", drop_repeated_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
