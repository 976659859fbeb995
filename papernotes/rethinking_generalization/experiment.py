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
# chapter's training digits come from SUBSET; Theorem 1's points, labelling and direction from
# POINTS, LABELLING and DIRECTION (the ablations reuse DIRECTION, so all get one a), the
# random-bias ablation's biases from BIASES.
SUBSET, BATCHES, POINTS, LABELLING, DIRECTION, BIASES = 0, 3, 4, 5, 6, 7


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


# -- the randomization test: a fixed schedule, the epoch it fits, the test error at its end ------


@dataclass
class Run(training.Run):
    """A randomization test's run: per epoch (the History's steps count updates) the training
    loss, the training accuracy on the whole training set and the test accuracy; the epoch at
    which the training accuracy first reached 100% (None: not within the schedule)."""

    data: rethinking_generalization.RandomizedDigits
    updates_per_epoch: int
    epochs_to_fit: int | None

    @property
    def epochs(self) -> list[int]:
        return [step // self.updates_per_epoch for step in self.history.steps]

    @property
    def test_accuracy(self) -> float:
        """Test accuracy at the end of the schedule, the same epoch for every condition."""
        return self.history.final("test_accuracy")

    @property
    def train_accuracy(self) -> float:
        """Training accuracy at the end of the schedule."""
        return self.history.final("train_accuracy")

    @property
    def test_accuracy_when_fitted(self) -> float | None:
        """Test accuracy at the first epoch of 100% training accuracy (None: never fitted)."""
        if self.epochs_to_fit is None:
            return None
        return self.history["test_accuracy"][self.epochs_to_fit - 1]


def network(
    inputs: int, classes: int, *, hidden: int, depth: int, dropout: float = 0.0
) -> nn.Sequential:
    """The ReLU MLP inputs-hidden-...-hidden-classes (`depth` hidden layers); with `dropout`,
    a Dropout after every hidden layer's ReLU (no weights, so the same draws make the same
    initial weights with and without it)."""
    model = training.mlp([inputs] + [hidden] * depth + [classes])
    if dropout == 0.0:
        return model
    layers: list[nn.Module] = []
    for layer in model:
        layers.append(layer)
        if isinstance(layer, nn.ReLU):
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def randomization_test(
    data: rethinking_generalization.RandomizedDigits,
    *,
    seed: int = 0,
    epochs: int = 100,
    lr: float = 1e-3,
    batch_size: int = 100,
    hidden: int = 512,
    depth: int = 2,
    weight_decay: float = 0.0,
    dropout: float = 0.0,
) -> Run:
    """Train a ReLU network (`depth` hidden layers of `hidden` units, no normalisation) with
    Adam on `data` for exactly `epochs` epochs, measuring after every epoch; record the first
    epoch of 100% training accuracy. By default there is no explicit regulariser; `weight_decay`
    adds (weight_decay / 2) * ||theta||^2 to the loss (Adam's weight_decay, all parameters) and
    `dropout` drops each hidden unit with that probability during training.

    The seed fixes the initial weights and the order of the batches, so two conditions with one
    seed differ only in their data (and their regulariser).
    """
    if not isinstance(data, rethinking_generalization.RandomizedDigits):
        raise TypeError(f"data must be a RandomizedDigits; got {type(data).__name__}")
    checks.integer("seed", seed, 0)
    epochs = checks.integer("epochs", epochs)
    checks.number("lr", lr, 0.0, low_open=True)
    batch_size = checks.integer("batch_size", batch_size)
    n = len(data.train_x)
    if batch_size > n:
        raise ValueError(f"batch_size must be at most the {n} training examples; got {batch_size}")
    hidden = checks.integer("hidden", hidden)
    depth = checks.integer("depth", depth)
    weight_decay = checks.number("weight_decay", weight_decay, 0.0)
    dropout = checks.number("dropout", dropout, 0.0, 1.0, high_open=True)
    with training.seeded(seed):
        model = network(
            data.train_x.shape[1], data.num_classes, hidden=hidden, depth=depth, dropout=dropout
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    batches = minibatches(n, batch_size, training.generator(seed, BATCHES))
    updates_per_epoch = n // batch_size  # an epoch is N / B updates of B examples
    history, epochs_to_fit = training.History(), None
    for epoch in range(1, epochs + 1):
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
        if epochs_to_fit is None and history.final("train_accuracy") == 1.0:
            epochs_to_fit = epoch
    return Run(model, history, data, updates_per_epoch, epochs_to_fit)


def capped_epochs(run: Run) -> int:
    """The epochs a run took to fit, a run that never fitted counting as one past its
    schedule."""
    return run.epochs_to_fit if run.epochs_to_fit is not None else len(run.epochs) + 1


def error_standard_error(error: float, n: int) -> float:
    """The standard error of a test error measured on n examples: sqrt(e (1 - e) / n)."""
    checks.number("error", error, 0.0, 1.0)
    return (error * (1 - error) / checks.integer("n", n)) ** 0.5


def paired_standard_error(first: Run, second: Run) -> float:
    """The standard error of the difference of two runs' test accuracies on the same test set:
    sqrt(b + c) / n, with b and c the test examples that only the first, or only the second,
    classifies right (the paired, McNemar form). The runs must share their test set."""
    test_x, test_y = first.data.test_x, first.data.test_y
    if not (torch.equal(test_y, second.data.test_y) and len(test_x) == len(second.data.test_x)):
        raise ValueError("paired_standard_error needs two runs on the same test set")
    with training.evaluating(first.model), training.evaluating(second.model):
        right_first = first.model(test_x).argmax(-1) == test_y
        right_second = second.model(second.data.test_x).argmax(-1) == test_y
    discordant = (right_first != right_second).sum().item()
    return discordant**0.5 / len(test_y)


# -- Theorem 1: the ablation and the measurements -------------------------------------------------


def biases_below_the_points(z: torch.Tensor) -> torch.Tensor:
    """The ablation: n biases spread over an interval below z_1, none between the points.

    Then A_ij = z_i - b_j for every i and j: A = z 1^T - 1 b^T has rank 2, and c(x) can only be
    an affine function of z.
    """
    spread = (z.max() - z.min()).clamp_min(1.0)
    return z.min() - spread * torch.arange(1, len(z) + 1, dtype=z.dtype) / len(z)


def biases_at_random_inside(z: torch.Tensor, generator: torch.Generator | None = None):
    """The fair ablation: n biases drawn uniformly between the lowest and the highest z, sorted;
    as many as the construction's and over the same range, but not one per gap.

    Two biases in one gap (z_i, z_{i+1}) give columns of A that differ only by a multiple of
    the indicator of z > z_i, and a gap left without a bias loses the kink the labels need
    there, so A loses rank and some labellings are out of reach.
    """
    draws = torch.rand(len(z), generator=generator, dtype=z.dtype)
    return (z.min() + (z.max() - z.min()) * draws).sort().values


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
