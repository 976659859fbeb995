"""The book's sources hang together: one paper = one chapter + one module + one test file, every
chapter opens with the same setup cell, cites its papers and commits clean outputs."""

import re

import book
import nbformat
import pytest
import yaml

CHAPTERS = book.toc_chapters()
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What a committed output must not hold: a memory address, a machine path, a timing, a progress
# bar (its rate or its bar), an ipykernel temp file.
NOISE = re.compile(
    r"0x[0-9a-f]{8,}|/tmp/|/work/|/root/|/home/|ipykernel_\d+|\d+(\.\d+)?(it/s|s/it)"
    r"|\b(Wall time|CPU times)\b|\d+\.\d+ ?(ms|sec|seconds)\b|[█▏▎▍▌▋▊▉]{3,}"
)


def chapter_id(path):
    return path.stem


def load(path):
    return nbformat.read(path, as_version=4)


def test_the_toc_lists_every_chapter_on_disk_and_nothing_else():
    assert CHAPTERS, "_toc.yml lists no chapters"
    assert sorted(CHAPTERS) == book.chapter_files()


def test_every_toc_entry_exists():
    for entry in book.toc_files():
        candidates = [book.ROOT / f"{entry}{suffix}" for suffix in (".md", ".ipynb")]
        assert any(c.is_file() for c in candidates), entry
    assert "scoreboard" in book.toc_files()


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_has_a_paper_folder_a_test_file_and_mutants_named_alike(path):
    # Folders of papernotes/ are papers (mechanism and experiment); its files are shared.
    assert (book.ROOT / "papernotes" / path.stem / "__init__.py").is_file()
    assert (book.ROOT / "papernotes" / path.stem / "experiment.py").is_file()
    assert not (book.ROOT / "papernotes" / f"{path.stem}.py").exists()
    assert (book.ROOT / "tests" / f"test_{path.stem}.py").is_file()
    assert (book.ROOT / "tests" / "mutants" / f"{path.stem}.py").is_file()


def test_the_shared_layer_is_files_and_every_folder_is_a_chapters_paper():
    packages = {p.parent.name for p in (book.ROOT / "papernotes").glob("*/__init__.py")}
    assert packages == {p.stem for p in CHAPTERS}


def test_an_installed_papernotes_ships_every_papers_folder():
    # Colab's setup cell pip-installs the repository: a folder left out of the wheel would make
    # `from papernotes.<slug> import experiment` fail there and nowhere else.
    import tomllib
    from setuptools import find_packages

    config = tomllib.loads((book.ROOT / "pyproject.toml").read_text())
    found = config["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(book.ROOT), include=found["include"]))
    assert {f"papernotes.{p.stem}" for p in CHAPTERS} <= shipped


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_opens_with_the_books_setup_cell(path):
    first_code = next(c for c in load(path).cells if c.cell_type == "code")
    assert first_code.source == book.setup_cell_source()
    assert book.repository_url() in first_code.source


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapters_setup_cell_is_folded_on_the_page(path):
    first_code = next(c for c in load(path).cells if c.cell_type == "code")
    assert book.SETUP_CELL_TAG in first_code.metadata.get("tags", []), "run `make refresh` for it"


def test_refresh_writes_the_setup_cell_with_its_tag():
    import refresh

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import papernotes")])
    nb.cells[0].metadata["tags"] = ["nbval-check-output"]
    refresh.write_setup_cell(nb)
    refresh.write_setup_cell(nb)  # idempotent
    assert nb.cells[0].source == book.setup_cell_source()
    assert nb.cells[0].metadata["tags"] == [book.SETUP_CELL_TAG, "nbval-check-output"]


def test_the_setup_cell_installs_only_in_colab():
    source = book.setup_cell_source()
    assert 'if "google.colab" in sys.modules:' in source
    assert source.count("pip") == 1 and "pn.setup()" in source


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_has_the_anatomy_of_book_md(path):
    nb = load(path)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    assert nb.cells[0].source.startswith("# "), "a chapter starts with its title"
    assert re.search(r"arxiv\.org/abs/\d{4}\.\d{4,5}", nb.cells[0].source), "the arXiv link"
    assert "Source summary" in nb.cells[0].source, "credit to the source summary"
    assert "{cite}`" in markdown and "{bibliography}" in markdown
    assert f'pn.Claims("{path.stem}")' in code and "claims.check()" in code
    assert code.count("claims.add(") >= 2, "at least two claims"
    assert "pn.knob_panel(" in code, "at least one knob panel"
    assert any(h.startswith("What differs from the paper") for h in headings), headings
    assert headings[-1] == "References"
    tags = [t for c in nb.cells for t in c.metadata.get("tags", [])]
    assert "hide-input" in tags, "cells that only draw are tagged hide-input"


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_committed_chapter_stays_under_400_kb(path):
    assert path.stat().st_size < 400 * 1024, f"{path.stat().st_size / 1024:.0f} KB"


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
            data = output.get("data", {})
            text = output.get("text", "") + str(data.get("text/plain", ""))
            text += str(data.get("text/html", "")) if "pn-knobs" not in str(data) else ""
            assert not NOISE.search(text), (cell.id, NOISE.search(text).group(0))


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
    files = ["intro.md", "pyproject.toml", "_toc.yml", "tools/book.py", "scoreboard.md"]
    for name in files:
        assert url not in (book.ROOT / name).read_text(), name
    # The README's links block is written from _config.yml (make stamp), and only it names it.
    readme = (book.ROOT / "README.md").read_text().replace(book.readme_links(), "")
    assert url not in readme and book.repository_parts()["slug"] not in readme
    for path in CHAPTERS:  # only the stamped setup cell carries it
        cells = [c for c in load(path).cells if url in c.source]
        assert [c.source for c in cells] == [book.setup_cell_source()]


# -- on another machine the page must not contradict itself ----------------------------------------

CHECK_TAG = "nbval-check-output"
# A number with a decimal point and at least two significant digits (0.877, 98.4, 6.4e-4, 1.3):
# the kind a trained model prints. Integers and one-digit decimals (a seed, 0.5) are left out.
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:e-?\d+)?(?![\w.]*\d)")


def decimals(text: str) -> set[str]:
    found = set()
    for number in DECIMAL.findall(text):
        digits = number.split("e")[0].replace(".", "").lstrip("0")
        if len(digits) >= 2:
            found.add(number)
    return found


def output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                parts.append("".join(value) if isinstance(value, list) else value)
    return "\n".join(parts)


def quoted_trained_numbers(nb) -> list[str]:
    """Decimals in the prose that the chapter prints only in cells whose outputs vary with the
    CPU (not tagged nbval-check-output): on another machine the page would print other digits
    beside the same prose. A number also in the code or in a portable output (a constant, a
    paper's figure in the claims table) is not one of them."""
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = [c for c in nb.cells if c.cell_type == "code"]
    varying = "\n".join(output_text(c) for c in code if CHECK_TAG not in c.metadata.get("tags", []))
    fixed = "\n".join(
        [c.source for c in code]
        + [output_text(c) for c in code if CHECK_TAG in c.metadata.get("tags", [])]
    )
    return sorted(decimals(prose) & (decimals(varying) - decimals(fixed)))


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_the_prose_quotes_no_number_that_moves_with_the_cpu(path):
    quoted = quoted_trained_numbers(load(path))
    assert not quoted, (
        f"{path.stem}'s prose quotes {quoted}, printed only by cells whose outputs vary with the "
        "CPU: point at the printed cell, or say it in a form that holds on any CPU and seed "
        "(about, an inequality, the claim's bound)"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapter_keeps_two_cells_compared_on_any_cpu(path):
    """Two compared cells besides the claims' verdicts, and the claims cell."""
    code = [c for c in load(path).cells if c.cell_type == "code"]
    tagged = [c for c in code if CHECK_TAG in c.metadata.get("tags", [])]
    others = [c for c in tagged if "claims.check()" not in c.source]
    assert len(others) >= 2, (
        f"{path.stem}: fewer than two cells besides the claims tagged {CHECK_TAG} (make portable)"
    )
    assert len(others) < len(tagged), "the claims cell is not compared"


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_each_chapters_outputs_name_the_machine_that_computed_them(path):
    import kernels

    assert kernels.outputs_machine(load(path)), f"{path.stem}: run `make refresh` for it"


# -- a scaffold (make new) never passes until it is written ---------------------------------------


def unwritten(root) -> list[str]:
    """Files of the book that still hold the scaffold's placeholder marker."""
    from new_chapter import MARKER

    places = [*root.glob("chapters/*.ipynb"), *root.glob("papernotes/**/*.py")]
    places += [*root.glob("tests/**/*.py"), root / "_toc.yml", root / "intro.md"]
    return sorted(
        str(p.relative_to(root)) for p in places if p.is_file() and MARKER in p.read_text()
    )


def test_no_file_of_the_book_is_an_unwritten_scaffold():
    assert not unwritten(book.ROOT), "write these (make new left placeholders in them)"


def test_a_scaffolded_chapter_is_listed_and_caught_until_written(tmp_path):
    import shutil

    import new_chapter

    for folder in ("chapters", "papernotes", "tests/mutants"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("_toc.yml", "intro.md", "_config.yml"):
        shutil.copy(book.ROOT / name, tmp_path / name)
    new_chapter.scaffold("layer_norm", "Normalization and initialization", tmp_path)
    new_chapter.scaffold("world_models", "A new part", tmp_path)
    assert "chapters/layer_norm" in book.toc_files(tmp_path)
    # a new part comes after the parts of chapters, before the book's own pages (the scoreboard)
    files = book.toc_files(tmp_path)
    assert files[-2:] == ["chapters/world_models", "scoreboard"]
    toc = yaml.safe_load((tmp_path / "_toc.yml").read_text())
    assert [p["caption"] for p in toc["parts"]][-2:] == ["A new part", "The book itself"]
    intro = (tmp_path / "intro.md").read_text()
    assert "{doc}`chapters/layer_norm`" in intro and "**A new part**" in intro
    assert intro.index("chapters/layer_norm") < intro.index("**Memory, attention")
    assert unwritten(tmp_path) == [
        "chapters/layer_norm.ipynb",
        "chapters/world_models.ipynb",
        "intro.md",
        "papernotes/layer_norm/__init__.py",
        "papernotes/layer_norm/experiment.py",
        "papernotes/world_models/__init__.py",
        "papernotes/world_models/experiment.py",
        "tests/mutants/layer_norm.py",
        "tests/mutants/world_models.py",
        "tests/test_layer_norm.py",
        "tests/test_world_models.py",
    ]
    nb = nbformat.read(tmp_path / "chapters" / "layer_norm.ipynb", as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.source == book.setup_cell_source(tmp_path)
    assert first_code.metadata["tags"] == [book.SETUP_CELL_TAG]


def test_make_new_fills_what_it_is_told_of_the_paper(tmp_path):
    import shutil

    import new_chapter

    for folder in ("chapters", "papernotes", "tests/mutants"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("_toc.yml", "intro.md", "_config.yml"):
        shutil.copy(book.ROOT / name, tmp_path / name)
    paper = new_chapter.Paper(
        "mixup: Beyond Empirical Risk Minimization", "Zhang et al.", "2018", "1710.09412"
    )
    new_chapter.scaffold("mixup", "Regularization", tmp_path, paper)
    intro = (tmp_path / "intro.md").read_text()
    assert "- {doc}`chapters/mixup` (Zhang et al., 2018)\n" in intro
    assert "intro.md" not in unwritten(tmp_path)  # the intro's line is written
    title = nbformat.read(tmp_path / "chapters" / "mixup.ipynb", as_version=4).cells[0].source
    assert title.startswith("# mixup: Beyond Empirical Risk Minimization\n")
    assert "\nZhang et al. *" in title and "arxiv.org/abs/1710.09412" in title


def test_the_scaffolds_claims_cell_meets_the_claims_standard_as_written():
    """The scaffold teaches the current call: run as it stands, its rows break no rule of the
    standard (nulls, arms tuned alike, a bound with a source) and none fails."""
    import new_chapter

    import papernotes as pn

    namespace = {"pn": pn}
    exec(new_chapter.claims_cell("mixup"), namespace)
    claims = namespace["claims"]
    assert [c.status for c in claims.items] == [pn.ANALOG, pn.NOT_RUN]
    headline = claims.items[0]
    assert headline.nulls and headline.arms and headline.bound_from == "noise"
    assert claims.failed == [] and headline.breaches == ()


# -- the prose cites only what the reader can see ------------------------------------------------

HIDDEN_SOURCES = re.compile(
    r"papers\.md|BOOK\.md|design note|\bpilot|trial runs?\b|\bissues?\b|issue's|\bour notes\b"
    r"|book's notes|shared/|\bthe brief\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_the_prose_cites_nothing_the_reader_cannot_see(path):
    """No issue, design note, pilot or trial run whose numbers the chapter does not print: a
    threshold comes from the paper, a derivation in the chapter or a bound the notebook computes,
    and a pilot that shaped the design is re-run in a cell or not mentioned."""
    prose = "\n".join(c.source for c in load(path).cells if c.cell_type == "markdown")
    found = sorted({m.group(0).lower() for m in HIDDEN_SOURCES.finditer(prose)})
    assert not found, f"{path.stem}'s prose cites what the reader cannot see: {found}"


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_every_row_of_the_claims_says_its_kind(path):
    """Each `claims.add(...)` names its kind: a claim of the paper (with a status) or the book's
    own check (without one)."""
    import ast

    source = "\n".join(c.source for c in load(path).cells if c.cell_type == "code")
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "claims"
    ]
    assert calls, "no claims.add(...)"
    unnamed = [
        ast.get_source_segment(source, c)[:60]
        for c in calls
        if "kind" not in {k.arg for k in c.keywords}
    ]
    assert not unnamed, f"rows without kind=: {unnamed}"


def test_the_guide_names_every_word_the_prose_may_not_use():
    """CONTRIBUTING.md lists the rules that live in these tests: each forbidden word of the
    hidden-sources test appears in its section, so a contributor learns them there."""
    guide = (book.ROOT / "CONTRIBUTING.md").read_text()
    section = guide[guide.index("## What the tests check in a chapter") :]
    missing = [
        alternative
        for alternative in HIDDEN_SOURCES.pattern.split("|")
        if not re.search(alternative, section, re.IGNORECASE)
    ]
    assert not missing, f"CONTRIBUTING.md does not name {missing}"


@pytest.mark.parametrize("path", CHAPTERS, ids=chapter_id)
def test_compared_cells_print_nothing_another_cpu_can_flip(path):
    """A cell compared on any CPU prints no signed zero and no value at rounding level (issue:
    an Intel machine printed 5.8e-17 where the committed fixed point's miss read 0.0e+00, and
    +0.0000 for -0.0000): tools/portable.py's rule, on the committed outputs as nbval compares
    them."""
    import portable

    patterns = portable._patterns()
    code = [c for c in load(path).cells if c.cell_type == "code"]
    flags = [CHECK_TAG in c.metadata.get("tags", []) for c in code]
    refused = portable.refused(code, flags, patterns)
    assert not refused, f"{path.stem}: " + "; ".join(f"cell {i} {why}" for i, why in refused)
