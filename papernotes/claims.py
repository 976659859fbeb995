"""Claims: the paper's number or statement beside ours, with a status, a condition and a margin.

A chapter collects its claims as it goes and checks them at the end:

    claims = pn.Claims("concrete")
    claims.add(
        "Relaxed gradients have lower variance than REINFORCE",
        kind=pn.PAPER,
        paper="orders of magnitude lower (Figure 3)",
        ours=f"{gs_variance:.3g} against REINFORCE's {reinforce_variance:.3g}",
        measured=gs_variance, op="<=", bound=0.2 * reinforce_variance,
    )
    claims.check()

Every row has a **kind**:

- `PAPER`: a claim of the paper. Its `paper` column gives the paper's number or statement and
  where it stands (a table, a figure, a section);
- `CHECK`: the book's own check (a control, an identity, a sanity bound), which says so. A row
  that holds by construction is neither: it is a unit test.

A paper claim has a **status**, each meaning one thing:

- `REPRODUCED`: the paper's statement at the paper's own setting;
- `ANALOG`: the same statement at a scaled or changed setting (the chapter says how);
- `NOT_REPRODUCED`: we ran it and it did not hold; `ours` says what we measured;
- `NOT_RUN`: a result of the paper that the book does not attempt; `ours` gives the reason.

A check has no status: it must hold.

A comparative claim is a **condition** `measured op bound`, where `bound` comes from a baseline or
ablation run in the same notebook (`bound=0.95 * baseline`, and `baseline=` records that value) or
is a fixed level. Its **margin** is how far the measurement is from flipping the condition: the
gap between `measured` and `bound` as a fraction of the larger of the two in size, positive when
it holds. A claim that holds within 10% of flipping is marked *thin*. A claim that is a plain
yes or no (`holds=...`) has no margin.

`check()` shows the table, records the claims, the seed and the chapter's run time in
`_build/records/<chapter>.json` (read by the scoreboard and by `make seeds`), and raises
`ClaimsFailed` (an AssertionError) naming every reproduced or analog claim, and every check, that
does not hold, so a failed claim fails the notebook, nbval and CI. A not-reproduced or not-run
row never fails.
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from papernotes import chapter, checks
from papernotes.tables import Table

RECORD_DIR_VARIABLE = "PAPERNOTES_RECORD_DIR"
PAPER = "paper"
CHECK = "check"
KINDS = (PAPER, CHECK)
REPRODUCED = "reproduced"
ANALOG = "analog"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run"
STATUSES = (REPRODUCED, ANALOG, NOT_REPRODUCED, NOT_RUN)
NEVER_FAIL = (NOT_REPRODUCED, NOT_RUN)
THIN_MARGIN = 0.10
_OPERATORS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_SYMBOLS = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


class ClaimsFailed(AssertionError):
    """A reproduced or analog claim of a chapter did not hold."""


@dataclass(frozen=True)
class Claim:
    statement: str
    kind: str
    status: str  # CHECK for a check
    paper: str
    ours: str
    holds: bool | None  # None: not run
    measured: float | None = None
    op: str | None = None
    bound: float | None = None
    baseline: float | None = None
    margin: float | None = None

    @property
    def thin(self) -> bool:
        return self.holds and self.margin is not None and self.margin < THIN_MARGIN

    @property
    def must_hold(self) -> bool:
        return self.status not in NEVER_FAIL

    @property
    def failed(self) -> bool:
        return self.must_hold and not self.holds

    def condition(self) -> str:
        if self.status == NOT_RUN:
            return "—"
        if self.op is None:
            return "yes or no"
        return f"{self.measured:.4g} {_SYMBOLS[self.op]} {self.bound:.4g}"

    def verdict_word(self) -> str:
        if self.status == NOT_RUN:
            return "not run"
        if self.status == NOT_REPRODUCED:
            return "does not hold" if not self.holds else "holds here"
        return "holds" if self.holds else "FAILS"

    def verdict(self) -> str:
        return "holds (thin)" if self.thin else self.verdict_word()


def margin(measured: float, op: str, bound: float) -> float:
    """How far `measured` is from flipping `measured op bound`, as a fraction of the larger of
    the two in size: positive on the side where the condition holds."""
    gap = measured - bound if op in (">=", ">") else bound - measured
    scale = max(abs(measured), abs(bound))
    return gap / scale if scale > 0 else 0.0


class Claims:
    """The claims of one chapter, in the order the chapter states them."""

    def __init__(self, chapter_slug: str):
        if not chapter_slug or not chapter_slug.isidentifier():
            raise ValueError(f"chapter slug must be a name like 'batch_norm'; got {chapter_slug!r}")
        self.chapter = chapter_slug
        self.items: list[Claim] = []

    def add(
        self,
        statement: str,
        *,
        kind: str,
        paper: str,
        ours: str,
        status: str | None = None,
        measured: float | None = None,
        op: str | None = None,
        bound: float | None = None,
        baseline: float | None = None,
        holds=None,
    ) -> Claim:
        """Record one row: either the condition `measured op bound` (numbers; `op` one of
        >=, >, <=, <) or, for a plain yes or no, `holds` (a bool); a NOT_RUN row gives
        neither. `kind` is PAPER (then `status` is required) or CHECK (no status). Returns it."""
        checks.one_of("kind", kind, KINDS)
        if kind == CHECK:
            if status is not None:
                raise ValueError(f"claim {statement!r}: a check has no status; got {status!r}")
            status = CHECK
        elif status is None:
            raise ValueError(f"claim {statement!r}: a paper claim needs a status ({STATUSES})")
        else:
            checks.one_of("status", status, STATUSES)
        comparative = (measured, op, bound) != (None, None, None)
        if status == NOT_RUN:
            if comparative or holds is not None:
                raise ValueError(f"claim {statement!r}: a row not run has no measurement")
            claim = Claim(statement, kind, status, paper, ours, None)
            self.items.append(claim)
            return claim
        if comparative == (holds is not None):
            raise ValueError(
                f"claim {statement!r}: give either measured, op and bound, or holds; not both"
            )
        if comparative:
            checks.one_of("op", op, tuple(_OPERATORS))
            measured, bound = (
                _number(statement, "measured", measured),
                _number(statement, "bound", bound),
            )
            holds = bool(_OPERATORS[op](measured, bound))
            claim = Claim(
                statement,
                kind,
                status,
                paper,
                ours,
                holds,
                measured,
                op,
                bound,
                None if baseline is None else _number(statement, "baseline", baseline),
                margin(measured, op, bound),
            )
        else:
            claim = Claim(statement, kind, status, paper, ours, _as_bool(holds, statement))
        self.items.append(claim)
        return claim

    @property
    def failed(self) -> list[Claim]:
        return [claim for claim in self.items if claim.failed]

    def check(self) -> None:
        """Show the table, record the claims, and fail loudly if a claim that must hold does not."""
        if not self.items:
            raise ClaimsFailed(f"chapter {self.chapter!r} checks no claims")
        _display(self)
        self.record()
        if self.failed:
            names = "; ".join(
                f"{c.statement!r} (paper: {c.paper}; ours: {c.ours})" for c in self.failed
            )
            raise ClaimsFailed(
                f"{len(self.failed)} claim(s) of {self.chapter!r} do not hold: {names}"
            )

    # -- the record for the scoreboard and the seed runs ----------------------------------------

    def record(self) -> Path | None:
        """Write the claims, the seed and the run time as JSON; returns the path, or None where
        the chapter runs outside the book (Colab, say) and no record directory is set.

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
            "seed": chapter.chapter_seed(),
            "all_hold": not self.failed,
            "claims": [
                {**asdict(claim), "thin": claim.thin, "must_hold": claim.must_hold}
                for claim in self.items
            ],
            "seconds": round(chapter.elapsed(), 2),
            "python": platform.python_version(),
        }
        path.write_text(json.dumps(payload, indent=2) + "\n")
        return path

    # -- how the table looks --------------------------------------------------------------------

    def table(self) -> Table:
        rows = [
            [
                c.statement,
                c.status,
                c.paper or "the book's own check",
                c.ours,
                c.condition(),
                _percent(c.margin),
                c.verdict(),
            ]
            for c in self.items
        ]
        columns = ["claim", "status", "paper", "ours", "condition", "margin", "verdict"]
        measured = ["ours", "condition", "margin"]
        return Table(columns, rows, css_class="pn-claims", measured=measured)

    def verdicts(self) -> str:
        """Each claim's status and verdict, without the numbers: what must read the same on
        every machine (a margin may be thin on one CPU and not on another, so no "thin")."""
        lines = [f"Claims of {self.chapter!r}:"]
        lines += [f"- {c.verdict_word()} ({c.status}): {c.statement}" for c in self.items]
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        # A notebook shows the table; its plain-text view (what nbval compares on any machine,
        # beside the table with its measured columns masked) is the verdicts alone.
        return {"text/html": self.table()._repr_html_(), "text/plain": self.verdicts()}

    def __repr__(self) -> str:
        return f"Claims of {self.chapter!r}:\n{self.table()!r}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0%}"


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


def _number(statement: str, name: str, value) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"claim {statement!r}: {name} must be a finite number; got {value!r}")
    return float(value)


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
