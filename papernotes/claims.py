"""Claims: the paper's number or statement beside ours, and the condition that must hold.

A chapter collects its claims as it goes and checks them at the end:

    claims = Claims("concrete")
    claims.add("Relaxed gradients have lower variance than REINFORCE",
               paper="orders of magnitude lower", ours=f"{ratio:.2f} x REINFORCE's",
               holds=ratio <= 0.2)
    claims.check()

`check()` shows a table (claim | paper | ours | holds), records the claims and the chapter's run
time in `_build/records/<chapter>.json` (for a scoreboard page), and raises AssertionError
naming every claim that failed, so a failed claim fails the notebook, nbval and CI.

A claim's condition should compare against a baseline or ablation run in the same notebook, so
that a wrong or stubbed implementation fails it.
"""

from __future__ import annotations

import html
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from papernotes import chapter

RECORD_DIR_VARIABLE = "PAPERNOTES_RECORD_DIR"


@dataclass(frozen=True)
class Claim:
    statement: str
    paper: str
    ours: str
    holds: bool


class Claims:
    """The claims of one chapter, in the order the chapter states them."""

    def __init__(self, chapter_slug: str):
        if not chapter_slug or not chapter_slug.isidentifier():
            raise ValueError(f"chapter slug must be a name like 'batch_norm'; got {chapter_slug!r}")
        self.chapter = chapter_slug
        self.items: list[Claim] = []

    def add(self, statement: str, *, paper: str, ours: str, holds) -> None:
        """Record one claim; `holds` is the condition, evaluated already (a bool)."""
        self.items.append(Claim(statement, paper, ours, _as_bool(holds, statement)))

    @property
    def failed(self) -> list[Claim]:
        return [claim for claim in self.items if not claim.holds]

    def check(self) -> None:
        """Show the table, record the claims, and fail loudly if any claim does not hold."""
        if not self.items:
            raise AssertionError(f"chapter {self.chapter!r} checks no claims")
        _display(self)
        self.record()
        if self.failed:
            names = "; ".join(
                f"{c.statement!r} (paper: {c.paper}; ours: {c.ours})" for c in self.failed
            )
            raise AssertionError(
                f"{len(self.failed)} claim(s) of {self.chapter!r} do not hold: {names}"
            )

    # -- the record for the scoreboard ---------------------------------------------------------

    def record(self) -> Path | None:
        """Write the claims and the run time as JSON; returns the path, or None where the
        chapter runs outside the book (Colab, say) and no record directory is set.

        "seconds" runs from the setup cell to the claim check, so it leaves out the kernel's
        start and the knob panel drawn after the check; tools/benchmark.py times whole chapters.
        """
        directory = record_dir()
        if directory is None:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.chapter}.json"
        payload = {
            "chapter": self.chapter,
            "all_hold": not self.failed,
            "claims": [asdict(claim) for claim in self.items],
            "seconds": round(chapter.elapsed(), 2),
            "python": platform.python_version(),
        }
        path.write_text(json.dumps(payload, indent=2) + "\n")
        return path

    # -- how the table looks --------------------------------------------------------------------

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
                html.escape(c.statement),
                html.escape(c.paper),
                html.escape(c.ours),
                "&#10004; holds" if c.holds else "&#10008; FAILS",
            )
            for c in self.items
        )
        return (
            '<table class="pn-claims"><thead><tr><th>claim</th><th>paper</th><th>ours</th>'
            f"<th>holds</th></tr></thead><tbody>{rows}</tbody></table>"
        )

    def __repr__(self) -> str:
        lines = [f"Claims of {self.chapter!r}:"]
        for c in self.items:
            mark = "holds" if c.holds else "FAILS"
            lines.append(f"  [{mark}] {c.statement} | paper: {c.paper} | ours: {c.ours}")
        return "\n".join(lines)


def record_dir() -> Path | None:
    """Where records go: $PAPERNOTES_RECORD_DIR, else _build/records of the enclosing book."""
    if os.environ.get(RECORD_DIR_VARIABLE):
        return Path(os.environ[RECORD_DIR_VARIABLE])
    root = book_root(Path.cwd())
    return None if root is None else root / "_build" / "records"


def book_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds the book's _toc.yml."""
    for folder in (start, *start.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return None


def _as_bool(holds, statement: str) -> bool:
    # numpy and one-element torch booleans are fine; anything else is a bug in the chapter.
    if isinstance(holds, np.bool_):
        holds = bool(holds)
    elif isinstance(holds, torch.Tensor) and holds.dtype == torch.bool and holds.numel() == 1:
        holds = bool(holds.item())
    if not isinstance(holds, bool):
        raise TypeError(f"claim {statement!r}: holds must be a boolean; got {type(holds).__name__}")
    return holds


def _display(obj) -> None:
    try:
        from IPython.display import display
    except ImportError:  # plain Python: print the text table
        print(repr(obj))
        return
    display(obj)
