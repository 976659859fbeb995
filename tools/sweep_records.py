"""The seeds-and-mutants records: one file a chapter, `tests/seeds_and_mutants/<slug>.json`.

Written by `make seeds`, `make mutants` and `make sweep` (tools/seeds_and_mutants.py), read by the
staleness tests (tests/test_seeds_and_mutants.py), the scoreboard, and the sweep workflow's last
job, which compares the records its matrix jobs wrote with the committed ones:

    python tools/sweep_records.py compare FRESH_DIR [--committed DIR]

(it needs only PyYAML, no kernel). A change to one chapter touches one file, so two pull
requests on two chapters never conflict.

A record holds, under "seeds" and "mutants", the hash of what the chapter's results depend on
(tools/behaviour.py) beside what the runs found:

- seeds: per claim, on how many of the five held-out seeds it held (its condition, and every
  null failing it), on how many a null passed, its margin on each and its worst margin;
- mutants: the unbroken run's nulls (the reference), and per broken mechanism how the chapter
  ended, the claims that failed, and the nulls it moved (a null the mechanism's bugs can reach
  proves nothing about the mechanism).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

RECORDS = book.ROOT / "tests" / "seeds_and_mutants"
MIN_SEEDS_HELD = 4


def path_of(slug: str, folder: Path = RECORDS) -> Path:
    return folder / f"{slug}.json"


def load(slug: str, folder: Path = RECORDS) -> dict:
    """A chapter's record ({} where it has none yet)."""
    path = path_of(slug, folder)
    return json.loads(path.read_text()) if path.exists() else {}


def load_all(folder: Path = RECORDS) -> dict[str, dict]:
    """Every chapter's record in `folder`, by slug."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def merge(slug: str, entry: dict, folder: Path = RECORDS) -> Path:
    """Write this run's parts ("seeds", "mutants") into the chapter's record, keeping the other.

    Read, merge and write under an exclusive lock: a seeds run and a mutants run of the same
    chapter may finish at the same moment, and neither may drop the other's part.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = path_of(slug, folder)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = json.loads(path.read_text()) if path.exists() else {}
        record = {"chapter": slug, **record, **entry}
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


def must_hold(claim: dict) -> bool:
    """Whether a recorded row must hold (a reproduced or analog claim, or a check)."""
    if "must_hold" in claim:
        return claim["must_hold"]
    return claim["status"] not in ("not reproduced", "not run")


def null_passed(claim: dict) -> bool:
    return any(n["holds"] for n in claim.get("nulls", []))


def held(claim: dict) -> bool:
    """A row held on a run when its condition held, none of its nulls passed it too, and it
    broke no rule of the standard there (an arm chosen at its grid's edge on that seed, say)."""
    return bool(claim["holds"]) and not null_passed(claim) and not claim.get("problems")


def failed(claim: dict) -> bool:
    """A row failed the chapter on a run: its claim record says so (older records: a row that
    must hold and did not)."""
    return claim["failed"] if "failed" in claim else must_hold(claim) and not claim["holds"]


def nulls_by_row(claims: list[dict]) -> dict[tuple[str, str], float | bool]:
    """Each null's measurement, keyed by (claim, null)."""
    return {(c["statement"], n["name"]): n["measured"] for c in claims for n in c.get("nulls", [])}


def moved_nulls(reference: dict, mutated: dict) -> list[str]:
    """The nulls whose measurement differs between the unbroken run and a mutant's run."""
    moved = []
    for key, value in mutated.items():
        if key in reference and not _same(reference[key], value):
            moved.append(f"{key[0]}: {key[1]} ({reference[key]} -> {value})")
    return moved


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


# -- comparing a fresh sweep with the committed records ------------------------------------------


def compare(committed: dict, fresh: dict, slug: str) -> list[str]:
    """What the fresh record of a chapter contradicts in the committed one: a row held on
    another number of seeds (each must still reach MIN_SEEDS_HELD where it must hold, and the
    count may not move by more than one), a row missing, a mutant caught by other claims or no
    longer caught. Margins may differ within the seeds' spread; they are not compared."""
    problems = []
    for part in ("seeds", "mutants"):
        if part in committed and part not in fresh:
            problems.append(f"{slug}: the fresh sweep has no {part}")
    if "seeds" in committed and "seeds" in fresh:
        problems += _compare_seeds(committed["seeds"], fresh["seeds"], slug)
    if "mutants" in committed and "mutants" in fresh:
        problems += _compare_mutants(committed["mutants"], fresh["mutants"], slug)
    return problems


def _compare_seeds(committed: dict, fresh: dict, slug: str) -> list[str]:
    problems = []
    rows = {c["statement"]: c for c in fresh["claims"]}
    for claim in committed["claims"]:
        mine = rows.get(claim["statement"])
        if mine is None:
            problems.append(f"{slug}: row {claim['statement']!r} is missing from the fresh sweep")
            continue
        was, now = claim["held"], mine["held"]
        if must_hold(claim) and now < MIN_SEEDS_HELD <= was:
            problems.append(
                f"{slug}: row {claim['statement']!r} held on {now} of 5 seeds "
                f"(committed: {was}); it must hold on {MIN_SEEDS_HELD}"
            )
        elif abs(now - was) > 1:
            problems.append(
                f"{slug}: row {claim['statement']!r} held on {now} of 5 seeds, committed {was}"
            )
    if fresh.get("crashed"):
        problems.append(f"{slug}: seeds crashed in the fresh sweep: {fresh['crashed']}")
    return problems


def _compare_mutants(committed: dict, fresh: dict, slug: str) -> list[str]:
    problems = []
    results = {r["name"]: r for r in fresh["results"]}
    for result in committed["results"]:
        mine = results.get(result["name"])
        if mine is None:
            problems.append(f"{slug}: mutant {result['name']!r} is missing from the fresh sweep")
        elif mine["outcome"] != result["outcome"]:
            problems.append(
                f"{slug}: mutant {result['name']!r} {mine['outcome']} (committed: "
                f"{result['outcome']})"
            )
        elif sorted(mine["failed_claims"]) != sorted(result["failed_claims"]):
            problems.append(
                f"{slug}: mutant {result['name']!r} is caught by {sorted(mine['failed_claims'])} "
                f"(committed: {sorted(result['failed_claims'])})"
            )
    return problems


def compare_folders(fresh: Path, committed: Path = RECORDS) -> list[str]:
    """Every contradiction between the records in `fresh` and the committed ones."""
    found = load_all(fresh)
    if not found:
        return [f"no records in {fresh}"]
    problems = []
    for slug, record in found.items():
        problems += compare(load(slug, committed), record, slug)
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Compare a fresh sweep with the committed one")
    parser.add_argument("what", choices=("compare",))
    parser.add_argument("fresh", type=Path, help="the fresh sweep's records")
    parser.add_argument("--committed", type=Path, default=RECORDS, help="the committed records")
    args = parser.parse_args(argv)
    problems = compare_folders(args.fresh.resolve(), args.committed.resolve())
    for line in problems:
        print(f"DOES NOT REPRODUCE: {line}")
    count = len(load_all(args.fresh))
    print(f"compared {count} chapter record(s) with {args.committed}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
