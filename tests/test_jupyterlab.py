"""Live knobs in a real client: JupyterLab runs a notebook with a knob panel, a slider moves, and
the kernel redraws the figure (run by `make test` with the book's browser checks).

JupyterLab comes from the project's venv and listens on loopback only, without a token; it runs
as root too (--allow-root), as in containers. The notebook is a small fixture, so the test is
quick; the chapters' panels are the same code.
"""

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from test_browser import CHROMIUM_FLAGS, chromium_path

pytestmark = pytest.mark.book

FIXTURE = Path(__file__).parent / "fixtures" / "knob_panel.ipynb"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    shutil.copy(FIXTURE, folder / FIXTURE.name)
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "jupyter"),
        "lab",
        "--allow-root",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={folder}",
        f"--LabApp.workspaces_dir={folder / 'workspaces'}",
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/api/status", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not start within 60 s")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_slider_in_jupyterlab_makes_the_kernel_redraw(lab):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        outside = []

        def route(request_route):
            if request_route.request.url.startswith(lab) or request_route.request.url.startswith(
                ("data:", "ws://127.0.0.1", "blob:")
            ):
                request_route.continue_()
            else:
                outside.append(request_route.request.url)
                request_route.abort()

        page.route("**/*", route)
        page.goto(f"{lab}/lab/tree/{FIXTURE.name}")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        select_kernel = page.locator(".jp-Dialog button", has_text="Select")
        try:  # JupyterLab asks when the notebook's kernel name is not an exact match
            select_kernel.click(timeout=10_000)
        except Exception:
            pass
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()

        handle = page.locator(".widget-slider .noUi-handle").first
        try:
            handle.wait_for(timeout=180_000)  # a kernel start and a torch import on a busy CPU
        except Exception:
            page.screenshot(path=str(Path(__file__).parent.parent / "_build" / "jupyterlab.png"))
            raise
        label = page.locator(".widget-slider .widget-label").first
        assert label.inner_text() == "slope of the line"  # the whole label, not "slope of..."
        image = page.locator(".widget-output img").first
        image.wait_for(timeout=30_000)
        before = image.get_attribute("src")
        handle.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "before => { const i = document.querySelector('.widget-output img');"
            " return i && i.getAttribute('src') !== before; }",
            arg=before,
            timeout=30_000,
        )
        assert page.locator(".widget-readout").first.inner_text() == "1"
        browser.close()
    assert outside == []
