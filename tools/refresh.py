"""Re-execute chapters and save their outputs in place, with as little diff churn as possible.

    .venv/bin/python tools/refresh.py                        # every chapter
    .venv/bin/python tools/refresh.py chapters/concrete.ipynb

Each chapter gets the book's setup cell (tools/book.py, tagged to be folded on the page), runs
top to bottom in a fresh kernel in chapters/ with progress bars off (tools/kernels.py), $JOBS
chapters at a time, and is saved with
what varies between runs taken out: execution timestamps, widget state, and the live-widget view
of knob panels (a stored widget view has no kernel behind it; the panel's static HTML view stays
and shows in Jupyter until the cell runs). The machine that computed the outputs is written into
the chapter's metadata: nbval compares every output on that machine, and only the cells tagged
`nbval-check-output` on any other (conftest.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book
import kernels

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def write_setup_cell(nb) -> None:
    """The book's setup cell, tagged so that the web page folds it (its source and its tag are
    the book's, whatever the chapter held)."""
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    first_code.source = book.setup_cell_source()
    tags = first_code.metadata.setdefault("tags", [])
    if book.SETUP_CELL_TAG not in tags:
        tags.insert(0, book.SETUP_CELL_TAG)


def normalize(nb) -> None:
    # Widget state is stored while executing (nbclient's Output-widget capture needs it) and
    # dropped here.
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            data = output.get("data", {})
            data.pop(WIDGET_VIEW, None)
        # An output left with nothing to show (a bare widget) is dropped.
        cell.outputs = [
            o
            for o in cell.outputs
            if o.get("output_type") not in ("display_data", "execute_result") or o.get("data")
        ]


def refresh(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    write_setup_cell(nb)
    seconds = kernels.execute(nb, path, record_dir=book.ROOT / "_build" / "records")
    normalize(nb)
    nb.metadata.setdefault(kernels.METADATA_KEY, {})["outputs_from"] = kernels.machine()
    nbformat.validate(nb)
    text = nbformat.writes(nb) + "\n"
    if path.read_text() != text:
        path.write_text(text)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: every chapter)")
    args = parser.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters] or book.chapter_files()
    start, failed = time.perf_counter(), []
    for done, (path, seconds, failure) in enumerate(kernels.in_parallel(refresh, chapters), 1):
        if failure is None:
            what = f"{path.stem}: executed and saved ({seconds:.1f} s)"
        else:
            what, failed = f"FAILED {failure}", [*failed, path.stem]
        kernels.progress(done, len(chapters), start, what)
    if failed:
        print(f"not saved (a cell failed): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
