"""The scoreboard page, from claim records and the seeds-and-mutants records: the overview on
top, one section a chapter, each claim's evidence folded into its row."""

import json

import book
import mutation_records
import scoreboard
import seeds_and_mutants

CHAPTERS = book.toc_chapters()


def claim(statement, status="reproduced", holds=True, margin=0.5, thin=False, kind="paper", **more):
    must = status not in ("not reproduced", "not run")
    return {
        "statement": statement,
        "kind": kind,
        "status": status,
        "paper": "p | q",
        "ours": "o",
        "holds": holds,
        "margin": margin,
        "thin": thin,
        "must_hold": must,
        "failed": must and not holds,
        "op": ">=" if margin is not None else None,
        "measured": 0.9,
        "bound": 0.6,
        "bound_from": "noise",
        "bound_why": "two SE",
        "nulls": [{"name": "untrained", "measured": 0.5, "holds": False}],
        "strongest_null": {"name": "untrained", "measured": 0.5, "margin": 0.44},
        **more,
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


def seeds_entry(path, *held, margins=None):
    rows = [
        {"statement": s, "must_hold": True, "held": h, "of": 5, "margins": margins or [0.2] * 5}
        for s, h in held
    ]
    return {"hash": seeds_and_mutants.content_hash(path), "claims": rows}


def test_the_summary_counts_every_status_and_each_chapter_gets_a_section(tmp_path, monkeypatch):
    first, *others = [p.stem for p in CHAPTERS]
    mutation = tmp_path / "mutation"  # make mutate's record of the first paper, and its triage
    monkeypatch.setattr(mutation_records, "RECORDS", mutation)
    survivor = {"outcome": "survived", "function": "f", "diff": []}
    mutation_records.write(
        {
            "chapter": first,
            "hash": "old",
            "killed": ["f/1", "f/2", "f/3"],
            "mutants": [{"id": "f/4", **survivor}, {"id": "f/5", **survivor}],
        },
        mutation,
    )
    (mutation / f"{first}.yml").write_text('equivalent:\n  f/5: "the same value"\n')
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
    seeds = seeds_entry(CHAPTERS[0], ("a", 5), ("b", 4), ("c", 0))
    seeds["claims"][2]["must_hold"] = False  # not reproduced: it need not hold
    results = write_results(
        tmp_path / "results",
        {
            first: {
                "seeds": seeds,
                "mutants": {
                    "hash": "old",
                    "results": [
                        {
                            "name": "m1",
                            "breaks": "stats never updated",
                            "outcome": "caught",
                            "failed_claims": ["b"],
                            "moved_nulls": [],
                        },
                        {"name": "m2", "breaks": "", "outcome": "survived", "failed_claims": []},
                    ],
                },
            }
        },
    )
    page = scoreboard.markdown(tmp_path / "records", results)
    total, checked = 3 + len(others), 1 + len(others)
    assert page.startswith(
        f"**{checked} of {len(CHAPTERS)} chapters checked.** {total} claims of the papers: "
        f"{1 + len(others)} reproduced, 1 reproduced as an analog, 1 not reproduced, 0 not run; "
        "and 0 checks of the book's own."
    )
    assert "FAILS" not in page
    for path in CHAPTERS:
        assert f"## {scoreboard.chapter_title(path)}\n" in page
        assert f"{{doc}}`Read the chapter <chapters/{path.stem}>`" in page
        name = scoreboard.short_name(path)
        assert f'<a href="chapters/{path.stem}.html">{name}</a>' in page.replace("&#x27;", "'")
    # the overview comes first, a row per chapter
    assert page.index("## The book at a glance") < page.index(
        f"## {scoreboard.chapter_title(CHAPTERS[0])}"
    )
    row = (
        '<td data-label="reproduced">1</td><td data-label="analog">1</td>'
        '<td data-label="not reproduced">1</td><td data-label="not run">0</td>'
        '<td data-label="checks">0</td>'
        '<td data-label="the headline&#x27;s strongest null, and its margin over it">'
        "untrained (+44%)</td>"
        '<td data-label="rows on 4 of 5 seeds">2/2</td>'
        '<td data-label="broken mechanisms caught">1/2*</td>'
        '<td data-label="mutation score: mutants of the paper&#x27;s code its unit tests kill '
        '(make mutate)">75.0%*</td><td data-label="run time">12 s</td>'
    )
    assert row in page and "* stale: the chapter changed since" in page
    assert page.count("<svg") == 1 and page.count('class="pn-scoreboard"') == len(CHAPTERS)
    assert page.count('class="pn-overview"') == 1
    top, sections = scoreboard.parts(tmp_path / "records", results)
    assert "## The book at a glance" in top and "## The book at a glance" not in sections
    # a claim's row: statement, status, margin, seeds with their strip, catches; the rest folded
    assert '<td data-label="claim">b<details><summary>what it rests on</summary>' in page
    assert "<li><em>paper</em>: p | q</li>" in page
    assert "<li><em>null</em>: untrained: 0.5 (fails)</li>" in page
    assert "<li><em>condition</em>: 0.9 &gt;= 0.6 (noise: two SE)</li>" in page
    assert '<td data-label="margin">+5% (thin)</td><td data-label="seeds">4 of 5<br>' in page
    assert '<td data-label="catches">m1</td>' in page
    # the headline (first row) fails for no mutant: the page says so, under the chapter and on top
    assert "**The headline (the first claim of the paper) catches none of the broken" in page
    assert f"Headlines that catch no broken mechanism: 1 of {checked} chapters ({first})." in page
    assert "caught 1 of 2 (stale: the chapter changed since)." in page
    assert (
        "5 mutants of the paper's mechanism and experiment; killed by its unit tests 3, "
        "surviving 1, equivalent 1: score 75.0% (stale: the paper's code or tests changed since)."
    ) in page
    assert page.count("Mutation testing (`make mutate`): not run.") == len(others)
    assert "- stats never updated (caught)\n- m2 (survived)" in page
    assert page.count("Broken mechanisms: not run.") == len(others)
    assert "The claims standard: headline beats its nulls: yes; bounds from the paper 0" in page


def test_a_failing_claim_a_passing_null_a_waiver_and_a_missing_record_show(tmp_path):
    first = CHAPTERS[0].stem
    passing = [{"name": "untrained network", "measured": 0.86, "holds": True}]
    write_records(
        tmp_path / "records",
        {
            first: [
                claim("a", holds=False, margin=-0.1),
                claim("d", "not reproduced", nulls=passing),
                claim("w", waiver="nulls to come", nulls=[]),
            ]
        },
    )
    page = scoreboard.markdown(tmp_path / "records", tmp_path / "absent")
    assert "; **1 failing**." in page and "<strong>reproduced, FAILS</strong>" in page
    assert "untrained network: 0.86 (passes too)" in page
    assert "rows a null passes too: 1" in page and "waived rows: 1" in page
    assert f"Rows that do not meet the claims standard yet (waived): 1; {first} 1 (" in page
    assert "nulls to come" in page.split("## The book at a glance")[1]  # under its chapter
    assert "not run" in page
    if len(CHAPTERS) > 1:
        assert "has not been executed in this build" in page


def test_short_names_fit_a_line_of_the_overview():
    names = {p.stem: scoreboard.short_name(p) for p in CHAPTERS}
    assert all(len(n) <= scoreboard.SHORT_NAME_CHARACTERS for n in names.values()), names
    if "ggnn" in names:
        assert names["ggnn"] == "GGNN"


def test_the_headline_verdict_on_its_nulls():
    assert scoreboard.headline_null_verdict(claim("a")) == "yes"
    passes = [{"name": "n", "measured": 0.9, "holds": True}]
    assert scoreboard.headline_null_verdict(claim("a", nulls=passes)) == "no"
    assert scoreboard.headline_null_verdict(claim("a", nulls=[])) == "no null"
    assert scoreboard.headline_null_verdict(claim("a", nulls=[], waiver="w")) == "waived"
    assert scoreboard.headline_null_verdict(None) == "no headline"
    # a null at chance by construction, or the row's own comparator, cannot pass: not counted
    chance = [{"name": "majority", "measured": 0.3, "holds": False, "at_chance": True}]
    assert scoreboard.headline_null_verdict(claim("a", nulls=chance)) == "no null"
    own = claim("a", comparator="untrained")
    assert scoreboard.headline_null_verdict(own) == "no null"
    assert scoreboard.strongest_null(own) is None


def test_the_overview_names_the_headlines_strongest_null_and_the_margin_over_it():
    summary = {"headline_null": "yes", "strongest_null": claim("a")["strongest_null"]}
    assert scoreboard.strongest_null_text(summary) == "untrained (+44%)"
    passing = {"headline_null": "no", "strongest_null": {"name": "u", "margin": -0.1}}
    assert scoreboard.strongest_null_text(passing) == "a null passes: u"
    assert scoreboard.strongest_null_text({"headline_null": "no null"}) == "no null"


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
    seeds = seeds_entry(CHAPTERS[0], ("headline", 5), ("control", 5), ("cart-pole", 0))
    seeds["claims"][0]["margins"] = [0.0, 0.05, 0.3, 0.3, 1.5]
    seeds["claims"][2]["margins"] = [None] * 5
    results = write_results(tmp_path / "results", {first: {"seeds": seeds}})
    page = scoreboard.markdown(tmp_path / "records", results)
    assert "2 claims of the papers: 1 reproduced" in page and "1 not run; and 1 checks" in page
    assert "FAILS" not in page  # a row not run never fails
    # threshold at place 5 of 16 (margin 0), 10% a place: 0 and 5% round to places 5 and 6
    # (so side by side), two at 30%, one past the right edge
    assert ">" + "-" * 5 + "●●·2" + "·" * 6 + "●</code>" in page
    assert ">" + "-" * 5 + "┃·5" + "·" * 8 + "</code>" in page
