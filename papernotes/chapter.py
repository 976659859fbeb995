"""What the setup cell of every chapter does, and the chapter-wide settings it reads.

`setup()` makes a chapter reproducible and fast on a small CPU:

- one seed for Python, NumPy and torch, so two runs print the same numbers; the seed is 0 unless
  `PAPERNOTES_SEED` says otherwise (`make seeds` runs every chapter under seeds 0-4), and every
  run of the chapter derives its random streams from it (`papernotes.chapter_seed()`);
- torch pinned to one thread: on a 2-core machine small matmuls run up to 100x faster that way,
  and results are bit-identical run after run;
- deterministic algorithms on;
- the book's plot style, figures stored as small palette PNGs, and in Colab the widget manager
  that live knobs need;
- the chapter's clock, which the claims record reads at the end.
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np
import torch
import torch.utils.deterministic

from papernotes.plotting import apply_style

DEFAULT_SEED = 0
SEED_VARIABLE = "PAPERNOTES_SEED"
_QUIET_VARIABLES = ("PAPERNOTES_QUIET", "CI")
_started_at: float | None = None
_seed: int | None = None


def seed_everything(seed: int = DEFAULT_SEED) -> None:
    """Seed Python's, NumPy's and torch's global generators with one integer."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global generator is what readers' code uses
    torch.manual_seed(seed)


def pin_threads() -> None:
    """Run torch on one thread (see the module docstring for why)."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # can only be set before the first parallel op; a second setup() call lands here


def setup(seed: int | None = None) -> None:
    """The setup cell's work: determinism, one thread, one seed, plot style, start the clock.

    The seed is `seed` when given, else $PAPERNOTES_SEED, else 0.
    """
    global _started_at, _seed
    if seed is None:
        seed = _seed_from_environment()
    # cuBLAS needs this before its first call to be deterministic; harmless on a CPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every new tensor with NaN, in case code reads memory it never
    # wrote. Ours writes what it allocates, and the fills cost up to a quarter of a small
    # recurrent update on a 2-core CPU.
    torch.utils.deterministic.fill_uninitialized_memory = False
    pin_threads()
    seed_everything(seed)
    _seed = seed
    apply_style()
    _store_figures_as_palette_pngs()
    if in_colab():
        _enable_colab_widgets()
    _started_at = time.perf_counter()


def chapter_seed() -> int:
    """The chapter's seed: what `setup()` used (before it runs, what it would use)."""
    return _seed_from_environment() if _seed is None else _seed


def _seed_from_environment() -> int:
    text = os.environ.get(SEED_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SEED
    if not text.isdigit():
        raise ValueError(f"{SEED_VARIABLE} must be a non-negative integer; got {text!r}")
    return int(text)


def elapsed() -> float:
    """Seconds since `setup()` ran; raises if it has not."""
    if _started_at is None:
        raise RuntimeError(
            "papernotes.setup() has not run in this kernel; run the setup cell first"
        )
    return time.perf_counter() - _started_at


def quiet() -> bool:
    """True where nobody watches progress: under CI, nbval and the book build.

    The test command and the book build set PAPERNOTES_QUIET=1; CI services set CI=true.
    Progress bars stay off there so that committed outputs do not churn.
    """
    return any(
        os.environ.get(name, "").lower() not in ("", "0", "false") for name in _QUIET_VARIABLES
    )


def show_source(obj):
    """Show the source of a function or class from the package, as a code block."""
    import inspect

    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj)}```")


def in_colab() -> bool:
    return "google.colab" in sys.modules


def _store_figures_as_palette_pngs() -> None:
    """Inline figures as palette PNGs (a third of the size, the same look): in a kernel, the
    PNG formatter for matplotlib figures is replaced by `plotting.figure_png`."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from papernotes.plotting import figure_png

    plt.close(plt.figure())  # loads the inline backend, which installs its own formatter first
    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)


def _enable_colab_widgets() -> None:
    # Colab renders ipywidgets 8 only through its custom widget manager.
    from google.colab import output  # type: ignore[import-not-found]

    output.enable_custom_widget_manager()
