"""One row of a chapter's claims, and the standard a row must meet.

A row is the paper's number or statement beside ours. What it must carry to be believed:

- **Its nulls.** A must-hold claim of the paper names the simplest runs without the paper's idea
  that could produce the effect (an untrained network, the competitor's method fairly tuned, a
  count-only or additive rule, the mechanism's exact ablation), each with its measurement. Each
  null goes through the row's own condition, the same op and bound (a yes-or-no row: whether the
  null passes the same test). A row is worth something only when every null fails it: a null
  that passes too means the row does not tell the paper's idea from its absence.
- **Nulls that could pass.** A row names its comparator, the arm whose value (`baseline`) its
  bound is built from. A null that is the comparator cannot pass by construction and is
  refused; a null the chapter marks as at chance
  by how the task is built (`at_chance`) is shown but does not count: a must-hold paper row needs
  at least one null that could pass, and the strongest of those is the one the table and the
  scoreboard show.
- **Its arms' tuning.** Every trained arm a row compares says how it was tuned (`Arm`): the grid,
  the split it was chosen on, the chosen value and the budget. Arms on different grids or budgets,
  a choice on the test split, or a choice at a grid's edge break the standard, unless the row
  says why in one line (`arms_why`); a choice on the test split is never excused.
- **Its bound's source.** A comparative row says where its bound comes from (`bound_from`):
  `paper` (its number, and where it stands), `derived` (a cell prints the derivation) or `noise`
  (k standard errors of a paired difference, a bootstrap the chapter computes); `bound_why` says
  it in one line.
- **A waiver**, one line, marks a row that does not meet the standard yet: the row is shown and
  counted as waived, and the waiver must go once the row meets the standard.

This module holds the row and the rules; `papernotes.claims` collects the rows of a chapter and
checks them, `claim_records` writes them down, `claim_table` shows them.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

PAPER = "paper"
CHECK = "check"
KINDS = (PAPER, CHECK)
REPRODUCED = "reproduced"
ANALOG = "analog"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not run"
STATUSES = (REPRODUCED, ANALOG, NOT_REPRODUCED, NOT_RUN)
NEVER_FAIL = (NOT_REPRODUCED, NOT_RUN)
FROM_PAPER, DERIVED, NOISE = "paper", "derived", "noise"
BOUND_SOURCES = (FROM_PAPER, DERIVED, NOISE)
TEST_SPLIT = "test"
THIN_MARGIN = 0.10
OPERATORS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
SYMBOLS = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


class ClaimsFailed(AssertionError):
    """A chapter's claim that must hold did not, or a row broke the claims standard."""


def margin(measured: float, op: str, bound: float) -> float:
    """How far `measured` is from flipping `measured op bound`, as a fraction of the larger of
    the two in size: positive on the side where the condition holds."""
    gap = measured - bound if op in (">=", ">") else bound - measured
    scale = max(abs(measured), abs(bound))
    return gap / scale if scale > 0 else 0.0


# -- nulls ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Null:
    """A run without the paper's idea, put through the row's condition. `holds`: it passes
    too, so the row cannot tell the idea from its absence. `at_chance`: the chapter marks it as
    at chance by how the task is built, so that failing it says nothing (shown, not counted)."""

    name: str
    measured: float | bool
    holds: bool
    at_chance: bool = False


def nulls_of(
    statement: str, nulls, op: str | None, bound: float | None, at_chance=None
) -> tuple[Null, ...]:
    """The row's nulls, each measured and put through the row's condition (a yes-or-no row's
    null is a bool: whether it passes the same test); `at_chance` names those at chance by
    construction."""
    if nulls is None:
        if at_chance:
            raise ValueError(f"claim {statement!r}: at_chance names nulls, and the row has none")
        return ()
    if not isinstance(nulls, Mapping):
        raise TypeError(
            f"claim {statement!r}: nulls must map a null's name to its measurement; "
            f"got {type(nulls).__name__}"
        )
    chance = _names(statement, "at_chance", at_chance)
    unknown = sorted(chance - set(nulls))
    if unknown:
        raise ValueError(
            f"claim {statement!r}: at_chance names {unknown}, which are not among its nulls "
            f"{sorted(nulls)}"
        )
    found = []
    for name, value in nulls.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"claim {statement!r}: a null's name must be a non-empty string")
        if op is None:
            passes = as_bool(value, f"{statement!r}: null {name!r}")
            found.append(Null(name, passes, passes, name in chance))
        else:
            value = as_number(statement, f"null {name!r}", value)
            found.append(Null(name, value, bool(OPERATORS[op](value, bound)), name in chance))
    return tuple(found)


def _names(statement: str, what: str, names) -> set[str]:
    if names is None:
        return set()
    if isinstance(names, str) or not isinstance(names, (Sequence, set, frozenset)):
        raise TypeError(f"claim {statement!r}: {what} must be a list of null names; got {names!r}")
    return set(names)


def is_comparator(claim: Claim, null: Null) -> bool:
    """The null is the row's own comparator (the arm its bound is built from, by name): it
    cannot pass by construction."""
    return claim.comparator is not None and null.name == claim.comparator


def counting_nulls(claim: Claim) -> list[Null]:
    """The nulls that could pass: neither at chance by construction nor the row's comparator."""
    return [n for n in claim.nulls if not n.at_chance and not is_comparator(claim, n)]


def best_null(claim: Claim) -> Null | None:
    """The strongest null: the one that comes nearest to passing the row's condition (one that
    passes, first), among the nulls that could pass (all of them, where none could)."""
    if not claim.nulls:
        return None
    passing = [n for n in claim.nulls if n.holds]
    if passing:
        return passing[0]
    pool = counting_nulls(claim) or list(claim.nulls)
    if claim.op is None:
        return pool[0]
    larger_is_nearer = claim.op in (">=", ">")
    return max(pool, key=lambda n: n.measured if larger_is_nearer else -n.measured)


def strongest_null(claim: Claim) -> Null | None:
    """The strongest run without the paper's idea that the row stands against: the nearest to
    passing of the nulls that could pass and the comparator (the arm the bound is built from,
    at its value `baseline`: the paper's model less its idea, often); None for a yes-or-no row
    or a row with neither."""
    if claim.op is None:
        return None
    pool = counting_nulls(claim)
    if claim.comparator is not None and claim.baseline is not None:
        within = bool(OPERATORS[claim.op](claim.baseline, claim.bound))
        pool.append(Null(claim.comparator, claim.baseline, within))
    if not pool:
        return None
    larger_is_nearer = claim.op in (">=", ">")
    return max(pool, key=lambda n: n.measured if larger_is_nearer else -n.measured)


def margin_over(claim: Claim, null: Null) -> float | None:
    """How far the row's measurement stands beyond a null's, as `margin` measures it (positive
    on the side the condition asks for); None for a yes-or-no row."""
    if claim.op is None or claim.measured is None:
        return None
    return margin(claim.measured, claim.op, null.measured)


# -- arms ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """A trained arm that a row compares, and how it was tuned.

    `grid` maps each tuned setting to the values tried (a plain sequence is one setting,
    "setting"); `chosen` maps each to the value picked (a plain value for a plain sequence);
    `split` is where the choice was made ("validation"; None only when no grid has more than one
    value, a fixed setting); `budget` says what each arm trained on ("800 updates of 64").
    """

    name: str
    grid: Mapping[str, tuple]
    chosen: Mapping[str, object]
    split: str | None
    budget: str

    def __init__(self, name: str, *, grid, chosen, split: str | None, budget: str):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"an arm's name must be a non-empty string; got {name!r}")
        plain = not isinstance(grid, Mapping)
        grid = {"setting": grid} if plain else dict(grid)
        chosen = {"setting": chosen} if plain else dict(chosen or {})
        for setting, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise TypeError(f"arm {name!r}: grid {setting!r} must be a non-empty list")
            if setting not in chosen:
                raise ValueError(f"arm {name!r}: no chosen value for {setting!r}")
            if not any(_same(chosen[setting], v) for v in values):
                raise ValueError(
                    f"arm {name!r}: the chosen {setting} {chosen[setting]!r} is not in its grid "
                    f"{list(values)!r}"
                )
        if set(chosen) != set(grid):
            raise ValueError(f"arm {name!r}: chosen names {sorted(chosen)}, grid {sorted(grid)}")
        if not isinstance(budget, str) or not budget.strip():
            raise ValueError(f"arm {name!r}: budget must say what it trained on, as text")
        tuned = any(len(v) > 1 for v in grid.values())
        if split is None and tuned:
            raise ValueError(
                f"arm {name!r}: a grid of several values needs the split it was chosen on"
            )
        if split is not None and (not isinstance(split, str) or not split.strip()):
            raise ValueError(f"arm {name!r}: split must be a split's name, such as 'validation'")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "grid", {k: tuple(_plain(x) for x in v) for k, v in grid.items()})
        object.__setattr__(self, "chosen", {k: _plain(v) for k, v in chosen.items()})
        object.__setattr__(self, "split", split)
        object.__setattr__(self, "budget", budget)

    @classmethod
    def best(
        cls,
        name: str,
        scores: Mapping,
        *,
        split: str,
        budget: str,
        higher_is_better: bool = True,
        setting: str = "setting",
    ) -> Arm:
        """The arm tuned on `scores` (each value of one setting to its score on `split`): the
        grid is the values tried, the chosen one the best score."""
        if not scores:
            raise ValueError(f"arm {name!r}: no scores to choose from")
        pick = max if higher_is_better else min
        chosen = pick(scores, key=lambda value: float(scores[value]))
        return cls(
            name, grid={setting: list(scores)}, chosen={setting: chosen}, split=split, budget=budget
        )

    def edges(self) -> list[str]:
        """The settings whose chosen value is the smallest or largest number of its grid."""
        found = []
        for setting, values in self.grid.items():
            numbers_ = [v for v in values if _is_number(v)]
            chosen = self.chosen[setting]
            if len(numbers_) < 2 or len(numbers_) != len(values) or not _is_number(chosen):
                continue
            if chosen in (min(numbers_), max(numbers_)):
                found.append(setting)
        return found

    def as_record(self) -> dict:
        return {
            "name": self.name,
            "grid": {k: list(v) for k, v in self.grid.items()},
            "chosen": dict(self.chosen),
            "split": self.split,
            "budget": self.budget,
        }


def arms_of(statement: str, arms) -> tuple[Arm, ...]:
    if arms is None:
        return ()
    if isinstance(arms, (Arm, Mapping)) or not isinstance(arms, Sequence):
        raise TypeError(f"claim {statement!r}: arms must be a list of pn.Arm")
    found = []
    for arm in arms:
        if isinstance(arm, Mapping):
            arm = Arm(**arm)
        if not isinstance(arm, Arm):
            raise TypeError(f"claim {statement!r}: arms must be pn.Arm; got {type(arm).__name__}")
        found.append(arm)
    return tuple(found)


def arms_problems(arms: Sequence[Arm]) -> list[str]:
    """What is unfair about a row's arms (empty when they were tuned alike)."""
    problems = []
    if len({_key(a.grid) for a in arms}) > 1:
        problems.append("its arms were tuned on different grids: " + _each(arms, "grid"))
    if len({a.budget for a in arms}) > 1:
        problems.append("its arms had different budgets: " + _each(arms, "budget"))
    for arm in arms:
        for setting in arm.edges():
            problems.append(
                f"arm {arm.name!r} chose {setting} {arm.chosen[setting]!r} at its grid's edge "
                f"{list(arm.grid[setting])!r} (extend the grid)"
            )
    return problems


def test_split_problems(arms: Sequence[Arm]) -> list[str]:
    return [
        f"arm {a.name!r} was chosen on the test split (choose on validation)"
        for a in arms
        if a.split == TEST_SPLIT
    ]


# -- the row ---------------------------------------------------------------------------------------


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
    nulls: tuple[Null, ...] = ()
    bound_from: str | None = None
    bound_why: str | None = None
    arms: tuple[Arm, ...] = ()
    arms_why: str | None = None
    waiver: str | None = None
    comparator: str | None = None
    # What breaks the standard, excused by the waiver or not (see `problems`).
    breaches: tuple[str, ...] = field(default=())

    @property
    def must_hold(self) -> bool:
        return self.status not in NEVER_FAIL

    @property
    def passing_nulls(self) -> list[Null]:
        return [n for n in self.nulls if n.holds]

    @property
    def problems(self) -> tuple[str, ...]:
        """Breaches of the standard that no waiver excuses: they fail the chapter."""
        if self.waiver is None:
            return self.breaches
        if not self.breaches:
            return ("carries a waiver but meets the standard: remove the waiver",)
        return tuple(b for b in self.breaches if "test split" in b)

    @property
    def waived(self) -> tuple[str, ...]:
        """Breaches the waiver excuses: shown, counted, and to be fixed."""
        return tuple(b for b in self.breaches if b not in self.problems) if self.waiver else ()

    @property
    def beats_nulls(self) -> bool | None:
        """Whether every null that could pass fails the condition (None: the row names none
        that could: at chance by construction, or its own comparator, do not count)."""
        return None if not counting_nulls(self) else not self.passing_nulls

    @property
    def failed(self) -> bool:
        measured_fails = self.must_hold and (not self.holds or bool(self.passing_nulls))
        return measured_fails or bool(self.problems)

    @property
    def thin(self) -> bool:
        return bool(self.holds) and self.margin is not None and self.margin < THIN_MARGIN

    def condition(self) -> str:
        if self.status == NOT_RUN:
            return "—"
        if self.op is None:
            return "yes or no"
        return f"{self.measured:.4g} {SYMBOLS[self.op]} {self.bound:.4g}"

    def verdict_word(self) -> str:
        if self.status == NOT_RUN:
            return "not run"
        word = self.measured_verdict()
        return f"{word}; BREAKS THE STANDARD" if self.problems else word

    def measured_verdict(self) -> str:
        """The verdict on the numbers alone: the condition, and the nulls."""
        if self.status == NOT_REPRODUCED:
            if not self.holds:
                return "does not hold"
            return "holds here, and so does a null" if self.passing_nulls else "holds here"
        if not self.holds:
            return "FAILS"
        return "FAILS: a null passes too" if self.passing_nulls else "holds"

    def verdict(self) -> str:
        word = self.verdict_word()
        return "holds (thin)" if word == "holds" and self.thin else word


def breaches_of(claim: Claim) -> tuple[str, ...]:
    """What the row lacks or gets wrong against the standard (the module docstring)."""
    if claim.status == NOT_RUN:
        return ()
    found = []
    paper_must_hold = claim.kind == PAPER and claim.must_hold
    if paper_must_hold and not claim.nulls:
        found.append("names no null (nulls={...}: the simplest runs without the paper's idea)")
    found += [
        f"the null {n.name!r} is the row's own comparator (the arm its bound is built from): "
        "it cannot pass; name a null that could"
        for n in claim.nulls
        if is_comparator(claim, n)
    ]
    if paper_must_hold and claim.nulls and not counting_nulls(claim):
        found.append(
            "names no null that could pass (at chance by construction or its own comparator "
            "do not count): name the strongest run without the paper's idea"
        )
    if claim.op is not None and claim.baseline is not None and claim.comparator is None:
        found.append(
            "gives a baseline but names no comparator (comparator='...': the arm whose value "
            "the bound is built from)"
        )
    if paper_must_hold and claim.bound_from == NOISE and claim.comparator is None:
        found.append(
            "its bound is built from noise around an arm's value: name that arm (comparator=, "
            "with its value as baseline=)"
        )
    if claim.op is not None and claim.bound_from is None:
        found.append("its bound names no source (bound_from='paper', 'derived' or 'noise')")
    found += arms_problems(claim.arms) if claim.arms_why is None else []
    found += test_split_problems(claim.arms)
    return tuple(found)


def one_line(statement: str, name: str, text) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str) or not text.strip() or "\n" in text:
        raise ValueError(f"claim {statement!r}: {name} must be one line of text; got {text!r}")
    return text.strip()


# -- values ----------------------------------------------------------------------------------------


def as_number(statement: str, name: str, value) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"claim {statement!r}: {name} must be a finite number; got {value!r}")
    return float(value)


def as_bool(holds, what: str) -> bool:
    # numpy and one-element torch booleans are fine; anything else is a bug in the chapter.
    if isinstance(holds, np.bool_):
        holds = bool(holds)
    elif isinstance(holds, torch.Tensor) and holds.dtype == torch.bool and holds.numel() == 1:
        holds = bool(holds.item())
    if not isinstance(holds, bool):
        raise TypeError(f"claim {what}: holds must be a boolean; got {type(holds).__name__}")
    return holds


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _plain(value):
    """A grid value as JSON can hold it (numpy and torch scalars become Python numbers)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same(a, b) -> bool:
    return _plain(a) == _plain(b)


def _key(grid: Mapping[str, tuple]) -> str:
    return repr(sorted((k, list(v)) for k, v in grid.items()))


def _each(arms: Sequence[Arm], what: str) -> str:
    return "; ".join(f"{a.name} {getattr(a, what)}" for a in arms)
