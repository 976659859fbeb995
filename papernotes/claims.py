"""Claims: the paper's number or statement beside ours, with a status, a condition, its nulls and
a margin.

A chapter collects its claims as it goes and checks them at the end:

    claims = pn.Claims("concrete")
    claims.add(
        "Relaxed gradients have lower variance than REINFORCE",
        kind=pn.PAPER,
        status=pn.ANALOG,
        paper="orders of magnitude lower (Figure 3)",
        ours=f"{gs_variance:.3g} against REINFORCE's {reinforce_variance:.3g}",
        measured=gs_variance, op="<=", bound=reinforce_variance / 10,
        bound_from="paper", bound_why="an order of magnitude, the least the paper's Figure 3 shows",
        nulls={"REINFORCE with a baseline": baseline_variance},
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

A comparative claim is a **condition** `measured op bound`; a plain yes or no is `holds=...`.
Its **margin** is how far the measurement is from flipping the condition: the gap between
`measured` and `bound` as a fraction of the larger of the two in size, positive when it holds;
within 10% of flipping it is marked *thin*. A row also names its **nulls** (runs without the
paper's idea, each put through the same condition, each of which must fail it), its **arms**'
tuning (`pn.Arm`), where its **bound** comes from, and, while it falls short of that standard,
a **waiver** (papernotes.claim_rows says each rule).

`check()` shows the table, records the claims, the seed and the chapter's run time in
`_build/records/<chapter>.json` (read by the scoreboard and by `make seeds`), and raises
`ClaimsFailed` (an AssertionError) naming every claim that must hold and does not, every row
whose null passes its condition too, and every row that breaks the standard, so a failed claim
fails the notebook, nbval and CI. A not-reproduced or not-run row never fails on its numbers.
"""

from __future__ import annotations

from pathlib import Path

from papernotes import checks, claim_records, claim_table
from papernotes.claim_records import book_root, record_dir
from papernotes.claim_rows import (
    ANALOG,
    BOUND_SOURCES,
    CHECK,
    KINDS,
    NEVER_FAIL,
    NOT_REPRODUCED,
    NOT_RUN,
    OPERATORS,
    PAPER,
    REPRODUCED,
    STATUSES,
    THIN_MARGIN,
    Arm,
    Claim,
    ClaimsFailed,
    Null,
    arms_of,
    as_bool,
    as_number,
    breaches_of,
    margin,
    nulls_of,
    one_line,
)
from papernotes.tables import Table

__all__ = [
    "ANALOG",
    "CHECK",
    "KINDS",
    "NEVER_FAIL",
    "NOT_REPRODUCED",
    "NOT_RUN",
    "PAPER",
    "REPRODUCED",
    "STATUSES",
    "THIN_MARGIN",
    "Arm",
    "Claim",
    "Claims",
    "ClaimsFailed",
    "Null",
    "book_root",
    "margin",
    "record_dir",
]


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
        nulls: dict | None = None,
        bound_from: str | None = None,
        bound_why: str | None = None,
        arms: list[Arm] | None = None,
        arms_why: str | None = None,
        waiver: str | None = None,
        comparator: str | None = None,
        at_chance: list[str] | None = None,
    ) -> Claim:
        """Record one row: either the condition `measured op bound` (numbers; `op` one of
        >=, >, <=, <) or, for a plain yes or no, `holds` (a bool); a NOT_RUN row gives
        neither. `kind` is PAPER (then `status` is required) or CHECK (no status).

        `nulls` maps each null's name to its measurement (a number, or a bool for a yes-or-no
        row); `at_chance` lists those of them that sit at chance by how the task is built (shown,
        not counted: the row needs a null that could pass); `comparator` names the arm whose
        value, `baseline`, the bound is built from (a null of that name is refused);
        `bound_from` is 'paper', 'derived' or 'noise', with `bound_why` in one line; `arms`
        lists the compared arms' tuning (`pn.Arm`), `arms_why` excuses unequal arms in one line;
        `waiver`, one line, marks a row that does not meet the standard yet. Returns the row."""
        status = _status_of(statement, kind, status)
        comparative = (measured, op, bound) != (None, None, None)
        text = {
            "bound_why": one_line(statement, "bound_why", bound_why),
            "arms_why": one_line(statement, "arms_why", arms_why),
            "waiver": one_line(statement, "waiver", waiver),
            "comparator": one_line(statement, "comparator", comparator),
        }
        if status == NOT_RUN:
            given = (holds, nulls, bound_from, bound_why, arms, arms_why, waiver, comparator)
            if comparative or at_chance or any(x is not None for x in given):
                raise ValueError(f"claim {statement!r}: a row not run has no measurement")
            return self._append(Claim(statement, kind, status, paper, ours, None))
        if comparative == (holds is not None):
            raise ValueError(
                f"claim {statement!r}: give either measured, op and bound, or holds; not both"
            )
        if comparative:
            checks.one_of("op", op, tuple(OPERATORS))
            measured = as_number(statement, "measured", measured)
            bound = as_number(statement, "bound", bound)
            if bound_from is not None:
                checks.one_of("bound_from", bound_from, BOUND_SOURCES)
                if text["bound_why"] is None:
                    raise ValueError(f"claim {statement!r}: bound_from needs bound_why, one line")
            if baseline is not None:
                baseline = as_number(statement, "baseline", baseline)
            condition = {
                "holds": bool(OPERATORS[op](measured, bound)),
                "measured": measured,
                "op": op,
                "bound": bound,
                "baseline": None
                if baseline is None
                else as_number(statement, "baseline", baseline),
                "margin": margin(measured, op, bound),
                "bound_from": bound_from,
            }
        else:
            if bound_from is not None or bound_why is not None or baseline is not None:
                raise ValueError(f"claim {statement!r}: a yes-or-no row has no bound")
            if baseline is not None:
                baseline = as_number(statement, "baseline", baseline)
            condition = {"holds": as_bool(holds, repr(statement))}
        claim = Claim(
            statement,
            kind,
            status,
            paper,
            ours,
            nulls=nulls_of(statement, nulls, op, bound, at_chance),
            arms=arms_of(statement, arms),
            **condition,
            **text,
        )
        return self._append(claim)

    def _append(self, claim: Claim) -> Claim:
        claim = Claim(**{**claim.__dict__, "breaches": breaches_of(claim)})
        self.items.append(claim)
        return claim

    @property
    def failed(self) -> list[Claim]:
        return [claim for claim in self.items if claim.failed]

    def check(self) -> None:
        """Show the table, record the claims, and fail loudly if a claim that must hold does not,
        a null passes a row's condition too, or a row breaks the standard."""
        if not self.items:
            raise ClaimsFailed(f"chapter {self.chapter!r} checks no claims")
        _display(self)
        self.record()
        if self.failed:
            raise ClaimsFailed(
                f"{len(self.failed)} claim(s) of {self.chapter!r} do not hold: "
                + "; ".join(_why_it_fails(c) for c in self.failed)
            )

    def record(self) -> Path | None:
        """Write the claims, the seed and the run time (papernotes.claim_records)."""
        return claim_records.write(self.chapter, self.items)

    def table(self) -> Table:
        return claim_table.table(self.items)

    def verdicts(self) -> str:
        return claim_table.verdicts(self.chapter, self.items)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        # A notebook shows the table; its plain-text view (what nbval compares on any machine,
        # beside the table with its measured columns masked) is the verdicts alone.
        return {"text/html": self.table()._repr_html_(), "text/plain": self.verdicts()}

    def __repr__(self) -> str:
        return f"Claims of {self.chapter!r}:\n{self.table()!r}"


def _status_of(statement: str, kind: str, status: str | None) -> str:
    checks.one_of("kind", kind, KINDS)
    if kind == CHECK:
        if status is not None:
            raise ValueError(f"claim {statement!r}: a check has no status; got {status!r}")
        return CHECK
    if status is None:
        raise ValueError(f"claim {statement!r}: a paper claim needs a status ({STATUSES})")
    return checks.one_of("status", status, STATUSES)


def _why_it_fails(claim: Claim) -> str:
    reasons = []
    if claim.must_hold and not claim.holds:
        reasons.append(f"paper: {claim.paper}; ours: {claim.ours}")
    if claim.must_hold and claim.holds:
        reasons += [
            f"the null {n.name!r} ({n.measured}) passes the condition too"
            for n in claim.passing_nulls
        ]
    reasons += list(claim.problems)
    return f"{claim.statement!r} ({'; '.join(reasons)})"


def _display(obj) -> None:
    try:
        from IPython.display import display
    except ImportError:  # plain Python: print the text table
        print(repr(obj))
        return
    display(obj)
