"""The chapter's experiment around the randomization tests and Theorem 1
(papernotes.rethinking_generalization): the distinct subset, the network and the loop that
trains it until it fits, the ablation of the construction and the measurements of the chapter's
tables and claims.

The randomizations and the construction are `papernotes.rethinking_generalization`; this module
calls them through the module (`rethinking_generalization.name`), so a mutant patched there
reaches the chapter.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from papernotes import checks, rethinking_generalization, together, training

# The random streams (generator(seed, stream)); the integers the chapter's numbers were drawn
# with. A randomized set draws its labels and inputs from streams 1 and 2
# (rethinking_generalization.LABEL_STREAM, INPUT_STREAM); the training batches from BATCHES. The
# chapter's training digits come from SUBSET; Theorem 1's points, labelling and direction from
# POINTS, LABELLING and DIRECTION (the ablations reuse DIRECTION, so all get one a), the
# random-bias ablation's biases from BIASES; the dropout masks from DROPOUT; the nulls' labels
# and pixels (`null_set`) from NULL_LABELS and NULL_PIXELS; the initial weights of a condition
# that asks for other ones than the seed's (`Condition.init` > 0) from INITS; the untrained
# network of the read-out null (`untrained_features`) from UNTRAINED.
SUBSET, BATCHES, POINTS, LABELLING, DIRECTION, BIASES, DROPOUT = 0, 3, 4, 5, 6, 7, 8
NULL_LABELS, NULL_PIXELS, INITS, UNTRAINED = 9, 10, 11, 12


def distinct_subset(
    x: torch.Tensor, y: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples drawn at random among the distinct images of x (N, D), with their labels.

    Two copies of one image would get two independent random labels that no classifier can
    both fit; duplicates are dropped before the draw.
    """
    return distinct_subset_and_rest(x, y, n, generator)[:2]


def distinct_subset_and_rest(
    x: torch.Tensor, y: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`distinct_subset`'s n examples (the same draw), then the distinct images of x it left
    out, with their labels: images that no network trained on the subset has seen."""
    count = checks.tensor("x", x, "(N, D)")["N"]
    checks.tensor("y", y, "(N,)", N=count)
    keep = rethinking_generalization.first_occurrences(x)
    n = checks.integer("n", n)
    if n > len(keep):
        raise ValueError(f"n must be at most the {len(keep)} distinct images of x; got {n}")
    order = torch.randperm(len(keep), generator=generator)
    chosen, rest = keep[order[:n]].sort().values, keep[order[n:]].sort().values
    return x[chosen], y[chosen], x[rest], y[rest]


# -- the randomization test: a fixed schedule, the epoch it fits, the test error at its end ------


@dataclass
class Run(training.Run):
    """A randomization test's run: per epoch (the History's steps count updates) the training
    loss, the training accuracy on the whole training set and the test accuracy; the epoch at
    which the training accuracy first reached 100% (None: not within the schedule); with a
    validation set, `validation` logs its accuracy and cross-entropy after each of the last
    epochs (`randomization_tests`'s `val_epochs`)."""

    data: rethinking_generalization.RandomizedDigits
    updates_per_epoch: int
    epochs_to_fit: int | None
    validation: training.History = field(default_factory=training.History)

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
    """The ReLU MLP inputs-hidden-...-hidden-classes (`depth` hidden layers; 0: a linear
    classifier); with `dropout`, a Dropout after the last hidden layer's ReLU, before the
    classifier, where Inception has its one (no weights, so the same draws make the same
    initial weights with and without it)."""
    model = training.mlp([inputs] + [hidden] * depth + [classes])
    if dropout == 0.0 or depth == 0:
        return model
    layers = list(model)
    return nn.Sequential(*layers[:-1], nn.Dropout(dropout), layers[-1])


@dataclass(frozen=True)
class FixedSet:
    """A training set and a test set as given, served every epoch: the data of the nulls' runs,
    built by `null_set` with the experiment's own code, out of the mechanism's reach (and its
    mutants')."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int = 10

    def epoch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.train_x, self.train_y


def null_set(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    *,
    seed: int,
    corruption: float = 0.0,
    pixels: str | None = None,
    num_classes: int = 10,
) -> FixedSet:
    """A null's data, drawn once from streams of its own: each training label replaced, with
    probability `corruption`, by a class drawn uniformly; `pixels` "shared" (one permutation
    of the pixels for every image, test images too) or "per_image" (a permutation of its own for
    each image). The same recipes as the mechanism's randomizations, written again."""
    n = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")["N"]
    checks.number("corruption", corruption, 0.0, 1.0)
    if pixels is not None:
        checks.one_of("pixels", pixels, ("shared", "per_image"))
    labels = training.generator(seed, NULL_LABELS)
    replace = torch.rand(n, generator=labels) < corruption
    train_y = torch.where(replace, torch.randint(num_classes, (n,), generator=labels), train_y)
    both = torch.cat([train_x, test_x])
    draws = training.generator(seed, NULL_PIXELS)
    if pixels == "shared":
        both = both[:, torch.randperm(both.shape[1], generator=draws)]
    elif pixels == "per_image":
        both = both.gather(1, torch.rand(both.shape, generator=draws).argsort(dim=1))
    return FixedSet(both[:n], train_y, both[n:], test_y, num_classes)


def untrained_features(data: FixedSet, *, seed: int, hidden: int, depth: int = 2) -> FixedSet:
    """The null of the untrained network with the arms' read-out: the same data, each image
    (training and test) replaced by the last hidden layer of a ReLU MLP of `depth` hidden layers
    of `hidden` units whose weights are drawn from a stream of their own (UNTRAINED) and never
    trained. A linear classifier trained on these features (`randomization_tests` with depth 0)
    is the network with its hidden layers frozen at their initial weights."""
    d = checks.tensor("data.train_x", data.train_x, "(N, D)", dtype="floating")["D"]
    checks.integer("seed", seed, 0)
    hidden = checks.integer("hidden", hidden)
    depth = checks.integer("depth", depth)
    weights = int(torch.randint(2**62, (1,), generator=training.generator(seed, UNTRAINED)))
    with training.seeded(weights):
        body = training.mlp([d] + [hidden] * depth + [data.num_classes])[:-1]  # no classifier
    with torch.no_grad():
        train_h, test_h = body(data.train_x), body(data.test_x)
    return FixedSet(train_h, data.train_y, test_h, data.test_y, data.num_classes)


def zero_padded(data: FixedSet, width: int) -> FixedSet:
    """The same data with zero columns appended to its images up to `width`: a linear
    classifier on them is one on the images (the zero columns' weights get no gradient and add
    nothing), and can train in one stack with linear classifiers on `width` features."""
    d = checks.tensor("data.train_x", data.train_x, "(N, D)", dtype="floating")["D"]
    width = checks.integer("width", width, d)

    def pad(x):
        return torch.cat([x, x.new_zeros(len(x), width - d)], dim=1)

    return FixedSet(
        pad(data.train_x), data.train_y, pad(data.test_x), data.test_y, data.num_classes
    )


@dataclass(frozen=True)
class Condition:
    """One randomization test: its data and its explicit regulariser (none by default):
    `weight_decay` adds (weight_decay / 2) ||theta||^2 to the loss, all parameters (what Adam's
    coupled weight_decay does), `dropout` drops each hidden unit with that probability during
    training. `init` picks the initial weights: 0 the seed's (every condition's by default),
    k > 0 the k-th other draw of the seed's INITS stream (a replicate of a run from other
    initial weights, with dropout masks of its own and the same batch order)."""

    data: rethinking_generalization.RandomizedDigits | FixedSet
    weight_decay: float = 0.0
    dropout: float = 0.0
    init: int = 0


def initial_weights_seed(seed: int, init: int) -> int:
    """The torch seed of the initial weights `init` of a run with seed `seed`: the seed itself
    for init 0, else the init-th draw of the seed's INITS stream."""
    checks.integer("init", init, 0)
    if init == 0:
        return seed
    draws = torch.randint(2**62, (init,), generator=training.generator(seed, INITS))
    return int(draws[-1])


def with_dropout(model: nn.Sequential, dropout: float) -> nn.Sequential:
    """A copy of `network`'s MLP with a Dropout of rate `dropout` (0 included) before the
    classifier, where `network(..., dropout=...)` puts it: the layers every condition's network
    has when they train together (a linear classifier, depth 0, gets none)."""
    layers = list(copy.deepcopy(model))
    if len(layers) == 1:
        return nn.Sequential(*layers)
    return nn.Sequential(*layers[:-1], nn.Dropout(dropout), layers[-1])


def randomization_tests(
    conditions: dict[str, Condition],
    *,
    seed: int = 0,
    epochs: int = 100,
    lr: float = 1e-3,
    batch_size: int = 100,
    hidden: int = 512,
    depth: int = 2,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    val_epochs: int | None = None,
    lr_drops: tuple[float, ...] = (),
    measure_every: int = 1,
    test_curves: Collection[str] | None = None,
) -> dict[str, Run]:
    """Train one ReLU network (`depth` hidden layers of `hidden` units, no normalisation) per
    condition with Adam for exactly `epochs` epochs, measuring after every epoch; record the
    first epoch of 100% training accuracy.

    Every condition starts from the same initial weights (the seed's, unless its `init` asks
    for others) and sees the same batch order, so two conditions differ only in their data and
    their regulariser. The networks train side by side, as one stacked model
    (`papernotes.together`: each network its own weight decay, dropout rate and masks), which
    gives each the updates of its own run and costs about one run. After every epoch each
    network's training accuracy (on its whole training set, dropout off) and test accuracy are
    logged, and with `val` (images, labels), after each of the last `val_epochs` epochs (None:
    every epoch), its validation accuracy and cross-entropy (the window the regularisers are
    scored on need not cost more); each Run's model is its network as a plain MLP (with a
    Dropout layer, of rate 0 where the condition has none). `lr_drops` are fractions of the
    schedule (in (0, 1), increasing) at each of which the rate falls to a tenth (a step decay,
    as the paper's SGD decays its rate; none: a fixed rate). `measure_every` > 1 measures after
    every that many epochs (and the last) instead of every epoch, so the first epoch at 100% is
    known to that many epochs. `test_curves` names the conditions whose test accuracy is
    measured at every measurement (None: all); the others' only at the end of the schedule (NaN
    before), which is all the tuning grids need and saves most of the evaluation's cost.
    """
    if not conditions:
        raise ValueError("conditions must name at least one condition")
    for name, condition in conditions.items():
        if not isinstance(condition, Condition):
            raise TypeError(f"condition {name!r} must be a Condition; got {type(condition)}")
        if not isinstance(condition.data, (rethinking_generalization.RandomizedDigits, FixedSet)):
            raise TypeError(f"data must be a RandomizedDigits; got {type(condition.data).__name__}")
        checks.number("weight_decay", condition.weight_decay, 0.0)
        checks.number("dropout", condition.dropout, 0.0, 1.0, high_open=True)
        checks.integer("init", condition.init, 0)
    checks.integer("seed", seed, 0)
    epochs = checks.integer("epochs", epochs)
    checks.number("lr", lr, 0.0, low_open=True)
    batch_size = checks.integer("batch_size", batch_size)
    hidden = checks.integer("hidden", hidden)
    depth = checks.integer("depth", depth, 0)
    measure_every = checks.integer("measure_every", measure_every)
    if test_curves is not None and not set(test_curves) <= set(conditions):
        raise ValueError(
            f"test_curves names unknown conditions: {set(test_curves) - set(conditions)}"
        )
    val_epochs = epochs if val_epochs is None else checks.integer("val_epochs", val_epochs)
    if val_epochs > epochs:
        raise ValueError(f"val_epochs must be at most the {epochs} epochs; got {val_epochs}")
    drops = [
        checks.number("lr_drops[]", f, 0.0, 1.0, low_open=True, high_open=True) for f in lr_drops
    ]
    if drops != sorted(set(drops)):
        raise ValueError(f"lr_drops must be increasing fractions of the schedule; got {lr_drops}")
    names, chosen = list(conditions), list(conditions.values())
    first = chosen[0].data
    n, d = first.train_x.shape
    for c in chosen:
        if c.data.train_x.shape != (n, d) or c.data.num_classes != first.num_classes:
            raise ValueError("every condition must have training sets of one shape and classes")
    if batch_size > n:
        raise ValueError(f"batch_size must be at most the {n} training examples; got {batch_size}")
    templates = {}
    for init in sorted({c.init for c in chosen}):
        with training.seeded(initial_weights_seed(seed, init)):
            templates[init] = network(d, first.num_classes, hidden=hidden, depth=depth)
    members = [with_dropout(templates[c.init], c.dropout) for c in chosen]
    stack = together.MLPStack(members, masks=training.generator(seed, DROPOUT))
    optimizer = together.Adam(stack.parameters(), lr=lr)
    decay = torch.tensor([c.weight_decay for c in chosen])
    # one batch order for every condition: a generator each, all drawn from the seed's BATCHES
    orders = [training.generator(seed, BATCHES) for _ in chosen]
    batches = together.minibatches(n, batch_size, orders)
    updates_per_epoch = n // batch_size  # an epoch is N / B updates of B examples
    test_x = torch.stack([c.data.test_x for c in chosen])
    test_y = torch.stack([c.data.test_y for c in chosen])
    rows = torch.arange(len(chosen)).unsqueeze(1)  # network g reads its own set's rows
    validations = [training.History() for _ in chosen]
    traced = torch.tensor(
        [g for g, name in enumerate(names) if test_curves is None or name in test_curves],
        dtype=torch.int64,
    )
    current = {}  # the epoch and its training sets (G, N, D) and labels (G, N)

    def losses_of_update(i: int) -> torch.Tensor:
        if drops:  # lr_i = lr * 0.1^(the drops update i has passed)
            passed = sum(i >= round(f * epochs * updates_per_epoch) for f in drops)
            for group in optimizer.param_groups:
                group["lr"] = lr * 0.1**passed
        if i % updates_per_epoch == 0:  # each set as drawn at construction, every epoch
            xs, ys = zip(*(c.data.epoch() for c in chosen), strict=True)
            current.update(epoch=i // updates_per_epoch + 1, x=torch.stack(xs), y=torch.stack(ys))
        x, y = current["x"], current["y"]
        index = next(batches)  # (G, B)
        losses = together.cross_entropy(stack(x[rows, index]), y[rows, index])
        # + (lambda_g / 2) ||theta_g||^2 for each network g (nothing to add where every lambda is 0)
        for p in stack.parameters() if decay.any() else ():
            losses = losses + (decay.view(-1, *[1] * (p.dim() - 1)) / 2 * p.square()).flatten(
                1
            ).sum(1)
        return losses

    def evaluate() -> dict[str, torch.Tensor]:
        epoch, x, y = current["epoch"], current["x"], current["y"]
        if val is not None and epoch > epochs - val_epochs:
            val_logits = stack.on_all(val[0])
            val_loss = together.cross_entropy(val_logits, val[1])
            val_right = together.accuracy(val_logits, val[1])
            for g, validation in enumerate(validations):
                metrics = {"val_accuracy": val_right[g].item(), "val_loss": val_loss[g].item()}
                validation.log(epoch * updates_per_epoch, metrics)
        if epoch == epochs or len(traced) == len(chosen):
            test = together.accuracy(stack(test_x), test_y)
        else:  # only the traced networks, the others NaN until the end
            test = torch.full((len(chosen),), torch.nan)
            logits = eval_logits(stack, traced, test_x[traced])
            test[traced] = together.accuracy(logits, test_y[traced]).to(test.dtype)
        return {"train_accuracy": together.accuracy(stack(x), y), "test_accuracy": test}

    histories = together.train(
        stack,
        optimizer,
        losses_of_update,
        epochs * updates_per_epoch,
        evaluate=evaluate,
        eval_every=measure_every * updates_per_epoch,
        desc="randomization tests",
    )
    runs = {}
    for g, (name, c) in enumerate(zip(names, chosen, strict=True)):
        fitted = histories[g].first_step_reaching("train_accuracy", 1.0)
        epochs_to_fit = None if fitted is None else fitted // updates_per_epoch
        model = stack.member(g)
        runs[name] = Run(
            model, histories[g], c.data, updates_per_epoch, epochs_to_fit, validations[g]
        )
    return runs


def eval_logits(stack: together.MLPStack, members: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The logits (G', M, C) of some members (indices (G',)) of a stack of `network`s on their
    inputs x (G', M, D), in eval mode (dropout off): each linear layer one batched product over
    those members alone, a ReLU between them, as `network` has."""
    h = x
    layers = list(zip(stack.weights, stack.biases, strict=True))
    for layer, (w, b) in enumerate(layers):
        h = torch.baddbmm(b[members].unsqueeze(1), h, w[members])
        if layer < len(layers) - 1:
            h = torch.relu(h)
    return h


def randomization_test(
    data: rethinking_generalization.RandomizedDigits,
    *,
    weight_decay: float = 0.0,
    dropout: float = 0.0,
    **settings,
) -> Run:
    """One condition's randomization test (`randomization_tests` with a single condition)."""
    if not isinstance(data, rethinking_generalization.RandomizedDigits):
        raise TypeError(f"data must be a RandomizedDigits; got {type(data).__name__}")
    condition = Condition(data, weight_decay=weight_decay, dropout=dropout)
    return randomization_tests({"run": condition}, **settings)["run"]


def weight_norm(run: Run) -> float:
    """||theta||, every parameter of the run's network."""
    return sum(p.detach().double().square().sum() for p in run.model.parameters()).sqrt().item()


def validation_score(run: Run, last: int = 20) -> float:
    """The run's validation cross-entropy averaged over its last `last` epochs: the score the
    regularisers are tuned on (the last epoch alone moves by more than the strengths differ)."""
    last = checks.integer("last", last)
    losses = run.validation["val_loss"] if "val_loss" in run.validation else []
    if len(losses) < last:
        raise ValueError(f"the run logged {len(losses)} validation losses; {last} are averaged")
    return sum(losses[-last:]) / last


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


def error_removed(plain: list[Run], regularised: list[Run]) -> tuple[float, float]:
    """The share of the plain runs' test error that the regularised runs remove, each pair from
    the same initial weights, and its standard error: (e_plain - e_reg) / e_plain with e the
    mean test error over the P pairs; the difference's standard error sqrt(sum_i (b_i + c_i)) /
    (N P) (b_i, c_i the test digits only one run of pair i gets right), divided by e_plain."""
    if not plain or len(plain) != len(regularised):
        raise ValueError("plain and regularised must be runs of the same pairs, one each")
    n, pairs = len(plain[0].data.test_y), len(plain)
    plain_error = sum(1 - r.test_accuracy for r in plain) / pairs
    regularised_error = sum(1 - r.test_accuracy for r in regularised) / pairs
    # sum_i (b_i + c_i), from each pair's paired standard error sqrt(b_i + c_i) / N
    discordant = sum(
        (paired_standard_error(a, b) * n) ** 2 for a, b in zip(plain, regularised, strict=True)
    )
    share = (plain_error - regularised_error) / plain_error
    return share, discordant**0.5 / (n * pairs) / plain_error


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
    # the sort and the hidden units written again here, so that the ablation (the Theorem 1
    # row's null) keeps its value whatever a mutant of the construction breaks
    order = (x @ a).argsort()
    z, y = (x @ a)[order], y[order]
    b = biases(z)
    A = torch.relu(z[:, None] - b[None, :])
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


# -- section 5: the kernel interpolant's null, and paired comparisons of predictions ------------


def plain_kernel_accuracy(
    x: torch.Tensor, labels: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, gamma: float
) -> float:
    """Test accuracy of the minimum-norm Gaussian-kernel interpolant of `labels`, computed by
    the experiment's own code (the nulls' route, out of the mechanism's reach)."""
    x, test_x = x.double(), test_x.double()
    K = torch.exp(-gamma * torch.cdist(x, x).square())
    Y = torch.nn.functional.one_hot(labels, 10).double()
    alpha = torch.linalg.solve(K, Y)
    scores = torch.exp(-gamma * torch.cdist(test_x, x).square()) @ alpha
    return (scores.argmax(1) == test_y).double().mean().item()


def descent_from_elsewhere(
    K: torch.Tensor, Y: torch.Tensor, start: torch.Tensor, steps: int, lr: float
) -> torch.Tensor:
    """The null of gradient descent from zero: the same descent on the same loss, written again
    here, started from a function f_0 that is not 0. `start` (N, C) is f_0 at the training
    points; the iterate is f_0 + sum_i alpha_i k(x_i, .), and the alpha (N, C) it ends at is
    returned. It fits the labels too, but keeps the part of f_0 outside the span of the k(x_i, .):
    a larger norm than the minimum."""
    alpha = torch.zeros_like(Y, dtype=torch.float64)
    for _ in range(checks.integer("steps", steps, 0)):
        alpha = alpha - lr * (start + K @ alpha - Y)
    return alpha


def warm_started_distance(
    x: torch.Tensor,
    Y: torch.Tensor,
    start_x: torch.Tensor,
    start_Y: torch.Tensor,
    gamma: float,
    steps: int,
    lr: float,
) -> float:
    """The null of gradient descent from zero, by the experiment's own code: the same descent
    on the labels Y (N, C) of x (N, D), started from the minimum-norm interpolant of other
    points start_x (M, D) with labels start_Y (M, C) (a warm start from another fit); the RKHS
    distance from where it ends to the minimum-norm interpolant of (x, Y), as a fraction of
    that interpolant's norm."""
    x, start_x, Y, start_Y = x.double(), start_x.double(), Y.double(), start_Y.double()

    def gram(a, b):
        return torch.exp(-gamma * torch.cdist(a, b).square())

    K, K_start, K_cross = gram(x, x), gram(start_x, start_x), gram(start_x, x)
    beta = torch.linalg.solve(K_start, start_Y)  # f_0 = sum_j beta_j k(z_j, .)
    alpha = descent_from_elsewhere(K, Y, K_cross.T @ beta, steps, lr)
    delta = alpha - torch.linalg.solve(K, Y)  # f_T - f* = f_0 + sum_i delta_i k(x_i, .)
    # ||f_T - f*||^2 = beta^T K_zz beta + 2 beta^T K_zx delta + delta^T K delta (over the C)
    squared = (beta * (K_start @ beta)).sum() + 2 * (beta * (K_cross @ delta)).sum()
    squared = squared + (delta * (K @ delta)).sum()
    optimum = torch.linalg.solve(K, Y)
    return (squared.sqrt() / (optimum * (K @ optimum)).sum().sqrt()).item()


def masked_training_fit(run: Run, *, seed: int, draws: int = 10) -> dict[str, float]:
    """The run's accuracy and cross-entropy on its own training set with its dropout masks on,
    as its updates see them (training mode, averaged over `draws` draws of the masks from the
    seed), and with them off (eval mode)."""
    x, y = run.data.epoch()
    draws = checks.integer("draws", draws)
    model = run.model
    with torch.no_grad():
        off = model(x)
        model.train()
        try:
            with training.seeded(seed):
                on = [model(x) for _ in range(draws)]
        finally:
            model.eval()
    return {
        "accuracy, masks on": sum(training.accuracy(logits, y) for logits in on) / draws,
        "cross-entropy, masks on": sum(F.cross_entropy(logits, y).item() for logits in on) / draws,
        "accuracy, masks off": training.accuracy(off, y),
        "cross-entropy, masks off": F.cross_entropy(off, y).item(),
    }


def paired_prediction_error(first: torch.Tensor, second: torch.Tensor, truth: torch.Tensor):
    """The standard error of the difference of two classifiers' accuracies from their
    predictions (N,) on the same N examples: sqrt(b + c) / N, b and c the examples only one of
    them gets right."""
    n = checks.tensor("truth", truth, "(N,)")["N"]
    checks.tensor("first", first, "(N,)", N=n)
    checks.tensor("second", second, "(N,)", N=n)
    discordant = ((first == truth) != (second == truth)).sum().item()
    return discordant**0.5 / n


def predictions(run: Run) -> torch.Tensor:
    """The run's network's classes for its test set."""
    with training.evaluating(run.model):
        return run.model(run.data.test_x).argmax(-1)
