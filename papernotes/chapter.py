"""What the setup cell of every chapter does, and the chapter-wide settings it reads.

`setup()` makes a chapter reproducible and fast on a small CPU:

- one seed for Python, NumPy and torch, so two runs print the same numbers;
- torch pinned to one thread: on a 2-core machine small matmuls run up to 100x faster that way,
  and results are bit-identical run after run;
- deterministic algorithms on, so a GPU (used when present, never required) does not reorder sums;
- the book's plot style, and in Colab the widget manager that live knobs need;
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
_QUIET_VARIABLES = ("PAPERNOTES_QUIET", "CI")
_started_at: float | None = None


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


def setup(seed: int = DEFAULT_SEED) -> None:
    """The setup cell's work: determinism, one thread, one seed, plot style, start the clock."""
    global _started_at
    # cuBLAS needs this before its first call to be deterministic; harmless on a CPU.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    # Deterministic mode also fills every new tensor with NaN, in case code reads memory it never
    # wrote. Ours writes what it allocates, and the fills cost up to a quarter of a small
    # recurrent update on a 2-core CPU.
    torch.utils.deterministic.fill_uninitialized_memory = False
    pin_threads()
    seed_everything(seed)
    apply_style()
    if in_colab():
        _enable_colab_widgets()
    _started_at = time.perf_counter()


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


def device() -> torch.device:
    """The accelerator when there is one, else the CPU. Committed outputs come from the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def show_source(obj):
    """Show the source of a function or class from the package, as a code block."""
    import inspect

    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj)}```")


def in_colab() -> bool:
    return "google.colab" in sys.modules


def _enable_colab_widgets() -> None:
    # Colab renders ipywidgets 8 only through its custom widget manager.
    from google.colab import output  # type: ignore[import-not-found]

    output.enable_custom_widget_manager()
