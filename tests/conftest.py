"""Test settings: the book's tools importable, torch on one thread as in the chapters, and the
strict book build that the tests marked `book` share."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def built_book() -> Path:
    """Build the book once per session, strictly (warnings are errors), executing every chapter.

    Returns the HTML folder. Only the tests marked `book` ask for it.
    """
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", "--all", "-W", "-n"]
    command += ["--keep-going", str(ROOT)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"the strict book build failed:\n{(result.stdout + result.stderr)[-6000:]}")
    return ROOT / "_build" / "html"
