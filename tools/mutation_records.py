"""Mutation records: what `make mutate` found (tests/mutation/<slug>.json, written by
tools/mutate.py) and what people decided about its survivors (tests/mutation/<slug>.yml).

    python tools/mutation_records.py compare FRESH_DIR [--committed DIR]   # the sweep's last job
    python tools/mutation_records.py section      # BENCHMARK.md's mutation scores, from the records

Both need only PyYAML (no mutmut, no torch): the sweep workflow's compare job runs them on a bare
Python.

**The record** (JSON, written by the tool, never by hand) holds, besides how and where it ran:

- `files`, `tests`, `hash`: what was mutated, the unit tests run against it, and a hash of both
  (the record is stale when they changed);
- `excluded`: how many mutants the exclusion rule left out (argument checks and messages);
- `killed`: the ids of the mutants the unit tests killed;
- `mutants`: every other mutant, with its id, function, outcome (`survived`, `timeout`,
  `crashed` or `no tests`: no unit test reaches its function) and its diff (`-` the line as
  written, `+` the line as mutated).

A mutant's **id** is `<function>/<hash>`: the function (`Class.method`; `experiment.` before the
experiment's), and eight hex digits of a hash of the changed lines' text before and after, so
that it survives edits elsewhere in the file (no line number, no counter). Identical mutations in
one function get `.2`, `.3` after it.

**The triage** (YAML, written by people; `tools/mutate.py triage` rewrites it from the record,
keeping its lines and adding new survivors under `open`) has two mappings from id to one line:

    equivalent:   # no test can tell it from the mechanism; the line says why, checkably
      reversal/0a1b2c3d: "device=None: the book runs on the CPU, torch's default device"
    open:         # a survivor still to kill; the line says what would kill it
      mlm_loss/4e5f6a7b: "unit test: mlm_loss with mask_fraction=0.5 masks about half"

The **score** is (killed + timeout + crashed) / (mutants - equivalent): a mutant that makes the
unit tests fail, hang or crash is caught. An id listed in the triage that the record no longer
has is *stale* (the code changed): `make mutate` and the compare say so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

RECORDS = book.ROOT / "tests" / "mutation"
BENCHMARK = book.ROOT / "BENCHMARK.md"
SECTION = ("<!-- mutation scores: written by make mutate -->", "<!-- end mutation scores -->")
DETECTED = ("killed", "timeout", "crashed")
OUTCOMES = (*DETECTED, "survived", "no tests")
TRIAGE_KINDS = ("equivalent", "open")


def files_of(slug: str, root: Path = book.ROOT) -> list[str]:
    """What `make mutate` mutates of a paper: its mechanism, and its experiment where it has one."""
    folder = Path("papernotes") / slug
    return [
        str(folder / name)
        for name in ("__init__.py", "experiment.py")
        if (root / folder / name).exists()
    ]


def source_hash(slug: str, root: Path = book.ROOT) -> str:
    """What a run's outcomes depend on: the mutated files and the paper's unit tests, as they are
    in `root` (the repository, or the copy a run mutated). A record whose hash differs is stale."""
    digest = hashlib.sha256()
    for path in [*files_of(slug, root), f"tests/test_{slug}.py", "tests/conftest.py"]:
        digest.update(path.encode() + b"\0" + (root / path).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def record_path(slug: str, folder: Path = RECORDS) -> Path:
    return folder / f"{slug}.json"


def triage_path(slug: str, folder: Path = RECORDS) -> Path:
    return folder / f"{slug}.yml"


def load(slug: str, folder: Path = RECORDS) -> dict:
    """A paper's record ({} where `make mutate` has not run for it)."""
    path = record_path(slug, folder)
    return json.loads(path.read_text()) if path.exists() else {}


def load_all(folder: Path = RECORDS) -> dict[str, dict]:
    """Every record in `folder`, by slug."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def write(record: dict, folder: Path = RECORDS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = record_path(record["chapter"], folder)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path


# -- the triage ------------------------------------------------------------------------------------


def load_triage(slug: str, folder: Path = RECORDS) -> dict[str, dict[str, str]]:
    """{"equivalent": {id: why}, "open": {id: what would kill it}}; empty where none is written.
    Refuses an entry without its line, and an id listed twice."""
    path = triage_path(slug, folder)
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    data = data or {}
    unknown = set(data) - set(TRIAGE_KINDS)
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; use {TRIAGE_KINDS}")
    triage = {kind: dict(data.get(kind) or {}) for kind in TRIAGE_KINDS}
    for kind, entries in triage.items():
        for mutant, line in entries.items():
            # an open survivor's line may wait to be written; an equivalent one's may not
            if not isinstance(line, str) or "\n" in line.strip():
                raise ValueError(f"{path}: {kind} {mutant} takes one line")
            if kind == "equivalent" and not line.strip():
                raise ValueError(f"{path}: equivalent {mutant} needs one line saying why")
    both = set(triage["equivalent"]) & set(triage["open"])
    if both:
        raise ValueError(f"{path}: listed as both equivalent and open: {sorted(both)}")
    return triage


def outcomes(record: dict) -> dict[str, str]:
    """Every mutant's outcome by id, as the run found it."""
    found = dict.fromkeys(record.get("killed", []), "killed")
    found.update({m["id"]: m["outcome"] for m in record.get("mutants", [])})
    return found


def scored(record: dict, triage: dict) -> dict:
    """The record read with its triage: counts by outcome (equivalents apart), the score, the
    triage's stale ids, and the ids listed as equivalent that the tests kill after all."""
    found = outcomes(record)
    equivalent = {i for i in triage["equivalent"] if found.get(i) in ("survived", "no tests")}
    counts = {o: 0 for o in OUTCOMES}
    for mutant, outcome in found.items():
        if mutant not in equivalent:
            counts[outcome] += 1
    counts["equivalent"] = len(equivalent)
    counts["mutants"] = len(found)
    tested = len(found) - len(equivalent)
    detected = sum(counts[o] for o in DETECTED)
    listed = set(triage["equivalent"]) | set(triage["open"])
    return {
        "counts": counts,
        "score": detected / tested if tested else None,
        "stale": sorted(i for i in listed if i not in found),
        "killed_but_listed": sorted(i for i in triage["equivalent"] if found.get(i) in DETECTED),
        "untriaged": sorted(
            i for i, o in found.items() if o in ("survived", "no tests") and i not in listed
        ),
    }


def score_of(slug: str, folder: Path = RECORDS, triage_folder: Path | None = None) -> dict | None:
    """A paper's committed record read with its triage (None where it has no record)."""
    record = load(slug, folder)
    if not record:
        return None
    return scored(record, load_triage(slug, triage_folder or folder))


def percent(score: float | None) -> str:
    return "—" if score is None else f"{100 * score:.1f}%"


# -- comparing a fresh run with the committed record -----------------------------------------------


def compare(committed: dict, fresh: dict, slug: str, triage: dict) -> list[str]:
    """What a fresh run contradicts in the committed record: a score below the committed one
    (both read with the same triage), naming the mutants the tests no longer catch."""
    if not committed:
        return [f"{slug}: no committed mutation record (tests/mutation/{slug}.json)"]
    was, now = scored(committed, triage)["score"], scored(fresh, triage)["score"]
    if was is None or now is None or now >= was - 1e-9:
        return []
    before, after = outcomes(committed), outcomes(fresh)
    escaped = sorted(i for i, o in after.items() if o not in DETECTED and before.get(i) in DETECTED)
    new = sorted(i for i, o in after.items() if o not in DETECTED and i not in before)
    detail = "; ".join(
        part
        for part in (
            f"no longer caught: {', '.join(escaped)}" if escaped else "",
            f"new and not caught: {', '.join(new)}" if new else "",
        )
        if part
    )
    return [
        f"{slug}: mutation score {percent(now)} is below the committed {percent(was)}"
        + (f" ({detail})" if detail else "")
    ]


def compare_folders(fresh: Path, committed: Path = RECORDS) -> list[str]:
    found = load_all(fresh)
    if not found:
        return [f"no mutation records in {fresh}"]
    problems = []
    for slug, record in found.items():
        problems += compare(load(slug, committed), record, slug, load_triage(slug, committed))
    return problems


# -- BENCHMARK.md's section ------------------------------------------------------------------------


def section(records: dict[str, dict], folder: Path = RECORDS) -> str:
    """The mutation scores as a markdown section between SECTION's markers, a row a paper."""
    rows = []
    for path in book.toc_chapters():
        record = records.get(path.stem)
        if not record:
            rows.append(f"| {path.stem} | not run | | | | | | | |")
            continue
        s = scored(record, load_triage(path.stem, folder))
        c = s["counts"]
        run = record.get("run", {})
        rows.append(
            f"| {path.stem} | {c['mutants']} | {c['killed'] + c['crashed']} | {c['timeout']} | "
            f"{c['survived']} | {c['no tests']} | {c['equivalent']} | {percent(s['score'])} | "
            f"{run.get('minutes', '—')} |"
        )
    runs = [r.get("run", {}) for r in records.values() if r.get("run")]
    where = ""
    if runs:
        tools = sorted({r.get("tool", "") for r in records.values()})
        loads = sorted(r["load"] for r in runs if r.get("load") is not None)
        spread = (
            ""
            if not loads
            else f", under a load of {loads[0]:.1f}"
            if loads[0] == loads[-1]
            else f", under loads from {loads[0]:.1f} to {loads[-1]:.1f}"
        )
        where = (
            f"Run with {', '.join(tools)} on {runs[0].get('cpus', '?')} CPUs, "
            f"{runs[0].get('jobs', '?')} mutant at a time{spread} (the one-minute load average "
            f"during each run), last on {max(r.get('date', '') for r in runs)}.\n\n"
        )
    return (
        f"{SECTION[0]}\n"
        "## Mutation scores\n\n"
        "`make mutate` (tools/mutate.py) mutates each paper's mechanism and experiment one "
        "change at a time,\nargument checks and messages left out (CONTRIBUTING.md), and runs "
        "the paper's unit tests against\neach mutant. *Killed*: the tests failed (or crashed) "
        "with it; *timeout*: they hung; both count as\ncaught. *No tests*: no unit test reaches "
        "the mutated function. *Equivalent*: listed in\ntests/mutation/<slug>.yml with the reason "
        "no test can tell it from the code. Score = caught /\n(mutants - equivalent). *Minutes*: "
        "the run's wall time.\n\n"
        + where
        + "| chapter | mutants | killed | timeout | survived | no tests | equivalent | score | "
        "minutes |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + f"\n{SECTION[1]}\n"
    )


def write_section(path: Path = BENCHMARK, folder: Path = RECORDS) -> None:
    """Replace the section between SECTION's markers in BENCHMARK.md (append it if absent),
    leaving the rest of the file as it is."""
    text = path.read_text() if path.exists() else ""
    new = section(load_all(folder), folder)
    start, end = SECTION
    if start in text and end in text:
        before, _, rest = text.partition(start)
        _, _, after = rest.partition(end)
        text = before + new.rstrip("\n") + after
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + new
    path.write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    check = sub.add_parser("compare", help="fail where a fresh run's score drops")
    check.add_argument("fresh", type=Path, help="the fresh run's records")
    check.add_argument("--committed", type=Path, default=RECORDS)
    sub.add_parser("section", help="rewrite BENCHMARK.md's mutation scores from the records")
    args = parser.parse_args(argv)
    if args.what == "section":
        write_section()
        print(f"wrote the mutation scores into {BENCHMARK}")
        return 0
    problems = compare_folders(args.fresh.resolve(), args.committed.resolve())
    for line in problems:
        print(f"MUTATION SCORE DROPPED: {line}")
    count = len(load_all(args.fresh))
    print(f"compared {count} mutation record(s) with {args.committed}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
