"""Mutation testing of each paper's mechanism against its unit tests: `make mutate`.

    .venv/bin/python tools/mutate.py run [chapters/x.ipynb ...]     # make mutate CHAPTERS=...
    .venv/bin/python tools/mutate.py run chapters/x.ipynb --only ID [ID ...]   # just those
    .venv/bin/python tools/mutate.py run chapters/x.ipynb --survivors   # the record's survivors
    .venv/bin/python tools/mutate.py show SLUG ID [ID ...]          # a mutant's diff, its outcome
    .venv/bin/python tools/mutate.py triage SLUG                    # new survivors into its .yml

**What is mutated.** For each chapter, `papernotes/<slug>/__init__.py` (the mechanism) and
`papernotes/<slug>/experiment.py` (its data, runs, measurements and nulls: what the claims rest
on), every function and method, less the experiment's drawing functions (`draw_*`, `plot_*`).

**What is left out (the exclusion rule).** Argument checks and messages: a call of the shared
checks (`checks.<name>(...)`, its arguments included), a `raise` statement (the exception and its
message), an `if` branch that ends by raising (its condition and what it computes for the
message: a hand-written argument check), and a progress bar's label (a `desc=` argument changed,
set to None or dropped; a `desc` parameter's default). Only what lies inside them is left out:
`n = checks.integer("n", n)` still becomes `n = None`, and `torch.randn(checks.integer(...))`
still loses its argument. mutmut leaves out docstrings, type annotations and decorators itself.

**How.** mutmut 3 (pinned in requirements.txt) writes every mutant of a function beside it
behind a trampoline, measures which unit tests reach each function (a run of
tests/test_<slug>.py), and then forks one process a mutant from the warmed-up interpreter (torch
imported once) that runs only those tests, fastest first, stopping at the first failure. A
mutant's time is limited to TIMEOUT_MULTIPLIER times its tests' measured time plus
TIMEOUT_CONSTANT_S, wall clock (twice that in CPU time), generous enough that a loaded machine
does not turn a slow mutant into a timeout. It runs in a copy of the repository under
_build/mutate/<slug>/, made afresh each run, so that the outcomes depend on the code alone and a
run on unchanged code reproduces the record. JOBS mutants run at once (2 by default); torch and
its libraries run on one thread each.

This tool generates the mutants with mutmut's own code first, to name them by a stable id
(tools/mutation_records.py), to apply the exclusion rule node by node (mutmut's own
`do_not_mutate_patterns` match whole lines, which would leave out the arithmetic on a line that
also checks an argument), and to hand mutmut the names of the mutants to run; after the run it
checks that mutmut's mutants are the ones it named.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import date
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book
import mutation_records

TOOL = f"mutmut {version('mutmut')}"
# The repository whose papers are mutated, and where each run's copy of it lives.
ROOT = book.ROOT
WORK = ROOT / "_build" / "mutate"
BIN = Path(sys.executable).parent
# A mutant may run for (its tests' measured seconds + TIMEOUT_CONSTANT_S) * TIMEOUT_MULTIPLIER.
TIMEOUT_MULTIPLIER = 10.0
TIMEOUT_CONSTANT_S = 20.0
DRAWING = ("draw_", "plot_")
LABEL = "desc"  # a progress bar's label (papernotes.training.progress): a message
COPIED = ("papernotes", "tests", "tools", "conftest.py")
# mutmut's exit codes (mutmut.stats.status_by_exit_code) as the record's outcomes: a segfault
# fails the tests (killed); SIGKILL (-9) is the hard CPU limit's second after SIGXCPU (timeout).
OUTCOME_OF_STATUS = {
    "killed": "killed",
    "segfault": "killed",
    "survived": "survived",
    "timeout": "timeout",
    "no tests": "no tests",
    "suspicious": "crashed",
}


@dataclass
class Mutant:
    name: str  # mutmut's: papernotes.<slug>[.experiment].x_<function>__mutmut_<n>
    id: str  # ours: [experiment.]<function>/<hash>, stable across unrelated edits
    file: str
    function: str
    diff: list[str]
    excluded: bool


def files_of(slug: str) -> list[str]:
    return mutation_records.files_of(slug, ROOT)


def source_hash(slug: str, root: Path | None = None) -> str:
    return mutation_records.source_hash(slug, root or ROOT)


# -- the workspace mutmut runs in ------------------------------------------------------------------


def mutmut_config(slug: str) -> str:
    """The [tool.mutmut] table for one paper (appended to a copy of pyproject.toml)."""
    items = {
        "source_paths": ["papernotes"],
        "only_mutate": files_of(slug),
        "also_copy": ["tools/", "conftest.py"],
        "pytest_add_cli_args_test_selection": [f"tests/test_{slug}.py"],
        "timeout_multiplier": TIMEOUT_MULTIPLIER,
        "timeout_constant": TIMEOUT_CONSTANT_S,
        "use_git_change_detection": False,
        "process_isolation": "fork",
    }
    lines = ["", "[tool.mutmut]"]
    for key, value in items.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif not isinstance(value, float):
            value = json.dumps(value)  # a TOML string or array of strings
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def workspace(slug: str, under: Path | None = None) -> Path:
    """A fresh copy of what the paper's unit tests need, with mutmut's configuration."""
    work = (under or WORK) / slug
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".lock")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=ignore)
        else:
            shutil.copy2(source, work / name)
    pyproject = (ROOT / "pyproject.toml").read_text()
    (work / "pyproject.toml").write_text(pyproject + mutmut_config(slug))
    return work


@contextlib.contextmanager
def inside(work: Path):
    """Run in `work` with mutmut's configuration read from there."""
    from mutmut import configuration

    before = Path.cwd()
    os.chdir(work)
    configuration.reset_config()
    try:
        yield
    finally:
        os.chdir(before)
        configuration.reset_config()


# -- the mutants, named ----------------------------------------------------------------------------


def excluded_nodes(module) -> set[int]:
    """The ids of the nodes the exclusion rule leaves out: `checks.<name>(...)` calls, `raise`
    statements, an `if` branch that ends by raising (its condition and its body: an error path),
    and a progress bar's label (the value of a `desc=` argument, the default of a `desc`
    parameter), each with everything inside."""
    import libcst as cst

    found: set[int] = set()

    def take(node) -> None:
        found.add(id(node))
        for child in node.children:
            take(child)

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node) -> None:
            func = node.func
            if (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Name)
                and func.value.value == "checks"
            ):
                take(node)

        def visit_Raise(self, node) -> None:
            take(node)

        def visit_Arg(self, node) -> None:
            if node.keyword is not None and node.keyword.value == LABEL:
                take(node.value)

        def visit_Param(self, node) -> None:
            if node.name.value == LABEL and node.default is not None:
                take(node.default)

        def visit_If(self, node) -> None:
            # an error path: a branch that ends by raising; its condition checks an argument and
            # what it computes before the raise (a `got = ...`) only feeds the message
            last = node.body.body[-1] if node.body.body else None
            if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Raise):
                take(node.test)
                take(node.body)

    module.visit(Finder())
    return found


def changes_only_the_label(mutation) -> bool:
    """Whether a mutation of a call only drops its `desc=` argument or sets it to None: a
    progress bar's label, which nothing computes with (papernotes.training.progress)."""
    import libcst as cst

    before, after = mutation.original_node, mutation.mutated_node
    if not (isinstance(before, cst.Call) and isinstance(after, cst.Call)):
        return False

    def args(call) -> list[str]:
        return [
            cst.Module([]).code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
            for a in call.args
        ]

    kept = args(after)
    changed = [a for a in args(before) if a not in kept or kept.remove(a)]
    return bool(changed) and all(a.startswith(f"{LABEL}=") for a in changed)


def owners(module) -> dict[int, tuple[str, str | None]]:
    """Each top-level function and method (by node id): its name and its class's."""
    import libcst as cst

    found = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            found[id(statement)] = (statement.name.value, None)
        elif isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            for method in statement.body.body:
                if isinstance(method, cst.FunctionDef):
                    found[id(method)] = (method.name.value, statement.name.value)
    return found


def changed_lines(before: str, after: str) -> list[str]:
    """The lines a mutation removes (`-`) and adds (`+`), stripped."""
    lines = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if line[:1] in "-+" and not line.startswith(("---", "+++")):
            lines.append(line[0] + " " + line[1:].strip())
    return lines


def mutants_of_file(path: str) -> list[Mutant]:
    """Every mutant mutmut makes of one file, in mutmut's order and with mutmut's names (run
    inside the workspace: mutmut reads its configuration from there)."""
    import libcst as cst
    from mutmut.mutation.file_mutation import create_mutations, deep_replace
    from mutmut.mutation.trampoline_templates import mangle_function_name
    from mutmut.utils.format_utils import get_mutant_name

    module, mutations, _, _ = create_mutations(path, Path(path).read_text())
    leave_out = excluded_nodes(module)
    names_of = owners(module)
    module_prefix = "experiment." if path.endswith("experiment.py") else ""
    counters: Counter = Counter()
    seen: Counter = Counter()
    mutants = []
    for mutation in mutations:
        function = mutation.contained_by_top_level_function
        if function is None or id(function) not in names_of:
            continue  # module-level code: mutmut does not mutate it either
        name, cls = names_of[id(function)]
        mangled = mangle_function_name(name=name, class_name=cls) + "__mutmut"
        counters[mangled] += 1
        mutant_name = get_mutant_name(Path(path), f"{mangled}_{counters[mangled]}")
        before = cst.Module([function]).code
        after = cst.Module(
            [deep_replace(function, mutation.original_node, mutation.mutated_node)]
        ).code
        diff = changed_lines(before, after)
        qualname = module_prefix + (f"{cls}.{name}" if cls else name)
        digest = hashlib.sha256("\n".join([qualname, *diff]).encode()).hexdigest()[:8]
        key = f"{qualname}/{digest}"
        seen[key] += 1
        mutants.append(
            Mutant(
                name=mutant_name,
                id=key if seen[key] == 1 else f"{key}.{seen[key]}",
                file=path,
                function=qualname,
                diff=diff,
                excluded=id(mutation.original_node) in leave_out
                or changes_only_the_label(mutation),
            )
        )
    return mutants


def in_scope(mutant: Mutant) -> bool:
    name = mutant.function.removeprefix("experiment.").split(".")[-1]
    return not (mutant.file.endswith("experiment.py") and name.startswith(DRAWING))


def mutants_of(slug: str, work: Path) -> list[Mutant]:
    with inside(work):
        return [m for path in files_of(slug) for m in mutants_of_file(path) if in_scope(m)]


# -- running them ----------------------------------------------------------------------------------


class LoadSampler:
    """The machine's one-minute load, sampled while a run goes on (the record says it)."""

    def __init__(self, every_s: float = 15.0):
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return round(sum(self.samples) / len(self.samples), 1)


def run_mutmut(work: Path, names: list[str], jobs: int) -> None:
    environment = {
        **os.environ,
        "PAPERNOTES_QUIET": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }
    command = [str(BIN / "mutmut"), "run", "--max-children", str(jobs), *names]
    log = work / "mutmut.log"
    with open(log, "w") as out:
        result = subprocess.run(
            command, cwd=work, env=environment, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"mutmut failed in {work} (exit {result.returncode}):\n{tail}")


def read_outcomes(slug: str, work: Path, mutants: list[Mutant]) -> dict[str, str]:
    """Each run mutant's outcome by its id, after checking that mutmut's mutant of that name is
    the mutation this tool named."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    by_name = {m.name: m for m in mutants}
    found = {}
    with inside(work):
        for path in files_of(slug):
            data = SourceFileMutationData(path=path)
            data.load()
            for name, code in data.exit_code_by_key.items():
                mutant = by_name.get(name)
                if mutant is None or code is None:
                    continue  # excluded, out of scope or not asked for
                theirs = changed_lines_of_diff(get_diff_for_mutant(name, path=path))
                if theirs != mutant.diff:
                    raise SystemExit(
                        f"{name}: mutmut's mutant is not the one named {mutant.id}:\n"
                        f"{theirs}\n{mutant.diff}\n(a mutmut other than {TOOL}?)"
                    )
                found[mutant.id] = OUTCOME_OF_STATUS.get(status_by_exit_code[code], "crashed")
    return found


def changed_lines_of_diff(diff: str) -> list[str]:
    return [
        line[0] + " " + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "-+" and not line.startswith(("---", "+++"))
    ]


@contextlib.contextmanager
def one_run_at_a_time(slug: str):
    """Refuse a second run of the same paper while one goes on: both would work in (and wipe)
    the same copy, _build/mutate/<slug>/."""
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / f"{slug}.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            raise SystemExit(
                f"{slug}: another `make mutate` of this paper is running ({lock.read().strip()}); "
                "wait for it, or run another chapter"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}, since {time.strftime('%H:%M')}")
        lock.flush()
        yield


def mutate(
    path: Path, out: Path, jobs: int, only: list[str] | None = None, survivors: bool = False
) -> dict:
    """Mutate one chapter's paper, run its unit tests against each mutant; returns its record.
    `only`: run those mutants, write nothing. `survivors`: run again only the mutants that the
    record in `out` does not count as caught, and update that record (see `survivors_of`)."""
    with one_run_at_a_time(path.stem):
        return _mutate(path, out, jobs, only, survivors)


def _mutate(
    path: Path, out: Path, jobs: int, only: list[str] | None, survivors: bool = False
) -> dict:
    slug = path.stem
    started = time.perf_counter()
    work = workspace(slug)
    mutants = mutants_of(slug, work)
    chosen = [m for m in mutants if not m.excluded]
    committed = mutation_records.load(slug, out) if survivors else {}
    if only:
        unknown = sorted(set(only) - {m.id for m in chosen})
        if unknown:
            raise SystemExit(f"{slug}: no mutant has the id(s) {unknown}")
        chosen = [m for m in chosen if m.id in only]
    elif survivors:
        chosen = survivors_of(slug, committed, chosen)
    print(
        f"{slug}: {len(chosen)} mutants of {', '.join(files_of(slug))} "
        f"({len(mutants) - len([m for m in mutants if not m.excluded])} left out by the "
        f"exclusion rule), against tests/test_{slug}.py, {jobs} at a time",
        flush=True,
    )
    with LoadSampler() as load:
        run_mutmut(work, [m.name for m in chosen], jobs)
    found = read_outcomes(slug, work, chosen)
    missing = [m.id for m in chosen if m.id not in found]
    if missing:
        raise SystemExit(f"{slug}: mutmut reported nothing for {missing[:5]}...")
    minutes = round((time.perf_counter() - started) / 60, 1)
    record = {
        "chapter": slug,
        "tool": TOOL,
        "files": files_of(slug),
        "tests": f"tests/test_{slug}.py",
        "hash": source_hash(slug, work),
        "excluded": len(mutants) - len([m for m in mutants if not m.excluded]),
        "killed": [m.id for m in chosen if found[m.id] == "killed"],
        "mutants": [
            {"id": m.id, "outcome": found[m.id], "function": m.function, "diff": m.diff}
            for m in chosen
            if found[m.id] != "killed"
        ],
        "run": {
            "minutes": minutes,
            "jobs": jobs,
            "cpus": os.cpu_count(),
            "load": load.mean,
            "date": date.today().isoformat(),
        },
    }
    if only:
        for m in chosen:
            print(f"  {m.id}: {found[m.id]}")
        return record
    if survivors:
        record = with_survivors_rerun(committed, record)
    report(record, mutation_records.load_triage(slug))
    mutation_records.write(record, out)
    return record


def survivors_of(slug: str, record: dict, mutants: list[Mutant]) -> list[Mutant]:
    """The mutants a record does not count as caught (survived, no tests), to run again after
    unit tests were added. Refused where there is no record, or where the paper's mutants are no
    longer the record's (its code changed: every outcome may have moved, so run it whole)."""
    if not record:
        raise SystemExit(f"{slug}: no record whose survivors to run again: run `make mutate` whole")
    known = mutation_records.outcomes(record)
    now = {m.id for m in mutants}
    if now != set(known):
        raise SystemExit(
            f"{slug}: the paper's code changed since its record ({len(now - set(known))} mutants "
            f"new, {len(set(known) - now)} gone): run `make mutate "
            f"CHAPTERS=chapters/{slug}.ipynb` whole"
        )
    return [m for m in mutants if known[m.id] not in mutation_records.DETECTED]


def with_survivors_rerun(committed: dict, rerun: dict) -> dict:
    """The committed record with the outcomes of its survivors' new run (`rerun`, a record of
    those mutants only): the ones now killed join `killed`, the rest keep their entries with
    their new outcome, the hash becomes the current code's and tests', and `survivors_rerun` says
    when and how many. The mutants it counted as caught are not run again: unit tests added
    since cannot let one escape; a test weakened or removed shows in the next whole run (the
    weekly sweep's)."""
    now = mutation_records.outcomes(rerun)
    newly_killed = [i for i, outcome in now.items() if outcome == "killed"]
    return {
        **committed,
        "hash": rerun["hash"],
        "killed": committed["killed"] + newly_killed,
        "mutants": [
            {**m, "outcome": now.get(m["id"], m["outcome"])}
            for m in committed["mutants"]
            if now.get(m["id"]) != "killed"
        ],
        "survivors_rerun": {**rerun["run"], "mutants": len(now), "killed": len(newly_killed)},
    }


def report(record: dict, triage: dict) -> None:
    s = mutation_records.scored(record, triage)
    c = s["counts"]
    print(
        f"{record['chapter']}: {c['mutants']} mutants: {c['killed'] + c['crashed']} killed, "
        f"{c['timeout']} timeout, {c['survived']} survived, {c['no tests']} not reached by a "
        f"test, {c['equivalent']} equivalent: score {mutation_records.percent(s['score'])} "
        f"({record['run']['minutes']} minutes, load {record['run']['load']})",
        flush=True,
    )
    if s["stale"]:
        print(
            f"  stale in tests/mutation/{record['chapter']}.yml (no such mutant now): {s['stale']}"
        )
    if s["killed_but_listed"]:
        print(f"  listed as equivalent, but the tests kill them: {s['killed_but_listed']}")
    if s["untriaged"]:
        print(
            f"  {len(s['untriaged'])} survivor(s) not in tests/mutation/{record['chapter']}.yml: "
            f"`python tools/mutate.py show {record['chapter']} ID` shows one"
        )


# -- helping people kill or list survivors ---------------------------------------------------------


def show(slug: str, ids: list[str]) -> None:
    """Print each mutant's diff with its function's context, and its last recorded outcome."""
    (WORK / "show").mkdir(parents=True, exist_ok=True)
    under = Path(tempfile.mkdtemp(dir=WORK / "show"))  # its own: shows may run side by side
    try:
        _show(slug, ids, workspace(slug, under))
    finally:
        shutil.rmtree(under, ignore_errors=True)


def _show(slug: str, ids: list[str], work: Path) -> None:
    mutants = {m.id: m for m in mutants_of(slug, work)}
    found = mutation_records.outcomes(mutation_records.load(slug))
    triage = mutation_records.load_triage(slug)
    for mutant_id in ids:
        mutant = mutants.get(mutant_id)
        if mutant is None:
            print(f"{slug}: no mutant {mutant_id} in the code as it is now")
            continue
        outcome = found.get(mutant_id, "not run")
        if mutant.excluded:
            outcome = "left out by the exclusion rule"
        listed = next((f"{k}: {v[mutant_id]}" for k, v in triage.items() if mutant_id in v), "")
        print(f"# {mutant_id} ({mutant.file}, {mutant.name}): {outcome}")
        if listed:
            print(f"# triage: {listed}")
        with inside(work):
            from mutmut.mutation.diff_apply import get_diff_for_mutant

            # mutmut reads a function's mutants from its generated file: write it for this one
            write_mutated(mutant.file)
            print(get_diff_for_mutant(mutant.name, path=mutant.file))
        print()


def write_mutated(path: str) -> None:
    from mutmut.mutation.file_mutation import mutate_file_contents

    target = Path("mutants") / path
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(mutate_file_contents(path, Path(path).read_text()).code)


def triage(
    slug: str, decided: dict[str, tuple[str, str]] | None = None, folder: Path | None = None
) -> Path:
    """Write tests/mutation/<slug>.yml afresh from the record and what it already says: every
    survivor of the record under `equivalent` or `open`, with its diff as a comment above it, the
    lines people wrote kept, the survivors nobody listed yet added under `open` with an empty line,
    and entries the record no longer has kept at the end, marked stale. `decided` (id: (section,
    line)) overrides the file's entries."""
    folder = folder or mutation_records.RECORDS
    record = mutation_records.load(slug, folder)
    if not record:
        raise SystemExit(f"{slug}: no record; run `make mutate CHAPTERS=chapters/{slug}.ipynb`")
    path = mutation_records.triage_path(slug, folder)
    listed = mutation_records.load_triage(slug, folder)
    entries = {
        i: (kind, line) for kind in ("equivalent", "open") for i, line in listed[kind].items()
    }
    entries.update(decided or {})
    survivors = [m for m in record["mutants"] if m["outcome"] in ("survived", "no tests")]
    for mutant in survivors:
        entries.setdefault(mutant["id"], ("open", ""))
    diffs = {m["id"]: m["diff"] for m in survivors}
    sections = {"equivalent": [], "open": []}
    for mutant_id, (kind, line) in entries.items():
        sections[kind].append(triage_entry(mutant_id, diffs.get(mutant_id), line))
    text = triage_header(slug)
    for kind in ("equivalent", "open"):
        text += f"{kind}:\n" + "".join(sorted(sections[kind], key=_entry_order))
    path.write_text(text)
    added = sum(1 for m in survivors if m["id"] not in listed["equivalent"] | listed["open"])
    print(f"{path}: {len(survivors)} survivor(s), {added} of them new (under open)")
    return path


def _entry_order(entry: str) -> tuple:
    # stale entries last, then in the record's order of functions: by the id's function and hash
    return ("# stale" in entry, entry.split("\n")[-2].strip())


def triage_header(slug: str) -> str:
    return (
        f"# The survivors of `make mutate CHAPTERS=chapters/{slug}.ipynb` "
        f"(tests/mutation/{slug}.json), triaged.\n"
        "# equivalent: no test can tell the mutant from the code; the line says why, checkably "
        "(left out\n# of the score). open: a survivor still to kill; the line says what would "
        "kill it (a unit test\n# that pins ..., or a claim row: then a broken mechanism in "
        f"tests/mutants/{slug}.py).\n"
        f"# `.venv/bin/python tools/mutate.py show {slug} ID` prints a mutant in its function; "
        f"`.venv/bin/python\n# tools/mutate.py triage {slug}` rewrites this file from the "
        "record, keeping its lines.\n"
    )


def triage_entry(mutant_id: str, diff: list[str] | None, line: str) -> str:
    comments = (
        "".join(f"  # {d}\n" for d in diff)
        if diff is not None
        else "  # stale: the record has no such survivor now\n"
    )
    return f"{comments}  {mutant_id}: {json.dumps(line, ensure_ascii=False)}\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="mutate chapters' papers and run their unit tests")
    run.add_argument("chapters", nargs="*", type=Path)
    run.add_argument("--out", type=Path, default=mutation_records.RECORDS)
    run.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or 2))
    run.add_argument("--only", nargs="+", help="run these mutant ids only; write no record")
    run.add_argument(
        "--survivors",
        action="store_true",
        help="run again only the record's survivors (after unit tests were added); update it",
    )
    shown = sub.add_parser("show", help="print mutants' diffs and outcomes")
    shown.add_argument("slug")
    shown.add_argument("ids", nargs="+")
    listing = sub.add_parser("triage", help="add new survivors to tests/mutation/<slug>.yml")
    listing.add_argument("slug")
    args = parser.parse_args(argv)
    if args.what == "show":
        show(args.slug, args.ids)
        return 0
    if args.what == "triage":
        triage(args.slug)
        return 0
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    if args.only and len(chapters) != 1:
        parser.error("--only takes the ids of one chapter's mutants")
    out = args.out.resolve()
    if args.only and args.survivors:
        parser.error("--only and --survivors: choose one")
    for path in chapters:
        mutate(path, out, args.jobs, args.only, args.survivors)
    if out == mutation_records.RECORDS and not args.only:
        mutation_records.write_section()
        print(f"wrote the mutation scores into {mutation_records.BENCHMARK.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
