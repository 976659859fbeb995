"""pytest settings for the whole repository, chapters included.

Progress bars off: nbval's kernels inherit this environment, and a progress bar's output would
differ from the committed one on every run.

**nbval on any CPU.** A chapter's committed outputs were computed on one machine
(`metadata.papernotes.outputs_from`, written by `make refresh`; see tools/kernels.py). When this
machine is that machine, nbval compares every cell, as in its default mode: a stale output, a
changed number or text fails. On any other machine (another processor, torch's other vector
kernels, another torch) the trained numbers round differently, so nbval compares there only the
cells tagged `nbval-check-output` (nbval's lax mode, per chapter): outputs that do not depend on
floating-point training (text, data-set sizes, exact math, constants, the claims' verdicts),
with the claims table's measured columns masked by tests/nbval_sanitize_lax.cfg. Every cell
still runs, and a claim that fails still stops the chapter, on every machine.

**Kernels start over IPC** (tools/kernels.py): two nbval kernels started side by side cannot
race for the same TCP ports.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("PAPERNOTES_QUIET", "1")

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))

import kernels  # noqa: E402 - after the path insert

CHECK_TAG = "nbval-check-output"
LAX_SANITIZE = ROOT / "tests" / "nbval_sanitize_lax.cfg"
_THIS_MACHINE = None


def this_machine() -> str:
    global _THIS_MACHINE
    if _THIS_MACHINE is None:
        _THIS_MACHINE = kernels.machine()
    return _THIS_MACHINE


def pytest_configure(config):
    try:
        import nbval.kernel
    except ImportError:  # nbval absent: no chapters to run
        return
    nbval.kernel.KernelManager = kernels.IpcKernelManager


def pytest_report_header(config):
    if not getattr(config.option, "nbval", False):
        return []
    lines = [f"papernotes: this machine is {this_machine()}"]
    lax = _chapters_from_elsewhere()
    if lax:
        lines.append(
            f"papernotes: {len(lax)} chapters' outputs were computed on another machine; nbval "
            f"compares only their cells tagged {CHECK_TAG} (every cell runs, every claim is "
            f"checked): {', '.join(lax)}"
        )
    return lines


def _chapters_from_elsewhere() -> list[str]:
    import nbformat

    return [
        path.stem
        for path in sorted((ROOT / "chapters").glob("*.ipynb"))
        if kernels.outputs_machine(nbformat.read(path, as_version=4)) != this_machine()
    ]


def pytest_collection_modifyitems(config, items):
    try:
        from nbval.plugin import IPyNbCell, get_sanitize_patterns
    except ImportError:
        return
    lax_patterns = get_sanitize_patterns(LAX_SANITIZE.read_text())
    foreign: dict[Path, bool] = {}
    for item in items:
        if not isinstance(item, IPyNbCell):
            continue
        notebook = item.parent
        if notebook not in foreign:
            foreign[notebook] = kernels.outputs_machine(notebook.nb) != this_machine()
            if foreign[notebook]:
                # The lax patterns first: nbval's setup() adds the common ones after them.
                notebook.sanitize_patterns.update(lax_patterns)
        if foreign[notebook] and CHECK_TAG not in item.cell.metadata.get("tags", []):
            item.options["check"] = False
