"""The book's sources hang together: one paper = one chapter + one module + one test file, every
chapter opens with the same setup cell, cites its papers and commits clean outputs."""

import re

import book
import nbformat
import pytest

CHAPTERS = book.toc_chapters()
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def chapter_id(path):
    return path.stem


def load(path):
    return nbformat.read(path, as_version=4)


def test_the_toc_lists_every_chapter_on_disk_and_nothing_else():
    assert CHAPTERS, "_toc.yml lists no chapters"
    assert sorted(CHAPTERS) == book.chapter_files()


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_has_a_module_and_a_test_file_named_alike(path):
    assert (book.ROOT / "papernotes" / f"{path.stem}.py").is_file()
    assert (book.ROOT / "tests" / f"test_{path.stem}.py").is_file()


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_opens_with_the_books_setup_cell(path):
    first_code = next(c for c in load(path).cells if c.cell_type == "code")
    assert first_code.source == book.setup_cell_source()
    assert book.repository_url() in first_code.source


def test_the_setup_cell_installs_only_in_colab():
    source = book.setup_cell_source()
    assert 'if "google.colab" in sys.modules:' in source
    assert source.count("pip") == 1 and "pn.setup()" in source


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_cites_its_paper_and_checks_claims(path):
    nb = load(path)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert nb.cells[0].source.startswith("# "), "a chapter starts with its title"
    assert re.search(r"arxiv\.org/abs/\d{4}\.\d{4,5}", nb.cells[0].source)
    assert "Source summary" in nb.cells[0].source
    assert "{cite}`" in markdown and "{bibliography}" in markdown
    assert f'pn.Claims("{path.stem}")' in code and "claims.check()" in code
    assert "pn.knob_panel(" in code


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_knob_cells_are_ignored_by_nbval_and_hold_no_stale_widgets(path):
    for cell in load(path).cells:
        if cell.cell_type != "code":
            continue
        if "pn.knob_panel(" in cell.source:
            assert "nbval-ignore-output" in cell.metadata.get("tags", [])
        for output in cell.outputs:
            assert WIDGET_VIEW not in output.get("data", {})


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_committed_outputs_are_complete_and_clean(path):
    nb = load(path)
    assert "widgets" not in nb.metadata
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code[1:]), "every cell has run (refresh the chapter)"
    for cell in code:
        for output in cell.outputs:
            assert output.output_type != "error", cell.id
            assert not (output.output_type == "stream" and output.name == "stderr"), cell.id
            text = output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
            assert not re.search(r"0x[0-9a-f]{8,}|/tmp/|/work/|/root/|\d+\.\d+it/s", text), cell.id


def test_every_cited_key_is_in_references_bib():
    bib = (book.ROOT / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for path in CHAPTERS:
        markdown = "\n".join(c.source for c in load(path).cells if c.cell_type == "markdown")
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", markdown):
            for key in group.split(","):
                assert key.strip() in keys, (path.name, key)


def test_the_intro_links_every_chapter():
    intro = (book.ROOT / "intro.md").read_text()
    for path in CHAPTERS:
        assert f"{{doc}}`chapters/{path.stem}`" in intro


def test_the_repository_url_is_named_in_one_place_only():
    url = book.repository_url()
    files = ["README.md", "intro.md", "pyproject.toml", "_toc.yml", "tools/book.py"]
    for name in files:
        assert url not in (book.ROOT / name).read_text(), name
    for path in CHAPTERS:  # only the stamped setup cell carries it
        cells = [c for c in load(path).cells if url in c.source]
        assert [c.source for c in cells] == [book.setup_cell_source()]
