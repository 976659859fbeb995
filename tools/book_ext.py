"""A small Sphinx extension for the papernotes book, loaded from _config.yml.

While the book builds it executes every chapter in a kernel that inherits this process's
environment; this extension sets that environment:

- PAPERNOTES_QUIET=1: progress bars stay off (nobody watches them; their rates would show on
  the page);
- PAPERNOTES_RECORD_DIR=_build/records: each chapter's claims and run time land beside the build.

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


def setup(app):
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(Path(app.srcdir) / "_build" / "records"))
    app.connect("html-page-context", drop_repeated_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
