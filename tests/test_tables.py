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


def test_a_number_that_rounds_to_zero_prints_without_a_sign():
    # the fixed point's mean of the SELU chapter is 0 in theory: one CPU's last rounding printed
    # -0.0000 and another's +0.0000, so neither sign may show
    plain = pn.Table(
        ["mean", "e"],
        [[-1e-9, -1e-20], [1e-9, 0.0], [-0.00051, -2.5e-3]],
        formats={"mean": "+.4f", "e": "+.1e"},
    )
    assert [row[0] for row in plain.cells] == ["0.0000", "0.0000", "-0.0005"]
    assert [row[1] for row in plain.cells] == ["-1.0e-20", "0.0e+00", "-2.5e-03"]
