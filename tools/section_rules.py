"""Section rules, the house style's `# -- what follows ---...` comment lines, padded for you.

    .venv/bin/python tools/section_rules.py [FILE ...]          # make rules: pad them in place
    .venv/bin/python tools/section_rules.py --check [FILE ...]  # list the rules that are off

A rule is a comment line that starts `# -- ` and ends in a run of dashes; its dashes run to
column RULE_END (ruff's line limit), whatever the indentation and the title, so that nobody pads
one by hand and ruff's line limit never fires on one. A title too long to leave four dashes is
reported, not cut. Without FILE: every Python file of papernotes/, tools/ and tests/.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book

RULE_END = 100
MIN_DASHES = 4
RULE = re.compile(r"^(?P<indent> *)# -- (?P<title>.*?) ?-{2,}$")


def padded(line: str) -> str | None:
    """The rule `line` padded to RULE_END, or None if it is no rule or its title is too long."""
    match = RULE.match(line)
    if match is None:
        return None
    head = f"{match['indent']}# -- {match['title']} "
    dashes = RULE_END - len(head)
    return head + "-" * dashes if dashes >= MIN_DASHES else None


def fix(path: Path, check: bool) -> list[str]:
    """Pad the rules of one file (or, with `check`, only say which are off)."""
    lines = path.read_text().split("\n")
    problems, changed = [], False
    for i, line in enumerate(lines):
        if not RULE.match(line):
            continue
        wanted = padded(line)
        if wanted is None:
            problems.append(f"{path}:{i + 1}: the title leaves no room for {MIN_DASHES} dashes")
        elif wanted != line:
            problems.append(f"{path}:{i + 1}: the rule ends at column {len(line)}, not {RULE_END}")
            lines[i], changed = wanted, True
    if changed and not check:
        path.write_text("\n".join(lines))
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="say which rules are off; change none")
    args = parser.parse_args(argv)
    files = args.files or [
        p for folder in ("papernotes", "tools", "tests") for p in (book.ROOT / folder).rglob("*.py")
    ]
    problems = [p for path in files for p in fix(path, args.check)]
    for line in problems:
        print(line)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
