"""A chapter's claims written down: `_build/records/<chapter>.json`, read by the scoreboard and by
the seeds-and-mutants runs.

One file a chapter, written by `claims.check()`: the seed, whether every claim that must hold
held, each row (its condition, margin, nulls with their measurements and verdicts, the bound's
source, the arms' tuning, its waiver and what it breaks of the standard) and the run time.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

from papernotes import chapter
from papernotes.claim_rows import Claim, margin_over
from papernotes.claim_rows import strongest_null as strongest

RECORD_DIR_VARIABLE = "PAPERNOTES_RECORD_DIR"


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


def row(claim: Claim) -> dict:
    """One claim as the record holds it."""
    fields = asdict(claim)
    fields.pop("breaches")
    return {
        **fields,
        "nulls": [asdict(n) for n in claim.nulls],
        "arms": [a.as_record() for a in claim.arms],
        "thin": claim.thin,
        "must_hold": claim.must_hold,
        "beats_nulls": claim.beats_nulls,
        "strongest_null": strongest_null(claim),
        "failed": claim.failed,
        "problems": list(claim.problems),
        "waived": list(claim.waived),
    }


def strongest_null(claim: Claim) -> dict | None:
    """The strongest run without the paper's idea that the row stands against (a null that
    could pass, or the comparator: papernotes.claim_rows.strongest_null), and the row's margin
    over it."""
    best = strongest(claim)
    if best is None:
        return None
    return {"name": best.name, "measured": best.measured, "margin": margin_over(claim, best)}


def write(slug: str, claims: list[Claim]) -> Path | None:
    """Write the claims, the seed and the run time as JSON; returns the path, or None where the
    chapter runs outside the book (Colab, say) and no record directory is set.

    "seconds" runs from the setup cell to the claim check, so it leaves out the kernel's start
    and the knob panel drawn after the check; tools/benchmark.py times whole chapters.
    """
    directory = record_dir()
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{slug}.json"
    payload = {
        "chapter": slug,
        "seed": chapter.chapter_seed(),
        "all_hold": not any(c.failed for c in claims),
        "claims": [row(c) for c in claims],
        "seconds": round(chapter.elapsed(), 2),
        "python": platform.python_version(),
    }
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return path
