r"""Understanding deep learning requires rethinking generalization.

Zhang, Bengio, Hardt, Recht & Vinyals, ICLR 2017 (arXiv:1611.03530). The module follows the
paper in order.

1. **Randomization tests** (the paper's section 2). The same network, optimiser and schedule,
   with no explicit regulariser, are trained on training sets whose information is destroyed
   step by step. Each corruption is drawn **once**, before training, and the network sees the
   same labelled set in every epoch (a corruption drawn afresh each epoch is a moving target
   that no network can fit).

   - *Partially corrupted labels*, `corrupt_labels`: independently for each example, with
     probability $p$, the label $y_i$ is replaced by a class drawn uniformly from the $C$ classes
     (so it still equals the true one with probability $1 - p + p/C$). $p = 1$: *random labels*.
   - *Shuffled pixels*, `randomize_inputs(x, "shuffled_pixels")`: one permutation $\pi$ of the
     $d$ pixels, drawn once, for every image: $x'_i = x_{i,\pi}$.
   - *Random pixels*, `"random_pixels"`: a permutation of its own for each image,
     $x'_i = x_{i,\pi_i}$.
   - *Gaussian*, `"gaussian"`: every image replaced by noise $x'_{ij} \sim N(\mu, \sigma^2)$,
     with the mean and variance of the data set's pixels.

   Input randomizations keep the labels; they are applied to the training and test images alike
   (one draw over both, so shuffled pixels use the same $\pi$ on the test set).

2. **The measurement**: training accuracy on the whole training set after every epoch (an epoch
   is $N / B$ updates of $B$ examples), the number of epochs until it reaches 100%, and the test
   error once the training set is fitted. `randomization_test` runs one condition.

3. **Finite-sample expressivity** (section 4, Theorem 1). A two-layer ReLU network with
   $2n + d$ weights,

   $$c(x) = \sum_{j=1}^{n} w_j \max(\langle a, x\rangle - b_j,\, 0),
     \qquad a \in \mathbb{R}^d,\ b, w \in \mathbb{R}^n,$$

   can take any values $y$ on any $n$ distinct points $x_1, \dots, x_n \in \mathbb{R}^d$. Pick
   $a$ so that the projections $z_i = \langle a, x_i\rangle$ are distinct, and number the points
   so that $z_1 < \dots < z_n$; interleave the biases, $b_1 < z_1 < b_2 < z_2 < \dots < b_n < z_n$.
   Then $A_{ij} = \max(z_i - b_j, 0)$ is lower triangular ($z_i < b_j$ when $j > i$) with a
   positive diagonal, so it is invertible, and $w = A^{-1} y$ gives $c(x_i) = (A w)_i = y_i$.
   `finite_sample_expressivity` builds it in float64.

Arguments are checked where they enter (`corrupt_labels`, `randomize_inputs`, `RandomizedDigits`,
`randomization_test`, `finite_sample_expressivity`); the helpers below them trust their input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, generator, seeded, train

INPUT_MODES = ("shuffled_pixels", "random_pixels", "gaussian")
INPUTS = ("real", *INPUT_MODES)  # "real": the images as they are
LABEL_STREAM, INPUT_STREAM, BATCH_STREAM = 1, 2, 3  # random streams of a randomization test

# -- 1. Randomization tests ------------------------------------------------------------------------


def corrupt_labels(
    labels: torch.Tensor,
    fraction: float,
    num_classes: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A copy of `labels` (N,) in which each label, independently with probability `fraction`,
    is replaced by a class drawn uniformly from `num_classes` (it may draw its own class again).

    Drawn once: call it before training and train on what it returns.
    """
    n = checks.tensor("labels", labels, "(N,)", dtype=torch.int64)["N"]
    fraction = checks.number("fraction", fraction, 0.0, 1.0)
    num_classes = checks.integer("num_classes", num_classes, 2)
    if n and not (0 <= labels.min() and labels.max() < num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes - 1}] (num_classes = {num_classes})")
    return replace_labels(labels, fraction, num_classes, generator)


def replace_labels(labels, fraction, num_classes, generator=None) -> torch.Tensor:
    """mask_i ~ Bernoulli(p); y'_i = U{0, ..., C-1} where mask_i, else y_i."""
    mask = torch.rand(labels.shape, generator=generator) < fraction
    random = torch.randint(num_classes, labels.shape, generator=generator)
    return torch.where(mask, random, labels)


def randomize_inputs(
    x: torch.Tensor, mode: str, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Images (N, D) with their information destroyed: `mode` is "shuffled_pixels" (one
    permutation of the D pixels for all images), "random_pixels" (a permutation per image) or
    "gaussian" (i.i.d. N(mu, sigma^2) pixels, mu and sigma those of all pixels of x)."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    checks.one_of("mode", mode, INPUT_MODES)
    if mode == "shuffled_pixels":
        return shuffle_pixels(x, generator)
    if mode == "random_pixels":
        return random_pixels(x, generator)
    return gaussian_pixels(x, generator)


def shuffle_pixels(x, generator=None) -> torch.Tensor:
    """x'_i = x_{i, pi}: one permutation pi for every image."""
    return x[:, torch.randperm(x.shape[1], generator=generator)]


def random_pixels(x, generator=None) -> torch.Tensor:
    """x'_i = x_{i, pi_i}: a permutation pi_i of its own for each image."""
    permutations = torch.rand(x.shape, generator=generator).argsort(dim=1)
    return x.gather(1, permutations)


def gaussian_pixels(x, generator=None) -> torch.Tensor:
    """x'_ij ~ N(mu, sigma^2), with the mean and standard deviation of all pixels of x."""
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return x.mean() + x.std() * noise


def distinct_subset(
    x: torch.Tensor, y: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """n examples drawn at random among the distinct images of x (N, D), with their labels.

    Two copies of one image would get two independent random labels that no classifier can
    both fit; duplicates are dropped before the draw.
    """
    count = checks.tensor("x", x, "(N, D)")["N"]
    checks.tensor("y", y, "(N,)", N=count)
    keep = first_occurrences(x)
    n = checks.integer("n", n)
    if n > len(keep):
        raise ValueError(f"n must be at most the {len(keep)} distinct images of x; got {n}")
    chosen = keep[torch.randperm(len(keep), generator=generator)[:n]].sort().values
    return x[chosen], y[chosen]


def first_occurrences(x: torch.Tensor) -> torch.Tensor:
    """Indices of the first copy of each distinct row of x, in order."""
    if len(x) == 0:
        return torch.zeros(0, dtype=torch.int64)
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), len(x), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(len(x)), reduce="amin")
    return first.sort().values


class RandomizedDigits:
    """One condition of the randomization tests: a training set and a test set, randomized once.

    Like the authors' `CIFAR10RandomLabels`, the corruption is drawn when the set is built.
    `corruption` is the label corruption probability p (the training labels only: the test
    labels stay true, so the test error measures the real task); `inputs` is "real" or an input
    randomization, applied to training and test images in one draw. `epoch()` is what every
    epoch trains on: the same images and labels each time.
    """

    def __init__(
        self,
        train_x: torch.Tensor,
        train_y: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        *,
        corruption: float = 0.0,
        inputs: str = "real",
        num_classes: int = 10,
        seed: int = 0,
    ):
        n, d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating").values()
        checks.tensor("train_y", train_y, "(N,)", N=n)
        m = checks.tensor("test_x", test_x, "(M, D)", D=d, dtype="floating")["M"]
        checks.tensor("test_y", test_y, "(M,)", M=m)
        checks.one_of("inputs", inputs, INPUTS)
        self.corruption = checks.number("corruption", corruption, 0.0, 1.0)
        self.inputs = inputs
        self.num_classes = checks.integer("num_classes", num_classes, 2)
        self.clean_y = train_y
        self.train_y = corrupt_labels(
            train_y, corruption, num_classes, generator(seed, LABEL_STREAM)
        )
        self.test_y = test_y
        if inputs == "real":
            self.train_x, self.test_x = train_x, test_x
        else:
            both = randomize_inputs(
                torch.cat([train_x, test_x]), inputs, generator(seed, INPUT_STREAM)
            )
            self.train_x, self.test_x = both[:n], both[n:]

    def epoch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training images and labels of one epoch: those drawn at construction."""
        return self.train_x, self.train_y

    @property
    def changed_fraction(self) -> float:
        """The fraction of training labels that differ from the true ones."""
        return (self.train_y != self.clean_y).double().mean().item()


# -- 2. The measurement: epochs to fit, test error once fitted -------------------------------------


def mlp(
    n_inputs: int = 64, hidden: int = 512, depth: int = 2, n_classes: int = 10
) -> nn.Sequential:
    """A ReLU network: `depth` hidden layers of `hidden` units (no dropout, no normalisation)."""
    widths = [n_inputs] + [hidden] * depth
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], n_classes))


@dataclass
class Run:
    """A randomization test's run: per epoch (the History's steps count updates) the training
    loss, the training accuracy on the whole training set and the test accuracy; the epoch at
    which the training accuracy first reached 100% (None: not within `max_epochs`)."""

    data: RandomizedDigits
    history: History
    updates_per_epoch: int
    epochs_to_fit: int | None
    model: nn.Module = field(repr=False)

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
    data: RandomizedDigits,
    *,
    seed: int = 0,
    max_epochs: int = 300,
    lr: float = 1e-3,
    batch_size: int = 100,
    hidden: int = 512,
    depth: int = 2,
) -> Run:
    """Train `mlp` with Adam on `data` until it fits its training labels (100% training
    accuracy) or `max_epochs` have passed, measuring after every epoch.

    The seed fixes the initial weights and the order of the batches, so two conditions with one
    seed differ only in their data.
    """
    if not isinstance(data, RandomizedDigits):
        raise TypeError(f"data must be a RandomizedDigits; got {type(data).__name__}")
    checks.integer("seed", seed, 0)
    max_epochs = checks.integer("max_epochs", max_epochs)
    checks.number("lr", lr, 0.0, low_open=True)
    batch_size = checks.integer("batch_size", batch_size)
    n = len(data.train_x)
    if batch_size > n:
        raise ValueError(f"batch_size must be at most the {n} training examples; got {batch_size}")
    with seeded(seed):
        model = mlp(
            data.train_x.shape[1],
            checks.integer("hidden", hidden),
            checks.integer("depth", depth),
            data.num_classes,
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = minibatches(n, batch_size, generator(seed, BATCH_STREAM))
    updates_per_epoch = n // batch_size
    history, epochs_to_fit = History(), None
    for epoch in range(1, max_epochs + 1):
        x, y = data.epoch()

        def loss_of_update(_, x=x, y=y):
            index = next(batches)
            return F.cross_entropy(model(x[index]), y[index])

        def evaluate(x=x, y=y):
            return {
                "train_accuracy": accuracy(model(x), y),
                "test_accuracy": accuracy(model(data.test_x), data.test_y),
            }

        one = train(
            model,
            optimizer,
            loss_of_update,
            updates_per_epoch,
            evaluate=evaluate,
            desc=f"epoch {epoch}",
        )
        history.log(epoch * updates_per_epoch, {k: v[-1] for k, v in one.metrics.items()})
        if history.final("train_accuracy") == 1.0:
            epochs_to_fit = epoch
            break
    return Run(data, history, updates_per_epoch, epochs_to_fit, model)


# -- 3. Finite-sample expressivity (Theorem 1) -----------------------------------------------------


class TwoLayerReLU(nn.Module):
    """c(x) = sum_j w_j max(<a, x> - b_j, 0): a (d,), b (n,), w (n,), so 2n + d parameters."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.a, self.b, self.w = nn.Parameter(a), nn.Parameter(b), nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, d) -> c(x) (N,)."""
        return hidden_units(x @ self.a, self.b) @ self.w


def hidden_units(z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A_ij = max(z_i - b_j, 0) for projections z (N,) and biases b (n,): shape (N, n)."""
    return torch.relu(z[:, None] - b[None, :])


def interleaved_biases(z: torch.Tensor) -> torch.Tensor:
    """b_1 < z_1 < b_2 < z_2 < ... < b_n < z_n for sorted z: b_j halfway between z_{j-1} and
    z_j, and b_1 as far below z_1 as b_2 is (one unit below when n = 1)."""
    if len(z) == 1:
        return z - 1.0
    midpoints = (z[:-1] + z[1:]) / 2
    return torch.cat([(2 * z[0] - midpoints[0]).reshape(1), midpoints])


def finite_sample_expressivity(
    x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None = None
) -> TwoLayerReLU:
    """The paper's Theorem 1 network, in float64: c(x_i) = y_i on the n points x (n, d), with
    exactly 2n + d parameters.

    `generator` draws the direction a (a Gaussian vector: distinct points then project to
    distinct z_i with probability one). A point given twice with one value counts once in n; a
    point given twice with two values cannot be fitted by any function and raises ValueError.
    """
    n, d = checks.tensor("x", x, "(n, d)", dtype="floating").values()
    checks.tensor("y", y, "(n,)", n=n)
    if n == 0 or d == 0:
        raise ValueError(
            f"x must hold at least one point of at least one coordinate; got {n} x {d}"
        )
    x, y = x.double(), y.double()
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    conflict = conflicting_duplicates(x, y)
    if conflict is not None:
        i, j = conflict
        raise ValueError(
            f"x has duplicate points with different labels: rows {i} and {j} are the same "
            f"point, labelled {y[i].item():g} and {y[j].item():g}, and no function (so no "
            "network) takes two values at one point"
        )
    keep = first_occurrences(x)
    return theorem_1_network(x[keep], y[keep], generator)


def theorem_1_network(x, y, generator=None) -> TwoLayerReLU:
    """The construction on distinct points x (n, d) with values y (n,), both float64."""
    a = projection_direction(x, generator)  # z_i = <a, x_i> distinct
    z, y = sort_by_projection(x @ a, y)  # z_1 < z_2 < ... < z_n
    b = interleaved_biases(z)  # b_1 < z_1 < b_2 < ... < b_n < z_n
    w = output_weights(hidden_units(z, b), y)  # w = A^{-1} y, A_ij = max(z_i - b_j, 0)
    return TwoLayerReLU(a, b, w)


def projection_direction(
    x: torch.Tensor, generator: torch.Generator | None = None, candidates: int = 8
) -> torch.Tensor:
    """A direction a (d,) along which the distinct points x (n, d) project to distinct z_i.

    Any Gaussian a will do in exact arithmetic (equal projections have probability zero). In
    float64 the fit loses digits as the gaps between neighbouring z_i shrink (w_j changes the
    slope by up to |y_i - y_{i-1}| / (z_i - z_{i-1})), so we draw `candidates` directions and
    keep the one whose smallest gap is the largest fraction of the spread of z.
    """
    best, best_score = None, -1.0
    for _ in range(candidates):
        a = torch.randn(x.shape[1], generator=generator, dtype=torch.float64)
        z = (x @ a).sort().values
        gaps = z[1:] - z[:-1]
        score = (gaps.min() / (z[-1] - z[0])).item() if len(z) > 1 else 1.0
        if score > best_score:
            best, best_score = a, score
    if best_score <= 0:
        raise ValueError(
            f"no direction out of {candidates} separates the points of x: some project to one "
            "z = <a, x>"
        )
    return best


def sort_by_projection(z: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Number the points so that z_1 < z_2 < ... < z_n; their values y follow them."""
    order = z.argsort()
    return z[order], y[order]


def output_weights(A: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """w = A^{-1} y, by forward substitution: A is lower triangular with a positive diagonal."""
    return torch.linalg.solve_triangular(A, y[:, None], upper=False)[:, 0]


def biases_below_the_points(z: torch.Tensor) -> torch.Tensor:
    """The ablation: n biases spread over an interval below z_1, none between the points.

    Then A_ij = z_i - b_j for every i and j: A = z 1^T - 1 b^T has rank 2, and c(x) can only be
    an affine function of z.
    """
    spread = (z.max() - z.min()).clamp_min(1.0)
    return z.min() - spread * torch.arange(1, len(z) + 1, dtype=z.dtype) / len(z)


def least_squares_network(
    x: torch.Tensor, y: torch.Tensor, biases, generator: torch.Generator | None = None
) -> TwoLayerReLU:
    """A network of the same shape (a, b, w) with b = biases(sorted z) and the w that fits y
    best in least squares: the ablation of the construction."""
    checks.tensor("x", x, "(n, d)", dtype="floating")
    x, y = x.double(), y.double()
    a = projection_direction(x, generator)
    z, y = sort_by_projection(x @ a, y)
    b = biases(z)
    w = torch.linalg.lstsq(hidden_units(z, b), y[:, None], driver="gelsd").solution[:, 0]
    return TwoLayerReLU(a, b, w)


def conflicting_duplicates(x: torch.Tensor, y: torch.Tensor) -> tuple[int, int] | None:
    """Two rows i < j with x_i = x_j and y_i != y_j, or None."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    first: dict[int, int] = {}
    for j, group in enumerate(inverse.tolist()):
        i = first.setdefault(group, j)
        if y[i] != y[j]:
            return i, j
    return None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def max_fit_error(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """max_i |c(x_i) - y_i|, in float64."""
    with torch.no_grad():
        return (model(x.double()) - y.double()).abs().max().item()
