"""Test settings: the book's tools importable, torch on one thread as in the chapters, and the
strict book build that the tests marked `book` share."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# A chapter written for tests/test_new_chapter.py, which copies it into a temporary clone: here
# its module does not exist, so neither nbval nor pytest may collect it. The cells of
# fixtures/portable/ are outputs to read (tests/test_portable.py), not a notebook to run.
collect_ignore_glob = ["fixtures/new_chapter/*", "fixtures/portable/*"]
sys.path.insert(0, str(ROOT / "tools"))
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Build the book once per session, strictly (warnings are errors), from the committed
    outputs: the test command has just executed every chapter under nbval, which checked those
    outputs against a fresh run, so the build does not execute them a second time.

    Returns the HTML folder. Only the tests marked `book` ask for it.
    """
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", "--all", "-W", "-n"]
    command += ["--keep-going", str(ROOT)]
    environment = {**os.environ, "PAPERNOTES_EXECUTE": "off"}
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=False, env=environment
    )
    if result.returncode != 0:
        pytest.fail(f"the strict book build failed:\n{(result.stdout + result.stderr)[-6000:]}")
    return ROOT / "_build" / "html"


# -- helpers the unit tests share (import them: `from conftest import gen, randn`) ---------------


def gen(seed: int = 0) -> torch.Generator:
    """A fresh generator, so that a test's random data does not depend on test order."""
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int = 0, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """Gaussian float64 test data: shift + scale * N(0, 1), from its own seed."""
    return shift + scale * torch.randn(*shape, generator=gen(seed), dtype=torch.float64)
