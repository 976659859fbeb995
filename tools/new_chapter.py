"""Lay out a new chapter: its files, with the anatomy's headings, and its place in the book.

    make new SLUG=layer_norm PART="Normalization and initialization"
    .venv/bin/python tools/new_chapter.py layer_norm --part "Normalization and initialization"

Writes `chapters/<slug>.ipynb` (title, the setup cell, every section of the anatomy, a claims
cell and a knob cell to fill), the paper's folder `papernotes/<slug>/` (`__init__.py` for the
mechanism, `experiment.py` for the chapter's data, runs and measurements), `tests/test_<slug>.py`
and `tests/mutants/<slug>.py`, and lists the chapter in `_toc.yml` and `intro.md` under its part (a
new part if none has that caption). Every placeholder carries the marker below, and
tests/test_book.py fails any file that still holds it: a scaffold never passes the tests until
it has been written. CONTRIBUTING.md walks from here to a finished chapter.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

MARKER = "TO" + "WRITE"  # split so that this file itself does not trip the hygiene test


@dataclass(frozen=True)
class Paper:
    """What `make new` may be told of the paper (TITLE, AUTHORS, YEAR, ARXIV); what it is not
    told stays a placeholder."""

    title: str = ""
    authors: str = ""
    year: str = ""
    arxiv: str = ""

    def intro_line(self, slug: str) -> str:
        if self.authors and self.year:
            return f"- {{doc}}`chapters/{slug}` ({self.authors}, {self.year})\n"
        return f"- {{doc}}`chapters/{slug}` ({MARKER}: authors, year)\n"


def chapter_notebook(slug: str, paper: Paper | None = None) -> nbformat.NotebookNode:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    paper = paper or Paper()
    cells = [
        md(
            f"# {paper.title or MARKER + ': the paper' + chr(39) + 's title'}\n\n"
            f"{(paper.authors or MARKER + ': authors').rstrip('.')}. *{MARKER}: venue*, "
            f"{paper.year or MARKER + ': year'}. "
            f"[arXiv:{paper.arxiv or '0000.00000'}](https://arxiv.org/abs/"
            f"{paper.arxiv or '0000.00000'}) {{cite}}`{MARKER}`\n\n"
            f"Source summary: {MARKER} (who wrote the summary this chapter draws on, and where)."
        ),
        code(book.setup_cell_source()),
        md(f"## The idea\n\n{MARKER}: the paper's idea in the book's words, with its equations."),
        md(f"## The mechanism\n\n{MARKER}: the few lines that matter, shown from the module."),
        code(f"from papernotes import {slug}\n\npn.show_source({slug})"),
        md(f"## The experiment\n\n{MARKER}: the headline against the ablation of the idea."),
        code(f"def draw_{MARKER.lower()}():\n    ...  # {MARKER}: one figure, one function"),
        md(f"## Claim check\n\n{MARKER}: the paper's headline first, then every abstract result."),
        code(claims_cell(slug)),
        code("claims.check()"),
        md(f"## Knobs\n\n{MARKER}: the paper's hyper-parameters as sliders."),
        code(f"pn.knob_panel(draw_{MARKER.lower()}, [])  # {MARKER}"),
        md(f"## What differs from the paper\n\n{MARKER}: scale, data, optimiser; what to try."),
        md("## References\n\n```{bibliography}\n:filter: docname in docnames\n```"),
    ]
    cells[1].metadata["tags"] = [book.SETUP_CELL_TAG]
    cells[6].metadata["tags"] = ["hide-input"]
    cells[11].metadata["tags"] = ["nbval-ignore-output"]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def claims_cell(slug: str) -> str:
    """A claims cell that already meets the claims standard (CONTRIBUTING.md, "Claims"): the
    headline against the exact ablation with its nulls, its arms' tuning and its bound's source,
    and a result of the abstract not run. Its numbers are placeholders for the experiment's."""
    return f'''# {MARKER}: the numbers below come from the experiment above; these show the call.
ours, ablation, untrained, heuristic, noise = 0.90, 0.70, 0.50, 0.60, 0.05  # {MARKER}
validation = {{  # {MARKER}: each arm's validation score at each learning rate of one grid
    "ours": {{1e-3: 0.80, 1e-2: 0.90, 1e-1: 0.85}},
    "ablation": {{1e-3: 0.60, 1e-2: 0.70, 1e-1: 0.65}},
}}
budget = "{MARKER}: updates and data, the same for every arm"

claims = pn.Claims("{slug}")
claims.add(
    "{MARKER}: the paper's headline, against the ablation that removes exactly its idea",
    kind=pn.PAPER,
    status=pn.ANALOG,
    paper="{MARKER}: the paper's number, and where it stands (a table, a figure)",
    ours=f"{{ours:.3f}} against the ablation's {{ablation:.3f}}",
    measured=ours,
    op=">=",
    bound=ablation + noise,
    baseline=ablation,
    comparator="the exact ablation: the paper's model less only its idea ({MARKER})",
    bound_from="noise",
    bound_why="{MARKER}: the ablation plus two standard errors of the paired difference",
    nulls={{  # runs without the idea that could pass, each by code the mechanism cannot reach
        "the untrained network with the same read-out ({MARKER})": untrained,
        "the simplest tuned heuristic for the task ({MARKER})": heuristic,
    }},
    arms=[
        pn.Arm.best(name, scores, split="validation", budget=budget, setting="learning rate")
        for name, scores in validation.items()
    ],
)
claims.add(
    "{MARKER}: a result of the abstract this chapter does not attempt",
    kind=pn.PAPER,
    status=pn.NOT_RUN,
    paper="{MARKER}: the paper's number, and where it stands",
    ours="not run: {MARKER}: why, in one line",
)'''


def module_text(slug: str) -> str:
    return f'''"""{MARKER}: the paper's mechanism alone, read top to bottom like the paper.

Say here what the paper does; the chapter (chapters/{slug}.ipynb, "The idea") derives it. Each
equation goes in a comment right above the lines that compute it. Public entry points check
their arguments with papernotes.checks over an unchecked core; the math trusts its input.
"""
'''


def experiment_text(slug: str) -> str:
    return f'''"""{MARKER}: the chapter's experiment: its data, training runs and measurements.

The mechanism is imported as a module and looked up at call time (`{slug}.name(...)`), so that
a mutant patched into papernotes.{slug} reaches the runs. Random streams are named once here.
"""

from papernotes import {slug}  # noqa: F401
'''


def test_text(slug: str) -> str:
    return f'''"""Unit tests of papernotes.{slug}: what a broken implementation gets wrong."""

from papernotes import {slug}


def test_{MARKER.lower()}():
    raise AssertionError("{MARKER}: tests of papernotes.{slug}")  # {slug}
'''


def mutants_text(slug: str) -> str:
    return f'''"""Broken variants of papernotes.{slug}: each patches the module; a claim must fail.

`make mutants` calls each function right after the chapter's setup cell.
"""

from papernotes import {slug} as m  # noqa: F401


def {MARKER.lower()}():
    """{MARKER}: what this plausible bug breaks."""


MUTANTS = [{MARKER.lower()}]
'''


def register_in_toc(root: Path, slug: str, part: str) -> None:
    path = root / "_toc.yml"
    toc = yaml.safe_load(path.read_text())
    entry = f"chapters/{slug}"
    if any(c["file"] == entry for p in toc["parts"] for c in p["chapters"]):
        return
    text = path.read_text()
    caption = f"  - caption: {part}\n    chapters:\n"
    if caption in text:
        # after the part's last chapter
        start = text.index(caption) + len(caption)
        lines = text[start:].splitlines(keepends=True)
        n = next((i for i, line in enumerate(lines) if not line.startswith("      ")), len(lines))
        text = text[:start] + "".join(lines[:n]) + f"      - file: {entry}\n" + "".join(lines[n:])
    else:
        text = with_new_part(text, toc, f"{caption}      - file: {entry}\n")
    path.write_text(text)


def with_new_part(text: str, toc: dict, part: str) -> str:
    """The toc's text with a new part after the last part of chapters: before the parts that hold
    the book's own pages (the scoreboard, under "The book itself"), which stay last."""
    pages = [
        p for p in toc["parts"] if not any(c["file"].startswith("chapters/") for c in p["chapters"])
    ]
    if not pages:
        return text.rstrip("\n") + "\n" + part
    first_pages = text.index(f"  - caption: {pages[0]['caption']}\n")
    return text[:first_pages] + part + text[first_pages:]


def register_in_intro(root: Path, slug: str, part: str, paper: Paper | None = None) -> None:
    path = root / "intro.md"
    text = path.read_text()
    line = (paper or Paper()).intro_line(slug)
    if f"`chapters/{slug}`" in text:
        return
    heading = f"**{part}**\n"
    if heading in text:
        start = text.index(heading) + len(heading)
        rest = text[start:]
        n = re.match(r"(?:- .*\n)*", rest).end()
        text = text[:start] + rest[:n] + line + rest[n:]
    else:
        last = list(re.finditer(r"\*\*[^*\n]+\*\*\n(?:- .*\n)+", text))[-1]
        text = text[: last.end()] + f"\n{heading}{line}" + text[last.end() :]
    path.write_text(text)


def scaffold(
    slug: str, part: str, root: Path = book.ROOT, paper: Paper | None = None
) -> list[Path]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", slug):
        raise SystemExit(f"SLUG must be a lower-case Python name like layer_norm; got {slug!r}")
    files = {
        root / "chapters" / f"{slug}.ipynb": nbformat.writes(chapter_notebook(slug, paper)) + "\n",
        root / "papernotes" / slug / "__init__.py": module_text(slug),
        root / "papernotes" / slug / "experiment.py": experiment_text(slug),
        root / "tests" / f"test_{slug}.py": test_text(slug),
        root / "tests" / "mutants" / f"{slug}.py": mutants_text(slug),
    }
    existing = [p for p in files if p.exists()]
    if existing:
        raise SystemExit(f"{slug} exists already: {', '.join(str(p) for p in existing)}")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    register_in_toc(root, slug, part)
    register_in_intro(root, slug, part, paper)
    return [*files, root / "_toc.yml", root / "intro.md"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--part", default="New chapters", help="the _toc.yml part's caption")
    parser.add_argument("--title", default="", help="the paper's title")
    parser.add_argument("--authors", default="", help='as the intro lists them: "Zhang et al."')
    parser.add_argument("--year", default="", help="the paper's year")
    parser.add_argument("--arxiv", default="", help="its arXiv id, 1710.09412")
    args = parser.parse_args(argv)
    if args.arxiv and not re.fullmatch(r"\d{4}\.\d{4,5}", args.arxiv):
        raise SystemExit(f"ARXIV must be an arXiv id like 1710.09412; got {args.arxiv!r}")
    paper = Paper(args.title, args.authors, args.year, args.arxiv)
    for path in scaffold(args.slug, args.part, paper=paper):
        print(f"wrote {path.relative_to(book.ROOT)}")
    print(f"Search the files for {MARKER} and write each; then follow CONTRIBUTING.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
