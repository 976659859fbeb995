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
from pathlib import Path

import nbformat
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

MARKER = "TO" + "WRITE"  # split so that this file itself does not trip the hygiene test


def chapter_notebook(slug: str) -> nbformat.NotebookNode:
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [
        md(
            f"# {MARKER}: the paper's title\n\n"
            f"{MARKER}: authors. *Venue*, year. "
            "[arXiv:0000.00000](https://arxiv.org/abs/0000.00000) {cite}`" + MARKER + "`\n\n"
            f"Source summary: {MARKER} (who wrote the summary this chapter draws on, and where)."
        ),
        code(book.setup_cell_source()),
        md(f"## The idea\n\n{MARKER}: the paper's idea in the book's words, with its equations."),
        md(f"## The mechanism\n\n{MARKER}: the few lines that matter, shown from the module."),
        code(f"from papernotes import {slug}\n\npn.show_source({slug})"),
        md(f"## The experiment\n\n{MARKER}: the headline against the ablation of the idea."),
        code(f"def draw_{MARKER.lower()}():\n    ...  # {MARKER}: one figure, one function"),
        md(f"## Claim check\n\n{MARKER}: the paper's headline first, then every abstract result."),
        code(
            f'claims = pn.Claims("{slug}")\n'
            f'claims.add("{MARKER}", paper="{MARKER}", ours="{MARKER}", holds=False)\n'
            f'claims.add("{MARKER}", paper="{MARKER}", ours="{MARKER}", holds=False)'
        ),
        code("claims.check()"),
        md(f"## Knobs\n\n{MARKER}: the paper's hyper-parameters as sliders."),
        code(f"pn.knob_panel(draw_{MARKER.lower()}, [])  # {MARKER}"),
        md(f"## What differs from the paper\n\n{MARKER}: scale, data, optimiser; what to try."),
        md("## References\n\n```{bibliography}\n:filter: docname in docnames\n```"),
    ]
    cells[6].metadata["tags"] = ["hide-input"]
    cells[11].metadata["tags"] = ["nbval-ignore-output"]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


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
        text = text.rstrip("\n") + f"\n{caption}      - file: {entry}\n"
    path.write_text(text)


def register_in_intro(root: Path, slug: str, part: str) -> None:
    path = root / "intro.md"
    text = path.read_text()
    line = f"- {{doc}}`chapters/{slug}` ({MARKER}: authors, year)\n"
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


def scaffold(slug: str, part: str, root: Path = book.ROOT) -> list[Path]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", slug):
        raise SystemExit(f"SLUG must be a lower-case Python name like layer_norm; got {slug!r}")
    files = {
        root / "chapters" / f"{slug}.ipynb": nbformat.writes(chapter_notebook(slug)) + "\n",
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
    register_in_intro(root, slug, part)
    return [*files, root / "_toc.yml", root / "intro.md"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--part", default="New chapters", help="the _toc.yml part's caption")
    args = parser.parse_args(argv)
    for path in scaffold(args.slug, args.part):
        print(f"wrote {path.relative_to(book.ROOT)}")
    print(f"Search the files for {MARKER} and write each; then follow CONTRIBUTING.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
