"""The benchmark's table: timing some chapters keeps the other chapters' rows (a clone has no
_build/benchmark.json; the committed BENCHMARK.md is where the last figures are read back)."""

import benchmark


def report(chapters, book=None):
    return {
        "chapters": chapters,
        "total_s": sum(m["seconds"] for m in chapters.values()),
        "book": book,
        "machine": {"cpus": 2, "python": "3.11"},
        "when": "2026-12-01",
    }


def test_rows_and_book_times_read_back_from_the_committed_table(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmark, "TABLE", tmp_path / "BENCHMARK.md")
    chapters = {
        "batch_norm": {"seconds": 33.2, "peak_mib": 489},
        "jsma": {"seconds": 14.0, "peak_mib": 5},
    }
    benchmark.write_table(report(chapters, {"cold_s": 251.3, "again_s": 12.5}))
    assert benchmark.previous_rows() == chapters
    assert benchmark._previous_book() == {"cold_s": 251.3, "again_s": 12.5}
    text = benchmark.TABLE.read_text()
    assert "| **`make book`, cold** (two chapters at a time) | **251.3** | | within 300 s |" in text
    assert "over" not in text.lower().replace("overwrit", "")
