"""`make portable` tags only what no CPU's rounding can move (tools/portable.py): by
construction (no signed zero, no value at rounding level) and by experiment (the same on another
arithmetic and under another seed)."""

import nbformat
import portable
import pytest

from conftest import ROOT

SELU_CELLS = ROOT / "tests" / "fixtures" / "portable" / "selu_a3375bf.ipynb"


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("largest miss of (0, 1): SELU 5.8e-17 (bound 2.2e-13)", ["5.8e-17", "2.2e-13"]),
        ("largest miss of (0, 1): SELU 0.0e+00", ["0.0e+00"]),
        ("1.0507       +0.0000                 1.0000", ["+0.0000"]),
        ("mean -0.000 and a margin of +0%", ["-0.000", "+0"]),
        ("a residual of 0.00000012", ["0.00000012"]),
        # what a CPU cannot flip: a one-digit bound, ordinary numbers, an unsigned zero
        ("SELU below 2e-13; constants 1.8e-05; 10, 0.05, -0.5, +0.3, 0.0000, x-0.0", []),
    ],
)
def test_fragile_numbers_are_signed_zeros_and_values_at_rounding_level(text, flagged):
    assert portable.fragile_numbers(text) == flagged


def test_the_rule_refuses_the_two_selu_cells_an_intel_machine_printed_otherwise():
    """The committed cells of chapters/selu.ipynb at a3375bf (the Theorem 1 print and the table
    of where the moment map settles), both tagged by three runs on one AMD machine: the rule
    refuses both, whatever those runs said."""
    cells = [c for c in nbformat.read(SELU_CELLS, as_version=4).cells if c.cell_type == "code"]
    assert all(portable.CHECK_TAG in c.metadata["tags"] for c in cells)
    refused = dict(portable.refused(cells, [True, True], portable._patterns()))
    assert sorted(refused) == [0, 1]
    assert "0.0e+00" in refused[0] and "2.2e-13" in refused[0] and "+0.0000" in refused[1]
    # a cell nobody would tag is not the rule's business
    assert portable.refused(cells, [False, False], portable._patterns()) == []


def test_another_arithmetic_sends_each_dispatching_library_down_another_path():
    """The perturbed run changes what each library that picks routines by CPU features picks:
    torch's kernels, both BLAS libraries, NumPy's loops, glibc's libm."""
    environment = portable.OTHER_ARITHMETIC
    assert environment["ATEN_CPU_CAPABILITY"] == "default"
    assert {"MKL_CBWR", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "GLIBC_TUNABLES"} <= set(
        environment
    )
    assert portable.VARIANTS["other-arithmetic"] == (environment, 0)


def test_a_cell_is_tagged_only_when_it_reads_the_same_in_every_run():
    def cell(text, source="print(x)"):
        return nbformat.v4.new_code_cell(
            source, outputs=[nbformat.v4.new_output("stream", name="stdout", text=text)]
        )

    committed = [cell("sizes 1000\n"), cell("loss 0.4312\n"), cell("verdicts", "claims.check()")]
    other_cpu = [cell("sizes 1000\n"), cell("loss 0.4313\n"), cell("verdicts", "claims.check()")]
    seed_1 = [cell("sizes 1000\n"), cell("loss 0.4490\n"), cell("other", "claims.check()")]
    flags = portable.portable_cells(committed, [other_cpu, seed_1], portable._patterns())
    # the claims cell is compared with the other CPU's run only: a claim may fail on a seed
    assert flags == [True, False, True]
