"""What the book's tools and tests need to know about the book: its chapters, its repository,
and the setup cell that opens every chapter.

The setup cell is the same in every chapter and is written from one template here, with the
repository URL read from _config.yml (the one place that names it). tools/refresh.py stamps it
into each chapter; tests/test_book.py checks that every chapter carries it unchanged.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

SETUP_CELL = """\
# Setup, the same in every chapter. In Colab it first installs the book's package, papernotes.
import subprocess
import sys

if "google.colab" in sys.modules:
    url = "{url}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{{url}}"], check=True)

import papernotes as pn

pn.setup()  # one seed, one thread, deterministic algorithms, the book's plot style"""


def config(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text())


def repository_url(root: Path = ROOT) -> str:
    return config(root)["repository"]["url"]


def setup_cell_source(root: Path = ROOT) -> str:
    return SETUP_CELL.format(url=repository_url(root))


def toc_chapters(root: Path = ROOT) -> list[Path]:
    """The chapter notebooks listed in _toc.yml, in book order (pages such as the scoreboard
    are listed there too, but are not chapters)."""
    return [root / f"{f}.ipynb" for f in toc_files(root) if f.startswith("chapters/")]


def toc_files(root: Path = ROOT) -> list[str]:
    """Every page of _toc.yml (its root first), without suffix."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [c["file"] for part in toc.get("parts", []) for c in part.get("chapters", [])]
    return [toc["root"], *files]


def chapter_files(root: Path = ROOT) -> list[Path]:
    """Every chapter notebook on disk."""
    return sorted((root / "chapters").glob("*.ipynb"))
