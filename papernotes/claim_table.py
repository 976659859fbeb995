"""How a chapter's claims look: the table in the notebook and the page, and the verdicts alone,
which read the same on every machine."""

from __future__ import annotations

from collections.abc import Sequence

from papernotes.claim_rows import Claim, best_null, counting_nulls
from papernotes.tables import Table

COLUMNS = ["claim", "status", "paper", "ours", "condition", "best null", "margin", "verdict"]
# Measured by training: masked where a chapter's outputs come from another CPU.
MEASURED = ["ours", "condition", "best null", "margin"]


def table(claims: Sequence[Claim]) -> Table:
    rows = [
        [
            statement_cell(c),
            c.status,
            c.paper or "the book's own check",
            c.ours,
            condition_cell(c),
            null_cell(c),
            percent(c.margin),
            c.verdict(),
        ]
        for c in claims
    ]
    return Table(COLUMNS, rows, css_class="pn-claims", measured=MEASURED)


def statement_cell(claim: Claim) -> str:
    return claim.statement + (f" (waived: {claim.waiver})" if claim.waiver else "")


def condition_cell(claim: Claim) -> str:
    source = f" ({claim.bound_from})" if claim.bound_from else ""
    return claim.condition() + source


def null_cell(claim: Claim) -> str:
    best = best_null(claim)
    if best is None:
        return "—"
    value = ("passes" if best.measured else "fails") if claim.op is None else f"{best.measured:.4g}"
    more = f" (+{len(claim.nulls) - 1})" if len(claim.nulls) > 1 else ""
    return f"{best.name}: {value}{more}"


def verdicts(slug: str, claims: Sequence[Claim]) -> str:
    """Each claim's status and verdict, without the numbers: what must read the same on every
    machine (a margin may be thin on one CPU and not on another, so no "thin")."""
    lines = [f"Claims of {slug!r}:"]
    for c in claims:
        nulls = beaten(c) if c.beats_nulls else ""
        waived = "; waived" if c.waiver else ""
        lines.append(f"- {c.verdict_word()} ({c.status}{nulls}{waived}): {c.statement}")
    return "\n".join(lines)


def beaten(claim: Claim) -> str:
    """ "; beats 2 nulls": the nulls that could pass, and apart those at chance by construction."""
    n = len(counting_nulls(claim))
    chance = sum(null.at_chance for null in claim.nulls)
    return f"; beats {n} null{'s' * (n != 1)}" + (f" ({chance} more at chance)" if chance else "")


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0%}"
