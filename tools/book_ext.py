"""A small Sphinx extension for the papernotes book, loaded from _config.yml.

While the book builds it executes every chapter in a kernel that inherits this process's
environment; this extension sets that environment:

- PAPERNOTES_QUIET=1: progress bars stay off (nobody watches them; their rates would show on
  the page);
- PAPERNOTES_RECORD_DIR=_build/records: each chapter's claims and run time land beside the build.
"""

import os
from pathlib import Path


def setup(app):
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(Path(app.srcdir) / "_build" / "records"))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
