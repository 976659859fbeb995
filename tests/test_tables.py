"""The shared table: the same digits as HTML and as text."""

import pytest

import papernotes as pn


def test_a_table_formats_numbers_once_for_both_views():
    table = pn.Table(
        ["model", "accuracy"],
        [["BN", 0.97654], ["no <BN>", None]],
        formats={"accuracy": ".3f"},
        title="final",
    )
    text = repr(table)
    assert text.splitlines() == [
        "final",
        "model    accuracy",
        "-------  --------",
        "BN       0.977",
        "no <BN>  —",
    ]
    html = table._repr_html_()
    assert "<caption>final</caption>" in html and '<td data-label="accuracy">0.977</td>' in html
    assert "no &lt;BN&gt;" in html and html.count("<tr>") == 3


def test_rows_must_fit_the_columns_and_formats_name_columns():
    with pytest.raises(ValueError, match="row 1 has 1 cells; the table has 2 columns"):
        pn.Table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="unknown column"):
        pn.Table(["a"], [[1]], formats={"b": ".2f"})
