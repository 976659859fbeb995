"""Time each chapter cold (a fresh kernel, as a reader or CI runs it), its peak memory, the book.

    .venv/bin/python tools/benchmark.py            # every chapter in _toc.yml (make bench)
    .venv/bin/python tools/benchmark.py chapters/concrete.ipynb

Chapters run one after another, never side by side (two at once would share two cores), each in
a process of its own that starts the kernel, executes every cell and shuts the kernel down; the
kernel is that process's only child, so its maximum resident set is the process's
RUSAGE_CHILDREN figure. Prints a table, writes _build/benchmark.json and the committed table
BENCHMARK.md (timing some chapters updates their rows and keeps the rest). Budgets
(CONTRIBUTING.md): 45 s per chapter at most, 30 s aimed for. Timings are
measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

CHAPTER_BUDGET_S = 45
CHAPTER_AIM_S = 30
BOOK_BUDGET_S = 300
REBUILD_BUDGET_S = 60
JSON = book.ROOT / "_build" / "benchmark.json"
TABLE = book.ROOT / "BENCHMARK.md"


def time_chapter(path: Path) -> dict:
    """Execute one chapter in a fresh kernel; its wall time and the kernel's peak memory."""
    import kernels
    import nbformat

    nb = nbformat.read(path, as_version=4)
    # kernel start, imports and every cell, kernel shut down and reaped
    seconds = kernels.execute(nb, path, record_dir=book.ROOT / "_build" / "records", timeout=600)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    return {"seconds": round(seconds, 1), "peak_mib": round(peak_kib / 1024)}


def measure_in_own_process(path: Path) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--one", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_table(report: dict) -> None:
    rows = [
        f"| {slug} | {m['seconds']:.1f} | {m['peak_mib']} | {verdict(m['seconds'])} |"
        for slug, m in report["chapters"].items()
    ]
    book_rows = ""
    if report.get("book"):
        cold, again = report["book"]["cold_s"], report["book"]["again_s"]
        book_rows = (
            f"| **`make book`, cold** (two chapters at a time) | **{cold:.1f}** | | "
            f"{'within' if cold <= BOOK_BUDGET_S else 'OVER'} {BOOK_BUDGET_S} s |\n"
            f"| **`make book` again, nothing changed** | **{again:.1f}** | | "
            f"{'within' if again <= REBUILD_BUDGET_S else 'OVER'} {REBUILD_BUDGET_S} s |\n"
        )
    TABLE.write_text(
        "# Benchmark\n\n"
        "Each chapter executed cold (a fresh kernel: start, imports, every cell), one after\n"
        "another on an otherwise idle machine, by `make bench` (tools/benchmark.py). Peak memory\n"
        "is the kernel's maximum resident set. The book's rows time `make book` from an empty\n"
        "cache, then again with nothing changed. Budgets (CONTRIBUTING.md): 45 s a chapter,\n"
        f"30 s aimed for; the book cold under {BOOK_BUDGET_S // 60} minutes on 2 cores, a\n"
        f"rebuild with nothing changed under {REBUILD_BUDGET_S} s.\n\n"
        f"Measured {report['when']} on {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}.\n\n"
        "| chapter | seconds | peak MiB | budget |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n| chapters one after another | {report['total_s']:.1f} | | |\n"
        + book_rows
    )


def previous_rows() -> dict:
    """The chapters' last figures, read back from the committed BENCHMARK.md."""
    if not TABLE.exists():
        return {}
    found = {}
    for slug, seconds, peak in re.findall(
        r"^\| (\w+) \| ([\d.]+) \| (\d+) \|", TABLE.read_text(), re.M
    ):
        found[slug] = {"seconds": float(seconds), "peak_mib": int(peak)}
    return found


def time_make_book(cold: bool) -> float:
    """`make book`'s two steps (tools/execute.py, then the strict build), from an empty cache
    when `cold`."""
    if cold:
        shutil.rmtree(book.ROOT / "_build", ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, str(book.ROOT / "tools" / "execute.py")], check=True)
    build = [str(Path(sys.executable).parent / "jupyter-book"), "build", "-W", "-n", "-q"]
    environment = {**os.environ, "PAPERNOTES_EXECUTE": "cache"}
    subprocess.run([*build, "--keep-going", str(book.ROOT)], check=True, env=environment)
    return round(time.perf_counter() - start, 1)


def _previous_book() -> dict | None:
    if not TABLE.exists():
        return None
    text = TABLE.read_text()
    cold = re.search(r"make book`, cold\*\* \(two chapters at a time\) \| \*\*([\d.]+)", text)
    again = re.search(r"nothing changed\*\* \| \*\*([\d.]+)", text)
    if not (cold and again):
        return None
    return {"cold_s": float(cold[1]), "again_s": float(again[1])}


def verdict(seconds: float) -> str:
    if seconds > CHAPTER_BUDGET_S:
        return f"OVER {CHAPTER_BUDGET_S} s"
    return "within the aim" if seconds <= CHAPTER_AIM_S else f"under {CHAPTER_BUDGET_S} s"


def book_verdict(report: dict) -> str:
    return "within" if report["total_s"] <= BOOK_BUDGET_S else f"OVER {BOOK_BUDGET_S} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the per-chapter process
    args = parser.parse_args(argv)
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(book.ROOT / "_build" / "records"))
    if args.one:
        print(json.dumps(time_chapter(args.one.resolve())))
        return 0
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    # Timing some chapters updates their rows and keeps the others' last figures.
    measured = previous_rows() if args.chapters else {}
    old_book = _previous_book() if args.chapters else None
    for path in chapters:
        measured[path.stem] = measure_in_own_process(path)
        m = measured[path.stem]
        print(
            f"{path.stem:<28}{m['seconds']:>7.1f} s {m['peak_mib']:>6} MiB  {verdict(m['seconds'])}"
        )
    order = [p.stem for p in book.toc_chapters()]
    measured = {slug: measured[slug] for slug in order if slug in measured}
    total = round(sum(m["seconds"] for m in measured.values()), 1)
    print(f"{'book total':<28}{total:>7.1f} s over {len(measured)} chapters")
    if args.chapters:
        book_times = old_book
    else:
        book_times = {"cold_s": time_make_book(cold=True), "again_s": time_make_book(cold=False)}
        print(f"make book: {book_times['cold_s']:.1f} s cold, {book_times['again_s']:.1f} s again")
    report = {
        "chapters": measured,
        "total_s": total,
        "book": book_times,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%d"),
    }
    JSON.parent.mkdir(exist_ok=True)
    JSON.write_text(json.dumps(report, indent=2) + "\n")
    write_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
