"""A small table that shows as HTML in a notebook and a page, and as aligned text elsewhere.

    pn.Table(["model", "accuracy"], [["BN", 0.97], ["no BN", 0.94]], formats={"accuracy": ".3f"})

The last expression of a cell: Jupyter and the HTML book show `_repr_html_`, a terminal and
nbval's text comparison `__repr__`. Numbers are formatted once, by column, so both views print
the same digits, and a number that rounds to zero prints without a sign (`+.4f` of -1e-9 is
`0.0000`), so that no CPU's last rounding decides it.
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Mapping, Sequence


class Table:
    """Rows of cells under named columns; `formats` maps a column to a format spec."""

    def __init__(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence],
        *,
        formats: Mapping[str, str] | None = None,
        title: str = "",
        css_class: str = "pn-table",
        measured: Sequence[str] = (),
    ):
        self.columns = [str(c) for c in columns]
        formats = dict(formats or {})
        unknown = sorted(set(formats) - set(self.columns))
        if unknown:
            raise ValueError(f"formats name unknown column(s) {unknown}; columns: {self.columns}")
        for i, row in enumerate(rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"row {i} has {len(row)} cells; the table has {len(self.columns)} columns"
                )
        self.cells = [
            [
                _format(cell, formats.get(column, ""))
                for column, cell in zip(columns, row, strict=True)
            ]
            for row in rows
        ]
        self.title = title
        self.css_class = css_class
        # Columns of numbers measured by training: their cells are marked so that a comparison
        # across machines can mask them (tests/nbval_sanitize_lax.cfg).
        unknown = sorted(set(measured) - set(self.columns))
        if unknown:
            raise ValueError(f"measured names unknown column(s) {unknown}; columns: {self.columns}")
        self.measured = {self.columns.index(c) for c in measured}

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(self._td(i, cell) for i, cell in enumerate(row)) + "</tr>"
            for row in self.cells
        )
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return (
            f'<table class="{self.css_class}">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )

    def _td(self, column: int, cell: str) -> str:
        # The column's name rides on each cell, so that a narrow screen can stack a row's cells
        # under their names (tools/static/papernotes.css) instead of scrolling sideways.
        marker = ' class="pn-measured"' if column in self.measured else ""
        label = html.escape(self.columns[column], quote=True)
        return f'<td{marker} data-label="{label}">{html.escape(cell)}</td>'

    def __repr__(self) -> str:
        widths = [
            max(len(text) for text in [column, *(row[i] for row in self.cells)])
            for i, column in enumerate(self.columns)
        ]

        def line(cells):
            return "  ".join(
                cell.ljust(width) for cell, width in zip(list(cells), widths, strict=True)
            ).rstrip()

        lines = [self.title] if self.title else []
        lines += [line(self.columns), line("-" * w for w in widths)]
        lines += [line(row) for row in self.cells]
        return "\n".join(lines)


def _format(cell, spec: str) -> str:
    if cell is None:
        return "—"
    if spec and isinstance(cell, numbers.Number) and not isinstance(cell, bool):
        return unsigned_zero(format(cell, spec))
    return str(cell)


def unsigned_zero(text: str) -> str:
    """A number that rounds to zero, without its sign: whether -0.0000 or +0.0000 is printed
    depends on the last rounding of a value that is 0 in theory, which differs from CPU to CPU."""
    if text[:1] in "+-" and not any(d in "123456789" for d in text.split("e")[0]):
        return text[1:]
    return text
