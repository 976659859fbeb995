"""nbval's verdict depends on the science and the code, not on the CPU's rounding (conftest.py).

A scratch copy of one chapter, with some committed outputs edited, runs under nbval twice:

- with torch's plain kernels (ATEN_CPU_CAPABILITY=default: the arithmetic of another CPU), where
  only the cells tagged nbval-check-output are compared: an edited text in such a cell, or an
  edited verdict in the claims' text view, fails; an edited trained number in another cell does
  not, since that cell's numbers are expected to differ there;
- on the machine that computed the outputs (the copy says it is this one), where every cell is
  compared and the edited trained number fails too.
"""

import os
import re
import shutil
import subprocess
import sys

import book
import nbformat
import pytest

pytestmark = pytest.mark.slow

CHAPTER = book.ROOT / "chapters" / "jsma.ipynb"  # the quickest chapter
SCRATCH = book.ROOT / "_build" / "nbval-scratch"
CHECK_TAG = "nbval-check-output"


def stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def scratch_copy(edit) -> tuple:
    """The chapter copied under _build (inside the repository, so conftest.py applies), with
    `edit(code_cells)` applied; returns the copy's path and the edited cells' indices."""
    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    nb = nbformat.read(CHAPTER, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    edited = edit(nb, code)
    path = SCRATCH / CHAPTER.name
    nbformat.write(nb, path)
    return path, edited


def failed_cells(path, **environment) -> set[int]:
    command = [sys.executable, "-m", "pytest", "--nbval", str(path), "-q", "-rf", "-p", "no:xdist"]
    result = subprocess.run(
        command, cwd=book.ROOT, capture_output=True, text=True, env={**os.environ, **environment}
    )
    output = result.stdout + result.stderr
    assert "passed" in output or "failed" in output, output[-3000:]
    return {int(n) for n in re.findall(r"FAILED \S+::Cell (\d+)", output)}


def tagged(cell) -> bool:
    return CHECK_TAG in cell.metadata.get("tags", [])


def edit_a_checked_text_a_verdict_and_a_trained_number(nb, code):
    """Edit (1) the text of a tagged cell (the mechanism's source shown as markdown), (2) a
    verdict in the claims cell's text view, (3) a trained number printed by an untagged cell."""
    checked = next(
        i
        for i, c in enumerate(code)
        if tagged(c)
        and "claims.check()" not in c.source
        and any("text/markdown" in o.get("data", {}) for o in c.outputs)
    )
    for output in code[checked].outputs:
        if "text/markdown" in output.get("data", {}):
            shown = "".join(output.data["text/markdown"])
            output.data["text/markdown"] = "an edited line\n" + shown
            break
    claims = next(i for i, c in enumerate(code) if "claims.check()" in c.source)
    for output in code[claims].outputs:
        plain = output.get("data", {}).get("text/plain")
        if plain:
            text = "".join(plain)
            output.data["text/plain"] = text.replace("- holds (", "- does not hold (", 1)
    trained = next(
        i for i, c in enumerate(code) if not tagged(c) and re.search(r"\d\.\d", stream_text(c))
    )
    stream = next(o for o in code[trained].outputs if o.output_type == "stream")
    stream.text = re.sub(r"(\d\.)(\d)", lambda m: m[1] + str((int(m[2]) + 1) % 10), stream.text)
    return checked, claims, trained


def test_on_another_cpu_nbval_fails_on_text_and_verdicts_and_not_on_rounding():
    path, (checked, claims, trained) = scratch_copy(
        edit_a_checked_text_a_verdict_and_a_trained_number
    )
    failed = failed_cells(path, ATEN_CPU_CAPABILITY="default")
    assert checked in failed and claims in failed
    assert trained not in failed
    assert failed == {checked, claims}, f"other cells failed too: {failed}"


def test_on_the_machine_that_computed_the_outputs_nbval_compares_every_cell():
    import kernels

    def edit(nb, code):
        nb.metadata[kernels.METADATA_KEY]["outputs_from"] = kernels.machine()
        return edit_a_checked_text_a_verdict_and_a_trained_number(nb, code)

    path, (checked, claims, trained) = scratch_copy(edit)
    assert {checked, claims, trained} <= failed_cells(path)
