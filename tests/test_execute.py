"""`make book`'s executor stores each chapter where the book build will look it up."""

import copy

import execute
import kernels
import nbformat
import pytest
from jupyter_cache import get_cache
from jupyter_cache.base import CacheBundleIn


def a_chapter(tmp_path):
    source = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# A chapter"),
            nbformat.v4.new_code_cell("print(6 * 7)", metadata={"tags": ["hide-input"]}),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    path = tmp_path / "chapter.ipynb"
    nbformat.write(source, path)
    executed = copy.deepcopy(source)
    kernels.execute(executed, path)
    return path, source, executed


def test_an_executed_chapter_is_found_by_the_build_and_brings_its_outputs(tmp_path):
    path, source, executed = a_chapter(tmp_path)
    cache = get_cache(tmp_path / "cache")
    cache.cache_notebook_bundle(CacheBundleIn(execute.with_outputs(source, executed), str(path)))
    # What myst-nb does with the file as written, in execute_notebooks "cache" mode:
    as_written = nbformat.read(path, as_version=4)
    cache.match_cache_notebook(as_written)
    _, page = cache.merge_match_into_notebook(as_written)
    assert page.cells[1].outputs[0].text == "42\n"
    assert page.cells[1].metadata.tags == ["hide-input"]


def test_the_executed_copy_as_it_is_would_be_executed_again(tmp_path):
    # Why with_outputs exists: nbclient writes timing into each cell's metadata, which
    # jupyter-cache hashes.
    path, source, executed = a_chapter(tmp_path)
    assert "execution" in executed.cells[1].metadata
    cache = get_cache(tmp_path / "cache")
    cache.cache_notebook_bundle(CacheBundleIn(executed, str(path)))
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(path, as_version=4))


def test_a_matrix_job_executes_into_a_folder_and_the_build_job_files_it_for_the_build(
    tmp_path, monkeypatch
):
    """book.yml's matrix: a job a chapter runs `execute.py --out`, the build job `--from`; the
    cache then holds every chapter, so the build that follows executes none."""
    path, source, _ = a_chapter(tmp_path)
    for name in ("CACHE", "KEYS", "KEPT_RECORDS", "RECORDS"):
        monkeypatch.setattr(execute, name, tmp_path / "build" / name.lower())
    monkeypatch.setattr(execute.book, "toc_chapters", lambda root=None: [path])
    monkeypatch.setattr(execute.behaviour, "behaviour_hash", lambda p, root=None: "h")
    monkeypatch.setenv("JOBS", "1")
    folder = tmp_path / "executed"
    assert execute.execute_into(folder, [path]) == 0
    kept = nbformat.read(folder / path.name, as_version=4)
    assert kept.cells[1].outputs[0].text == "42\n" and "execution" not in kept.cells[1].metadata
    assert execute.file_from(folder) == 0
    cache = get_cache(execute.CACHE)
    assert execute.stale_chapters(cache, [path], {"chapter": "h"}) == []  # nothing to execute
    (folder / path.name).unlink()
    assert execute.file_from(folder) == 1  # a chapter missing from the artifacts fails the job
