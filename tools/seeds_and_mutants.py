"""Do the chapters' claims hold up? Seeds and broken mechanisms, recorded one file a chapter in
tests/seeds_and_mutants/<slug>.json (tools/sweep_records.py).

    .venv/bin/python tools/seeds_and_mutants.py seeds   [chapters/x.ipynb ...]   # make seeds
    .venv/bin/python tools/seeds_and_mutants.py mutants [chapters/x.ipynb ...]   # make mutants
    .venv/bin/python tools/seeds_and_mutants.py sweep   [chapters/x.ipynb ...]   # make sweep

`seeds` executes each chapter under five held-out seeds (SEEDS: no design choice may use them)
and records, per claim, on how many of the five it held (its condition, with every null failing
it), on how many a null passed, its margin on each (the scoreboard draws them) and its worst
margin. A reproduced or analog claim, and a check, must hold on at least 4 of 5.

`mutants` executes each chapter once unbroken (the reference: it must pass, and its nulls'
measurements are kept) and once per broken variant of its mechanism, defined in
tests/mutants/<slug>.py: a list MUTANTS of functions, each of which patches the paper's module
(its docstring says what it breaks). The call is put in a cell right after the setup cell. A
mutant is caught when the chapter then stops on its claim check (papernotes.claims.ClaimsFailed);
it survives when the chapter passes, and it crashes when something else stops the chapter first.
Every mutant must be caught, and none may move a null: a null computed by code the mechanism's
bugs reach would break with the mechanism and prove nothing.

`sweep` does both in one pool of workers; `--out DIR` writes the records elsewhere (the sweep
workflow's matrix jobs), and tools/sweep_records.py compares them with the committed ones.

Each execution runs the chapter only up to its claim check (the knob panels after it are not
needed), JOBS at a time (`--jobs`, or $JOBS; 2 by default, one single-threaded kernel per core),
each within `--timeout` seconds in all, so that a hang fails naming the chapter and the cell.
`--stale` skips the chapters whose record is current (the per-chapter loop, `make check`, uses
it so that a sweep just run is not run again).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import behaviour
import book
import kernels
import sweep_records
from sweep_records import MIN_SEEDS_HELD, RECORDS, must_hold

MUTANTS_DIR = book.ROOT / "tests" / "mutants"
# Held out: the committed run is seed 0, and a design may use any seed but these five.
SEEDS = (1000, 1001, 1002, 1003, 1004)
CHECK_CALL = "claims.check()"
EXECUTION_TIMEOUT_S = 600
PARTS = {"seeds": ("seeds",), "mutants": ("mutants",), "sweep": ("seeds", "mutants")}
LAST_SWEEP = book.ROOT / "_build" / "last_sweep.json"

__all__ = ["MIN_SEEDS_HELD", "RECORDS", "SEEDS", "content_hash", "must_hold", "mutants_of"]


def content_hash(path: Path) -> str:
    """What the chapter's results depend on: its code cells, the code of every papernotes module
    it imports (docstrings and comments aside) and its mutants (tools/behaviour.py)."""
    return behaviour.behaviour_hash(path)


def mutants_of(slug: str) -> list[tuple[str, str]]:
    """(name, what it breaks) for each mutant of a chapter, from tests/mutants/<slug>.py."""
    path = MUTANTS_DIR / f"{slug}.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(f"mutants_{slug}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(f.__name__, " ".join((f.__doc__ or "").split())) for f in module.MUTANTS]


def up_to_the_claim_check(nb):
    """The notebook's cells up to and including the one that checks the claims."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and CHECK_CALL in cell.source:
            nb.cells = nb.cells[: i + 1]
            return nb
    raise ValueError("the chapter never calls claims.check()")


def run(
    path: Path, seed: int = 0, mutant: str | None = None, timeout: int = EXECUTION_TIMEOUT_S
) -> dict:
    """Execute one chapter up to its claim check; returns its claims record and how it ended."""
    nb = up_to_the_claim_check(nbformat.read(path, as_version=4))
    if mutant is not None:
        first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        patch = (
            f"import sys\nsys.path.insert(0, {str(book.ROOT / 'tests')!r})\n"
            f"from mutants import {path.stem} as _mutants\n_mutants.{mutant}()"
        )
        nb.cells.insert(first_code + 1, nbformat.v4.new_code_cell(patch))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as records:
        ended, error = "passed", ""
        try:
            kernels.execute(nb, path, seed=seed, record_dir=records, total_timeout=timeout)
        except kernels.ChapterFailed as failure:
            ended = "claims failed" if failure.ename == "ClaimsFailed" else "crashed"
            error = f"{failure}"[:500]
        record = Path(records) / f"{path.stem}.json"
        claims = json.loads(record.read_text())["claims"] if record.exists() else []
    seconds = round(time.perf_counter() - started, 1)
    return {
        "seed": seed,
        "mutant": mutant,
        "ended": ended,
        "error": error,
        "claims": claims,
        "seconds": seconds,
    }


def summarize_seeds(runs: list[dict]) -> dict:
    claims: list[dict] = []
    for run_ in sorted(runs, key=lambda r: r["seed"]):
        for i, claim in enumerate(run_["claims"]):
            if i == len(claims):
                claims.append(
                    {
                        "statement": claim["statement"],
                        "kind": claim.get("kind"),
                        "status": claim["status"],
                        "must_hold": must_hold(claim),
                        "held": 0,
                        "null_passed": 0,
                        "worst_margin": None,
                        "margins": [],
                    }
                )
            entry = claims[i]
            entry["held"] += sweep_records.held(claim)
            entry["null_passed"] += sweep_records.null_passed(claim)
            entry["margins"].append(None if claim["margin"] is None else round(claim["margin"], 4))
            if claim["margin"] is not None:
                worst = entry["worst_margin"]
                entry["worst_margin"] = round(
                    claim["margin"] if worst is None else min(worst, claim["margin"]), 4
                )
    for entry in claims:
        entry["of"] = len(SEEDS)
    crashed = {str(r["seed"]): r["error"] for r in runs if r["ended"] == "crashed"}
    return {"seeds": list(SEEDS), "claims": claims, "crashed": crashed}


def summarize_mutant(run_: dict, description: str, reference: dict) -> dict:
    failed = [c["statement"] for c in run_["claims"] if sweep_records.failed(c)]
    outcome = {"passed": "survived", "claims failed": "caught", "crashed": "crashed"}[run_["ended"]]
    return {
        "name": run_["mutant"],
        "breaks": description,
        "outcome": outcome,
        "failed_claims": failed,
        "moved_nulls": sweep_records.moved_nulls(
            reference, sweep_records.nulls_by_row(run_["claims"])
        ),
        "error": run_["error"] if outcome == "crashed" else "",
    }


def summarize_mutants(runs: list[dict], descriptions: dict[str, str]) -> dict:
    reference = next(r for r in runs if r["mutant"] is None)
    nulls = sweep_records.nulls_by_row(reference["claims"])
    return {
        "reference": {
            "ended": reference["ended"],
            "error": reference["error"],
            "nulls": [[claim, name, value] for (claim, name), value in nulls.items()],
        },
        "results": [
            summarize_mutant(r, descriptions[r["mutant"]], nulls)
            for r in runs
            if r["mutant"] is not None
        ],
    }


def jobs_for(parts: tuple[str, ...], chapters: list[Path]) -> list[tuple[Path, int, str | None]]:
    jobs = []
    for path in chapters:
        if "seeds" in parts:
            jobs += [(path, seed, None) for seed in SEEDS]
        if "mutants" in parts:
            names = mutants_of(path.stem)
            if not names:
                print(f"{path.stem}: no mutants in {MUTANTS_DIR.relative_to(book.ROOT)}/")
            jobs += [(path, 0, None)] + [(path, 0, name) for name, _ in names]
    return jobs


def execute_all(jobs, workers: int, timeout: int) -> list[dict]:
    """Run every (chapter, seed, mutant) job, `workers` at a time; results in the jobs' order."""
    outcomes: list[dict | None] = [None] * len(jobs)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(run, path, seed, mutant, timeout): i
            for i, (path, seed, mutant) in enumerate(jobs)
        }
        for done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            outcomes[i] = future.result()
            path, seed, mutant = jobs[i]
            what = f"{path.stem} {'mutant ' + mutant if mutant else f'seed {seed}'}"
            kernels.progress(done, len(jobs), started, f"{what}: {outcomes[i]['ended']}")
    return outcomes


def report_seeds(slug: str, seeds: dict) -> bool:
    ok = True
    for claim in seeds["claims"]:
        weak = claim["must_hold"] and claim["held"] < MIN_SEEDS_HELD
        ok &= not weak
        margin = claim["worst_margin"]
        worst = "" if margin is None else f", worst margin {margin:+.0%}"
        nulls = f", a null passed on {claim['null_passed']}" if claim["null_passed"] else ""
        flag = "  TOO FEW" if weak else ""
        held = f"{claim['held']}/{claim['of']} seeds"
        print(f"{slug}: {held}{worst}{nulls}: {claim['statement']}{flag}")
    for seed, error in seeds["crashed"].items():
        ok = False
        print(f"{slug}: seed {seed} CRASHED: {error}")
    return ok


def report_mutants(slug: str, mutants: dict) -> bool:
    reference = mutants["reference"]
    ok = reference["ended"] == "passed"
    if not ok:
        print(f"{slug}: the unbroken chapter did not pass ({reference['error']}): fix it first")
    for result in mutants["results"]:
        ok &= result["outcome"] == "caught" and not result["moved_nulls"]
        detail = "; ".join(result["failed_claims"]) or result["error"]
        print(f"{slug}: mutant {result['name']}: {result['outcome'].upper()} ({detail})")
        for moved in result["moved_nulls"]:
            print(f"{slug}: mutant {result['name']} MOVES A NULL: {moved}")
    return ok


def is_current(path: Path, parts: tuple[str, ...]) -> bool:
    record = sweep_records.load(path.stem)
    current = content_hash(path)
    return all(record.get(part, {}).get("hash") == current for part in parts)


def sweep(parts, chapters, workers, timeout, out: Path = RECORDS) -> bool:
    jobs = jobs_for(parts, chapters)
    start = time.perf_counter()
    outcomes = execute_all(jobs, workers, timeout)
    ok = True
    for path in chapters:
        slug = path.stem
        mine = [o for (p, _, _), o in zip(jobs, outcomes, strict=True) if p == path]
        entry = {}
        if "seeds" in parts:
            seeds = [o for o in mine if o["mutant"] is None and o["seed"] in SEEDS]
            entry["seeds"] = {"hash": content_hash(path), **summarize_seeds(seeds)}
            entry["seeds"]["seconds"] = round(sum(o["seconds"] for o in seeds), 1)
            ok &= report_seeds(slug, entry["seeds"])
        if "mutants" in parts:
            runs = [o for o in mine if o["seed"] == 0]
            summary = summarize_mutants(runs, dict(mutants_of(slug)))
            entry["mutants"] = {"hash": content_hash(path), **summary}
            entry["mutants"]["seconds"] = round(sum(o["seconds"] for o in runs), 1)
            ok &= report_mutants(slug, entry["mutants"])
        sweep_records.merge(slug, entry, out)
    seconds = time.perf_counter() - start
    where = out.relative_to(book.ROOT) if out.is_relative_to(book.ROOT) else out
    print(f"{len(jobs)} runs in {seconds:.0f} s with {workers} at a time; wrote {where}/")
    if {p.stem for p in chapters} == {p.stem for p in book.toc_chapters()} and parts == PARTS[
        "sweep"
    ]:
        # the whole book's sweep: its wall time for BENCHMARK.md (make bench reads it)
        LAST_SWEEP.parent.mkdir(parents=True, exist_ok=True)
        LAST_SWEEP.write_text(
            json.dumps({"seconds": round(seconds), "jobs": workers, "runs": len(jobs)}) + "\n"
        )
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=tuple(PARTS))
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel executions ($JOBS)")
    parser.add_argument("--timeout", type=int, default=EXECUTION_TIMEOUT_S, help="seconds a run")
    parser.add_argument("--stale", action="store_true", help="only chapters whose record is old")
    parser.add_argument("--out", type=Path, default=RECORDS, help="where the records go")
    # intermixed: `sweep --stale chapters/x.ipynb` (flags between the positionals) parses too
    args = parser.parse_intermixed_args(argv)
    workers = args.jobs if args.jobs is not None else kernels.jobs()
    if workers < 1:
        parser.error(f"--jobs must be at least 1; got {workers}")
    parts = PARTS[args.what]
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    if args.stale:
        current = [p for p in chapters if is_current(p, parts)]
        for path in current:
            print(f"{path.stem}: {' and '.join(parts)} current, not run again")
        chapters = [p for p in chapters if p not in current]
        if not chapters:
            return 0
    return 0 if sweep(parts, chapters, workers, args.timeout, args.out.resolve()) else 1


if __name__ == "__main__":
    sys.exit(main())
