"""Claims: the table, the assertion, the record."""

import json

import numpy as np
import pytest
import torch

from papernotes import chapter
from papernotes.claims import Claims, book_root, record_dir


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setenv("PAPERNOTES_RECORD_DIR", str(tmp_path))
    monkeypatch.setattr(chapter, "_started_at", 0.0)
    monkeypatch.setattr(chapter.time, "perf_counter", lambda: 12.345)
    return tmp_path


def test_claims_that_hold_pass_and_are_recorded(records):
    claims = Claims("demo")
    claims.add("A beats B", paper="A 1.0 vs B 2.0", ours="A 0.5 vs B 0.9", holds=0.5 < 0.9)
    claims.add("numpy booleans count", paper="-", ours="-", holds=np.float64(1) > 0)
    claims.add("torch booleans count", paper="-", ours="-", holds=torch.tensor(2) > 1)
    claims.check()
    record = json.loads((records / "demo.json").read_text())
    assert record["chapter"] == "demo" and record["all_hold"] is True
    assert record["seconds"] == 12.35
    assert [c["statement"] for c in record["claims"]] == [
        "A beats B",
        "numpy booleans count",
        "torch booleans count",
    ]


def test_a_failing_claim_raises_naming_it_and_is_still_recorded(records):
    claims = Claims("demo")
    claims.add("holds", paper="x", ours="y", holds=True)
    claims.add("GS beats REINFORCE", paper="101.5 vs 110.6", ours="23 vs 21", holds=False)
    with pytest.raises(AssertionError, match=r"1 claim\(s\) of 'demo' do not hold: 'GS beats"):
        claims.check()
    record = json.loads((records / "demo.json").read_text())
    assert record["all_hold"] is False
    assert [c["holds"] for c in record["claims"]] == [True, False]


def test_a_chapter_without_claims_fails(records):
    with pytest.raises(AssertionError, match="checks no claims"):
        Claims("demo").check()


@pytest.mark.parametrize("holds", [1, "yes", None, torch.tensor([True, False]), 0.5])
def test_holds_must_be_a_boolean(holds):
    with pytest.raises(TypeError, match="holds must be a boolean"):
        Claims("demo").add("x", paper="p", ours="o", holds=holds)


def test_the_table_shows_every_claim_escaped():
    claims = Claims("demo")
    claims.add("a <b> claim", paper="p & q", ours="o", holds=True)
    claims.add("second", paper="p", ours="o", holds=False)
    table = claims._repr_html_()
    assert table.count("<tr>") == 3
    assert "a &lt;b&gt; claim" in table and "p &amp; q" in table
    assert "&#10004; holds" in table and "&#10008; FAILS" in table
    assert "[FAILS] second" in repr(claims)


def test_slugs_must_be_names():
    with pytest.raises(ValueError, match="chapter slug"):
        Claims("batch norm")


def test_records_go_beside_the_book_or_nowhere(tmp_path, monkeypatch):
    monkeypatch.delenv("PAPERNOTES_RECORD_DIR", raising=False)
    (tmp_path / "book" / "chapters").mkdir(parents=True)
    (tmp_path / "book" / "_toc.yml").write_text("root: intro\n")
    monkeypatch.chdir(tmp_path / "book" / "chapters")
    assert book_root(tmp_path / "book" / "chapters") == tmp_path / "book"
    assert record_dir() == tmp_path / "book" / "_build" / "records"
    monkeypatch.chdir(tmp_path)
    assert record_dir() is None  # outside the book (Colab, say): no record
