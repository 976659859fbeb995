"""The book's reproduction scoreboard: every chapter's claims, as its last execution checked them.

The page `scoreboard.md` holds the explanation; tools/book_ext.py appends the tables written
here while the book builds, from

- the claim records of the execution that builds the book (_build/records/<slug>.json, written
  by each chapter's `claims.check()`: by nbval's kernels in the test command, by
  tools/execute.py in `make book`), and
- the committed seeds-and-mutants records (tests/seeds_and_mutants/<slug>.json, from `make seeds`
  and `make mutants`), marked stale where the chapter or its module changed since they ran.

So the page cannot disagree with the chapters it summarises.
"""

from __future__ import annotations

import json
from pathlib import Path

import book
import seeds_and_mutants
import sweep_records

from papernotes.claims import CHECK, PAPER, STATUSES

STRIP_FROM, STRIP_TO, STRIP_SLOTS = -0.5, 1.0, 31  # margins from -50% to +100%, 5% a slot


def load_records(records: Path) -> dict[str, dict]:
    found = {}
    for path in book.toc_chapters():
        record = records / f"{path.stem}.json"
        if record.exists():
            found[path.stem] = json.loads(record.read_text())
    return found


def markdown(records_dir: Path, results_dir: Path = sweep_records.RECORDS) -> str:
    """The scoreboard's summary line and one table per chapter, as MyST markdown."""
    records = load_records(records_dir)
    results = sweep_records.load_all(results_dir) if results_dir.is_dir() else {}
    chapters = book.toc_chapters()
    claims = [c for r in records.values() for c in r["claims"]]
    paper = [c for c in claims if c.get("kind", PAPER) == PAPER]
    checks = [c for c in claims if c.get("kind") == CHECK]
    count = {s: sum(c["status"] == s for c in paper) for s in STATUSES}
    failing = sum(seeds_and_mutants.must_hold(c) and not c["holds"] for c in claims)
    weak_headlines = [
        p.stem
        for p in chapters
        if headline_catches_none(records.get(p.stem), results.get(p.stem, {}).get("mutants"))
    ]
    lines = [
        # The book's chapters are the ones _toc.yml lists: nothing here counts them by hand.
        f"**{len(records)} of {len(chapters)} chapters checked.** {len(paper)} claims of the "
        f"papers: {count['reproduced']} reproduced, {count['analog']} reproduced as an analog, "
        f"{count['not reproduced']} not reproduced, {count['not run']} not run; and "
        f"{len(checks)} checks of the book's own"
        + (f"; **{failing} failing**." if failing else "."),
        "",
    ]
    if weak_headlines:
        lines += [
            f"Headlines that catch no broken mechanism: {len(weak_headlines)} of "
            f"{len(records)} chapters ({', '.join(weak_headlines)}).",
            "",
        ]
    for path in chapters:
        lines += chapter_section(path, records.get(path.stem), results.get(path.stem, {}))
    return "\n".join(lines) + "\n"


def chapter_section(path: Path, record: dict | None, result: dict) -> list[str]:
    slug = path.stem
    lines = [f"## {chapter_title(path)}", "", f"{{doc}}`Read the chapter <chapters/{slug}>`", ""]
    if record is None:
        return [*lines, "No claim record: this chapter has not been executed in this build.", ""]
    current = seeds_and_mutants.content_hash(path)
    seeds, mutants = result.get("seeds"), result.get("mutants")
    seeds_stale = seeds is not None and seeds["hash"] != current
    held = {i: c for i, c in enumerate(seeds["claims"])} if seeds else {}
    lines += [
        f"Run time: {record['seconds']:.0f} s from the setup cell to the claim check "
        f"(seed {record['seed']}).",
        "",
        *_mutants_lines(mutants, current),
        "",
        *_headline_lines(record, mutants),
        "| claim | status | paper | ours | margin | seeds | margins on the seeds | catches |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, claim in enumerate(record["claims"]):
        seeds_cell = "not run"
        if i in held:
            seeds_cell = f"holds on {held[i]['held']} of {held[i]['of']}"
            seeds_cell += " (stale)" if seeds_stale else ""
        margin = "—" if claim["margin"] is None else f"{claim['margin']:+.0%}"
        if claim.get("thin"):
            margin += " (thin)"
        status = claim["status"]
        if not claim["holds"] and seeds_and_mutants.must_hold(claim):
            status = f"**{status}, FAILS**"
        catches = ", ".join(catching(claim["statement"], mutants)) or "—"
        strip = strip_plot(held[i].get("margins", [])) if i in held else "—"
        paper_cell = claim["paper"] or "the book's own check"
        cells = [claim["statement"], status, paper_cell, claim["ours"], margin, seeds_cell]
        cells += [strip, catches]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def strip_plot(margins: list) -> str:
    """The seeds' margins on one line: `-` below the threshold, `┃` the threshold (margin 0),
    `·` above it, `●` a seed (several in one place: their count), from -50% to +100%."""
    numbers = [m for m in margins if m is not None]
    if not numbers:
        return "—"
    slots = ["-" if i < _slot(0.0) else "·" for i in range(STRIP_SLOTS)]
    slots[_slot(0.0)] = "┃"
    counts: dict[int, int] = {}
    for m in numbers:
        counts[_slot(m)] = counts.get(_slot(m), 0) + 1
    for slot, n in counts.items():
        slots[slot] = "●" if n == 1 else str(n)
    return "`" + "".join(slots) + "`"


def _slot(margin: float) -> int:
    clipped = min(max(margin, STRIP_FROM), STRIP_TO)
    return round((clipped - STRIP_FROM) / (STRIP_TO - STRIP_FROM) * (STRIP_SLOTS - 1))


def catching(statement: str, mutants: dict | None) -> list[str]:
    """The broken mechanisms that made this claim fail (tests/mutants/<slug>.py, make mutants)."""
    results = (mutants or {}).get("results", [])
    return [r["name"] for r in results if statement in r.get("failed_claims", [])]


def headline(claims: list[dict]) -> dict | None:
    """The chapter's headline: its first claim of the paper that must hold (checks of the
    book's own aside; a result not reproduced or not run cannot vouch for the mechanism)."""
    return next(
        (c for c in claims if c.get("kind", PAPER) == PAPER and seeds_and_mutants.must_hold(c)),
        None,
    )


def headline_catches_none(record: dict | None, mutants: dict | None) -> bool:
    """The paper's headline fails for none of the chapter's broken mechanisms: only another row
    stands between a wrong mechanism and a green chapter."""
    first = headline(record["claims"]) if record else None
    if first is None or not mutants:
        return False
    return not catching(first["statement"], mutants)


def _headline_lines(record: dict, mutants: dict | None) -> list[str]:
    if not headline_catches_none(record, mutants):
        return []
    return [
        "**The headline (the first claim of the paper) catches none of the broken "
        "mechanisms**: only other rows fail for them.",
        "",
    ]


def chapter_title(path: Path) -> str:
    """The chapter's title: the first line of its first cell, without the leading '# '."""
    import nbformat

    first = nbformat.read(path, as_version=4).cells[0].source.splitlines()[0]
    return first.lstrip("# ").strip()


def _mutants_lines(mutants: dict | None, current: str) -> list[str]:
    if not mutants:
        return ["Broken mechanisms: not run."]
    outcomes = mutants["results"]
    caught = sum(r["outcome"] == "caught" for r in outcomes)
    stale = " (stale: the chapter changed since)" if mutants["hash"] != current else ""
    return [
        f"Broken mechanisms: caught {caught} of {len(outcomes)}{stale}.",
        "",
        *(f"- {r['breaks'] or r['name']} ({r['outcome']})" for r in outcomes),
    ]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
