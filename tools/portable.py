"""Which of a chapter's outputs hold on any CPU? Find them, and tag them `nbval-check-output`.

    .venv/bin/python tools/portable.py                          # every chapter (make portable)
    .venv/bin/python tools/portable.py chapters/concrete.ipynb
    .venv/bin/python tools/portable.py --report                 # say, change nothing

On another machine nbval compares only a chapter's cells tagged `nbval-check-output`
(conftest.py). A cell earns the tag in two ways at once:

1. **By construction** (`fragile_numbers`): what it prints cannot flip on another CPU. It shows
   no signed zero (`-0.0000`, `+0.000`, `+0%`: a quantity whose true value is 0 prints with
   either sign, whichever way the last rounding fell) and no value at floating-point rounding
   level (`5.8e-17`, `0.0e+00`, any nonzero number below 1e-6 written out: an exact identity's
   miss is printed against its bound, "below 1e-12", never as the float it happened to be). A
   bound written with one significant digit (`1e-12`) is a constant and passes.
2. **By experiment**: it reads the same in two more runs beside its committed outputs. One runs
   on *another arithmetic* (`OTHER_ARITHMETIC`): torch's plain vector kernels
   (ATEN_CPU_CAPABILITY=default), MKL's and OpenBLAS's most compatible code paths (other
   blockings, so matrix products sum in another order), NumPy's baseline loops and glibc's
   routines without AVX and FMA: every library that picks its routines by the processor's
   features picks others, so every rounding-level result moves and a printed digit that sits on
   a rounding edge shows it. The other runs under another seed (a different training run). A cell
   whose outputs, as nbval compares them (after both sanitize files), read the same in all three
   does not depend on floating-point training: text, data-set sizes, constants, exact math
   printed against its bounds, the claims' verdicts.

Sampling kernels on one machine cannot show what another CPU prints (an Intel AVX-512 machine's
math library rounds in places no setting here reproduces), so (1) is a rule, not a sample: a
cell that would be tagged but prints a fragile number is refused, and the tool fails naming the
cell and the number, so that its print is fixed, never its tag dropped silently.

The claims cell is compared with the other arithmetic's run only (its measured columns masked):
its verdicts must not move with the CPU, though a claim may fail under another seed (the seed
runs go on past a failing cell). A chapter must keep at least two tagged cells besides it.

Run it after `make refresh` whenever a chapter's outputs changed, and commit the tags.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import book
import kernels

CHECK_TAG = "nbval-check-output"
IGNORE_TAG = "nbval-ignore-output"
SANITIZE_FILES = (
    book.ROOT / "tests" / "nbval_sanitize.cfg",
    book.ROOT / "tests" / "nbval_sanitize_lax.cfg",
)
# What nbval leaves out of a comparison (its IPyNbFile.skip_compare).
NOT_COMPARED = {"image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json"}
# Another CPU's arithmetic, as far as one machine can show it: each library that dispatches on
# the processor's features is sent down another path (names a library does not know are ignored,
# so the same set serves x86 and ARM, and NumPy 1.x and 2.x).
OTHER_ARITHMETIC = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's plain vector kernels (its RNG's too)
    "MKL_CBWR": "COMPATIBLE",  # torch's BLAS: MKL's SSE2 path, another blocking
    "OPENBLAS_CORETYPE": "Prescott",  # NumPy's and SciPy's BLAS: the oldest x86 kernels
    "NPY_DISABLE_CPU_FEATURES": (  # NumPy's ufuncs: the baseline loops
        "X86_V3 X86_V4 AVX512_ICL AVX512_SPR AVX2 FMA3 AVX512F AVX512_SKX AVX512_CLX "
        "AVX512_CNL AVX512_KNL AVX512_KNM ASIMDHP ASIMDDP ASIMDFHM SVE"
    ),
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX",  # libm's routines without FMA
}
VARIANTS = {
    "other-arithmetic": (OTHER_ARITHMETIC, 0),
    "seed-1": ({}, 1),
}
# A signed zero: -0, +0.000, -0.0e+00, +0% (not part of a longer number such as 10 or 0.05).
SIGNED_ZERO = re.compile(r"(?<![\w.])[-+−]0(?:\.0+)?(?:[eE][-+]?\d+)?(?![\d.])")
SCIENTIFIC = re.compile(r"(?<![\w.])[-+−]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\d.])")
SMALL_DECIMAL = re.compile(r"(?<![\w.])[-+−]?0\.0{6,}[1-9]\d*")
ROUNDING_LEVEL = 1e-6
SAVED = book.ROOT / "_build" / "portable"  # each run, to read or diff: <slug>.<variant>.ipynb
MIN_CHECKED = 2  # cells compared elsewhere besides the claims cell
CHECK_CALL = "claims.check()"


def _patterns() -> list[tuple[str, str]]:
    from nbval.plugin import get_sanitize_patterns

    return [p for path in SANITIZE_FILES for p in get_sanitize_patterns(path.read_text())]


def compared_view(cell, patterns) -> tuple:
    """A code cell's outputs as nbval compares them: streams joined by name, rich outputs by
    MIME type without images and widget views, every text sanitized."""

    def clean(text) -> str:
        text = "".join(text) if isinstance(text, list) else str(text)
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    streams: dict[str, str] = {}
    rich = []
    for output in cell.get("outputs", []):
        kind = output["output_type"]
        if kind == "stream":
            streams[output["name"]] = streams.get(output["name"], "") + clean(output["text"])
        elif kind in ("display_data", "execute_result"):
            data = output.get("data", {})
            shown = {k: clean(v) for k, v in data.items() if k not in NOT_COMPARED}
            rich.append(tuple(sorted(shown.items())))
        elif kind == "error":
            rich.append(("error", output.get("ename", "")))
    return tuple(sorted(streams.items())), tuple(rich)


def run_variant(path: Path, environment: dict, seed: int) -> str:
    """The chapter executed under one variant, as notebook text (plain text crosses processes)."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as records:
        # Under another seed a claim may fail (claims must hold on 4 of 5 seeds): the cells
        # after it still run, so that every cell can be compared.
        kernels.execute(
            nb, path, seed=seed, record_dir=records, environment=environment, allow_errors=True
        )
    return nbformat.writes(nb)


def code_cells(text: str) -> list:
    return [c for c in nbformat.reads(text, as_version=4).cells if c.cell_type == "code"]


def fragile_numbers(text: str) -> list[str]:
    """The numbers in `text` that another CPU's rounding can flip: signed zeros, and values at
    rounding level (below 1e-6 in size, zero written in scientific notation, or a small value
    with two or more significant digits; a one-digit constant such as 1e-12 is a bound)."""
    found = [m.group() for m in SIGNED_ZERO.finditer(text)]
    for m in SCIENTIFIC.finditer(text):
        mantissa, _, _ = m.group().lstrip("+-−").partition("e" if "e" in m.group() else "E")
        value = float(m.group().replace("−", "-"))
        significant = len(mantissa.replace(".", "").lstrip("0"))
        if value == 0 or (abs(value) < ROUNDING_LEVEL and significant >= 2):
            found.append(m.group())
    found += [m.group() for m in SMALL_DECIMAL.finditer(text)]
    return found


def view_text(view: tuple) -> str:
    streams, rich = view
    return "\n".join([text for _, text in streams] + [str(v) for item in rich for v in item])


def portable_cells(committed: list, variants: list[list], patterns) -> list[bool]:
    """Per code cell: does it show something to compare, the same in every run? The claims
    cell is compared with the other CPU's run alone: its verdicts may differ under another
    seed, they must not under another CPU."""
    flags = []
    for i, cell in enumerate(committed):
        view = compared_view(cell, patterns)
        shows = any(part for part in view)
        runs = variants[:1] if CHECK_CALL in cell.source else variants
        same = all(compared_view(run[i], patterns) == view for run in runs)
        ignored = IGNORE_TAG in cell.metadata.get("tags", [])
        flags.append(shows and same and not ignored)
    return flags


def refused(committed: list, flags: list[bool], patterns) -> list[tuple[int, str]]:
    """The cells that would be tagged but print a number another CPU can flip (the rule)."""
    found = []
    for i, (cell, flag) in enumerate(zip(committed, flags, strict=True)):
        numbers = fragile_numbers(view_text(compared_view(cell, patterns))) if flag else []
        if numbers:
            found.append(
                (
                    i,
                    f"holds here but prints {', '.join(dict.fromkeys(numbers))}: a signed zero or "
                    "a value at rounding level, which another CPU can flip; print it against its "
                    'bound ("below 1e-12") or without the sign',
                )
            )
    return found


def retag(path: Path, flags: list[bool]) -> bool:
    """Set the check tag on exactly the flagged code cells; True when the file changed."""
    text = path.read_text()
    nb = nbformat.reads(text, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell, flag in zip(code, flags, strict=True):
        tags = [t for t in cell.metadata.get("tags", []) if t != CHECK_TAG]
        if flag:
            tags.append(CHECK_TAG)
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
    new = nbformat.writes(nb) + "\n"
    if new != text:
        path.write_text(new)
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="notebooks (default: the book)")
    parser.add_argument("--report", action="store_true", help="report only; change no file")
    args = parser.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters] or book.toc_chapters()
    jobs = [(path, env, seed) for path in chapters for env, seed in VARIANTS.values()]
    names = [name for _ in chapters for name in VARIANTS]
    SAVED.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs: dict[Path, list] = {}
    with ProcessPoolExecutor(max_workers=kernels.jobs()) as pool:
        futures = [pool.submit(run_variant, *job) for job in jobs]
        for done, (job, name, future) in enumerate(zip(jobs, names, futures, strict=True), 1):
            text = future.result()
            (SAVED / f"{job[0].stem}.{name}.ipynb").write_text(text)
            runs.setdefault(job[0], []).append(code_cells(text))
            kernels.progress(done, len(jobs), start, f"{job[0].stem}: {name}")
    patterns, ok = _patterns(), True
    for path in chapters:
        committed = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        flags = portable_cells(committed, runs[path], patterns)
        for i, problem in refused(committed, flags, patterns):
            print(f"  {path.stem}: code cell {i} {problem}")
            flags[i], ok = False, False
        checked = [i for i, flag in enumerate(flags) if flag]
        varying = [i for i, c in enumerate(committed) if c.outputs and not flags[i]]
        changed = False if args.report else retag(path, flags)
        print(
            f"{path.stem}: {len(checked)} of {len(committed)} code cells hold on any CPU "
            f"(cells {checked}); {len(varying)} vary (cells {varying})"
            + ("; tags written" if changed else "")
        )
        besides_claims = [i for i in checked if CHECK_CALL not in committed[i].source]
        if len(besides_claims) < MIN_CHECKED:
            print(
                f"  {path.stem}: fewer than {MIN_CHECKED} cells besides the claims to compare "
                "elsewhere: print something that holds on any CPU (a data set's size, a constant, "
                "exact math against its bound)"
            )
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
