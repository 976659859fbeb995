"""The chapter's experiment around the randomization tests and Theorem 1
(papernotes.rethinking_generalization): the distinct subset, the network and the loop that
trains it until it fits, the ablation of the construction and the measurements of the chapter's
tables and claims.

The randomizations and the construction are `papernotes.rethinking_generalization`; this module
calls them through the module (`rethinking_generalization.name`), so a mutant patched there
reaches the chapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks, rethinking_generalization, training
from papernotes.data import minibatches

# The random streams (generator(seed, stream)); the integers the chapter's numbers were drawn
# with. A randomized set draws its labels and inputs from streams 1 and 2
# (rethinking_generalization.LABEL_STREAM, INPUT_STREAM); the training batches from BATCHES. The
# chapter's 1000 digits come from SUBSET; Theorem 1's points, labelling and direction from
# POINTS, LABELLING and DIRECTION (the ablation reuses DIRECTION, so both get one a).
SUBSET, BATCHES, POINTS, LABELLING, DIRECTION = 0, 3, 4, 5, 6


def distinct_subset(
    x: torch.Tensor, y: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples drawn at random among the distinct images of x (N, D), with their labels.

    Two copies of one image would get two independent random labels that no classifier can
    both fit; duplicates are dropped before the draw.
    """
    count = checks.tensor("x", x, "(N, D)")["N"]
    checks.tensor("y", y, "(N,)", N=count)
    keep = rethinking_generalization.first_occurrences(x)
    n = checks.integer("n", n)
    if n > len(keep):
        raise ValueError(f"n must be at most the {len(keep)} distinct images of x; got {n}")
    chosen = keep[torch.randperm(len(keep), generator=generator)[:n]].sort().values
    return x[chosen], y[chosen]


# -- the randomization test: epochs to fit, test error once fitted --------------------------------


@dataclass
class Run(training.Run):
    """A randomization test's run: per epoch (the History's steps count updates) the training
    loss, the training accuracy on the whole training set and the test accuracy; the epoch at
    which the training accuracy first reached 100% (None: not within `max_epochs`)."""

    data: rethinking_generalization.RandomizedDigits
    updates_per_epoch: int
    epochs_to_fit: int | None

    @property
    def epochs(self) -> list[int]:
        return [step // self.updates_per_epoch for step in self.history.steps]

    @property
    def test_accuracy(self) -> float:
        """Test accuracy where training stopped (once fitted, or after `max_epochs`)."""
        return self.history.final("test_accuracy")

    @property
    def train_accuracy(self) -> float:
        return self.history.final("train_accuracy")


def randomization_test(
    data: rethinking_generalization.RandomizedDigits,
    *,
    seed: int = 0,
    max_epochs: int = 300,
    lr: float = 1e-3,
    batch_size: int = 100,
    hidden: int = 512,
    depth: int = 2,
) -> Run:
    """Train a ReLU network (`depth` hidden layers of `hidden` units, no dropout, no
    normalisation) with Adam on `data` until it fits its training labels (100% training
    accuracy) or `max_epochs` have passed, measuring after every epoch.

    The seed fixes the initial weights and the order of the batches, so two conditions with one
    seed differ only in their data.
    """
    if not isinstance(data, rethinking_generalization.RandomizedDigits):
        raise TypeError(f"data must be a RandomizedDigits; got {type(data).__name__}")
    checks.integer("seed", seed, 0)
    max_epochs = checks.integer("max_epochs", max_epochs)
    checks.number("lr", lr, 0.0, low_open=True)
    batch_size = checks.integer("batch_size", batch_size)
    n = len(data.train_x)
    if batch_size > n:
        raise ValueError(f"batch_size must be at most the {n} training examples; got {batch_size}")
    hidden = checks.integer("hidden", hidden)
    depth = checks.integer("depth", depth)
    with training.seeded(seed):
        model = training.mlp([data.train_x.shape[1]] + [hidden] * depth + [data.num_classes])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = minibatches(n, batch_size, training.generator(seed, BATCHES))
    updates_per_epoch = n // batch_size  # an epoch is N / B updates of B examples
    history, epochs_to_fit = training.History(), None
    for epoch in range(1, max_epochs + 1):
        x, y = data.epoch()  # the set drawn at construction, the same every epoch

        def evaluate(x=x, y=y):
            return {
                "train_accuracy": training.accuracy(model(x), y),
                "test_accuracy": training.accuracy(model(data.test_x), data.test_y),
            }

        one = training.train_classifier(
            model,
            y,
            optimizer,
            updates_per_epoch,
            batches=batches,
            logits_of=lambda index, x=x: model(x[index]),
            evaluate=evaluate,
            desc=f"epoch {epoch}",
        )
        history.log(epoch * updates_per_epoch, {k: v[-1] for k, v in one.metrics.items()})
        if history.final("train_accuracy") == 1.0:
            epochs_to_fit = epoch
            break
    return Run(model, history, data, updates_per_epoch, epochs_to_fit)


def capped_epochs(run: Run, max_epochs: int) -> int:
    """The epochs a run took to fit, a run that never fitted counting as one past the cap."""
    checks.integer("max_epochs", max_epochs)
    return run.epochs_to_fit if run.epochs_to_fit is not None else max_epochs + 1


# -- Theorem 1: the ablation and the measurements -------------------------------------------------


def biases_below_the_points(z: torch.Tensor) -> torch.Tensor:
    """The ablation: n biases spread over an interval below z_1, none between the points.

    Then A_ij = z_i - b_j for every i and j: A = z 1^T - 1 b^T has rank 2, and c(x) can only be
    an affine function of z.
    """
    spread = (z.max() - z.min()).clamp_min(1.0)
    return z.min() - spread * torch.arange(1, len(z) + 1, dtype=z.dtype) / len(z)


def least_squares_network(
    x: torch.Tensor, y: torch.Tensor, biases, generator: torch.Generator | None = None
) -> rethinking_generalization.TwoLayerReLU:
    """A network of the same shape (a, b, w) with b = biases(sorted z) and the w that fits y
    best in least squares: the ablation of the construction."""
    checks.tensor("x", x, "(n, d)", dtype="floating")
    x, y = x.double(), y.double()
    a = rethinking_generalization.projection_direction(x, generator)
    z, y = rethinking_generalization.sort_by_projection(x @ a, y)
    b = biases(z)
    A = rethinking_generalization.hidden_units(z, b)
    w = torch.linalg.lstsq(A, y[:, None], driver="gelsd").solution[:, 0]
    return rethinking_generalization.TwoLayerReLU(a, b, w)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def max_fit_error(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """max_i |c(x_i) - y_i|, in float64."""
    with torch.no_grad():
        return (model(x.double()) - y.double()).abs().max().item()


def rank_of_A(network: rethinking_generalization.TwoLayerReLU, x: torch.Tensor) -> int:
    """The rank of the hidden units' matrix A_ij = max(<a, x_i> - b_j, 0) on the points x: n
    for the construction (A is invertible), 2 at most for the ablation."""
    z = x.double() @ network.a.detach()
    return torch.linalg.matrix_rank(
        rethinking_generalization.hidden_units(z, network.b.detach())
    ).item()
