"""Staleness follows behaviour: a docstring or a comment changes no hash; code does, in the
chapter, in any module it imports (directly or through another), or in its mutants."""

import shutil

import behaviour
import book
import nbformat
import pytest

SLUG = "recurrent_batch_norm"  # imports papernotes.batch_norm through its own module


@pytest.fixture
def copy(tmp_path):
    """A copy of the package, one chapter and its mutants, to edit."""
    shutil.copytree(book.ROOT / "papernotes", tmp_path / "papernotes")
    (tmp_path / "chapters").mkdir()
    (tmp_path / "tests" / "mutants").mkdir(parents=True)
    for part in (f"chapters/{SLUG}.ipynb", f"tests/mutants/{SLUG}.py", "chapters/jsma.ipynb"):
        shutil.copy(book.ROOT / part, tmp_path / part)
    return tmp_path


def hash_of(root, slug=SLUG):
    return behaviour.behaviour_hash(root / "chapters" / f"{slug}.ipynb", root)


def edit(path, old, new):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def modules(root, slug):
    paths = behaviour.dependencies(root / "chapters" / f"{slug}.ipynb", root)
    return {behaviour._module_name(p, root) for p in paths}


def module_file(root, name):
    return behaviour.module_path(f"papernotes.{name}", root)


def test_the_dependencies_follow_imports_through_modules(copy):
    names = modules(copy, SLUG)
    assert {"papernotes", "papernotes.training", "papernotes.batch_norm"} <= names
    assert {"papernotes.recurrent_batch_norm", "papernotes.recurrent_batch_norm.experiment"} <= (
        names
    )
    jsma = modules(copy, "jsma")
    assert "papernotes.batch_norm" not in jsma and "papernotes.jsma" in jsma


def test_a_docstring_or_comment_edit_leaves_the_results_fresh(copy):
    before = hash_of(copy)
    module = module_file(copy, "batch_norm")
    text = module.read_text()
    first_docstring_line = text.split('"""')[1].splitlines()[0]
    edit(module, first_docstring_line, first_docstring_line + " Reworded.")
    edit(module, "\nimport ", "\n# a new comment\nimport ")
    assert hash_of(copy) == before


def test_a_code_edit_in_an_imported_module_makes_the_chapter_stale(copy):
    before, jsma_before = hash_of(copy), hash_of(copy, "jsma")
    edit(module_file(copy, "batch_norm"), "import torch\n", "import torch\n\nEPS_ = 1\n")
    assert hash_of(copy) != before
    assert hash_of(copy, "jsma") == jsma_before  # jsma does not import batch_norm


@pytest.mark.parametrize("where", ["training", "experiment", "mutants", "chapter"])
def test_shared_code_mutants_and_code_cells_count_too(copy, where):
    before = hash_of(copy)
    if where == "training":
        edit(module_file(copy, "training"), "import torch\n", "import torch\n\nX_ = 1\n")
    elif where == "experiment":
        path = module_file(copy, f"{SLUG}.experiment")
        path.write_text(path.read_text() + "\nX_ = 1\n")
    elif where == "mutants":
        path = copy / "tests" / "mutants" / f"{SLUG}.py"
        path.write_text(path.read_text() + "\nX_ = 1\n")
    else:
        path = copy / "chapters" / f"{SLUG}.ipynb"
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        code[-1].source += "\nx_ = 1"
        nbformat.write(nb, path)
    assert hash_of(copy) != before


def test_a_markdown_edit_leaves_the_hash(copy):
    before = hash_of(copy)
    path = copy / "chapters" / f"{SLUG}.ipynb"
    nb = nbformat.read(path, as_version=4)
    next(c for c in nb.cells if c.cell_type == "markdown").source += " More prose."
    nbformat.write(nb, path)
    assert hash_of(copy) == before
