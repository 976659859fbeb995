"""What the book's tools and tests need to know about the book: its chapters, its repository,
and the setup cell that opens every chapter.

The setup cell is the same in every chapter and is written from one template here, with the
repository URL read from _config.yml (the one place that names it). tools/refresh.py writes it
into each chapter; tests/test_book.py checks that every chapter carries it unchanged.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# The setup cell stays first in the notebook (Colab needs it) and is folded on the web page, so
# that a chapter's page opens with its paper and its idea.
SETUP_CELL_TAG = "hide-cell"

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


# -- what names the repository besides _config.yml: generated from it -----------------------------

README_BLOCK = (
    "<!-- repository links: written by `make links` from _config.yml -->",
    "<!-- end -->",
)

README_LINKS = """\
[![tests]({url}/actions/workflows/ci.yml/badge.svg)]({url}/actions/workflows/ci.yml)
[![book]({url}/actions/workflows/book.yml/badge.svg)]({pages})
[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{slug}/blob/{branch}/chapters/concrete.ipynb)

**Read the book:** {pages} (published from `{branch}` by `.github/workflows/book.yml`).
**Code:** {url}"""

CITATION = """\
# Written by `make links` from _config.yml (the repository's address lives there).
cff-version: 1.2.0
message: "If you use this book or its code, please cite it as below."
type: software
title: "papernotes: executable notes on machine-learning papers"
authors:
  - name: "The papernotes authors"
license:
  - MIT
  - CC-BY-4.0
repository-code: "{url}"
url: "{pages}"
keywords:
  - machine learning
  - reproducibility
  - jupyter-book
  - executable paper notes
"""


def repository_parts(root: Path = ROOT) -> dict[str, str]:
    """The repository's address and what follows from it: owner/name, branch, the Pages URL."""
    url = repository_url(root).rstrip("/")
    owner, name = url.removeprefix("https://github.com/").split("/")[:2]
    branch = config(root)["repository"].get("branch", "main")
    pages = f"https://{owner.lower()}.github.io/{name}/"
    return {"url": url, "slug": f"{owner}/{name}", "branch": branch, "pages": pages}


def readme_links(root: Path = ROOT) -> str:
    start, end = README_BLOCK
    return f"{start}\n{README_LINKS.format(**repository_parts(root))}\n{end}"


def citation(root: Path = ROOT) -> str:
    return CITATION.format(**repository_parts(root))


def write_links(root: Path = ROOT) -> None:
    """Write the README's links block and CITATION.cff from _config.yml's repository.url."""
    readme = (root / "README.md").read_text()
    start, end = README_BLOCK
    before, _, rest = readme.partition(start)
    _, _, after = rest.partition(end)
    (root / "README.md").write_text(before + readme_links(root) + after)
    (root / "CITATION.cff").write_text(citation(root))


if __name__ == "__main__":
    write_links()
