"""Time each chapter cold (a fresh kernel, as a reader or CI runs it), its peak memory, the book,
against a calibration run measured in the same `make bench`.

    .venv/bin/python tools/benchmark.py            # every chapter in _toc.yml, and the book
    .venv/bin/python tools/benchmark.py chapters/concrete.ipynb   # its row (make bench CHAPTERS=)

**Budgets name no machine; a calibration does.** Seconds mean little without the machine's speed:
a contributor's laptop may run three times as fast as the machine that wrote BENCHMARK.md. So
every `make bench` first times tools/calibration.ipynb cold, like a chapter (a fresh kernel, the
book's setup, a small classifier trained for a fixed number of updates), and states each chapter
as a multiple of it: its *units*. The budgets are set in units, from the benchmark machine's
seconds: 45 s a chapter at most and 30 s aimed for, where the calibration took
REFERENCE_CALIBRATION_S. A row measured on any machine is then checked against the same budget.

**The book's budget scales with its chapters**: five minutes cold for fourteen chapters on two
cores (BOOK.md), so 300 s / 14 a chapter, in units; a rebuild with nothing changed under a minute.
On the CI's matrix (.github/workflows/book.yml) the book's wall time is its slowest chapter
plus the build.

Chapters run one at a time by default (two at once share two cores and time a loaded machine);
`JOBS=N` runs N at once and the calibration N times at once too, so that the ratio compares like
with like. Each runs in a process of its own that starts the kernel, executes every cell and
shuts the kernel down; the kernel is that process's only child, so its maximum resident set is
the process's RUSAGE_CHILDREN figure.

`make bench CHAPTERS=...` times those chapters only and updates their rows of BENCHMARK.md; the
other rows and the book's keep their last figures (with their own calibration). It reads them
back before it measures, and refuses a BENCHMARK.md whose table it cannot read rather than write
one that has lost them. `--report` prints the figures and writes nothing. Without
CHAPTERS it times every chapter and `make book` cold and again. It also copies each chapter's
seeds-and-mutants time from its record, and the whole book's last sweep (`make sweep`) when one
ran in this checkout. Timings are measured here, never asserted in tests.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book
import kernels
import mutation_records
import sweep_records

# The benchmark machine's calibration (2 cores, tools/calibration.ipynb cold, alone): the budgets'
# seconds are this machine's, and every other machine's figures are read as multiples of it.
REFERENCE_CALIBRATION_S = 12.0
CHAPTER_BUDGET_UNITS = 45 / REFERENCE_CALIBRATION_S
CHAPTER_AIM_UNITS = 30 / REFERENCE_CALIBRATION_S
BOOK_PER_CHAPTER_UNITS = 300 / 14 / REFERENCE_CALIBRATION_S
REBUILD_BUDGET_S = 60
CALIBRATION = book.ROOT / "tools" / "calibration.ipynb"
JSON = book.ROOT / "_build" / "benchmark.json"
TABLE = book.ROOT / "BENCHMARK.md"
LAST_SWEEP = book.ROOT / "_build" / "last_sweep.json"
HEADER = "| chapter | seconds | units | peak MiB | budget (units) | sweep (s) |"


class UnreadableTable(Exception):
    """BENCHMARK.md holds a table this tool cannot read back: timing some chapters would
    overwrite the other rows with nothing."""


def time_chapter(path: Path) -> dict:
    """Execute one chapter in a fresh kernel; its wall time and the kernel's peak memory."""
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


def measure(paths: list[Path], jobs: int) -> list[dict]:
    """Each path timed in its own process, `jobs` at a time; results in the paths' order."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(measure_in_own_process, paths))


def calibrate(jobs: int) -> float:
    """The calibration's cold time, run `jobs` times at once (the load the chapters will see)."""
    times = [m["seconds"] for m in measure([CALIBRATION] * jobs, jobs)]
    return round(sum(times) / len(times), 2)


def units(seconds: float, calibration_s: float) -> float:
    return round(seconds / calibration_s, 2)


def verdict(chapter_units: float) -> str:
    """A chapter against its budget, in calibration units (45 s and 30 s on the benchmark
    machine)."""
    if chapter_units > CHAPTER_BUDGET_UNITS:
        return f"OVER {CHAPTER_BUDGET_UNITS:.2f}"
    if chapter_units <= CHAPTER_AIM_UNITS:
        return "within the aim"
    return f"under {CHAPTER_BUDGET_UNITS:.2f}"


def book_budget_units(chapters: int) -> float:
    """The book's cold budget for `chapters` chapters, in calibration units."""
    return round(BOOK_PER_CHAPTER_UNITS * chapters, 2)


def write_table(report: dict) -> None:
    rows = [
        f"| {slug} | {m['seconds']:.1f} | {m['units']:.2f} | {m['peak_mib']} | "
        f"{verdict(m['units'])} | {_sweep_cell(slug)} |"
        for slug, m in report["chapters"].items()
    ]
    book_rows = ""
    if report.get("book"):
        b = report["book"]
        budget = book_budget_units(len(report["chapters"]))
        cold_units = units(b["cold_s"], b["calibration_s"])
        book_rows = (
            f"| **`make book`, cold** (two chapters at a time) | **{b['cold_s']:.1f}** | "
            f"**{cold_units:.2f}** | | {'within' if cold_units <= budget else 'OVER'} "
            f"{budget:.2f} | |\n"
            f"| **`make book` again, nothing changed** | **{b['again_s']:.1f}** | | | "
            f"{'within' if b['again_s'] <= REBUILD_BUDGET_S else 'OVER'} {REBUILD_BUDGET_S} s | |\n"
        )
    TABLE.write_text(
        timing_text(report, rows, book_rows) + mutation_section(),
    )


def mutation_section() -> str:
    """BENCHMARK.md's mutation scores, which `make mutate` writes between its markers
    (tools/mutation_records.py): kept as they are when the timings are rewritten."""
    if not TABLE.exists():
        return ""
    start, end = mutation_records.SECTION
    text = TABLE.read_text()
    if start not in text or end not in text:
        return ""
    return "\n" + text[text.index(start) : text.index(end) + len(end)] + "\n"


def timing_text(report: dict, rows: list[str], book_rows: str) -> str:
    return (
        "# Benchmark\n\n"
        "Each chapter executed cold (a fresh kernel: start, imports, every cell) by `make bench`\n"
        "(tools/benchmark.py), beside a calibration run of the same kind\n"
        "(tools/calibration.ipynb: the book's setup and a small classifier trained for a fixed\n"
        "number of updates). A\n"
        "chapter's *units* are its seconds divided by that calibration's, so that a budget means\n"
        "the same on any machine. The budgets, in units, are the benchmark machine's seconds\n"
        f"divided by its calibration ({REFERENCE_CALIBRATION_S:.1f} s): a chapter at most "
        f"{CHAPTER_BUDGET_UNITS:.2f} (45 s there),\n"
        f"{CHAPTER_AIM_UNITS:.2f} aimed for (30 s); the book cold "
        f"{BOOK_PER_CHAPTER_UNITS:.2f} a chapter (five minutes for fourteen\n"
        f"chapters on two cores); a rebuild with nothing changed under {REBUILD_BUDGET_S} s. Peak "
        "memory is the kernel's\nmaximum resident set. *Sweep* is the CPU time of the chapter's "
        "five held-out seeds, its\nunbroken run and its broken mechanisms (`make sweep`), from "
        "its record.\n\n"
        f"Measured {report['when']} on {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}, {report['jobs']} at a time; calibration "
        f"{report['calibration_s']:.1f} s.\n\n"
        f"{HEADER}\n"
        "|---|---|---|---|---|---|\n"
        + "\n".join(rows)
        + f"\n| chapters one after another | {report['total_s']:.1f} | | | | |\n"
        + book_rows
        + sweep_section(list(report["chapters"]))
    )


def _sweep_cell(slug: str) -> str:
    record = sweep_records.load(slug)
    seconds = [record[p].get("seconds") for p in ("seeds", "mutants") if p in record]
    if not seconds or None in seconds:
        return "—"
    return f"{sum(seconds):.0f}"


def sweep_section(slugs: list[str]) -> str:
    """The seeds-and-mutants sweep: its CPU time one chapter after another, what two cores make
    of it, and what the CI's matrix (a job a chapter) waits for: its slowest chapter."""
    times = {s: _sweep_cell(s) for s in slugs}
    known = {s: float(t) for s, t in times.items() if t != "—"}
    if not known:
        return ""
    serial = sum(known.values())
    slowest = max(known, key=known.get)
    lines = [
        "\n## The seeds-and-mutants sweep\n",
        f"- one run after another: {serial:.0f} s ({serial / 60:.0f} minutes) over "
        f"{len(known)} chapters, from their records;",
        f"- `JOBS=2` on two cores: about {serial / 2:.0f} s;",
        f"- the CI's matrix (.github/workflows/sweep.yml, a job a chapter): about its slowest "
        f"chapter's, {slowest} {known[slowest]:.0f} s, plus each job's set-up.",
    ]
    if LAST_SWEEP.exists():
        last = json.loads(LAST_SWEEP.read_text())
        lines.append(
            f"- the whole book's last `make sweep` in this checkout: {last['seconds']} s with "
            f"JOBS={last['jobs']} ({last['runs']} runs)."
        )
    return "\n".join(lines) + "\n"


def previous_rows() -> dict:
    """The chapters' last figures, read back from the committed BENCHMARK.md (none when there is
    no file). Raises UnreadableTable, naming what it found, for a file whose table is in another
    format or has no chapter rows it can read: the caller stops before measuring, rather than
    write a table that has lost every other row."""
    if not TABLE.exists():
        return {}
    text = timings_part(TABLE.read_text())
    headers = [line for line in text.splitlines() if line.startswith("| chapter |")]
    if headers != [HEADER]:
        found = headers[0] if headers else "no '| chapter |' table"
        raise UnreadableTable(
            f"{TABLE.name}: its table is not in this tool's format (found {found!r}; expected "
            f"{HEADER!r}), so timing some chapters would drop the others' rows. To time "
            f"chapters without writing the table: `.venv/bin/python tools/benchmark.py --report "
            f"chapters/<slug>.ipynb`; to rewrite it, `make bench` without CHAPTERS (every "
            f"chapter), or restore the file from git."
        )
    found = {}
    pattern = r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|"
    rows = re.findall(pattern, text, re.M)
    if not rows:
        raise UnreadableTable(f"{TABLE.name}: its table has no chapter row this tool can read")
    for slug, seconds, chapter_units, peak in rows:
        found[slug] = {
            "seconds": float(seconds),
            "units": float(chapter_units),
            "peak_mib": int(peak),
        }
    return found


def timings_part(text: str) -> str:
    """BENCHMARK.md less `make mutate`'s section, whose table has rows a chapter too."""
    start = mutation_records.SECTION[0]
    return text[: text.index(start)] if start in text else text


def _previous_book() -> dict | None:
    if not TABLE.exists():
        return None
    text = timings_part(TABLE.read_text())
    cold = re.search(
        r"make book`, cold\*\* \(two chapters at a time\) \| \*\*([\d.]+)\*\* \| \*\*([\d.]+)", text
    )
    again = re.search(r"nothing changed\*\* \| \*\*([\d.]+)", text)
    if not (cold and again):
        return None
    cold_s, cold_units = float(cold[1]), float(cold[2])
    return {
        "cold_s": cold_s,
        "again_s": float(again[1]),
        "calibration_s": round(cold_s / cold_units, 2),
    }


def time_make_book(cold: bool) -> float:
    """`make book`'s two steps (tools/execute.py, then the strict build), from an empty cache
    when `cold`."""
    if cold:
        shutil.rmtree(book.ROOT / "_build" / ".jupyter_cache", ignore_errors=True)
        shutil.rmtree(book.ROOT / "_build" / "html", ignore_errors=True)
    start = time.perf_counter()
    environment = {**os.environ, "JOBS": "2"}
    subprocess.run(
        [sys.executable, str(book.ROOT / "tools" / "execute.py")], check=True, env=environment
    )
    build = [str(Path(sys.executable).parent / "jupyter-book"), "build", "-W", "-n", "-q"]
    environment["PAPERNOTES_EXECUTE"] = "cache"
    subprocess.run([*build, "--keep-going", str(book.ROOT)], check=True, env=environment)
    return round(time.perf_counter() - start, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    parser.add_argument(
        "--report", action="store_true", help="print the figures; write no BENCHMARK.md"
    )
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the per-chapter process
    args = parser.parse_args(argv)
    os.environ["PAPERNOTES_QUIET"] = "1"
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(book.ROOT / "_build" / "records"))
    if args.one:
        print(json.dumps(time_chapter(args.one.resolve())))
        return 0
    jobs = kernels.jobs(default=1)
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    # Timing some chapters updates their rows and keeps the others' last figures: read them
    # first, so that a table this tool cannot read stops it before it measures anything.
    try:
        measured = previous_rows() if args.chapters and not args.report else {}
    except UnreadableTable as error:
        print(f"make bench: {error}", file=sys.stderr)
        return 2
    calibration_s = calibrate(jobs)
    print(f"{'calibration':<28}{calibration_s:>7.1f} s (the unit)")
    for path, m in zip(chapters, measure(chapters, jobs), strict=True):
        m["units"] = units(m["seconds"], calibration_s)
        measured[path.stem] = m
        print(
            f"{path.stem:<28}{m['seconds']:>7.1f} s {m['units']:>6.2f} units "
            f"{m['peak_mib']:>6} MiB  {verdict(m['units'])}"
        )
    if args.report:
        return 0
    order = [p.stem for p in book.toc_chapters()]
    measured = {slug: measured[slug] for slug in order if slug in measured}
    total = round(sum(m["seconds"] for m in measured.values()), 1)
    print(f"{'chapters one after another':<28}{total:>7.1f} s over {len(measured)} chapters")
    if args.chapters:
        book_times = _previous_book()
    else:
        book_times = {
            "cold_s": time_make_book(cold=True),
            "again_s": time_make_book(cold=False),
            "calibration_s": calibration_s,
        }
        print(f"make book: {book_times['cold_s']:.1f} s cold, {book_times['again_s']:.1f} s again")
    report = {
        "chapters": measured,
        "total_s": total,
        "book": book_times,
        "calibration_s": calibration_s,
        "jobs": jobs,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%d"),
    }
    JSON.parent.mkdir(exist_ok=True)
    JSON.write_text(json.dumps(report, indent=2) + "\n")
    write_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
