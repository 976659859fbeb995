"""A new chapter passes its own loop in a fresh clone, without running the other chapters.

A temporary clone of the repository's committed state gets a fifteenth paper the way
CONTRIBUTING.md tells a contributor to add one: `make new`, the scaffold's placeholders replaced
by a small written chapter (tests/fixtures/new_chapter/), `make refresh` and `make portable` for
it, then `make check CHAPTERS=chapters/mixup.ipynb`. The clone shares this checkout's .venv (make
is told not to rebuild it) and imports its own papernotes first (PYTHONPATH), so the chapter's
new module is found. Slow: a few minutes, most of it the chapter's seeds and mutants and the
strict book build; the browser checks visit the new chapter's page and the scoreboard only, as
`make check CHAPTERS=...` does.
"""

import os
import shutil
import subprocess

import book
import nbformat
import pytest

pytestmark = pytest.mark.slow

FIXTURE = book.ROOT / "tests" / "fixtures" / "new_chapter"
SLUG = "mixup"
WRITTEN = {
    "mechanism.py": f"papernotes/{SLUG}/__init__.py",
    "experiment.py": f"papernotes/{SLUG}/experiment.py",
    "mixup_tests.py": f"tests/test_{SLUG}.py",
    "mutants.py": f"tests/mutants/{SLUG}.py",
}


def make(clone, *arguments, timeout=1800):
    # .venv/.installed is older than the clone's fresh requirements.txt: never rebuild the
    # shared venv from here. Outside CI's own run, the whole-book tests skip as in a clone.
    environment = {**os.environ, "PYTHONPATH": str(clone), "JOBS": os.environ.get("JOBS") or "2"}
    environment.pop("CI", None)
    return subprocess.run(
        ["make", "-o", ".venv/.installed", *arguments],
        cwd=clone,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def written_chapter(clone):
    """The scaffold's notebook with the fixture's cells, keeping the scaffold's setup cell."""
    scaffold = nbformat.read(clone / "chapters" / f"{SLUG}.ipynb", as_version=4)
    written = nbformat.read(FIXTURE / f"{SLUG}.ipynb", as_version=4)
    setup = next(c for c in scaffold.cells if c.cell_type == "code")
    written.cells[1] = setup
    return written


def test_a_new_chapter_passes_make_check_in_a_fresh_clone_alone(tmp_path):
    clone = tmp_path / "book"
    subprocess.run(["git", "clone", "-q", str(book.ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(book.ROOT / ".venv")
    new = make(
        clone,
        "new",
        f"SLUG={SLUG}",
        "PART=Regularization",
        "TITLE=mixup: Beyond Empirical Risk Minimization",
        "AUTHORS=Zhang et al.",
        "YEAR=2018",
        "ARXIV=1710.09412",
    )
    assert new.returncode == 0, new.stdout + new.stderr
    for source, target in WRITTEN.items():
        shutil.copy(FIXTURE / source, clone / target)
    nbformat.write(written_chapter(clone), clone / "chapters" / f"{SLUG}.ipynb")
    with open(clone / "references.bib", "a") as bib:
        bib.write((FIXTURE / "references.bib").read_text())

    for step in ("refresh", "portable"):
        done = make(clone, step, f"CHAPTERS=chapters/{SLUG}.ipynb")
        assert done.returncode == 0, f"make {step}:\n{(done.stdout + done.stderr)[-4000:]}"
    check = make(clone, "check", f"CHAPTERS=chapters/{SLUG}.ipynb")
    output = check.stdout + check.stderr
    assert check.returncode == 0, f"make check:\n{output[-8000:]}"
    # the loop ran this chapter alone: its record, no other chapter's
    records = sorted(p.stem for p in (clone / "_build" / "records").glob("*.json"))
    assert records == [SLUG], records
    # and its seeds and mutants once; the check's sweep step, run again, finds them current and
    # runs none (make check runs exactly that step: the test below reads its recipe)
    assert output.count(" runs in ") == 1, output[-4000:]
    assert (clone / "tests" / "seeds_and_mutants" / f"{SLUG}.json").is_file()
    sweep = [".venv/bin/python", "tools/seeds_and_mutants.py", "sweep", "--stale"]
    again = subprocess.run(
        [*sweep, f"chapters/{SLUG}.ipynb"],
        cwd=clone,
        env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert " runs in " not in again.stdout and "current, not run again" in again.stdout


def test_make_check_runs_a_chapters_seeds_and_mutants_once_and_only_when_stale():
    makefile = (book.ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ncheck:") : makefile.index("\n## new:")]
    runs = [line for line in recipe.splitlines() if "tools/seeds_and_mutants.py" in line]
    assert len(runs) == 1 and " sweep --stale " in runs[0], runs
