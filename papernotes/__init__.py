"""papernotes: the mechanisms behind the book's chapters, and what every chapter shares.

Shared infrastructure (one module each, used by every chapter):

- `chapter`: the setup cell's work (seeding, one thread, determinism, plot style, the clock)
- `data`: the book's small MNIST (scikit-learn's bundled 8x8 digits) as tensors, split into
  train, validation and test
- `training`: the one training loop, its `History`, eval mode, seeded generators
- `together`: arms trained together: K models of one shape as one stacked model, through the
  one loop, with a learning rate, weight decay, dropout and batch order per member
- `checks`: argument checks at the entry points, so bad input fails with a message naming it
- `plotting`: one plot style, palette PNGs and the few drawing helpers chapters share
- `tables`: a small table that shows as HTML in a notebook and as text in a terminal
- `knobs`: a paper's hyper-parameters as controls, live in Jupyter and static in the HTML book
- `claims`: a paper's claim beside our measurement, with a status, its nulls and a margin,
  asserted and recorded (its rows and their standard in `claim_rows`, the record in
  `claim_records`, the table in `claim_table`)

The folders are papers, the files the shared layer. Each paper has a folder named after its
chapter: `papernotes.concrete` (its `__init__.py`) is the paper's mechanism alone, and
`papernotes.concrete.experiment` the chapter's data, training runs and measurements. Both are
imported by that chapter and its tests, not here. A later paper imports an earlier paper's
mechanism rather than re-deriving it (the BN-LSTM normalises with `papernotes.batch_norm`).

Conventions, for every module:

- Sequences are batch-first: (B, T, D) in and out, hidden states (B, H).
- Model variants are chosen with keyword flags or small constructors (`batch_norm=True`,
  `LSTM(...)` vs `BNLSTM(...)`), never with strings holding spaces.
- Arguments are checked where they enter: constructors, `train_*` functions and public samplers
  call `papernotes.checks` and then an unchecked core; the math trusts its input.
- Names are looked up at call time (`batch_norm.normalize(...)`, not a name imported from a
  paper's module): the mutants of tests/mutants/ patch a module after import, and must reach
  every run.
- Every random choice of a run follows one seed: `training.seeded(seed)` around model
  construction, `training.generator(seed, STREAM)` for batches, noise and generated data, each
  experiment naming its streams once at its top. A
  chapter passes `pn.chapter_seed()`, so `PAPERNOTES_SEED` changes every number it prints.
- Everything runs on the CPU, one thread. The experiments are sized for it: at these sizes a GPU
  spends longer launching kernels than computing, and committed outputs, which nbval compares,
  come from CPU arithmetic. (The package does not move tensors to a device; a reader with a GPU
  can move a model and its data by hand.)
"""

from papernotes.chapter import chapter_seed, elapsed, quiet, seed_everything, setup, show_source
from papernotes.claims import (
    ANALOG,
    CHECK,
    NOT_REPRODUCED,
    NOT_RUN,
    PAPER,
    REPRODUCED,
    Arm,
    Claims,
)
from papernotes.data import Digits, binarize, load_digits_split, minibatches
from papernotes.knobs import Knob, KnobPanel, Sweep, knob_panel, precompute
from papernotes.plotting import PALETTE, apply_style
from papernotes.tables import Table
from papernotes.training import (
    History,
    accuracy,
    evaluating,
    generator,
    progress,
    seeded,
    train,
)

__all__ = [
    "ANALOG",
    "CHECK",
    "NOT_REPRODUCED",
    "NOT_RUN",
    "PAPER",
    "PALETTE",
    "REPRODUCED",
    "Arm",
    "Claims",
    "Digits",
    "History",
    "Knob",
    "KnobPanel",
    "Sweep",
    "Table",
    "accuracy",
    "apply_style",
    "binarize",
    "elapsed",
    "evaluating",
    "generator",
    "knob_panel",
    "load_digits_split",
    "minibatches",
    "precompute",
    "progress",
    "quiet",
    "chapter_seed",
    "seed_everything",
    "seeded",
    "setup",
    "show_source",
    "train",
]
