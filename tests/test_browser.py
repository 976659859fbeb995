"""The built book in headless Chromium with the network blocked: math renders, knobs move.

An installed Chromium (tests/browser_path.py; `make test` installs Debian's where apt-get exists)
is driven by playwright-python; every request that does not go to the local server is blocked
and recorded, and the tests assert there were none.
"""

import functools
import http.server
import os
import threading

import book
import pytest
from browser_path import HOW_TO, find_chromium
from playwright.sync_api import sync_playwright

pytestmark = pytest.mark.book

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """An installed Chromium (tests/browser_path.py); without one the browser tests skip, saying
    how to run them, except under CI, where they must run."""
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the browser checks: {HOW_TO}")
        pytest.skip(HOW_TO)
    return path


@pytest.fixture(scope="module")
def server(built_book):
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def offline_page(browser, server):
    """A page that may only talk to the local server; `page.blocked` lists what it tried."""
    context = browser.new_context()
    page = context.new_page()
    page.blocked = []

    def route(request_route):
        url = request_route.request.url
        if url.startswith(server) or url.startswith("data:"):
            request_route.continue_()
        else:
            page.blocked.append(url)
            request_route.abort()

    context.route("**/*", route)
    page.errors = []
    page.console_errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on(
        "console",
        lambda message: message.type == "error" and page.console_errors.append(message.text),
    )
    yield page
    context.close()


# The per-chapter loop (make check CHAPTERS=...) names its chapters here: the browser checks
# then visit their pages and the scoreboard only; the whole book's stay in `make test`.
PAGES_VARIABLE = "PAPERNOTES_PAGES"


def checked_chapters() -> list:
    """The chapters whose pages the checks visit: every chapter, or those the loop names."""
    only = os.environ.get(PAGES_VARIABLE, "").split()
    chapters = book.toc_chapters()
    unknown = sorted(set(only) - {p.stem for p in chapters})
    if unknown:
        raise ValueError(f"{PAGES_VARIABLE} names no chapter of _toc.yml: {unknown}")
    return [p for p in chapters if p.stem in only] if only else chapters


def chapter_urls(server):
    pages = [p.relative_to(book.ROOT).with_suffix(".html").as_posix() for p in checked_chapters()]
    return [f"{server}/{page}" for page in pages]


def every_url(server):
    if os.environ.get(PAGES_VARIABLE, "").split():
        return [*chapter_urls(server), f"{server}/scoreboard.html"]
    return [f"{server}/{page}.html" for page in book.toc_files()]


def test_every_page_loads_offline_without_errors(offline_page, server):
    for url in every_url(server):
        response = offline_page.goto(url)
        assert response.ok, url
        offline_page.wait_for_load_state("load")
        assert offline_page.blocked == [], url
        assert offline_page.errors == [], url
        assert offline_page.console_errors == [], url


def test_math_renders_offline(offline_page, server):
    for url in chapter_urls(server):
        offline_page.goto(url)
        # Attached, not necessarily visible: the first formula may sit in a collapsed block.
        offline_page.wait_for_selector("mjx-container", state="attached", timeout=20_000)
        rendered = offline_page.locator("mjx-container").count()
        raw = offline_page.locator("div.math:not(:has(mjx-container))").count()
        assert rendered > 5 and raw == 0, (url, rendered, raw)
    assert offline_page.blocked == []
    assert offline_page.errors == []


def test_each_chapter_shows_its_claims_table(offline_page, server):
    for url in chapter_urls(server):
        offline_page.goto(url)
        table = offline_page.locator("table.pn-claims").first
        assert table.is_visible(), url
        headers = table.locator("th").all_inner_texts()
        assert headers[:2] == ["claim", "status"] and "margin" in headers, (url, headers)
        assert table.locator("tbody tr").count() >= 2, url
        assert "FAILS" not in table.inner_text(), url


def test_the_scoreboard_links_every_chapter(offline_page, server, built_book):
    offline_page.goto(f"{server}/scoreboard.html")
    body = offline_page.locator("article").first.inner_text()
    assert "chapters checked." in body and "claims of the papers" in body
    for path in book.toc_chapters():
        link = offline_page.locator(f'a[href$="chapters/{path.stem}.html"]')
        assert link.count() >= 1, path.stem
    # the overview's table, then one a chapter executed in this build: in the per-chapter loop
    # (make check CHAPTERS=...) only that chapter has a record, and the others say they did not run
    records = built_book.parent / "records"
    executed = [p for p in book.toc_chapters() if (records / f"{p.stem}.json").exists()]
    assert offline_page.locator("article table").count() == 1 + len(executed)
    missing = len(book.toc_chapters()) - len(executed)
    assert body.count("has not been executed in this build") == missing


def test_every_static_knob_control_swaps_the_figure_offline(offline_page, server):
    for url in chapter_urls(server):
        offline_page.goto(url)
        panels = offline_page.locator(".pn-knobs")
        assert panels.count() >= 1, url
        for p in range(panels.count()):
            panel = panels.nth(p)
            assert "pn-knobs-ready" in panel.get_attribute("class"), url
            image = panel.locator("img.pn-knob-frame")
            controls = panel.locator("[data-knob-control]")
            for c in range(controls.count()):
                control = controls.nth(c)
                before = image.get_attribute("src")
                if control.get_attribute("type") == "checkbox":
                    control.click()
                else:
                    readout = panel.locator(f'[data-knob-readout="{c}"]')
                    label_before = readout.inner_text()
                    # The next position, wrapping: the default may sit at either end.
                    control.evaluate(
                        "el => { el.value = String((Number(el.value) + 1) % (Number(el.max) + 1));"
                        " el.dispatchEvent(new Event('input')); }"
                    )
                    assert readout.inner_text() != label_before, (url, p, c)
                assert image.get_attribute("src") != before, (url, p, c)
        page_name = url.rsplit("/", 1)[-1]
        offline_page.screenshot(path=str(book.ROOT / "_build" / f"{page_name}.png"))
    assert offline_page.blocked == []
    assert offline_page.errors == []


# -- the reader's book: tables that fit, the overview first, phones, accessibility ---------------

DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}
WIDE_TABLES = "table.pn-claims, table.pn-scoreboard, table.pn-overview"
# axe-core runs its rules as shipped, plus one it marks experimental that names a control by a
# label leaving out its visible text (the theme's search field and colour-mode button did).
AXE_OPTIONS = {"rules": {"label-content-name-mismatch": {"enabled": True}}}
SERIOUS = ("serious", "critical")
OVERVIEW_SCREENSHOT = "_static/scoreboard-overview.png"  # in the built book


@pytest.fixture
def sized_page(browser, server):
    """A page of the given viewport and colour scheme, offline like `offline_page`."""
    contexts = []

    def open_page(viewport, scheme="light"):
        context = browser.new_context(viewport=viewport, color_scheme=scheme)
        contexts.append(context)
        page = context.new_page()
        context.route(
            "**/*",
            lambda r: r.continue_() if r.request.url.startswith(server) else r.abort(),
        )
        return page

    yield open_page
    for context in contexts:
        context.close()


def overflowing_tables(page) -> list:
    """Tables wider than the text column they sit in (their scroll width, the column's)."""
    return page.evaluate(
        """(selector) => [...document.querySelectorAll(selector)].map(t => {
            const column = t.closest('article') || document.body;
            const style = getComputedStyle(column);
            const inner = column.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);
            return [t.className, Math.ceil(t.scrollWidth), Math.floor(inner)];
        }).filter(([, width, inner]) => width > inner + 1)""",
        WIDE_TABLES,
    )


def test_claim_and_scoreboard_tables_fit_the_column_and_phones_never_scroll_sideways(
    sized_page, server
):
    urls = [*chapter_urls(server), f"{server}/scoreboard.html"]
    desktop, phone = sized_page(DESKTOP), sized_page(PHONE)
    for url in urls:
        desktop.goto(url)
        assert desktop.locator(WIDE_TABLES).count() >= 1, url
        assert overflowing_tables(desktop) == [], url
        phone.goto(url)
        assert overflowing_tables(phone) == [], url
        sideways = phone.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert sideways <= 1, (url, sideways)


def test_the_scoreboard_opens_with_the_whole_book_on_one_screen(sized_page, server, built_book):
    page = sized_page(DESKTOP)
    page.goto(f"{server}/scoreboard.html")
    chart, table = page.locator("svg.pn-overview-chart"), page.locator("table.pn-overview")
    assert chart.count() == 1 and table.locator("tbody tr").count() == len(book.toc_chapters())
    top = page.evaluate("document.querySelector('svg.pn-overview-chart').getBoundingClientRect()")
    assert top["y"] + top["height"] <= DESKTOP["height"], top  # the whole picture above the fold
    first_row = table.locator("tbody tr").first.bounding_box()
    assert first_row["y"] < DESKTOP["height"], first_row
    # kept with the built book, for a reader (or a reviewer) to see what the overview looks like
    table.scroll_into_view_if_needed()
    page.locator("#the-book-at-a-glance").screenshot(path=str(built_book / OVERVIEW_SCREENSHOT))


def test_each_chapter_opens_with_its_paper_the_setup_cell_folded(sized_page, server):
    page = sized_page(DESKTOP)
    for url in chapter_urls(server):
        page.goto(url)
        first = page.locator("div.cell").first
        assert "tag_hide-cell" in first.get_attribute("class"), url
        assert not first.locator("pre").first.is_visible(), url  # its code is folded away
        # what the reader sees first is the title and the paper, not the Colab install
        title = page.locator("article h1").first.bounding_box()
        assert title is not None and title["y"] < first.bounding_box()["y"], url


def test_figures_of_several_panels_scroll_as_one_on_a_phone(sized_page, server):
    page = sized_page(PHONE)
    seen = 0
    for url in chapter_urls(server):
        page.goto(url)
        page.wait_for_load_state("load")
        wide = page.locator("img.pn-wide-figure")
        for i in range(wide.count()):
            image = wide.nth(i)
            if not image.is_visible():
                continue
            seen += 1
            width = image.evaluate("el => el.getBoundingClientRect().width")
            scrolls = image.evaluate(
                """el => { let c = el.parentElement;
                    while (c && !['auto', 'scroll'].includes(getComputedStyle(c).overflowX))
                        c = c.parentElement;
                    return [!!c && c.scrollWidth > c.clientWidth,
                            c && c.getAttribute('tabindex')]; }"""
            )
            assert width >= 560 and scrolls == [True, "0"], (url, i, width, scrolls)
    # a chapter alone may have none; the book has some
    assert seen > 0 or os.environ.get(PAGES_VARIABLE), "no figure of several panels on any chapter"


def axe_violations(page) -> list:
    from axe_playwright_python.sync_playwright import Axe

    result = Axe().run(page, options=AXE_OPTIONS)
    return [
        (v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
        for v in result.response["violations"]
        if v["impact"] in SERIOUS
    ]


def theme_sample(server) -> list:
    """The pages the dark theme and the phone layout are audited on: one of each template (the
    intro, the scoreboard, a chapter: the one the checks visit first). Both change only the
    theme's CSS, which every chapter page shares; what differs from chapter to chapter (its
    tables, knob panels, figures' texts, headings) is audited on every page in the light
    desktop pass, so the other two combinations found nothing more there and cost two thirds of
    the audit (issue 57: `make test` took 95 minutes, 40 of them browser checks)."""
    if os.environ.get(PAGES_VARIABLE, "").split():
        return every_url(server)  # the per-chapter loop: its pages and the scoreboard
    return [f"{server}/intro.html", f"{server}/scoreboard.html", chapter_urls(server)[0]]


@pytest.mark.parametrize(
    ("viewport", "scheme", "pages"),
    [
        (DESKTOP, "light", every_url),
        (DESKTOP, "dark", theme_sample),
        (PHONE, "light", theme_sample),
    ],
    ids=["desktop-every-page", "desktop-dark", "phone"],
)
def test_axe_finds_nothing_serious_or_critical_on_any_page(
    sized_page, server, viewport, scheme, pages
):
    page = sized_page(viewport, scheme)
    found = {}
    for url in pages(server):
        page.goto(url)
        page.wait_for_load_state("load")
        if scheme == "dark":  # the theme's own switch, as a reader would flip it
            page.evaluate("document.documentElement.dataset.theme = 'dark'")
            # the theme's colours ease in: audit the page the reader sees once they have, not a
            # frame of the transition (a half-faded search button failed contrast at random)
            page.evaluate("Promise.all(document.getAnimations().map(a => a.finished))")
        violations = axe_violations(page)
        if violations:
            found[url] = violations
    assert found == {}


def test_one_search_box(sized_page, server):
    for viewport in (DESKTOP, PHONE):
        page = sized_page(viewport)
        page.goto(f"{server}/intro.html")
        buttons = page.locator("button.search-button__button")
        visible = [i for i in range(buttons.count()) if buttons.nth(i).is_visible()]
        assert len(visible) == 1, (viewport, visible)


def test_the_per_chapter_loop_visits_its_pages_and_the_scoreboard_only(monkeypatch):
    """`make check CHAPTERS=chapters/jsma.ipynb` sets PAPERNOTES_PAGES=jsma: the checks visit
    that chapter's page and the scoreboard; `make test` sets nothing and visits every page."""
    makefile = (book.ROOT / "Makefile").read_text()
    assert 'PAPERNOTES_PAGES="$(SLUGS)" $(BIN)/python -m pytest -m book' in makefile
    monkeypatch.setenv(PAGES_VARIABLE, "jsma")
    assert every_url("s") == ["s/chapters/jsma.html", "s/scoreboard.html"]
    monkeypatch.setenv(PAGES_VARIABLE, "no_such_chapter")
    with pytest.raises(ValueError, match="names no chapter"):
        chapter_urls("s")
    monkeypatch.delenv(PAGES_VARIABLE)
    assert len(every_url("s")) == len(book.toc_files())
