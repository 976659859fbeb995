"""The one training loop of the book, the history it returns, and the seeding it relies on.

Every paper's experiment trains through `train`, and a classifier through `train_classifier`
over it:

    with seeded(seed):                       # initial weights follow the run's seed
        model = Net()
    batches = minibatches(n, 64, generator(seed, stream=1))
    history = train(model, torch.optim.Adam(model.parameters()), loss_of_update, steps=500,
                    evaluate=lambda: {"val_accuracy": accuracy(model(val_x), val_y)},
                    eval_every=50, clip=1.0)
    history.first_step_reaching("val_accuracy", 0.9)

`loss_of_update(i)` draws its own batch and returns the loss of update i; the loop does the
rest the same way for every paper: train mode, zero_grad, backward, optional gradient-norm
clipping, the optimizer step, and every `eval_every` updates (and after the last) the evaluation
in eval mode without gradients. A loss that stops being finite ends the updates (the run has
diverged); the evaluation schedule carries on, so every run's history has the same steps.

Seeds. A chapter has one seed (`papernotes.chapter.chapter_seed()`, from `PAPERNOTES_SEED` when
set). Every random choice of a run follows it: `seeded(seed)` for what draws from torch's global
generator (initial weights), `generator(seed, stream)` for each other stream (batches, noise,
generated data), so that one stream drawing more numbers does not shift another.

Streams have names. Each experiment module names the streams it draws from once, at its top
(`BATCHES, NOISE = 1, 2`), and passes the name: `generator(seed, BATCHES)`. The integers are the
ones each chapter's published numbers were drawn with; a name says what the stream is for.

One run type. `Run` holds what every training run ends with, the model and its History; a paper
whose run also returns a measurement (the percentile bands of batch_norm, the epochs to fit of
rethinking_generalization) subclasses it with those fields.

The progress bar is tqdm.auto (a widget in Jupyter, text in a terminal) and is off under CI,
nbval and the book build (see `papernotes.chapter.quiet`), where nobody watches it and its rates
would churn the committed outputs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from papernotes import checks
from papernotes.chapter import quiet

T = TypeVar("T")


# -- seeds ----------------------------------------------------------------------------------------


def generator(seed: int, stream: int = 0) -> torch.Generator:
    """A torch.Generator for one random stream of a run, derived from (seed, stream).

    Different streams of one seed, and the same stream of different seeds, are independent
    (the pair goes through NumPy's SeedSequence, so seed 1 stream 0 is not seed 0 stream 1).
    """
    checks.integer("seed", seed, 0)
    checks.integer("stream", stream, 0)
    mixed = np.random.SeedSequence([seed, stream]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed))


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Inside the block torch's global generator starts from `seed`; after it, it is restored.

    For what cannot take a generator, chiefly the initial weights of nn layers.
    """
    checks.integer("seed", seed, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# -- the history of a run -------------------------------------------------------------------------


class History:
    """What a run logged: the update counts at which it evaluated, and one list per metric.

    `history["val_accuracy"]` is a metric's list, `history.steps` the update counts (after how
    many updates each entry was logged), `history.diverged` whether the loss stopped being finite.
    """

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.metrics: dict[str, list[float]] = {}
        self.diverged = False

    def log(self, step: int, values: dict[str, float]) -> None:
        if self.steps and set(values) != set(self.metrics):
            raise ValueError(
                f"every evaluation must log the same metrics: {sorted(self.metrics)} were "
                f"logged before, now {sorted(values)}"
            )
        self.steps.append(int(step))
        for name, value in values.items():
            self.metrics.setdefault(name, []).append(float(value))

    def __getitem__(self, name: str) -> list[float]:
        if name not in self.metrics:
            known = ", ".join(self.metrics) or "none yet"
            raise KeyError(f"no metric {name!r} was logged; logged: {known}")
        return self.metrics[name]

    def __contains__(self, name: str) -> bool:
        return name in self.metrics

    def final(self, name: str) -> float:
        """The metric's last logged value."""
        return self[name][-1]

    def mean(self, name: str) -> float:
        """The metric averaged over every evaluation of the run: an area under its curve, less
        noisy than a first crossing or a final value when comparing the speed of two runs."""
        return float(np.mean(self[name]))

    def first_step_reaching(self, name: str, level: float, *, above: bool = True) -> int | None:
        """The first logged update count at which the metric is at least `level` (at most, with
        `above=False`); None if it never gets there."""
        for step, value in zip(self.steps, self[name], strict=True):
            if (value >= level) if above else (value <= level):
                return step
        return None

    def __repr__(self) -> str:
        names = ", ".join(self.metrics)
        return f"History({len(self.steps)} evaluations of {names}; diverged={self.diverged})"


# -- the loop --------------------------------------------------------------------------------------


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and no gradients inside the block; the model's previous mode after it, even
    when the block raises."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_of_update: Callable[[int], torch.Tensor],
    steps: int,
    *,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_every: int | None = None,
    clip: float | None = None,
    desc: str = "training",
) -> History:
    """Make `steps` updates of `model` and return the History of its evaluations.

    Update i: train mode, `loss = loss_of_update(i)`, zero_grad, backward, the gradient norm
    clipped at `clip` (when given), optimizer step. After every `eval_every` updates and after
    the last one, `evaluate()` runs in eval mode without gradients and its metrics are logged,
    together with the training loss of that update as "loss". The model is returned in eval
    mode, ready to be measured.
    """
    steps = checks.integer("steps", steps)
    eval_every = steps if eval_every is None else checks.integer("eval_every", eval_every)
    if clip is not None:
        checks.number("clip", clip, 0.0, low_open=True)
    history = History()
    loss_value = math.nan
    for i in progress(range(steps), desc=desc):
        if not history.diverged:
            model.train()
            loss = loss_of_update(i)
            loss_value = loss.item()
            history.diverged = not math.isfinite(loss_value)
            if not history.diverged:
                optimizer.zero_grad()
                loss.backward()
                if clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
        if (i + 1) % eval_every == 0 or i == steps - 1:
            with evaluating(model):
                metrics = evaluate() if evaluate is not None else {}
            history.log(i + 1, {"loss": loss_value, **metrics})
    model.eval()
    return history


def progress(iterable: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    """Wrap an iterable in a progress bar that disappears when nobody watches."""
    return tqdm(iterable, desc=desc, total=total, disable=quiet(), leave=False)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose largest logit is at the label: logits (N, C), labels (N,)."""
    n = checks.tensor("logits", logits, "(N, C)")["N"]
    checks.tensor("labels", labels, "(N,)", N=n)
    return (logits.argmax(-1) == labels).float().mean().item()


def accuracy_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The model's accuracy on (x, y), in eval mode without gradients (its mode kept)."""
    with evaluating(model):
        return accuracy(model(x), y)


# -- what the papers share on top of the loop -----------------------------------------------------


@dataclass
class Run:
    """A training run's result: the model (in eval mode) and the History of its evaluations.

    The one run type of the book; a paper whose run returns more subclasses it."""

    model: nn.Module
    history: History


def train_classifier(
    model: nn.Module,
    train_y: torch.Tensor | None,
    optimizer: torch.optim.Optimizer,
    steps: int,
    *,
    batches: Iterator[torch.Tensor],
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    targets_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    extra_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_every: int | None = None,
    clip: float | None = None,
    desc: str = "classifier",
) -> History:
    """Train a classifier on cross-entropy over minibatches: the loop every paper's classifier
    shares (through `train`).

    Update i draws the row indices `index = next(batches)`, computes `logits_of(index)` (for a
    plain classifier `model(train_x[index])`; a recurrent one adds its initial state) and the
    cross-entropy against the batch's targets, plus `extra_loss(index)` when given (a penalty of
    the paper's). The targets are `train_y[index]`: class labels, shape (N,), or soft targets,
    shape (N, C), each row a probability distribution over the classes (label smoothing,
    distillation). A paper whose targets are made per update (mixup mixes pairs of examples and
    their labels) passes `targets_of(index)` instead, returning (B,) labels or (B, C)
    probabilities, and `train_y=None`; it is called after `logits_of(index)`, so the two can
    share the update's draw. `evaluate`, `eval_every`, `clip` and `desc` are `train`'s.
    """
    if (train_y is None) == (targets_of is None):
        raise ValueError("give the targets once: train_y (a tensor) or targets_of (a function)")
    if train_y is not None:
        _check_targets("train_y", train_y)

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        logits = logits_of(index)
        targets = train_y[index] if targets_of is None else targets_of(index)
        loss = F.cross_entropy(logits, targets)
        return loss if extra_loss is None else loss + extra_loss(index)

    return train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=evaluate,
        eval_every=eval_every,
        clip=clip,
        desc=desc,
    )


def _check_targets(name: str, targets: torch.Tensor) -> None:
    """Class labels (N,) of an integer type, or soft targets (N, C) whose rows are
    probability distributions."""
    if isinstance(targets, torch.Tensor) and targets.dim() == 2:
        checks.tensor(name, targets, "(N, C)", dtype="floating")
        if (targets < 0).any() or not torch.allclose(
            targets.sum(dim=1), torch.ones(len(targets), dtype=targets.dtype), atol=1e-5
        ):
            raise ValueError(f"{name}: soft targets must be non-negative rows that sum to 1")
        return
    checks.tensor(name, targets, "(N,)")


def mlp(
    widths: list[int],
    activation: Callable[[], nn.Module] = nn.ReLU,
    *,
    init: Callable[[nn.Linear, bool], None] | None = None,
) -> nn.Sequential:
    """A multilayer perceptron: linear layers of `widths` ([inputs, hidden..., outputs]) with
    `activation()` between them and none after the last.

    `init(linear, is_output)`, when given, re-initialises each layer right after it is made (so
    the random draws come in the order layer by layer)."""
    if len(widths) < 2:
        raise ValueError(f"widths needs the inputs and the outputs at least; got {widths}")
    for i, width in enumerate(widths):
        checks.integer(f"widths[{i}]", width)
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        linear = nn.Linear(fan_in, fan_out)
        is_output = i == len(widths) - 2
        if init is not None:
            init(linear, is_output)
        layers.append(linear)
        if not is_output:
            layers.append(activation())
    return nn.Sequential(*layers)
