"""Execute every chapter, two at a time, into the cache that the book build then reads.

    .venv/bin/python tools/execute.py      # run by `make book` before `jupyter-book build`

jupyter-book executes a book's notebooks one after another. On a 2-core machine this script
runs them in parallel instead, one single-threaded kernel per core, with jupyter-cache's
parallel executor, into a fresh _build/.jupyter_cache; the build that follows runs with
execute_notebooks "cache" (set by PAPERNOTES_EXECUTE, read by tools/book_ext.py) and takes every
chapter's outputs from there. The cache is cleared first: it keys on a notebook's code cells
only, so it would not notice a change in the papernotes package.

Each kernel writes its chapter's claims record into _build/records (for the scoreboard).
Exits non-zero, naming the chapter, when a chapter fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

CACHE = book.ROOT / "_build" / ".jupyter_cache"
TIMEOUT_S = 600


def main() -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.executors import load_executor

    os.environ["PAPERNOTES_QUIET"] = "1"  # the kernels inherit both
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(book.ROOT / "_build" / "records"))
    shutil.rmtree(CACHE, ignore_errors=True)
    cache = get_cache(CACHE)
    chapters = book.toc_chapters()
    for path in chapters:
        cache.add_nb_to_project(str(path))
    logger = logging.getLogger("papernotes.execute")
    logger.addHandler(logging.StreamHandler())
    logger.setLevel(logging.WARNING)
    start = time.perf_counter()
    result = load_executor("local-parallel", cache=cache, logger=logger).run_and_cache(
        timeout=TIMEOUT_S, allow_errors=False
    )
    seconds = time.perf_counter() - start
    failed = [Path(uri).name for uri in result.excepted + result.errored]
    for record in cache.list_project_records():
        if record.traceback:
            print(f"{Path(record.uri).name} failed:\n{record.traceback[-3000:]}", file=sys.stderr)
    print(f"executed {len(chapters) - len(failed)} of {len(chapters)} chapters in {seconds:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
