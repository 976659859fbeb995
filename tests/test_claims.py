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
# What a comparative row that meets the standard carries besides its condition: a null that fails
# it (0.5 is below every bound used here) and its bound's source. NO: a yes-or-no row's null.
STANDARD = {"nulls": {"untrained": 0.5}, "bound_from": "paper", "bound_why": "the paper's figure"}
NO = {"untrained": False}


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
        comparator="B",
        nulls={"a constant": 0.5},
        bound_from="paper",
        bound_why="the paper's B",
    )
    claims.add(
        "analog",
        kind=pn.PAPER,
        paper="p",
        ours="o",
        status=pn.ANALOG,
        holds=np.bool_(True),
        nulls={"untrained": False},
    )
    claims.add(
        "not here",
        kind=pn.PAPER,
        paper="p",
        ours="o",
        status=pn.NOT_REPRODUCED,
        measured=1,
        op=">",
        bound=2,
        bound_from="derived",
        bound_why="twice one",
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
    claims.add(
        "holds",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="x",
        ours="y",
        holds=True,
        nulls={"n": False},
    )
    claims.add(
        "GS beats REINFORCE",
        kind=pn.PAPER,
        paper="101.5 vs 110.6",
        ours="23 vs 21",
        measured=23,
        op="<",
        bound=21,
        status=pn.ANALOG,
        nulls={"REINFORCE": 21},
        bound_from="paper",
        bound_why="REINFORCE's",
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
        **STANDARD,
    )
    claims.add(
        "second", kind=pn.PAPER, status=pn.REPRODUCED, paper="p", ours="o", holds=False, nulls=NO
    )
    claims.add("third", kind=pn.PAPER, paper="p", ours="o", status=pn.NOT_REPRODUCED, holds=False)
    table = claims._repr_mimebundle_()["text/html"]
    assert table.count("<tr>") == 4
    assert "a &lt;b&gt; claim" in table and "p &amp; q" in table
    assert '<td data-label="verdict">holds (thin)</td>' in table
    assert '<td class="pn-measured" data-label="margin">+3%</td>' in table
    assert '<td data-label="verdict">FAILS</td>' in table
    assert '<td data-label="verdict">does not hold</td>' in table
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
            **STANDARD,
        )
        claims.add(
            "yes or no",
            kind=pn.PAPER,
            status=pn.REPRODUCED,
            paper="p",
            ours="o",
            holds=True,
            nulls=NO,
        )
        bundle = claims._repr_mimebundle_()
        return bundle["text/plain"], sanitized(bundle["text/html"], LAX)

    assert shown(0.72) == shown(0.9134)  # thin on one machine, not on the other
    assert "0.9" not in shown(0.9134)[0] and "paper&#x27;s 0.9" in shown(0.9134)[1]
    assert shown(0.72) != shown(0.69)  # the verdict flipped
    assert shown(0.72) != shown(0.72, status=pn.REPRODUCED)
    assert shown(0.72)[0].splitlines()[1] == "- holds (analog; beats 1 null): the claim"


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
    assert not check.breaches  # a check needs no null
    assert (check.status, check.must_hold, check.failed) == ("check", True, True)
    with pytest.raises(ClaimsFailed, match="control"):
        claims.check()  # a failed check stops the chapter like a failed claim
    html = claims._repr_mimebundle_()["text/html"]
    assert (
        '<td data-label="status">check</td><td data-label="paper">the book&#x27;s own check</td>'
        in html
    )


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
    claims.add(
        "a", kind=pn.PAPER, status=pn.ANALOG, paper="p", ours="o", holds=True, nulls={"n": False}
    )
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


# -- the standard: nulls, fair arms, bounds with a source, waivers ---------------------------------


def headline(claims, **kwargs):
    """A must-hold claim of the paper: 0.9 against a bound of 0.8, two paired SE above the
    comparator's 0.7."""
    row = {"kind": pn.PAPER, "status": pn.ANALOG, "paper": "p", "ours": "o", "measured": 0.9}
    row |= {"op": ">=", "bound": 0.8, "bound_from": "noise", "bound_why": "two paired SE"}
    row |= {"comparator": "the exact ablation", "baseline": 0.7}
    return claims.add("the headline", **{**row, **kwargs})


def test_a_must_hold_claim_of_the_paper_without_a_null_fails_naming_it(records):
    claims = Claims("demo")
    row = headline(claims)
    assert row.breaches and row.failed and row.beats_nulls is None
    with pytest.raises(ClaimsFailed, match=r"'the headline' \(names no null"):
        claims.check()
    # a check, a result not reproduced and one not run need none
    for status in (pn.NOT_REPRODUCED,):
        assert not headline(Claims("demo"), status=status).failed
    control = Claims("demo").add("control", kind=pn.CHECK, paper="", ours="o", holds=True)
    assert not control.failed


def test_a_null_that_passes_the_condition_too_fails_the_row(records):
    claims = Claims("demo")
    row = headline(claims, nulls={"untrained network": 0.863, "raw pixels": 0.5})
    assert row.holds and [n.name for n in row.passing_nulls] == ["untrained network"]
    assert row.failed and row.verdict() == "FAILS: a null passes too"
    assert claims._repr_mimebundle_()["text/html"].count("untrained network: 0.863 (+1)") == 1
    with pytest.raises(ClaimsFailed, match=r"the null 'untrained network' \(0.863\) passes"):
        claims.check()
    saved = json.loads((records / "demo.json").read_text())["claims"][0]
    assert saved["nulls"] == [
        {"name": "untrained network", "measured": 0.863, "holds": True, "at_chance": False},
        {"name": "raw pixels", "measured": 0.5, "holds": False, "at_chance": False},
    ]
    assert (saved["beats_nulls"], saved["failed"]) == (False, True)


def test_nulls_that_fail_the_condition_let_the_row_hold_and_the_nearest_is_shown(records):
    claims = Claims("demo")
    row = headline(claims, nulls={"ablation": 0.6, "untrained": 0.79})
    lower = claims.add(
        "lower is better",
        kind=pn.PAPER,
        status=pn.REPRODUCED,
        paper="p",
        ours="o",
        measured=0.1,
        op="<",
        bound=0.2,
        bound_from="derived",
        bound_why="an analytic floor",
        nulls={"no model": 0.5, "ablation": 0.25},
    )
    yes_no = claims.add(
        "yes", kind=pn.PAPER, status=pn.ANALOG, paper="p", ours="o", holds=True, nulls=NO
    )
    assert row.beats_nulls and lower.beats_nulls and yes_no.beats_nulls
    html = claims._repr_mimebundle_()["text/html"]
    assert "untrained: 0.79 (+1)" in html and "ablation: 0.25 (+1)" in html
    assert "untrained: fails" in html and "0.9 ≥ 0.8 (noise)" in html
    claims.check()
    assert "- holds (analog; beats 2 nulls): the headline" in claims.verdicts()


def test_a_null_is_measured_like_its_row(records):
    with pytest.raises(TypeError, match="null 'x' must be a finite number"):
        headline(Claims("demo"), nulls={"x": True})
    with pytest.raises(TypeError, match="null 'x'.*must be a boolean"):
        Claims("demo").add(
            "y", kind=pn.PAPER, status=pn.ANALOG, paper="p", ours="o", holds=True, nulls={"x": 0.3}
        )
    with pytest.raises(TypeError, match="nulls must map"):
        headline(Claims("demo"), nulls=[0.3])
    with pytest.raises(ValueError, match="not run has no measurement"):
        Claims("demo").add("z", kind=pn.PAPER, status=pn.NOT_RUN, paper="p", ours="o", nulls=NO)


def test_a_null_passing_a_result_we_could_not_reproduce_is_recorded_not_failed(records):
    claims = Claims("demo")
    row = headline(claims, status=pn.NOT_REPRODUCED, nulls={"untrained": 0.85})
    assert row.verdict() == "holds here, and so does a null" and not row.failed
    claims.check()


def arm(name, grid=(1e-3, 1e-2, 1e-1), chosen=1e-2, split="validation", budget="400 updates"):
    return pn.Arm(
        name, grid={"rate": list(grid)}, chosen={"rate": chosen}, split=split, budget=budget
    )


@pytest.mark.parametrize(
    ("arms", "problem"),
    [
        ([arm("A"), arm("B", grid=(3e-3, 1e-2, 3e-2))], "tuned on different grids"),
        ([arm("A"), arm("B", budget="200 updates")], "different budgets"),
        ([arm("A"), arm("B", chosen=1e-1)], "chose rate 0.1 at its grid's edge"),
        ([arm("A"), arm("B", split="test")], "chosen on the test split"),
    ],
)
def test_arms_tuned_unequally_break_the_standard(records, arms, problem):
    claims = Claims("demo")
    row = headline(claims, nulls={"n": 0.1}, arms=arms)
    assert any(problem in p for p in row.problems) and row.failed
    with pytest.raises(ClaimsFailed, match=re.escape(problem)):
        claims.check()
    excused = headline(Claims("demo"), nulls={"n": 0.1}, arms=arms, arms_why="why, in one line")
    # a reason in one line excuses unequal grids, budgets and edges, never a choice on test
    assert excused.failed == (problem == "chosen on the test split")


def test_arms_tuned_alike_meet_the_standard_and_are_recorded(records):
    claims = Claims("demo")
    untuned = pn.Arm("fixed", grid=[0.5], chosen=0.5, split=None, budget="400 updates")
    assert untuned.edges() == []  # one value is a fixed setting, not a choice at an edge
    row = headline(claims, nulls={"n": 0.1}, arms=[arm("A"), arm("B")])
    assert not row.failed
    claims.check()
    saved = json.loads((records / "demo.json").read_text())["claims"][0]["arms"]
    assert saved[0] == {
        "name": "A",
        "grid": {"rate": [0.001, 0.01, 0.1]},
        "chosen": {"rate": 0.01},
        "split": "validation",
        "budget": "400 updates",
    }


def test_an_arm_is_stated_completely():
    with pytest.raises(ValueError, match="not in its grid"):
        pn.Arm("A", grid=[1, 2, 3], chosen=4, split="validation", budget="b")
    with pytest.raises(ValueError, match="needs the split"):
        pn.Arm("A", grid=[1, 2, 3], chosen=2, split=None, budget="b")
    with pytest.raises(ValueError, match="budget"):
        pn.Arm("A", grid=[1, 2, 3], chosen=2, split="validation", budget="")
    with pytest.raises(TypeError, match="arms must be a list"):
        headline(Claims("demo"), nulls={"n": 0.1}, arms=arm("A"))
    best = pn.Arm.best(
        "A", {1e-3: 0.5, 1e-2: 0.9, 1e-1: 0.7}, split="validation", budget="b", setting="rate"
    )
    assert best.chosen == {"rate": 0.01} and best.grid == {"rate": (0.001, 0.01, 0.1)}
    lowest = pn.Arm.best(
        "A", {1: 3.0, 2: 1.0, 3: 2.0}, split="v", budget="b", higher_is_better=False
    )
    assert lowest.chosen == {"setting": 2}


def test_a_bound_says_where_it_comes_from(records):
    claims = Claims("demo")
    row = headline(claims, nulls={"n": 0.1}, bound_from=None, bound_why=None)
    assert row.failed and "its bound names no source" in row.problems[0]
    with pytest.raises(ValueError, match="bound_from must be one of"):
        headline(Claims("demo"), bound_from="taste")
    with pytest.raises(ValueError, match="bound_from needs bound_why"):
        headline(Claims("demo"), bound_why=None)
    with pytest.raises(ValueError, match="one line"):
        headline(Claims("demo"), bound_why="two\nlines")
    with pytest.raises(ValueError, match="a yes-or-no row has no bound"):
        Claims("demo").add(
            "y",
            kind=pn.PAPER,
            status=pn.ANALOG,
            paper="p",
            ours="o",
            holds=True,
            bound_from="paper",
        )


def test_a_waiver_marks_a_row_short_of_the_standard_and_must_go_when_it_is_met(records):
    claims = Claims("demo")
    waived = headline(claims, bound_from=None, bound_why=None, waiver="nulls to come")
    assert not waived.failed and len(waived.waived) == 2 and waived.problems == ()
    html = claims._repr_mimebundle_()["text/html"]
    assert "the headline (waived: nulls to come)" in html
    claims.check()
    saved = json.loads((records / "demo.json").read_text())["claims"][0]
    assert saved["waiver"] == "nulls to come" and len(saved["waived"]) == 2
    assert "- holds (analog; waived): the headline" in claims.verdicts()
    # a waiver excuses the standard, not the numbers: a failing row or a passing null still fail
    assert headline(Claims("demo"), measured=0.7, waiver="w").failed
    passing = headline(Claims("demo"), nulls={"n": 0.85}, arms=[arm("A", chosen=0.1)], waiver="w")
    assert passing.problems == () and passing.failed
    # and a waiver on a row that meets the standard is itself a problem
    unneeded = headline(Claims("demo"), nulls={"n": 0.1}, waiver="w")
    assert unneeded.failed and "remove the waiver" in unneeded.problems[0]


def test_a_null_that_is_the_rows_own_comparator_is_refused(records):
    # REINFORCE tuned alike, named as a null of a row whose bound is REINFORCE less two SE:
    # it can never pass, so it proves nothing
    claims = Claims("demo")
    row = headline(claims, nulls={"the exact ablation": 0.7, "untrained": 0.5})
    assert row.failed and row.holds and not row.passing_nulls
    assert any("'the exact ablation' is the row's own comparator" in p for p in row.problems)
    with pytest.raises(ClaimsFailed, match="own comparator"):
        claims.check()
    # only the comparator: no null that could pass is left either
    alone = headline(Claims("demo"), nulls={"the exact ablation": 0.7})
    assert any("names no null that could pass" in p for p in alone.problems)
    # named apart from its nulls, the comparator is fine
    assert not headline(Claims("demo"), nulls={"untrained": 0.5}).failed


def test_a_bound_built_from_an_arm_names_that_arm(records):
    no_name = headline(Claims("demo"), nulls={"untrained": 0.5}, comparator=None)
    assert no_name.failed and any("names no comparator" in p for p in no_name.problems)
    noise = headline(Claims("demo"), nulls={"untrained": 0.5}, comparator=None, baseline=None)
    assert noise.failed and any("noise around an arm" in p for p in noise.problems)
    with pytest.raises(ValueError, match="comparator must be one line"):
        headline(Claims("demo"), comparator="")


def test_a_null_at_chance_by_construction_is_shown_but_does_not_count(records):
    claims = Claims("demo")
    row = headline(
        claims, nulls={"majority class": 0.33, "untrained": 0.6}, at_chance=["majority class"]
    )
    # the untrained network is the strongest null that could pass, and the one shown
    assert not row.failed and row.beats_nulls
    assert pn.claim_rows.best_null(row).name == "untrained"
    assert "untrained: 0.6 (+1)" in claims._repr_mimebundle_()["text/html"]
    claims.check()
    assert "- holds (analog; beats 1 null (1 more at chance)): the headline" in claims.verdicts()
    saved = json.loads((records / "demo.json").read_text())["claims"][0]
    # the strongest run without the idea: here the comparator (0.7), nearer than the untrained 0.6
    strongest = saved["strongest_null"]
    assert (strongest["name"], strongest["measured"]) == ("the exact ablation", 0.7)
    assert strongest["margin"] == pytest.approx(2 / 9)  # (0.9 - 0.7) / 0.9
    stronger = headline(Claims("demo"), nulls={"untrained": 0.75})
    assert pn.claim_rows.strongest_null(stronger).name == "untrained"
    assert saved["comparator"] == "the exact ablation"
    # nulls at chance alone do not meet the standard: one that could pass is needed
    only_chance = headline(Claims("demo"), nulls={"majority": 0.33}, at_chance=["majority"])
    assert only_chance.failed and only_chance.beats_nulls is None
    assert any("names no null that could pass" in p for p in only_chance.problems)
    # a null at chance that passes all the same still fails the row
    passing = headline(Claims("demo"), nulls={"majority": 0.85, "u": 0.1}, at_chance=["majority"])
    assert passing.failed and passing.verdict() == "FAILS: a null passes too"
    with pytest.raises(ValueError, match="not among its nulls"):
        headline(Claims("demo"), nulls={"untrained": 0.6}, at_chance=["majority"])
    with pytest.raises(TypeError, match="at_chance must be a list"):
        headline(Claims("demo"), nulls={"untrained": 0.6}, at_chance="untrained")
