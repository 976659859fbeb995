"""Re-execute chapters and save their outputs in place, with as little diff churn as possible.

    .venv/bin/python tools/refresh.py                        # every chapter
    .venv/bin/python tools/refresh.py chapters/concrete.ipynb

Each chapter gets the book's setup cell (tools/book.py), runs top to bottom in a fresh kernel in
chapters/ with progress bars off, and is saved with what varies between runs taken out: execution
timestamps, widget state, and the live-widget view of knob panels (a stored widget view has no
kernel behind it; the panel's static HTML view stays and shows in Jupyter until the cell runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def stamp_setup_cell(nb) -> None:
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    first_code.source = book.setup_cell_source()


def execute(nb, path: Path) -> None:
    os.environ["PAPERNOTES_QUIET"] = "1"  # the kernel inherits it
    os.environ.setdefault("PAPERNOTES_RECORD_DIR", str(book.ROOT / "_build" / "records"))
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        # Widget state is stored while executing (nbclient's Output-widget capture needs it)
        # and dropped again by normalize().
    )
    client.execute()


def normalize(nb) -> None:
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
    stamp_setup_cell(nb)
    start = time.perf_counter()
    execute(nb, path)
    seconds = time.perf_counter() - start
    normalize(nb)
    nbformat.validate(nb)
    text = nbformat.writes(nb) + "\n"
    if path.read_text() != text:
        path.write_text(text)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: every chapter)")
    args = parser.parse_args(argv)
    for path in args.chapters or book.chapter_files():
        seconds = refresh(path.resolve())
        print(f"{path}: executed and saved ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
