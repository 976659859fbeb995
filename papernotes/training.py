"""A small training loop that every chapter shares.

A chapter writes one function, `step(i) -> dict of floats`, that makes one update and returns
what it wants to plot; `fit` calls it, shows a progress bar to a reader in Jupyter, and returns
the logged values as lists. The bar is tqdm.auto (a widget in Jupyter, text in a terminal) and is
switched off under CI, nbval and the book build (see `papernotes.chapter.quiet`), where nobody
watches it and its rates would churn the committed outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from tqdm.auto import tqdm

from papernotes.chapter import quiet

T = TypeVar("T")


def progress(iterable: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    """Wrap an iterable in a progress bar that disappears when nobody watches."""
    return tqdm(iterable, desc=desc, total=total, disable=quiet(), leave=False)


def fit(
    step: Callable[[int], dict[str, float] | None],
    steps: int,
    *,
    desc: str = "training",
    log_every: int = 1,
) -> dict[str, list[float]]:
    """Call `step(i)` for i = 0 .. steps-1 and collect what it returns.

    Every `log_every` steps (and at the last step) the values `step` returned are appended to
    the history, together with the step number under "step". Returns the history as lists.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}")
    if log_every < 1:
        raise ValueError(f"log_every must be at least 1; got {log_every}")
    history: dict[str, list[float]] = {"step": []}
    for i in progress(range(steps), desc=desc):
        logs = step(i)
        if logs is None or (i % log_every and i != steps - 1):
            continue
        history["step"].append(i + 1)
        for name, value in logs.items():
            history.setdefault(name, []).append(float(value))
    return history


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of rows whose largest logit is at the label: logits (N, C), labels (N,)."""
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        shapes = f"{tuple(logits.shape)} and {tuple(labels.shape)}"
        raise ValueError(f"accuracy needs logits (N, C) and labels (N,); got {shapes}")
    return (logits.argmax(-1) == labels).float().mean().item()
