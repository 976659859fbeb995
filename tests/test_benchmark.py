"""The benchmark's table: budgets in calibration units, some chapters timed keep the other rows
(a clone has no _build/benchmark.json; the committed BENCHMARK.md is where the last figures are
read back), and `make bench` honours CHAPTERS and JOBS."""

import re
import shutil

import benchmark
import book
import pytest


def report(chapters, book_times=None, calibration_s=10.0):
    return {
        "chapters": chapters,
        "total_s": sum(m["seconds"] for m in chapters.values()),
        "book": book_times,
        "calibration_s": calibration_s,
        "jobs": 1,
        "machine": {"cpus": 2, "python": "3.11"},
        "when": "2026-12-01",
    }


def test_rows_and_book_times_read_back_from_the_committed_table(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmark, "TABLE", tmp_path / "BENCHMARK.md")
    chapters = {
        "batch_norm": {"seconds": 33.2, "units": 3.32, "peak_mib": 489},
        "jsma": {"seconds": 14.0, "units": 1.4, "peak_mib": 5},
    }
    benchmark.write_table(
        report(chapters, {"cold_s": 251.3, "again_s": 12.5, "calibration_s": 12.0})
    )
    assert benchmark.previous_rows() == chapters
    assert benchmark._previous_book() == {"cold_s": 251.3, "again_s": 12.5, "calibration_s": 12.0}
    text = benchmark.TABLE.read_text()
    budget = benchmark.book_budget_units(2)
    assert (
        "| **`make book`, cold** (two chapters at a time) | **251.3** | **20.94** | | "
        f"OVER {budget:.2f} |" in text
    )


def test_budgets_are_ratios_to_the_calibration_not_seconds():
    # the same chapter on a machine three times as fast: a third of the seconds, the same units
    slow, fast = benchmark.units(42.0, 12.0), benchmark.units(14.0, 4.0)
    assert slow == fast == 3.5
    assert benchmark.verdict(slow) == benchmark.verdict(fast) == f"under {45 / 12:.2f}"
    assert benchmark.verdict(benchmark.units(23.7, 4.0)).startswith("OVER")  # 71 s there
    assert benchmark.verdict(benchmark.units(24.0, 12.0)) == "within the aim"
    # the book's budget grows with its chapters: five minutes for fourteen on the reference
    reference = benchmark.REFERENCE_CALIBRATION_S
    assert round(benchmark.book_budget_units(14) * reference) == 300
    assert benchmark.book_budget_units(15) > benchmark.book_budget_units(14)


def test_make_bench_passes_chapters_and_jobs_to_the_tool():
    makefile = (book.ROOT / "Makefile").read_text()
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "tools/benchmark.py $(CHAPTERS)" in recipe
    assert re.search(r"^export JOBS$", makefile, re.M)


def test_timing_some_chapters_keeps_the_committed_files_other_rows(tmp_path, monkeypatch):
    """`make bench CHAPTERS=...` on a copy of the committed BENCHMARK.md: the chapter timed gets
    its new row, every other chapter keeps the committed one, and so does the book's."""
    copy = tmp_path / "BENCHMARK.md"
    shutil.copy(book.ROOT / "BENCHMARK.md", copy)
    monkeypatch.setattr(benchmark, "TABLE", copy)
    committed = benchmark.previous_rows()
    assert set(committed) == {p.stem for p in book.toc_chapters()}, "make bench, the whole book"
    first = next(iter(committed))
    timed = {first: {"seconds": 1.0, "units": 0.1, "peak_mib": 1}}
    monkeypatch.setattr(benchmark, "calibrate", lambda jobs: 10.0)
    monkeypatch.setattr(benchmark, "measure", lambda paths, jobs: [dict(timed[first])])
    monkeypatch.setattr(benchmark, "JSON", tmp_path / "benchmark.json")
    assert benchmark.main([str(book.ROOT / "chapters" / f"{first}.ipynb")]) == 0
    after = benchmark.previous_rows()
    assert after[first] == timed[first]
    assert {s: r for s, r in after.items() if s != first} == {
        s: r for s, r in committed.items() if s != first
    }
    assert benchmark._previous_book() is not None


def test_a_table_it_cannot_read_is_refused_before_anything_is_measured(
    tmp_path, monkeypatch, capsys
):
    """The trap of 2026-12-07: the committed table was in an older format, `previous_rows()`
    kept nothing, and `make bench CHAPTERS=...` wrote a table of one chapter."""
    old = tmp_path / "BENCHMARK.md"
    old.write_text(
        "# Benchmark\n\n| chapter | seconds | peak MiB | budget |\n|---|---|---|---|\n"
        "| batch_norm | 39.9 | 477 | under 45 s |\n"
    )
    monkeypatch.setattr(benchmark, "TABLE", old)
    before = old.read_text()
    with pytest.raises(benchmark.UnreadableTable, match="not in this tool's format"):
        benchmark.previous_rows()

    def never(*_):
        raise AssertionError("measured a chapter although the table cannot be kept")

    monkeypatch.setattr(benchmark, "calibrate", never)
    assert benchmark.main([str(book.ROOT / "chapters" / "jsma.ipynb")]) == 2
    assert "`make bench` without CHAPTERS" in capsys.readouterr().err
    assert old.read_text() == before
    # --report times and prints, and never writes the table
    monkeypatch.setattr(benchmark, "calibrate", lambda jobs: 10.0)
    monkeypatch.setattr(benchmark, "measure", lambda paths, jobs: [{"seconds": 5.0, "peak_mib": 1}])
    monkeypatch.setattr(benchmark, "JSON", tmp_path / "benchmark.json")
    assert benchmark.main(["--report", str(book.ROOT / "chapters" / "jsma.ipynb")]) == 0
    assert "jsma" in capsys.readouterr().out and old.read_text() == before


def test_rewriting_the_timings_keeps_make_mutates_section(tmp_path, monkeypatch):
    """`make mutate` writes its scores between markers in BENCHMARK.md (a table with a row a
    chapter too): `make bench` reads its own rows back without them and keeps them as they are."""
    import mutation_records

    monkeypatch.setattr(benchmark, "TABLE", tmp_path / "BENCHMARK.md")
    chapters = {"jsma": {"seconds": 14.0, "units": 1.4, "peak_mib": 5}}
    benchmark.write_table(report(chapters))
    start, end = mutation_records.SECTION
    section = f"{start}\n| chapter | mutants | killed |\n|---|---|---|\n| jsma | 120 | 100 |\n{end}"
    benchmark.TABLE.write_text(benchmark.TABLE.read_text() + "\n" + section + "\n")
    assert benchmark.previous_rows() == chapters
    benchmark.write_table(
        report({**chapters, "bert": {"seconds": 9.0, "units": 0.9, "peak_mib": 7}})
    )
    text = benchmark.TABLE.read_text()
    assert text.count(section) == 1 and text.rstrip().endswith(end)
    assert set(benchmark.previous_rows()) == {"jsma", "bert"}
