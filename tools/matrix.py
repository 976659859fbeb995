"""Which chapters a change reaches: the CI's matrices, one job a chapter
(.github/workflows/sweep.yml and book.yml).

    python tools/matrix.py                        # every chapter of _toc.yml, as a JSON list
    python tools/matrix.py --changed FILE [FILE ...]   # the chapters those files can change

A chapter is reached by its notebook, its broken mechanisms (tests/mutants/<slug>.py), and every
papernotes file it imports, directly or through others (tools/behaviour.py): a paper's folder
reaches its chapter and the later chapters that import it, a shared module every chapter. A
change to what runs the chapters (the requirements, the package's metadata, the tools that execute
chapters and keep their records) reaches every chapter too; anything else (prose pages, the
README, the browser tests) reaches none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import behaviour
import book

EVERY_CHAPTER = {
    "requirements.txt",
    "pyproject.toml",
    "_toc.yml",
    "tools/behaviour.py",
    "tools/book.py",
    "tools/kernels.py",
    "tools/matrix.py",
    "tools/seeds_and_mutants.py",
    "tools/sweep_records.py",
}


def reached(changed: list[str], root: Path = book.ROOT) -> list[str]:
    """The slugs, in book order, of the chapters whose results `changed` (paths relative to the
    repository) can change."""
    chapters = book.toc_chapters(root)
    changed = {Path(c).as_posix() for c in changed}
    if changed & EVERY_CHAPTER:
        return [p.stem for p in chapters]
    slugs = []
    for path in chapters:
        own = {f"chapters/{path.stem}.ipynb", f"tests/mutants/{path.stem}.py"}
        imported = {p.relative_to(root).as_posix() for p in behaviour.dependencies(path, root)}
        if changed & (own | imported):
            slugs.append(path.stem)
    return slugs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changed", nargs="*", help="changed files (default: every chapter)")
    args = parser.parse_args(argv)
    slugs = [p.stem for p in book.toc_chapters()] if args.changed is None else reached(args.changed)
    print(json.dumps(slugs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
