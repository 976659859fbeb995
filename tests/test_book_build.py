"""The strict HTML build, and what its pages must hold (run by `make test` as `pytest -m book`)."""

import json
import re

import book
import pytest

pytestmark = pytest.mark.book

CDN = re.compile(
    r"""(?:src|href)=["']https?://(?!colab\.research\.google\.com|github\.com)[^"']+\.(?:js|css)"""
)


def chapter_pages(html):
    return [html / p.relative_to(book.ROOT).with_suffix(".html") for p in book.toc_chapters()]


def test_the_book_builds_with_the_intro_and_every_chapter(built_book):
    assert (built_book / "index.html").is_file()
    assert (built_book / "intro.html").is_file()
    for page in chapter_pages(built_book):
        assert page.is_file(), page


def test_math_and_scripts_are_served_from_the_build_not_a_cdn(built_book):
    assert (built_book / "_static" / "mathjax" / "tex-chtml.js").is_file()
    for page in [built_book / "intro.html", *chapter_pages(built_book)]:
        text = page.read_text()
        assert "_static/mathjax/tex-chtml.js" in text, page
        assert not CDN.findall(text), (page, CDN.findall(text))
        assert "require.min.js" not in text and "embed-amd.js" not in text


def test_chapter_pages_carry_claims_knobs_and_launch_buttons(built_book):
    for page in chapter_pages(built_book):
        text = page.read_text()
        slug = page.stem
        assert 'class="pn-claims"' in text and "FAILS" not in text
        assert 'class="pn-knobs"' in text
        assert "application/vnd.jupyter.widget-view+json" not in text
        assert "colab.research.google.com/github/" in text and f"chapters/{slug}.ipynb" in text
        assert f"_sources/chapters/{slug}.ipynb" in text  # the .ipynb download


def test_each_executed_chapter_records_its_claims_and_run_time(built_book):
    for page in chapter_pages(built_book):
        record = json.loads((built_book.parent / "records" / f"{page.stem}.json").read_text())
        assert record["chapter"] == page.stem
        assert record["all_hold"] is True
        assert record["claims"] and all(c["holds"] for c in record["claims"])
        assert 0 < record["seconds"] < 600


def test_progress_bars_stay_off_the_pages(built_book):
    for page in chapter_pages(built_book):
        assert not re.search(r"\d+it/s|it/s\]", page.read_text())
