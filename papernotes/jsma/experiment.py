"""The chapter's experiment around the saliency-map attack (papernotes.jsma): the networks under
attack, their training, the attacked sample and the measurements of its tables and claims.

The attack itself is `papernotes.jsma`; this module calls it through the module (`jsma.name`),
so a mutant patched there reaches the chapter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from papernotes import checks, jsma, training
from papernotes.data import IMAGE_SHAPE, N_CLASSES, Digits, minibatches

# The random streams of a run (generator(seed, stream)); the integers the chapter's numbers were
# drawn with.
BATCHES, SAMPLE, RANDOM_PAIRS = 1, 2, 3


# -- the networks under attack --------------------------------------------------------------------


class CNN(nn.Module):
    """A small LeNet-like network for 8x8 digits: two 3x3 convolutions (the second after a 2x2
    max-pool), a ReLU hidden layer and 10 logits. Takes flattened images (B, 64)."""

    def __init__(self, channels: int = 16, hidden: int = 64):
        super().__init__()
        checks.integer("channels", channels)
        checks.integer("hidden", hidden)
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(8 * channels, hidden), nn.ReLU(), nn.Linear(hidden, N_CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.reshape(-1, 1, *IMAGE_SHAPE)))


def train_classifier(
    digits: Digits,
    *,
    cnn: bool = False,
    lr: float = 3e-3,
    steps: int = 600,
    batch_size: int = 64,
    seed: int,
) -> training.Run:
    """Train the perceptron (64 pixels -> 128 ReLU units -> 10 logits) or, with `cnn=True`, the
    CNN, with Adam on cross-entropy, logging the validation accuracy. Weights and batches follow
    `seed`."""
    checks.boolean("cnn", cnn)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.integer("steps", steps)
    checks.integer("batch_size", batch_size)
    checks.integer("seed", seed, 0)
    with training.seeded(seed):
        model = CNN() if cnn else training.mlp([digits.n_pixels, 128, N_CLASSES])
    history = training.train_classifier(
        model,
        digits.train_y,
        torch.optim.Adam(model.parameters(), lr=lr),
        steps,
        batches=minibatches(len(digits.train_x), batch_size, training.generator(seed, BATCHES)),
        logits_of=lambda index: model(digits.train_x[index]),
        evaluate=lambda: {"val_accuracy": training.accuracy(model(digits.val_x), digits.val_y)},
        eval_every=max(1, steps // 6),
        desc="CNN" if cnn else "MLP",
    )
    return training.Run(model, history)


# -- the attacked sample --------------------------------------------------------------------------


def correctly_classified(
    labels: torch.Tensor, predictions: torch.Tensor, per_class: int, generator: torch.Generator
) -> torch.Tensor:
    """Indices of `per_class` correctly classified examples of each class, drawn without
    replacement class by class (class 0 first), in the order drawn."""
    checks.tensor("labels", labels, "(N,)", dtype=torch.int64)
    checks.tensor("predictions", predictions, "(N,)", N=len(labels))
    checks.integer("per_class", per_class)
    return torch.cat(
        [
            correct[torch.randperm(len(correct), generator=generator)[:per_class]]
            for correct in (
                ((labels == d) & (predictions == d)).nonzero().squeeze(1) for d in range(N_CLASSES)
            )
        ]
    )


def other_classes(labels: torch.Tensor) -> torch.Tensor:
    """For each label, the nine other classes in increasing order: the targets of its attacks,
    (9 N,) (repeat each input 9 times with `repeat_interleave(9, dim=0)` to match)."""
    checks.tensor("labels", labels, "(N,)", dtype=torch.int64)
    return torch.tensor([t for s in labels.tolist() for t in range(N_CLASSES) if t != s])


# -- measurements ---------------------------------------------------------------------------------


def success_rate(attack: jsma.Attack, budget: float, rows=slice(None)) -> float:
    """The share of the attacks (of `rows`) that reach their target within the budget."""
    return jsma.success_within(attack, budget)[rows].float().mean().item()


def distortion(attack: jsma.Attack, budget: float, rows=slice(None)) -> float:
    """The mean share of features changed by the attacks (of `rows`) that succeed within the
    budget; NaN when none does."""
    succeeded = jsma.success_within(attack, budget)[rows]
    return attack.changed[rows][succeeded].mean().item() if succeeded.any() else math.nan


def pair_hardness(attack: jsma.Attack, budgets: list[float], rows) -> float:
    """H(s, t) of the attacks of `rows` over the increasing `budgets` (a budget with no success
    yet contributes a distortion of 0, which `jsma.hardness` skips)."""
    return jsma.hardness(
        [success_rate(attack, b, rows) for b in budgets],
        [
            distortion(attack, b, rows) if success_rate(attack, b, rows) > 0 else 0.0
            for b in budgets
        ],
    )


def per_class_pair(
    measure: Callable[[torch.Tensor], float], source: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """A (10, 10) matrix of `measure(rows)` over the attacks from source class s to target
    class t (rows a boolean mask), NaN on the diagonal."""
    matrix = torch.full((N_CLASSES, N_CLASSES), math.nan, dtype=torch.float64)
    for s in range(N_CLASSES):
        for t in range(N_CLASSES):
            if s != t:
                matrix[s, t] = measure((source == s) & (target == t))
    return matrix


def paired_difference(
    a: torch.Tensor, b: torch.Tensor, clusters: torch.Tensor
) -> tuple[float, float]:
    """The difference of two success rates measured on the same attacks, mean(a) - mean(b), and
    its standard error when the attacks come in clusters (the nine attacks of one source digit
    share it): the per-attack differences are averaged within each cluster, and the SE is the
    standard deviation of those cluster means over sqrt(number of clusters), each cluster
    weighted by its size. a and b are boolean (N,), clusters int64 (N,)."""
    n = checks.tensor("a", a, "(N,)", dtype=torch.bool)["N"]
    checks.tensor("b", b, "(N,)", dtype=torch.bool, N=n)
    checks.tensor("clusters", clusters, "(N,)", dtype=torch.int64, N=n)
    _, index, sizes = clusters.unique(return_inverse=True, return_counts=True)
    if len(sizes) < 2:
        raise ValueError("a clustered standard error needs two clusters at least")
    d = a.double() - b.double()
    mean = d.mean()
    # the cluster-robust variance of a mean: sum_c (sum_{i in c} (d_i - mean))^2 / N^2, with the
    # small-sample factor C / (C - 1)
    residual = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, index, d - mean)
    c = len(sizes)
    variance = c / (c - 1) * residual.pow(2).sum() / n**2
    return mean.item(), variance.sqrt().item()


def three_standard_errors(p: float, q: float, n: int) -> float:
    """Three standard errors of the difference of two success rates p and q, each over n
    attacks: the margin a difference must beat to be more than sampling noise."""
    return 3 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)
