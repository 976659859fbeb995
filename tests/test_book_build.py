"""The strict HTML build, and what its pages must hold (run by `make test` as `pytest -m book`)."""

import json
import os
import re
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

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
    assert (built_book / "scoreboard.html").is_file()
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


@pytest.fixture
def every_record(built_book):
    """The whole-book tests need every chapter's claims record, written when nbval ran it. In
    the per-chapter loop (one chapter's nbval, then the build) the others' are absent: skip,
    except under CI, where the test command runs every chapter first."""
    missing = [
        page.stem
        for page in chapter_pages(built_book)
        if not (built_book.parent / "records" / f"{page.stem}.json").exists()
    ]
    if missing:
        message = f"no claims record for {', '.join(missing)}: run nbval on every chapter first"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.usefixtures("every_record")
def test_each_executed_chapter_records_its_claims_and_run_time(built_book):
    for page in chapter_pages(built_book):
        record = json.loads((built_book.parent / "records" / f"{page.stem}.json").read_text())
        assert record["chapter"] == page.stem
        assert record["all_hold"] is True
        assert len(record["claims"]) >= 2
        assert all(c["holds"] for c in record["claims"] if c["must_hold"])
        assert 0 < record["seconds"] < 600


def test_progress_bars_stay_off_the_pages(built_book):
    for page in chapter_pages(built_book):
        assert not re.search(r"\d+it/s|it/s\]", page.read_text())


class _Links(HTMLParser):
    """The hrefs and srcs of a page, and the ids (and names) that anchors can point to."""

    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])


def parse(page):
    parser = _Links()
    parser.feed(page.read_text())
    return parser


def test_every_internal_link_and_anchor_resolves(built_book):
    # External links cannot be checked offline (no Sphinx linkcheck here); they are skipped.
    pages = {
        page: parse(page)
        for page in built_book.rglob("*.html")
        if page.relative_to(built_book).parts[0]
        not in ("_static", "_sources")  # templates, not pages
    }
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue  # http(s), mailto, data, javascript: not ours to resolve here
            path, fragment = unquote(parts.path), unquote(parts.fragment)
            target = (page.parent / path).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(built_book)}: {link}")
            elif fragment and target.suffix == ".html":
                ids = (pages.get(target) or parse(target)).ids
                if fragment not in ids:
                    broken.append(f"{page.relative_to(built_book)}: {link} (no such anchor)")
    assert not broken, "\n".join(broken[:40])


@pytest.mark.usefixtures("every_record")
def test_the_scoreboard_is_built_from_this_builds_records(built_book):
    text = (built_book / "scoreboard.html").read_text()
    pages = chapter_pages(built_book)
    claims = 0
    for page in pages:
        record = json.loads((built_book.parent / "records" / f"{page.stem}.json").read_text())
        claims += len(record["claims"])
        assert f'href="chapters/{page.stem}.html"' in text
    assert f"{len(pages)} of {len(pages)} chapters checked." in text
    assert "checks of the book" in text  # Sphinx curls the apostrophe
    # the overview: a header and a row per chapter; each chapter: a header and a row per claim
    assert text.count("<tr") == (1 + len(pages)) + claims + len(pages)
