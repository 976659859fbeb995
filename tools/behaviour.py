"""What a chapter's results depend on, hashed so that only a change in behaviour changes the hash.

A chapter's seeds and mutants results (tests/seeds_and_mutants.json), its cached execution in
the book build (tools/execute.py) and its committed outputs are stale exactly when one of these
changed:

- its code cells;
- the code of any `papernotes` module it imports, directly or through other modules (the
  package's `__init__` and what it imports count for every chapter, since the setup cell
  imports `papernotes`);
- its broken mechanisms, tests/mutants/<slug>.py.

"Code" means the syntax tree without docstrings and comments: rewording a docstring, adding a
comment or reformatting leaves every hash as it was; changing a line of `batch_norm.py` changes
the hash of every chapter that imports it (recurrent_batch_norm does).
"""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

PACKAGE = "papernotes"


def code_of(source: str) -> str:
    """The syntax tree of Python source without docstrings, as text (comments never reach it).
    Source that does not parse (an IPython magic, say) counts as it is written."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False)


def module_path(name: str, root: Path = book.ROOT) -> Path | None:
    """The file of module `name` (papernotes or papernotes.x or papernotes.x.y), if it is ours."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, importer: str = "", is_package: bool = False) -> set[str]:
    """The names of our modules that `source` imports (absolute and relative imports, and
    `from papernotes import x` where x is a module)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = importer if is_package else importer.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        # `import papernotes.x.y` loads papernotes and papernotes.x too
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {n for n in found if n.split(".")[0] == PACKAGE}


def dependencies(chapter: Path, root: Path = book.ROOT) -> list[Path]:
    """Every papernotes file the chapter's code imports, directly or through other modules."""
    nb = nbformat.read(chapter, as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    pending = [*imported_modules(source), PACKAGE]
    seen: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        if name in seen or (path := module_path(name, root)) is None:
            continue
        seen[name] = path
        module = _module_name(path, root)
        pending += imported_modules(path.read_text(), module, path.name == "__init__.py")
    return sorted(set(seen.values()))


def behaviour_hash(chapter: Path, root: Path = book.ROOT) -> str:
    """A hash of the chapter's code cells, the code of every module it imports and its mutants."""
    nb = nbformat.read(chapter, as_version=4)
    digest = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(b"cell\0" + code_of(cell.source).encode())
    files = dependencies(chapter, root)
    mutants = root / "tests" / "mutants" / f"{chapter.stem}.py"
    if mutants.is_file():
        files.append(mutants)
    for path in files:
        digest.update(f"\0{path.relative_to(root).as_posix()}\0".encode())
        digest.update(code_of(path.read_text()).encode())
    return digest.hexdigest()[:16]
