"""The committed seeds-and-mutants records (tests/seeds_and_mutants/<slug>.json) are current and
good, and the tools that write and compare them do what they say.

`make seeds`, `make mutants` and `make sweep` write the records; these tests read them. A chapter
or module changed since its last run has a different content hash: rerun them for it.
"""

import copy
import json

import pytest
import sweep_records
from book import toc_chapters
from seeds_and_mutants import (
    MIN_SEEDS_HELD,
    SEEDS,
    content_hash,
    must_hold,
    mutants_of,
    summarize_mutants,
    summarize_seeds,
)

CHAPTERS = toc_chapters()
IDS = [p.stem for p in CHAPTERS]


def entry(slug: str, what: str) -> dict:
    result = sweep_records.load(slug).get(what)
    if result is None:
        pytest.fail(f"{slug}: no {what} results; run `make {what} CHAPTERS=chapters/{slug}.ipynb`")
    return result


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
@pytest.mark.parametrize("what", ["seeds", "mutants"])
def test_results_are_current(path, what):
    assert entry(path.stem, what)["hash"] == content_hash(path), (
        f"{path.stem} changed since its {what} run: run `make {what} CHAPTERS={path}`"
    )


def test_every_record_is_a_chapter_of_the_book():
    assert set(sweep_records.load_all()) <= set(IDS), "a record of a chapter the toc lacks"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_claims_that_must_hold_hold_on_four_of_five_seeds(path):
    seeds = entry(path.stem, "seeds")
    assert not seeds["crashed"], f"seeds on which {path.stem} crashed: {seeds['crashed']}"
    weak = [
        f"{c['statement']!r} held on {c['held']} of {c['of']}"
        for c in seeds["claims"]
        if must_hold(c) and c["held"] < MIN_SEEDS_HELD
    ]
    assert not weak, f"{path.stem}: " + "; ".join(weak)
    assert len(seeds["claims"]) >= 2, f"{path.stem} checks fewer than two claims"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_the_seeds_are_held_out(path):
    """The held-on counts come from seeds that no design choice used: not the committed run's
    seed 0, nor seeds 0-4, under which the chapters were designed and checked before."""
    seeds = entry(path.stem, "seeds")
    assert seeds["seeds"] == list(SEEDS) and not set(SEEDS) & set(range(5))


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_mutant_is_caught_by_a_claim(path):
    defined = [name for name, _ in mutants_of(path.stem)]
    assert len(defined) >= 2, f"tests/mutants/{path.stem}.py defines fewer than two mutants"
    mutants = entry(path.stem, "mutants")
    assert mutants["reference"]["ended"] == "passed", "the unbroken chapter must pass"
    results = {r["name"]: r for r in mutants["results"]}
    assert sorted(results) == sorted(defined), "mutants changed since `make mutants` ran"
    escaped = [
        f"{name}: {r['outcome']} {r['error']}"
        for name, r in results.items()
        if r["outcome"] != "caught"
    ]
    assert not escaped, f"{path.stem}: mutants no claim caught: {escaped}"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_no_broken_mechanism_moves_a_null(path):
    """A null is computed by code that the mechanism's bugs cannot reach: one that moves under
    a mutant breaks with the mechanism and proves nothing (compute it apart, from its own
    random streams)."""
    moved = [
        f"{r['name']}: {m}"
        for r in entry(path.stem, "mutants")["results"]
        for m in r["moved_nulls"]
    ]
    assert not moved, f"{path.stem}: nulls that a broken mechanism moves: {moved}"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_the_headline_itself_catches_a_broken_mechanism(path):
    claims = entry(path.stem, "seeds")["claims"]
    headline = next(
        (c["statement"] for c in claims if c.get("kind", "paper") == "paper" and must_hold(c)),
        None,
    )
    assert headline, f"{path.stem}: no paper row must hold, so the chapter has no headline to test"
    results = entry(path.stem, "mutants")["results"]
    catching = [r["name"] for r in results if headline in r["failed_claims"]]
    assert catching, f"{path.stem}: no mutant makes the headline {headline!r} fail"


# -- the tools ------------------------------------------------------------------------------------


def row(statement, holds=True, margin=0.2, nulls=(), failed=None, status="analog"):
    nulls = [{"name": n, "measured": v, "holds": h} for n, v, h in nulls]
    must = status not in ("not reproduced", "not run")
    failed = (must and (not holds or any(h for *_, h in nulls))) if failed is None else failed
    return {
        "statement": statement,
        "kind": "paper",
        "status": status,
        "must_hold": must,
        "holds": holds,
        "margin": margin,
        "nulls": nulls,
        "failed": failed,
    }


def test_a_seed_counts_as_held_only_when_every_null_fails_the_row_and_it_meets_the_standard():
    runs = [
        {"seed": s, "mutant": None, "ended": "passed", "error": "", "claims": [claim]}
        for s, claim in zip(
            SEEDS,
            [
                row("a", nulls=[("untrained", 0.5, False)]),
                row("a", nulls=[("untrained", 0.9, True)]),
                row("a", holds=False, margin=-0.1),
                row("a"),
                {**row("a"), "problems": ["arm 'A' chose rate 0.1 at its grid's edge"]},
            ],
            strict=True,
        )
    ]
    (claim,) = summarize_seeds(runs)["claims"]
    assert (claim["held"], claim["null_passed"], claim["worst_margin"]) == (2, 1, -0.1)


def test_the_mutants_run_keeps_the_reference_nulls_and_flags_a_mutant_that_moves_one():
    def ran(mutant, value, holds=False):
        claims = [row("a", holds=holds, nulls=[("untrained", value, False)])]
        ended = "claims failed" if not holds else "passed"
        return {"seed": 0, "mutant": mutant, "ended": ended, "error": "", "claims": claims}

    reference = ran(None, 0.5, holds=True)
    summary = summarize_mutants(
        [reference, ran("m1", 0.5), ran("m2", 0.7)], {"m1": "breaks one", "m2": "breaks two"}
    )
    assert summary["reference"] == {
        "ended": "passed",
        "error": "",
        "nulls": [["a", "untrained", 0.5]],
    }
    first, second = summary["results"]
    assert (first["outcome"], first["failed_claims"], first["moved_nulls"]) == ("caught", ["a"], [])
    assert second["moved_nulls"] == ["a: untrained (0.5 -> 0.7)"]


def committed_record():
    return {
        "chapter": "demo",
        "seeds": {
            "hash": "h",
            "crashed": {},
            "claims": [
                {"statement": "headline", "must_hold": True, "status": "analog", "held": 5},
                {"statement": "side", "must_hold": True, "status": "analog", "held": 4},
            ],
        },
        "mutants": {
            "hash": "h",
            "results": [{"name": "m1", "outcome": "caught", "failed_claims": ["headline"]}],
        },
    }


def test_the_comparison_accepts_a_record_that_reproduces_and_names_what_does_not():
    committed = committed_record()
    fresh = copy.deepcopy(committed)
    fresh["seeds"]["claims"][0]["held"] = 4  # one seed's rounding: still at least 4 of 5
    assert sweep_records.compare(committed, fresh, "demo") == []
    fresh["seeds"]["claims"][1]["held"] = 3
    fresh["mutants"]["results"][0]["failed_claims"] = ["side"]
    problems = sweep_records.compare(committed, fresh, "demo")
    assert problems == [
        "demo: row 'side' held on 3 of 5 seeds (committed: 4); it must hold on 4",
        "demo: mutant 'm1' is caught by ['side'] (committed: ['headline'])",
    ]


def test_the_compare_command_fails_on_a_hand_edited_record(tmp_path, capsys):
    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    for folder in (committed, fresh):
        folder.mkdir()
        (folder / "demo.json").write_text(json.dumps(committed_record()))
    argv = ["compare", str(fresh), "--committed", str(committed)]
    assert sweep_records.main(argv) == 0
    edited = committed_record()
    edited["mutants"]["results"][0]["outcome"] = "survived"
    (committed / "demo.json").write_text(json.dumps(edited))  # the committed file, edited by hand
    assert sweep_records.main(argv) == 1
    assert "DOES NOT REPRODUCE: demo: mutant 'm1' caught (committed: survived)" in (
        capsys.readouterr().out
    )


def test_records_merge_per_chapter_and_keep_the_other_part(tmp_path):
    sweep_records.merge("demo", {"seeds": {"hash": "a"}}, tmp_path)
    sweep_records.merge("demo", {"mutants": {"hash": "b"}}, tmp_path)
    sweep_records.merge("other", {"seeds": {"hash": "c"}}, tmp_path)
    assert sweep_records.load("demo", tmp_path) == {
        "chapter": "demo",
        "seeds": {"hash": "a"},
        "mutants": {"hash": "b"},
    }
    assert sorted(sweep_records.load_all(tmp_path)) == ["demo", "other"]


def test_jobs_come_from_the_environment(monkeypatch):
    import kernels

    monkeypatch.delenv("JOBS", raising=False)
    assert kernels.jobs() == 2
    monkeypatch.setenv("JOBS", "3")
    assert kernels.jobs() == 3
    monkeypatch.setenv("JOBS", "zero")
    with pytest.raises(SystemExit, match="JOBS must be a whole number"):
        kernels.jobs()


def test_flags_may_stand_between_the_command_and_the_chapters(monkeypatch):
    import seeds_and_mutants

    seen = {}
    monkeypatch.setattr(seeds_and_mutants, "is_current", lambda path, parts: True)
    monkeypatch.setattr(seeds_and_mutants, "sweep", lambda *a, **k: seen.setdefault("ran", a))
    # make check's call: every chapter named is current, so nothing runs
    assert seeds_and_mutants.main(["sweep", "--stale", "chapters/jsma.ipynb"]) == 0
    assert "ran" not in seen
