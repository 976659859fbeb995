"""Claims: statuses, conditions and margins, the table, the assertion, the record."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import papernotes as pn
from papernotes import chapter
from papernotes.claims import Claims, ClaimsFailed, book_root, margin, record_dir

LAX = Path(__file__).parent / "nbval_sanitize_lax.cfg"


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setenv("PAPERNOTES_RECORD_DIR", str(tmp_path))
    monkeypatch.setattr(chapter, "_started_at", 0.0)
    monkeypatch.setattr(chapter, "_seed", 3)
    monkeypatch.setattr(chapter.time, "perf_counter", lambda: 12.345)
    return tmp_path


def test_a_condition_decides_whether_a_claim_holds_and_gives_its_margin():
    claims = Claims("demo")
    a = claims.add(
        "A beats B",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p",
        ours="o",
        measured=0.8,
        op=">=",
        bound=0.7,
    )
    b = claims.add(
        "close",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p",
        ours="o",
        measured=0.72,
        op=">=",
        bound=0.7,
    )
    c = claims.add(
        "lower is better",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p",
        ours="o",
        measured=np.float64(5.0),
        op="<",
        bound=torch.tensor(4.0),
    )
    assert a.holds and a.margin == pytest.approx(0.1 / 0.8) and not a.thin
    assert b.holds and b.thin
    assert not c.holds and c.margin == pytest.approx(-0.2)
    assert [x.condition() for x in (a, c)] == ["0.8 ≥ 0.7", "5 < 4"]


def test_margin_is_the_gap_as_a_fraction_of_the_larger_value():
    assert margin(0.07, "<=", 0.2) == pytest.approx(0.65)
    assert margin(2.0, ">", 1.0) == pytest.approx(0.5)
    assert margin(0.0, ">=", 0.0) == 0.0


def test_claims_that_hold_pass_and_are_recorded_with_status_margin_and_seed(records):
    claims = Claims("demo")
    claims.add(
        "A beats B",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p",
        ours="o",
        measured=2.0,
        op=">",
        bound=1.0,
        baseline=1.0,
    )
    claims.add("analog", kind=pn.PAPER, paper="p", ours="o", status=pn.ANALOG, holds=np.bool_(True))
    claims.add(
        "not here",
        kind=pn.PAPER,
        paper="p",
        ours="o",
        status=pn.NOT_REPRODUCED,
        measured=1,
        op=">",
        bound=2,
    )
    claims.check()  # the not-reproduced row does not fail the chapter
    record = json.loads((records / "demo.json").read_text())
    assert record["chapter"] == "demo" and record["all_hold"] is True and record["seed"] == 3
    assert record["seconds"] == 12.35
    first, second, third = record["claims"]
    assert (first["status"], first["margin"], first["baseline"]) == ("reproduced", 0.5, 1.0)
    assert (second["status"], second["margin"]) == ("analog", None)
    assert (third["status"], third["holds"]) == ("not reproduced", False)


def test_a_failing_claim_raises_naming_it_and_is_still_recorded(records):
    claims = Claims("demo")
    claims.add("holds", kind=pn.PAPER, status=pn.REPRODUCED, paper="x", ours="y", holds=True)
    claims.add(
        "GS beats REINFORCE",
        kind=pn.PAPER,
        paper="101.5 vs 110.6",
        ours="23 vs 21",
        measured=23,
        op="<",
        bound=21,
        status=pn.ANALOG,
    )
    with pytest.raises(ClaimsFailed, match=r"1 claim\(s\) of 'demo' do not hold: 'GS beats"):
        claims.check()
    assert issubclass(ClaimsFailed, AssertionError)
    record = json.loads((records / "demo.json").read_text())
    assert record["all_hold"] is False
    assert [c["holds"] for c in record["claims"]] == [True, False]


def test_a_chapter_without_claims_fails(records):
    with pytest.raises(ClaimsFailed, match="checks no claims"):
        Claims("demo").check()


@pytest.mark.parametrize("holds", [1, "yes", torch.tensor([True, False]), 0.5])
def test_holds_must_be_a_boolean(holds):
    with pytest.raises(TypeError, match="holds must be a boolean"):
        Claims("demo").add(
            "x", kind=pn.PAPER, status=pn.REPRODUCED, paper="p", ours="o", holds=holds
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "either measured, op and bound, or holds"),
        ({"measured": 1, "op": ">", "bound": 0, "holds": True}, ValueError, "not both"),
        ({"measured": 1, "op": "=>", "bound": 0}, ValueError, "op must be one of"),
        ({"measured": float("nan"), "op": ">", "bound": 0}, TypeError, "finite number"),
        ({"holds": True, "status": "sort of"}, ValueError, "status must be one of"),
    ],
)
def test_a_claim_is_stated_one_way_and_with_a_known_status(kwargs, error, message):
    with pytest.raises(error, match=message):
        Claims("demo").add(
            "x", kind=pn.PAPER, **{"status": pn.REPRODUCED, "paper": "p", "ours": "o", **kwargs}
        )


def test_the_table_shows_status_condition_margin_and_verdict_escaped():
    claims = Claims("demo")
    claims.add(
        "a <b> claim",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p & q",
        ours="o",
        measured=0.72,
        op=">=",
        bound=0.7,
    )
    claims.add("second", kind=pn.PAPER, status=pn.REPRODUCED, paper="p", ours="o", holds=False)
    claims.add("third", kind=pn.PAPER, paper="p", ours="o", status=pn.NOT_REPRODUCED, holds=False)
    table = claims._repr_mimebundle_()["text/html"]
    assert table.count("<tr>") == 4
    assert "a &lt;b&gt; claim" in table and "p &amp; q" in table
    assert "<td>holds (thin)</td>" in table and '<td class="pn-measured">+3%</td>' in table
    assert "<td>FAILS</td>" in table and "<td>does not hold</td>" in table
    assert "not reproduced" in repr(claims)


def sanitized(text: str, config: Path) -> str:
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns(config.read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_another_machine_compares_the_verdicts_and_not_the_measurements():
    """The text view holds no number, and the lax sanitizer masks exactly the measured columns:
    two runs that differ in rounding read the same, a flipped verdict or status does not."""

    def shown(measured, status=pn.ANALOG, bound=0.7):
        claims = Claims("demo")
        claims.add(
            "the claim",
            kind=pn.PAPER,
            paper="paper's 0.9",
            ours=f"{measured:.3f}",
            status=status,
            measured=measured,
            op=">=",
            bound=bound,
        )
        claims.add(
            "yes or no", kind=pn.PAPER, status=pn.REPRODUCED, paper="p", ours="o", holds=True
        )
        bundle = claims._repr_mimebundle_()
        return bundle["text/plain"], sanitized(bundle["text/html"], LAX)

    assert shown(0.72) == shown(0.9134)  # thin on one machine, not on the other
    assert "0.9" not in shown(0.9134)[0] and "paper&#x27;s 0.9" in shown(0.9134)[1]
    assert shown(0.72) != shown(0.69)  # the verdict flipped
    assert shown(0.72) != shown(0.72, status=pn.REPRODUCED)
    assert shown(0.72)[0].splitlines()[1] == "- holds (analog): the claim"


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


def test_a_row_has_a_kind_and_a_check_has_no_status(records):
    claims = Claims("demo")
    with pytest.raises(ValueError, match="kind"):
        claims.add("x", kind="claim", paper="p", ours="o", holds=True)
    with pytest.raises(ValueError, match="needs a status"):
        claims.add("x", kind=pn.PAPER, paper="p", ours="o", holds=True)
    with pytest.raises(ValueError, match="a check has no status"):
        claims.add("x", kind=pn.CHECK, status=pn.ANALOG, paper="", ours="o", holds=True)
    check = claims.add("control", kind=pn.CHECK, paper="", ours="o", holds=False)
    assert (check.status, check.must_hold, check.failed) == ("check", True, True)
    with pytest.raises(ClaimsFailed, match="control"):
        claims.check()  # a failed check stops the chapter like a failed claim
    html = claims._repr_mimebundle_()["text/html"]
    assert "<td>check</td><td>the book&#x27;s own check</td>" in html


def test_a_result_not_run_says_why_and_never_fails(records):
    claims = Claims("demo")
    with pytest.raises(ValueError, match="not run has no measurement"):
        claims.add("x", kind=pn.PAPER, status=pn.NOT_RUN, paper="p", ours="o", holds=False)
    row = claims.add(
        "cart-pole",
        kind=pn.PAPER,
        status=pn.NOT_RUN,
        paper="Table 1",
        ours="not run: no policy is trained inside the model here",
    )
    claims.add("a", kind=pn.PAPER, status=pn.ANALOG, paper="p", ours="o", holds=True)
    assert (row.holds, row.must_hold, row.verdict(), row.condition()) == (
        None,
        False,
        "not run",
        "—",
    )
    claims.check()
    saved = json.loads((records / "demo.json").read_text())["claims"]
    assert [(c["kind"], c["status"], c["must_hold"]) for c in saved] == [
        ("paper", "not run", False),
        ("paper", "analog", True),
    ]
