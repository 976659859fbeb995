"""Execute the chapters that changed, $JOBS at a time, into the cache that the book build reads.

    .venv/bin/python tools/execute.py      # run by `make book` before `jupyter-book build`

jupyter-book executes a book's notebooks one after another, and its cache keys on a notebook's
code cells only, so it would not notice a change in the papernotes package. This script decides
instead: a chapter is executed again when its code cells, the code of a module it imports
(directly or through others), or its mutants changed (tools/behaviour.py), or when the cache has
no execution of it; otherwise its cached execution stands. A prose edit therefore re-executes
nothing, and an edit of `papernotes/batch_norm.py` re-executes the two chapters that import it.
The chapters to run go $JOBS at a time (two by default: one single-threaded kernel per core,
tools/kernels.py), with a line of progress for each; the build that follows runs with
execute_notebooks "cache" (set by PAPERNOTES_EXECUTE, read by tools/book_ext.py) and takes every
chapter's outputs from _build/.jupyter_cache.

Each execution writes its chapter's claims record into _build/records (for the scoreboard); a
copy is kept beside the cache, so a chapter that is not re-executed still has its record.
`make clean` removes the cache, and the next `make book` executes everything.

On the CI's matrix (.github/workflows/book.yml) each job executes one chapter and keeps it,
and one job builds the book from them all without executing again:

    .venv/bin/python tools/execute.py --out DIR chapters/x.ipynb   # a matrix job
    .venv/bin/python tools/execute.py --from DIR && make book      # the build job

`--out` executes the chapters named (whatever the cache holds) and writes each executed notebook
and its claims record into DIR; `--from` files the executed notebooks found in DIR into the cache,
as if this script had executed them, so that the build that follows executes nothing.

Exits non-zero, naming the chapter and the cell, when a chapter fails.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import behaviour
import book
import kernels

CACHE = book.ROOT / "_build" / ".jupyter_cache"
KEYS = CACHE / "papernotes-behaviour.json"
KEPT_RECORDS = CACHE / "papernotes-records"
RECORDS = book.ROOT / "_build" / "records"
TIMEOUT_S = 300  # a cell; as nbval's, so that a hang fails within minutes


def run(path: Path) -> tuple[str, str | None, float]:
    """Execute one chapter; returns its executed notebook as text, its record and seconds."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as records:
        seconds = kernels.execute(nb, path, record_dir=records, timeout=TIMEOUT_S)
        record = Path(records) / f"{path.stem}.json"
        return nbformat.writes(nb), record.read_text() if record.exists() else None, seconds


def stale_chapters(cache, chapters: list[Path], keys: dict) -> list[Path]:
    stale = []
    for path in chapters:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
            cached = True
        except KeyError:
            cached = False
        if not cached or keys.get(path.stem) != behaviour.behaviour_hash(path):
            stale.append(path)
    return stale


def with_outputs(source, executed):
    """The chapter as written, with the executed copy's outputs and notebook metadata.

    jupyter-cache files an execution under a hash of the notebook's code cells *with their
    metadata*, and the build looks a chapter up by the hash of the file as written; nbclient adds
    timing metadata to each cell it runs, so an executed copy stored as it is is never found
    (the build would execute the chapter a second time)."""
    merged = copy.deepcopy(source)
    for cell, ran in zip(merged.cells, executed.cells, strict=True):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = ran.outputs, ran.execution_count
    merged.metadata = copy.deepcopy(executed.metadata)
    merged.metadata.pop("kernelspec", None)
    if "kernelspec" in source.metadata:
        merged.metadata.kernelspec = source.metadata.kernelspec
    return merged


def store(cache, path: Path, text: str, record: str | None, keys: dict) -> None:
    from jupyter_cache.base import CacheBundleIn

    source = nbformat.read(path, as_version=4)
    bundle = with_outputs(source, nbformat.reads(text, as_version=4))
    cache.cache_notebook_bundle(CacheBundleIn(bundle, str(path)), overwrite=True)
    cache.match_cache_notebook(source)  # a KeyError here would mean the build cannot find it
    keys[path.stem] = behaviour.behaviour_hash(path)
    KEYS.write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    if record is not None:
        KEPT_RECORDS.mkdir(parents=True, exist_ok=True)
        (KEPT_RECORDS / f"{path.stem}.json").write_text(record)
    # The page's source did not change, only its outputs: tell Sphinx to read it again.
    os.utime(path)


def restore_records(chapters: list[Path]) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    for path in chapters:
        kept = KEPT_RECORDS / f"{path.stem}.json"
        if kept.exists():
            shutil.copy(kept, RECORDS / kept.name)


def execute_each(chapters: list[Path], keep) -> list[str]:
    """Execute `chapters` $JOBS at a time, calling `keep(path, text, record)` for each that
    passes, with a line of progress for each; returns the slugs of those that failed."""
    start, failed = time.perf_counter(), []
    for done, (path, result, failure) in enumerate(kernels.in_parallel(run, chapters), 1):
        if failure is not None:
            failed.append(path.stem)
            kernels.progress(done, len(chapters), start, f"FAILED {failure}")
            continue
        text, record, seconds = result
        keep(path, text, record)
        kernels.progress(done, len(chapters), start, f"{path.stem} ({seconds:.0f} s)")
    if failed:
        print(f"chapters that failed: {', '.join(failed)}", file=sys.stderr)
    return failed


def execute_into(folder: Path, chapters: list[Path]) -> int:
    """Execute `chapters` and write each, with its record, into `folder` (a matrix job)."""
    folder.mkdir(parents=True, exist_ok=True)

    def keep(path: Path, text: str, record: str | None) -> None:
        source = nbformat.read(path, as_version=4)
        nbformat.write(with_outputs(source, nbformat.reads(text, as_version=4)), folder / path.name)
        if record is not None:
            (folder / f"{path.stem}.json").write_text(record)

    return 1 if execute_each(chapters, keep) else 0


def file_from(folder: Path) -> int:
    """File the executed chapters in `folder` into the cache (the matrix's build job)."""
    from jupyter_cache import get_cache

    cache = get_cache(CACHE)
    keys = json.loads(KEYS.read_text()) if KEYS.exists() else {}
    chapters = {p.stem: p for p in book.toc_chapters()}
    found = sorted(folder.glob("*.ipynb"))
    missing = sorted(set(chapters) - {p.stem for p in found})
    if missing:
        print(f"no executed copy in {folder} of: {', '.join(missing)}", file=sys.stderr)
        return 1
    for executed in found:
        record = folder / f"{executed.stem}.json"
        text = record.read_text() if record.exists() else None
        store(cache, chapters[executed.stem], executed.read_text(), text, keys)
    restore_records(list(chapters.values()))
    print(f"filed {len(found)} executed chapters from {folder} into the cache", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    import argparse

    from jupyter_cache import get_cache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="with --out: the chapters to run")
    parser.add_argument("--out", type=Path, help="execute the chapters into this folder")
    parser.add_argument("--from", dest="source", type=Path, help="file executed chapters")
    args = parser.parse_args(argv)
    if args.out is not None:
        return execute_into(args.out, [p.resolve() for p in args.chapters] or book.toc_chapters())
    if args.source is not None:
        return file_from(args.source)
    chapters = book.toc_chapters()
    cache = get_cache(CACHE)
    keys = json.loads(KEYS.read_text()) if KEYS.exists() else {}
    stale = stale_chapters(cache, chapters, keys)
    print(
        f"{len(chapters) - len(stale)} of {len(chapters)} chapters unchanged since they ran; "
        f"executing {len(stale)}",
        file=sys.stderr,
    )
    failed = execute_each(stale, lambda path, text, record: store(cache, path, text, record, keys))
    restore_records(chapters)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
