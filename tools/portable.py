"""Which of a chapter's outputs hold on any CPU? Find them, and tag them `nbval-check-output`.

    .venv/bin/python tools/portable.py                          # every chapter (make portable)
    .venv/bin/python tools/portable.py chapters/concrete.ipynb
    .venv/bin/python tools/portable.py --report                 # say, change nothing

On another machine nbval compares only a chapter's cells tagged `nbval-check-output`
(conftest.py). This tool decides the tags by running each chapter twice more beside its
committed outputs: once with torch's plain vector kernels (ATEN_CPU_CAPABILITY=default, the
arithmetic of another CPU) and once under another seed (a different training run). A cell whose
outputs read the same in all three, as nbval compares them (after both sanitize files), does not
depend on floating-point training: text, data-set sizes, constants, exact math, the claims'
verdicts. Those cells get the tag and every other cell loses it. The claims cell is compared
with the other CPU's run only (its measured columns masked): its verdicts must not move with the
CPU, though a claim may fail under another seed (the seed runs go on past a failing cell). A
chapter must keep at least two tagged cells.

Run it after `make refresh` whenever a chapter's outputs changed, and commit the tags.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book
import kernels

CHECK_TAG = "nbval-check-output"
IGNORE_TAG = "nbval-ignore-output"
SANITIZE_FILES = (
    book.ROOT / "tests" / "nbval_sanitize.cfg",
    book.ROOT / "tests" / "nbval_sanitize_lax.cfg",
)
# What nbval leaves out of a comparison (its IPyNbFile.skip_compare).
NOT_COMPARED = {"image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json"}
VARIANTS = {
    "default-kernels": ({"ATEN_CPU_CAPABILITY": "default"}, 0),
    "seed-1": ({}, 1),
}
SAVED = book.ROOT / "_build" / "portable"  # each run, to read or diff: <slug>.<variant>.ipynb
MIN_CHECKED = 2
CHECK_CALL = "claims.check()"


def _patterns() -> list[tuple[str, str]]:
    from nbval.plugin import get_sanitize_patterns

    return [p for path in SANITIZE_FILES for p in get_sanitize_patterns(path.read_text())]


def compared_view(cell, patterns) -> tuple:
    """A code cell's outputs as nbval compares them: streams joined by name, rich outputs by
    MIME type without images and widget views, every text sanitized."""

    def clean(text) -> str:
        text = "".join(text) if isinstance(text, list) else str(text)
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    streams: dict[str, str] = {}
    rich = []
    for output in cell.get("outputs", []):
        kind = output["output_type"]
        if kind == "stream":
            streams[output["name"]] = streams.get(output["name"], "") + clean(output["text"])
        elif kind in ("display_data", "execute_result"):
            data = output.get("data", {})
            shown = {k: clean(v) for k, v in data.items() if k not in NOT_COMPARED}
            rich.append(tuple(sorted(shown.items())))
        elif kind == "error":
            rich.append(("error", output.get("ename", "")))
    return tuple(sorted(streams.items())), tuple(rich)


def run_variant(path: Path, environment: dict, seed: int) -> str:
    """The chapter executed under one variant, as notebook text (plain text crosses processes)."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as records:
        # Under another seed a claim may fail (claims must hold on 4 of 5 seeds): the cells
        # after it still run, so that every cell can be compared.
        kernels.execute(
            nb, path, seed=seed, record_dir=records, environment=environment, allow_errors=True
        )
    return nbformat.writes(nb)


def code_cells(text: str) -> list:
    return [c for c in nbformat.reads(text, as_version=4).cells if c.cell_type == "code"]


def portable_cells(committed: list, variants: list[list], patterns) -> list[bool]:
    """Per code cell: does it show something to compare, the same in every run? The claims
    cell is compared with the other CPU's run alone: its verdicts may differ under another
    seed, they must not under another CPU."""
    flags = []
    for i, cell in enumerate(committed):
        view = compared_view(cell, patterns)
        shows = any(part for part in view)
        runs = variants[:1] if CHECK_CALL in cell.source else variants
        same = all(compared_view(run[i], patterns) == view for run in runs)
        ignored = IGNORE_TAG in cell.metadata.get("tags", [])
        flags.append(shows and same and not ignored)
    return flags


def retag(path: Path, flags: list[bool]) -> bool:
    """Set the check tag on exactly the flagged code cells; True when the file changed."""
    text = path.read_text()
    nb = nbformat.reads(text, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell, flag in zip(code, flags, strict=True):
        tags = [t for t in cell.metadata.get("tags", []) if t != CHECK_TAG]
        if flag:
            tags.append(CHECK_TAG)
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    new = nbformat.writes(nb) + "\n"
    if new != text:
        path.write_text(new)
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    parser.add_argument("--report", action="store_true", help="report only; change no file")
    args = parser.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    jobs = [(path, env, seed) for path in chapters for env, seed in VARIANTS.values()]
    names = [name for _ in chapters for name in VARIANTS]
    SAVED.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs: dict[Path, list] = {}
    with ProcessPoolExecutor(max_workers=kernels.jobs()) as pool:
        futures = [pool.submit(run_variant, *job) for job in jobs]
        for done, (job, name, future) in enumerate(zip(jobs, names, futures, strict=True), 1):
            text = future.result()
            (SAVED / f"{job[0].stem}.{name}.ipynb").write_text(text)
            runs.setdefault(job[0], []).append(code_cells(text))
            kernels.progress(done, len(jobs), start, f"{job[0].stem}: {name}")
    patterns, ok = _patterns(), True
    for path in chapters:
        committed = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        flags = portable_cells(committed, runs[path], patterns)
        checked = [i for i, flag in enumerate(flags) if flag]
        varying = [i for i, c in enumerate(committed) if c.outputs and not flags[i]]
        changed = False if args.report else retag(path, flags)
        print(
            f"{path.stem}: {len(checked)} of {len(committed)} code cells hold on any CPU "
            f"(cells {checked}); {len(varying)} vary (cells {varying})"
            + ("; tags written" if changed else "")
        )
        if len(checked) < MIN_CHECKED:
            print(f"  {path.stem}: fewer than {MIN_CHECKED} cells to compare elsewhere")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
