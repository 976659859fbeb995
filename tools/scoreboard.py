"""The book's reproduction scoreboard: every chapter's claims, as its last execution checked them.

The page `scoreboard.md` holds the explanation; tools/book_ext.py appends what is written here
while the book builds, from

- the claim records of the execution that builds the book (_build/records/<slug>.json, written
  by each chapter's `claims.check()`: by nbval's kernels in the test command, by
  tools/execute.py in `make book`), and
- the committed seeds-and-mutants records (tests/seeds_and_mutants/<slug>.json, from `make
  sweep`), marked stale where the chapter or its module changed since they ran.

So the page cannot disagree with the chapters it summarises. It opens with the whole book on
one screen (a picture and a compact table, a row per chapter), then one section per chapter
whose table fits the text column: each claim's paper, ours, nulls, bound and arms fold into its
row, and the seeds' margins stay in view.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

import book
import mutation_records
import seeds_and_mutants
import sweep_records

from papernotes.claims import CHECK, PAPER, STATUSES

# The seeds' margins from -50% to +100%, 10% a place: the threshold (margin 0) is place 5.
STRIP_FROM, STRIP_TO, STRIP_SLOTS = -0.5, 1.0, 16
# Okabe and Ito's colour-blind-safe palette, one colour a status (the page's legend names them).
STATUS_COLOURS = {
    "reproduced": "#009E73",
    "analog": "#56B4E9",
    "not reproduced": "#E69F00",
    "not run": "#BBBBBB",
}


def load_records(records: Path) -> dict[str, dict]:
    found = {}
    for path in book.toc_chapters():
        record = records / f"{path.stem}.json"
        if record.exists():
            found[path.stem] = json.loads(record.read_text())
    return found


def markdown(records_dir: Path, results_dir: Path = sweep_records.RECORDS) -> str:
    """The scoreboard's summary, its overview and one section per chapter, as MyST markdown."""
    top, chapters = parts(records_dir, results_dir)
    return top + chapters


def parts(records_dir: Path, results_dir: Path = sweep_records.RECORDS) -> tuple[str, str]:
    """The page's two generated parts: the summary with the overview (the top of the page), and
    the chapters' sections (after the page's legend)."""
    records = load_records(records_dir)
    results = sweep_records.load_all(results_dir) if results_dir.is_dir() else {}
    chapters = book.toc_chapters()
    summaries = [summary(p, records.get(p.stem), results.get(p.stem, {})) for p in chapters]
    top = [*summary_lines(records, chapters, results), *overview(summaries)]
    sections: list[str] = []
    for path, chapter in zip(chapters, summaries, strict=True):
        sections += chapter_section(
            path, records.get(path.stem), results.get(path.stem, {}), chapter
        )
    return "\n".join(top) + "\n", "\n".join(sections) + "\n"


# -- one chapter in numbers ----------------------------------------------------------------------


def summary(path: Path, record: dict | None, result: dict) -> dict:
    """What the overview shows of one chapter."""
    found = {"slug": path.stem, "name": short_name(path), "record": record is not None}
    if record is None:
        return found
    claims = record["claims"]
    paper = [c for c in claims if c.get("kind", PAPER) == PAPER]
    current = seeds_and_mutants.content_hash(path)
    seeds, mutants = result.get("seeds"), result.get("mutants")
    must = [c for c in (seeds or {}).get("claims", []) if sweep_records.must_hold(c)]
    outcomes = (mutants or {}).get("results", [])
    first = headline(claims)
    found.update(
        {
            "counts": {s: sum(c["status"] == s for c in paper) for s in STATUSES},
            "checks": sum(c.get("kind") == CHECK for c in claims),
            "headline": first,
            "headline_null": headline_null_verdict(first),
            "strongest_null": strongest_null(first),
            "headline_catches": bool(first and catching(first["statement"], mutants)),
            "seeds": None
            if seeds is None
            else (sum(c["held"] >= sweep_records.MIN_SEEDS_HELD for c in must), len(must)),
            "seeds_stale": seeds is not None and seeds["hash"] != current,
            "caught": None
            if mutants is None
            else (sum(r["outcome"] == "caught" for r in outcomes), len(outcomes)),
            "mutants_stale": mutants is not None and mutants["hash"] != current,
            "waived": sum(bool(c.get("waiver")) for c in claims),
            "null_passes": sum(sweep_records.null_passed(c) for c in claims),
            "bounds": {
                source: sum(c.get("bound_from") == source for c in claims)
                for source in ("paper", "derived", "noise")
            },
            "unsourced": sum(c.get("op") is not None and not c.get("bound_from") for c in claims),
            "seconds": record["seconds"],
            "mutation": mutation_text(path.stem),
        }
    )
    return found


def headline(claims: list[dict]) -> dict | None:
    """The chapter's headline: its first claim of the paper that must hold (checks of the
    book's own aside; a result not reproduced or not run cannot vouch for the mechanism)."""
    return next(
        (c for c in claims if c.get("kind", PAPER) == PAPER and sweep_records.must_hold(c)),
        None,
    )


def headline_null_verdict(claim: dict | None) -> str:
    """Does the headline beat its nulls? "yes", "no" (a null passes), "waived" or "no null"
    (none that could pass: a null at chance by construction, or the row's own comparator, does
    not count)."""
    if claim is None:
        return "no headline"
    nulls = claim.get("nulls", [])
    if any(n["holds"] for n in nulls):
        return "no"
    if not could_pass(claim):
        return "waived" if claim.get("waiver") else "no null"
    return "waived" if claim.get("waiver") else "yes"


def could_pass(claim: dict) -> list[dict]:
    """The row's nulls that could pass: not at chance by construction, not its comparator."""
    return [
        n
        for n in claim.get("nulls", [])
        if not n.get("at_chance") and n["name"] != claim.get("comparator")
    ]


def strongest_null(claim: dict | None) -> dict | None:
    """The headline's strongest null (nearest to passing, among those that could) and the
    headline's margin over it, as claims.check() recorded them."""
    if claim is None or not could_pass(claim):
        return None
    return claim.get("strongest_null")


def strongest_null_text(summary_: dict) -> str:
    """The overview's cell: the headline's strongest null by name and the margin over it, or
    why there is none to show."""
    verdict, best = summary_["headline_null"], summary_.get("strongest_null")
    if verdict == "no":
        return "a null passes" + (f": {best['name']}" if best else "")
    if best is None:
        return verdict
    over = best.get("margin")
    return best["name"] + ("" if over is None else f" ({over:+.0%})")


def catching(statement: str, mutants: dict | None) -> list[str]:
    """The broken mechanisms that made this claim fail (tests/mutants/<slug>.py, make mutants)."""
    results = (mutants or {}).get("results", [])
    return [r["name"] for r in results if statement in r.get("failed_claims", [])]


def headline_catches_none(record: dict | None, mutants: dict | None) -> bool:
    """The paper's headline fails for none of the chapter's broken mechanisms: only another row
    stands between a wrong mechanism and a green chapter."""
    first = headline(record["claims"]) if record else None
    if first is None or not mutants:
        return False
    return not catching(first["statement"], mutants)


# -- the top of the page -------------------------------------------------------------------------


def summary_lines(records: dict, chapters: list[Path], results: dict) -> list[str]:
    claims = [c for r in records.values() for c in r["claims"]]
    paper = [c for c in claims if c.get("kind", PAPER) == PAPER]
    checks = [c for c in claims if c.get("kind") == CHECK]
    count = {s: sum(c["status"] == s for c in paper) for s in STATUSES}
    failing = sum(sweep_records.failed(c) for c in claims)
    lines = [
        # The book's chapters are the ones _toc.yml lists: nothing here counts them by hand.
        f"**{len(records)} of {len(chapters)} chapters checked.** {len(paper)} claims of the "
        f"papers: {count['reproduced']} reproduced, {count['analog']} reproduced as an analog, "
        f"{count['not reproduced']} not reproduced, {count['not run']} not run; and "
        f"{len(checks)} checks of the book's own"
        + (f"; **{failing} failing**." if failing else "."),
        "",
    ]
    weak = [
        p.stem for p in chapters if headline_catches_none(records.get(p.stem), _mutants(results, p))
    ]
    if weak:
        lines += [
            f"Headlines that catch no broken mechanism: {len(weak)} of "
            f"{len(records)} chapters ({', '.join(weak)}).",
            "",
        ]
    waived = [(slug, c) for slug, r in records.items() for c in r["claims"] if c.get("waiver")]
    if waived:
        # a count a chapter, so that the overview stays on the first screen; each row and its
        # waiver are listed in its chapter's table below
        by_chapter = Counter(slug for slug, _ in waived)
        lines += [
            f"Rows that do not meet the claims standard yet (waived): {len(waived)}; "
            + ", ".join(f"{slug} {n}" for slug, n in by_chapter.items())
            + " (each with its waiver in its chapter's table below).",
            "",
        ]
    return lines


def _mutants(results: dict, path: Path) -> dict | None:
    return results.get(path.stem, {}).get("mutants")


OVERVIEW_COLUMNS = [
    ("chapter", "chapter"),
    ("repr.", "reproduced"),
    ("analog", "analog"),
    ("not repr.", "not reproduced"),
    ("not run", "not run"),
    ("checks", "checks"),
    ("strongest null", "the headline's strongest null, and its margin over it"),
    ("seeds 4/5", "rows on 4 of 5 seeds"),
    ("caught", "broken mechanisms caught"),
    ("mutation", "mutation score: mutants of the paper's code its unit tests kill (make mutate)"),
    ("time", "run time"),
]


def overview(summaries: list[dict]) -> list[str]:
    """The whole book on one screen: a picture, then a compact table, a row per chapter."""
    return [
        "## The book at a glance",
        "",
        "```{raw} html",
        overview_svg(summaries),
        overview_table(summaries),
        "```",
        "",
    ]


def overview_table(summaries: list[dict]) -> str:
    head = "".join(
        f'<th title="{html.escape(long)}">{html.escape(short)}</th>'
        for short, long in OVERVIEW_COLUMNS
    )
    rows = []
    for s in summaries:
        link = f'<a href="chapters/{s["slug"]}.html">{html.escape(s["name"])}</a>'
        if not s["record"]:
            cells = [link, *[""] * 5, "not executed in this build", "", "", "", ""]
        else:
            counts = s["counts"]
            cells = [
                link,
                counts["reproduced"],
                counts["analog"],
                counts["not reproduced"],
                counts["not run"],
                s["checks"],
                html.escape(strongest_null_text(s)),
                _fraction(s["seeds"], s["seeds_stale"]),
                _fraction(s["caught"], s["mutants_stale"]),
                html.escape(s["mutation"]),
                f"{s['seconds']:.0f} s",
            ]
        tds = "".join(
            f'<td data-label="{html.escape(long)}">{cell}</td>'
            for (_, long), cell in zip(OVERVIEW_COLUMNS, cells, strict=True)
        )
        rows.append(f"<tr>{tds}</tr>")
    stale = any(
        s.get("seeds_stale") or s.get("mutants_stale") or s.get("mutation", "").endswith("*")
        for s in summaries
    )
    note = (
        '<p class="pn-note">* stale: the chapter changed since its seeds or mutants ran (the '
        "mutation score: its paper's code or unit tests, since <code>make mutate</code>).</p>"
        if stale
        else ""
    )
    return (
        f'<table class="pn-overview"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{note}"
    )


def _fraction(pair: tuple[int, int] | None, stale: bool) -> str:
    if pair is None:
        return "not run"
    return f"{pair[0]}/{pair[1]}" + ("*" if stale else "")


def overview_svg(summaries: list[dict]) -> str:
    """A bar a chapter, its paper's claims by status, and a mark for the headline and its null:
    colour-blind-safe colours, text in the page's own colour (light or dark)."""
    row_h, label_w, unit = 18, 170, 12
    shown = [s for s in summaries if s["record"]]
    longest = max((sum(s["counts"].values()) for s in shown), default=1)
    bar_w = unit * longest + 10
    height = row_h * (len(shown) + 1) + 6
    width = label_w + bar_w + 130
    parts = [
        f'<svg class="pn-overview-chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="100%" xmlns="http://www.w3.org/2000/svg" font-size="11" fill="currentColor">',
        "<title>Each chapter's claims of its paper by status, and whether its headline beats "
        "its nulls</title>",
    ]
    x = label_w
    for status, colour in STATUS_COLOURS.items():
        parts.append(f'<rect x="{x}" y="3" width="9" height="9" fill="{colour}"/>')
        parts.append(f'<text x="{x + 12}" y="11">{html.escape(status)}</text>')
        x += 12 + 6 * len(status) + 12
    for i, s in enumerate(shown, start=1):
        y = row_h * i + 2
        name = html.escape(s["name"])
        parts.append(f'<text x="{label_w - 6}" y="{y + 11}" text-anchor="end">{name}</text>')
        x = label_w
        for status, colour in STATUS_COLOURS.items():
            n = s["counts"][status]
            if n:
                parts.append(
                    f'<rect x="{x}" y="{y + 2}" width="{n * unit - 1}" height="12" '
                    f'fill="{colour}"><title>{n} {html.escape(status)}</title></rect>'
                )
                x += n * unit
        best = s.get("strongest_null") or {}
        over = best.get("margin")
        mark = {
            "yes": "✓ beats its nulls" if over is None else f"✓ {over:+.0%} over its best null",
            "no": "✗ a null passes",
        }.get(s["headline_null"], f"· {s['headline_null']}")
        parts.append(f'<text x="{label_w + bar_w}" y="{y + 11}">{html.escape(mark)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# -- one section a chapter -----------------------------------------------------------------------


def chapter_section(path: Path, record: dict | None, result: dict, numbers: dict) -> list[str]:
    slug = path.stem
    lines = [f"## {chapter_title(path)}", "", f"{{doc}}`Read the chapter <chapters/{slug}>`", ""]
    if record is None:
        return [*lines, "No claim record: this chapter has not been executed in this build.", ""]
    current = seeds_and_mutants.content_hash(path)
    seeds, mutants = result.get("seeds"), result.get("mutants")
    seeds_stale = seeds is not None and seeds["hash"] != current
    held = dict(enumerate(seeds["claims"])) if seeds else {}
    lines += [
        f"Run time: {record['seconds']:.0f} s from the setup cell to the claim check "
        f"(seed {record['seed']}).",
        "",
        *_mutants_lines(mutants, current),
        *_mutation_lines(slug),
        "",
        *_standard_lines(numbers),
        *_headline_lines(record, mutants),
        "```{raw} html",
        claims_table(record["claims"], held, seeds_stale, mutants),
        "```",
        "",
    ]
    return lines


def claims_table(claims: list[dict], held: dict, stale: bool, mutants: dict | None) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("claim", "status", "margin", "seeds", "catches"))
    rows = []
    for i, claim in enumerate(claims):
        status = html.escape(claim["status"])
        if sweep_records.failed(claim):
            status = f"<strong>{status}, FAILS</strong>"
        margin = "—" if claim["margin"] is None else f"{claim['margin']:+.0%}"
        if claim.get("thin"):
            margin += " (thin)"
        seeds_cell = "not run"
        if i in held:
            seeds_cell = f"{held[i]['held']} of {held[i]['of']}" + (" (stale)" if stale else "")
            seeds_cell = html.escape(seeds_cell)
            seeds_cell += (
                f'<br><code class="pn-strip">{strip_plot(held[i].get("margins", []))}</code>'
            )
        catches = html.escape(", ".join(catching(claim["statement"], mutants)) or "—")
        cells = [
            ("claim", claim_cell(claim)),
            ("status", status),
            ("margin", html.escape(margin)),
            ("seeds", seeds_cell),
            ("catches", catches),
        ]
        rows.append("<tr>" + "".join(f'<td data-label="{k}">{v}</td>' for k, v in cells) + "</tr>")
    return (
        f'<table class="pn-scoreboard"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def claim_cell(claim: dict) -> str:
    """The statement, and folded beneath it what it rests on: the paper, ours, the condition,
    the nulls, the bound's source, the arms' tuning, the waiver."""
    details = [
        ("paper", claim["paper"] or "the book's own check"),
        ("ours", claim["ours"]),
    ]
    if claim.get("op"):
        source = (
            f" ({claim['bound_from']}: {claim['bound_why']})" if claim.get("bound_from") else ""
        )
        details.append(
            ("condition", f"{claim['measured']:.4g} {claim['op']} {claim['bound']:.4g}{source}")
        )
    for null in claim.get("nulls", []):
        value = null["measured"]
        shown = ("passes" if value else "fails") if isinstance(value, bool) else f"{value:.4g}"
        verdict = "passes too" if null["holds"] else "fails"
        details.append(("null", f"{null['name']}: {shown} ({verdict})"))
    for arm in claim.get("arms", []):
        grid = "; ".join(f"{k} {v} → {arm['chosen'][k]}" for k, v in arm["grid"].items())
        details.append(("arm", f"{arm['name']}: {grid} on {arm['split']}, {arm['budget']}"))
    if claim.get("waiver"):
        details.append(("waiver", claim["waiver"]))
    items = "".join(f"<li><em>{k}</em>: {html.escape(str(v))}</li>" for k, v in details)
    return (
        f"{html.escape(claim['statement'])}<details><summary>what it rests on</summary>"
        f"<ul>{items}</ul></details>"
    )


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
    return "".join(slots)


def _slot(margin: float) -> int:
    clipped = min(max(margin, STRIP_FROM), STRIP_TO)
    return round((clipped - STRIP_FROM) / (STRIP_TO - STRIP_FROM) * (STRIP_SLOTS - 1))


def _standard_lines(numbers: dict) -> list[str]:
    bounds = numbers["bounds"]
    parts = [
        f"headline beats its nulls: {numbers['headline_null']}",
        f"bounds from the paper {bounds['paper']}, derived {bounds['derived']}, "
        f"from noise {bounds['noise']}"
        + (f", with no source {numbers['unsourced']}" if numbers["unsourced"] else ""),
    ]
    if numbers["null_passes"]:
        parts.append(f"rows a null passes too: {numbers['null_passes']}")
    if numbers["waived"]:
        parts.append(f"waived rows: {numbers['waived']}")
    return ["The claims standard: " + "; ".join(parts) + ".", ""]


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


def short_title(path: Path) -> str:
    """The title up to its first colon (the paper's name without its subtitle)."""
    return chapter_title(path).split(":")[0].strip()


SHORT_NAME_CHARACTERS = 26


def short_name(path: Path) -> str:
    """A name short enough for a line of the overview: the title up to its colon where that is
    short, else the chapter's slug in words (an acronym for a short one: GGNN, SELU)."""
    title = short_title(path)
    if len(title) <= SHORT_NAME_CHARACTERS:
        return title
    slug = path.stem
    if len(slug) <= 5 and "_" not in slug:
        return slug.upper()
    return slug.replace("_", " ").capitalize()


def mutation_text(slug: str) -> str:
    """A paper's mutation score for the overview: its percentage, starred where stale."""
    folder = mutation_records.RECORDS
    found = mutation_records.score_of(slug, folder)
    if found is None:
        return "not run"
    stale = mutation_records.load(slug, folder)["hash"] != mutation_records.source_hash(slug)
    return mutation_records.percent(found["score"]) + ("*" if stale else "")


def _mutation_lines(slug: str) -> list[str]:
    """What `make mutate` found: the paper's code mutated against its unit tests."""
    folder = mutation_records.RECORDS
    record = mutation_records.load(slug, folder)
    if not record:
        return ["", "Mutation testing (`make mutate`): not run."]
    found = mutation_records.scored(record, mutation_records.load_triage(slug, folder))
    c = found["counts"]
    stale = record["hash"] != mutation_records.source_hash(slug)
    return [
        "",
        f"Mutation testing (`make mutate`): {c['mutants']} mutants of the paper's mechanism "
        f"and experiment; killed by its unit tests {c['killed'] + c['crashed'] + c['timeout']}, "
        f"surviving {c['survived'] + c['no tests']}, equivalent {c['equivalent']}: score "
        f"{mutation_records.percent(found['score'])}"
        + (" (stale: the paper's code or tests changed since)" if stale else "")
        + ".",
    ]


def _mutants_lines(mutants: dict | None, current: str) -> list[str]:
    if not mutants:
        return ["Broken mechanisms: not run."]
    outcomes = mutants["results"]
    caught = sum(r["outcome"] == "caught" for r in outcomes)
    stale = " (stale: the chapter changed since)" if mutants["hash"] != current else ""
    moved = sum(bool(r.get("moved_nulls")) for r in outcomes)
    moves = f" **{moved} of them move a null.**" if moved else ""
    return [
        f"Broken mechanisms: caught {caught} of {len(outcomes)}{stale}.{moves}",
        "",
        *(f"- {r['breaks'] or r['name']} ({r['outcome']})" for r in outcomes),
    ]


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
