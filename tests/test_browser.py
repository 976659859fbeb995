"""The built book in headless Chromium with the network blocked: math renders, knobs move.

Debian's Chromium (installed by `make test`) is driven by playwright-python; every request that
does not go to the local server is blocked and recorded, and the tests assert there were none.
"""

import functools
import http.server
import shutil
import threading

import book
import pytest
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
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.fail("Chromium is not installed: `make test` installs Debian's chromium package")


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
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()


def chapter_urls(server):
    pages = [p.relative_to(book.ROOT).with_suffix(".html").as_posix() for p in book.toc_chapters()]
    return [f"{server}/{page}" for page in pages]


def test_math_renders_offline(offline_page, server):
    for url in [f"{server}/intro.html", *chapter_urls(server)]:
        offline_page.goto(url)
        if "intro" in url:
            continue  # the landing page has no math
        # Attached, not necessarily visible: the first formula may sit in a collapsed block.
        offline_page.wait_for_selector("mjx-container", state="attached", timeout=20_000)
        rendered = offline_page.locator("mjx-container").count()
        raw = offline_page.locator("div.math:not(:has(mjx-container))").count()
        assert rendered > 5 and raw == 0, (url, rendered, raw)
    assert offline_page.blocked == []
    assert offline_page.errors == []


def test_knob_sliders_swap_the_figure_offline(offline_page, server):
    for url in chapter_urls(server):
        offline_page.goto(url)
        panel = offline_page.locator(".pn-knobs").first
        panel.wait_for()
        assert "pn-knobs-ready" in panel.get_attribute("class")
        image = panel.locator("img.pn-knob-frame")
        before = image.get_attribute("src")

        slider = panel.locator('input[type="range"]').first
        readout = panel.locator("output").first
        label_before = readout.inner_text()
        # Move to the next position (wrapping): the default may sit at either end.
        slider.evaluate(
            "el => { el.value = String((Number(el.value) + 1) % (Number(el.max) + 1));"
            " el.dispatchEvent(new Event('input')); }"
        )
        assert image.get_attribute("src") != before
        assert readout.inner_text() != label_before

        checkbox = panel.locator('input[type="checkbox"]')
        if checkbox.count():
            moved = image.get_attribute("src")
            checkbox.first.click()
            assert image.get_attribute("src") != moved
        offline_page.screenshot(path=str(book.ROOT / "_build" / f"{url.rsplit('/', 1)[-1]}.png"))
    assert offline_page.blocked == []
    assert offline_page.errors == []
