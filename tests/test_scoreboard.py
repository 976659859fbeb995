"""The scoreboard page's tables, from claim records and the seeds-and-mutants results."""

import json

import book
import scoreboard
import seeds_and_mutants

CHAPTERS = book.toc_chapters()


def claim(statement, status="reproduced", holds=True, margin=0.5, thin=False, kind="paper"):
    return {
        "statement": statement,
        "kind": kind,
        "status": status,
        "paper": "p | q",
        "ours": "o",
        "holds": holds,
        "margin": margin,
        "thin": thin,
        "must_hold": status not in ("not reproduced", "not run"),
    }


def write_results(folder, results_by_chapter):
    """The seeds-and-mutants records, one file a chapter (tests/seeds_and_mutants/<slug>.json)."""
    folder.mkdir(exist_ok=True)
    for slug, entry in results_by_chapter.items():
        (folder / f"{slug}.json").write_text(json.dumps({"chapter": slug, **entry}))
    return folder


def write_records(folder, claims_by_chapter):
    folder.mkdir(exist_ok=True)
    for slug, claims in claims_by_chapter.items():
        record = {"chapter": slug, "seed": 0, "seconds": 12.3, "claims": claims}
        (folder / f"{slug}.json").write_text(json.dumps(record))


def test_the_summary_counts_every_status_and_each_chapter_gets_a_table(tmp_path):
    first, *others = [p.stem for p in CHAPTERS]
    write_records(
        tmp_path / "records",
        {
            first: [
                claim("a"),
                claim("b", "analog", margin=0.05, thin=True),
                claim("c", "not reproduced", holds=False, margin=-0.3),
            ],
            **{slug: [claim("x", margin=None)] for slug in others},
        },
    )
    current = seeds_and_mutants.content_hash(CHAPTERS[0])
    results = write_results(
        tmp_path / "results",
        {
            first: {
                "seeds": {
                    "hash": current,
                    "claims": [
                        {"held": 5, "of": 5},
                        {"held": 4, "of": 5},
                        {"held": 0, "of": 5},
                    ],
                },
                "mutants": {
                    "hash": "old",
                    "results": [
                        {
                            "name": "m1",
                            "breaks": "stats never updated",
                            "outcome": "caught",
                            "failed_claims": ["b"],
                        },
                        {"name": "m2", "breaks": "", "outcome": "survived"},
                    ],
                },
            }
        },
    )
    page = scoreboard.markdown(tmp_path / "records", results)
    total = 3 + len(others)
    checked = 1 + len(others)
    assert page.startswith(
        f"**{checked} of {len(CHAPTERS)} chapters checked.** {total} claims of the papers: "
        f"{1 + len(others)} reproduced, 1 reproduced as an analog, 1 not reproduced, 0 not run; "
        "and 0 checks of the book's own."
    )
    assert "FAILS" not in page
    for path in CHAPTERS:
        assert f"## {scoreboard.chapter_title(path)}\n" in page
        assert f"{{doc}}`Read the chapter <chapters/{path.stem}>`" in page
    assert "| a | reproduced | p \\| q | o | +50% | holds on 5 of 5 |" in page
    assert "| b | analog | p \\| q | o | +5% (thin) | holds on 4 of 5 | — | m1 |" in page
    assert "| a | reproduced | p \\| q | o | +50% | holds on 5 of 5 | — | — |" in page
    # the headline (first row) fails for no mutant: the page says so, under the chapter and on top
    assert "**The headline (the first claim of the paper) catches none of the broken" in page
    assert (
        f"Headlines that catch no broken mechanism: 1 of {len(CHAPTERS)} chapters ({first})."
        in page
    )
    assert "| c | not reproduced | p \\| q | o | -30% | holds on 0 of 5 |" in page
    assert "caught 1 of 2 (stale: the chapter changed since)." in page
    assert "- stats never updated (caught)\n- m2 (survived)" in page
    assert page.count("Broken mechanisms: not run.") == len(others)


def test_a_failing_claim_and_a_missing_record_show(tmp_path):
    first = CHAPTERS[0].stem
    write_records(tmp_path / "records", {first: [claim("a", holds=False, margin=-0.1)]})
    page = scoreboard.markdown(tmp_path / "records", tmp_path / "absent")
    assert "; **1 failing**." in page and "**reproduced, FAILS**" in page
    assert "| not run |" in page
    if len(CHAPTERS) > 1:
        assert "has not been executed in this build" in page


def test_kinds_are_counted_apart_and_margins_drawn(tmp_path):
    first = CHAPTERS[0].stem
    write_records(
        tmp_path / "records",
        {
            first: [
                claim("headline"),
                claim("control", status="check", kind="check", margin=0.2),
                claim("cart-pole", status="not run", holds=None, margin=None),
            ]
        },
    )
    seeds = [
        {"held": 5, "of": 5, "margins": [0.0, 0.05, 0.3, 0.3, 1.5]},
        {"held": 5, "of": 5, "margins": [0.2] * 5},
        {"held": 0, "of": 5, "margins": [None] * 5},
    ]
    results = write_results(
        tmp_path / "results",
        {first: {"seeds": {"hash": seeds_and_mutants.content_hash(CHAPTERS[0]), "claims": seeds}}},
    )
    page = scoreboard.markdown(tmp_path / "records", results)
    assert (
        "1 claims of the papers: 1 reproduced, 0 reproduced as an analog, 0 not reproduced"
        not in page
    )
    assert "2 claims of the papers: 1 reproduced" in page and "1 not run; and 1 checks" in page
    assert "FAILS" not in page  # a row not run never fails
    # threshold at slot 10 of 31 (margin 0), one seed per 5%: 0 and 5% side by side, two at 30%,
    # one past the right edge
    assert "`" + "-" * 10 + "●●····2" + "·" * 13 + "●`" in page
    assert "`" + "-" * 10 + "┃···5" + "·" * 16 + "`" in page
