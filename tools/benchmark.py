"""Time each chapter cold (a fresh kernel, as a reader or CI runs it) and the whole book.

    .venv/bin/python tools/benchmark.py            # every chapter in _toc.yml
    .venv/bin/python tools/benchmark.py chapters/concrete.ipynb

Chapters run one after another, never side by side (two at once would share two cores).
Prints a table and writes _build/benchmark.json (timing some chapters updates their entries and
keeps the rest). Budgets (BOOK.md): 60 s per chapter at most,
30 s aimed for; under 10 minutes for the whole book. Timings are measured here, never asserted
in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

CHAPTER_BUDGET_S = 60
BOOK_BUDGET_S = 600


def time_chapter(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()  # kernel start, imports and every cell
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    args = parser.parse_args(argv)
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(book.ROOT / "_build" / "records"))
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    out = book.ROOT / "_build" / "benchmark.json"
    # Timing some chapters updates their entries and keeps the others' last figures.
    seconds = json.loads(out.read_text())["chapters_s"] if args.chapters and out.exists() else {}
    for path in chapters:
        seconds[path.stem] = round(time_chapter(path), 1)
        flag = "" if seconds[path.stem] <= CHAPTER_BUDGET_S else f"  OVER {CHAPTER_BUDGET_S} s"
        print(f"{path.stem:<28}{seconds[path.stem]:>7.1f} s{flag}", flush=True)
    total = round(sum(seconds.values()), 1)
    budget = f"over {len(seconds)} chapters (budget {BOOK_BUDGET_S} s)"
    print(f"{'book total':<28}{total:>7.1f} s {budget}")
    out.parent.mkdir(exist_ok=True)
    report = {
        "chapters_s": seconds,
        "total_s": total,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
