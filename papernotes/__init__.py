"""papernotes: the mechanisms behind the book's chapters, and what every chapter shares.

Shared infrastructure (one module each, used by every chapter):

- `chapter`: the setup cell's work (seeding, one thread, determinism, plot style, the clock)
- `data`: the book's small MNIST (scikit-learn's bundled 8x8 digits) as tensors
- `training`: a step loop with a progress bar that stays silent under CI and nbval
- `plotting`: one plot style and the few drawing helpers chapters share
- `knobs`: a paper's hyper-parameters as controls, live in Jupyter and static in the HTML book
- `claims`: a paper's claim beside our measurement, asserted and recorded
- `checks`: argument checks, so bad input fails early with a message naming it

Each paper has a module of its own named after its chapter (`papernotes.concrete`, ...), imported
by that chapter and its tests, not here.
"""

from papernotes.chapter import device, elapsed, quiet, seed_everything, setup, show_source
from papernotes.claims import Claims
from papernotes.data import Digits, binarize, load_digits_split, minibatches
from papernotes.knobs import Knob, KnobPanel, Sweep, knob_panel, precompute
from papernotes.plotting import PALETTE, apply_style
from papernotes.training import accuracy, fit, progress

__all__ = [
    "PALETTE",
    "Claims",
    "Digits",
    "Knob",
    "KnobPanel",
    "Sweep",
    "accuracy",
    "apply_style",
    "binarize",
    "device",
    "elapsed",
    "fit",
    "knob_panel",
    "load_digits_split",
    "minibatches",
    "precompute",
    "progress",
    "quiet",
    "seed_everything",
    "setup",
    "show_source",
]
