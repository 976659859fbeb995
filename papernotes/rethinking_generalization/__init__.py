r"""Understanding deep learning requires rethinking generalization.

Zhang, Bengio, Hardt, Recht & Vinyals, ICLR 2017 (arXiv:1611.03530). The paper trains the same
networks, with no explicit regulariser, on training sets whose information is destroyed step by
step (labels replaced at random, pixels shuffled or replaced by noise) and finds that they fit
every one of them to zero training error, only somewhat more slowly, while the test error goes
to chance: the capacity to memorise is there, so what makes networks generalise is not their
size alone. It backs this with a construction: a two-layer ReLU network with 2n + d weights fits
any labelling of any n points (Theorem 1). The chapter (chapters/rethinking_generalization.ipynb,
"The idea") derives both; this module holds the randomizations, each drawn once before training,
and the Theorem 1 construction, in the paper's order, each equation in a comment above the lines
that compute it.

The network trained on the randomized sets, the randomization test's loop and the chapter's
measurements live in `papernotes.rethinking_generalization.experiment`. Arguments are checked
where they enter (`corrupt_labels`, `randomize_inputs`, `RandomizedDigits`,
`finite_sample_expressivity`); the cores below them trust their input.
"""

from __future__ import annotations

import torch
from torch import nn

from papernotes import checks
from papernotes.training import generator

INPUT_MODES = ("shuffled_pixels", "random_pixels", "gaussian")
INPUTS = ("real", *INPUT_MODES)  # "real": the images as they are
# The random streams of a randomized set (generator(seed, stream)): its labels and its inputs.
# The experiment's batches draw from stream 3 (experiment.BATCHES).
LABEL_STREAM, INPUT_STREAM = 1, 2

# -- 1. Randomization tests (section 2) ------------------------------------------------------------


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
    """Partially corrupted labels; p = 1 gives random labels. A replaced label still equals the
    true one with probability 1/C, so a label is right with probability 1 - p + p/C."""
    # mask_i ~ Bernoulli(p); y'_i = U{0, ..., C-1} where mask_i, else y_i
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
    """Shuffled pixels: one permutation for every image (training and test alike)."""
    # x'_i = x_{i, pi}
    return x[:, torch.randperm(x.shape[1], generator=generator)]


def random_pixels(x, generator=None) -> torch.Tensor:
    """Random pixels: a permutation of its own for each image."""
    # x'_i = x_{i, pi_i}, pi_i the argsort of i.i.d. uniform keys (a uniform permutation)
    permutations = torch.rand(x.shape, generator=generator).argsort(dim=1)
    return x.gather(1, permutations)


def gaussian_pixels(x, generator=None) -> torch.Tensor:
    """Gaussian: every image replaced by noise with the mean and standard deviation of all
    pixels of x."""
    # x'_ij ~ N(mu, sigma^2)
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return x.mean() + x.std() * noise


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
        # Drawn once: a corruption drawn afresh each epoch would be a moving target that no
        # network can fit.
        return self.train_x, self.train_y

    @property
    def changed_fraction(self) -> float:
        """The fraction of training labels that differ from the true ones."""
        return (self.train_y != self.clean_y).double().mean().item()


# -- 2. Finite-sample expressivity (section 4, Theorem 1) ------------------------------------------


class TwoLayerReLU(nn.Module):
    """The two-layer ReLU network of Theorem 1: a (d,), b (n,), w (n,), so 2n + d parameters."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.a, self.b, self.w = nn.Parameter(a), nn.Parameter(b), nn.Parameter(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, d) -> c(x) (N,)."""
        # c(x) = sum_j w_j max(<a, x> - b_j, 0)
        return hidden_units(x @ self.a, self.b) @ self.w


def hidden_units(z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The hidden units' outputs for projections z (N,) and biases b (n,): shape (N, n)."""
    # A_ij = max(z_i - b_j, 0)
    return torch.relu(z[:, None] - b[None, :])


def interleaved_biases(z: torch.Tensor) -> torch.Tensor:
    """Biases that interleave the sorted z: b_j halfway between z_{j-1} and z_j, and b_1 as far
    below z_1 as b_2 is (one unit below when n = 1). Then z_i < b_j when j > i, so A is lower
    triangular with a positive diagonal, hence invertible."""
    # b_1 < z_1 < b_2 < z_2 < ... < b_n < z_n
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
    """The output weights, by forward substitution: A is lower triangular with a positive
    diagonal."""
    # w = A^{-1} y, so that c(x_i) = (A w)_i = y_i
    return torch.linalg.solve_triangular(A, y[:, None], upper=False)[:, 0]


def conflicting_duplicates(x: torch.Tensor, y: torch.Tensor) -> tuple[int, int] | None:
    """Two rows i < j with x_i = x_j and y_i != y_j, or None."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    first: dict[int, int] = {}
    for j, group in enumerate(inverse.tolist()):
        i = first.setdefault(group, j)
        if y[i] != y[j]:
            return i, j
    return None


# -- 3. Appealing to linear models: the minimum-norm kernel interpolant (section 5) ---------------


def gaussian_kernel(x: torch.Tensor, z: torch.Tensor, gamma: float) -> torch.Tensor:
    """The Gram matrix (N, M) of the Gaussian kernel between the rows of x (N, D) and z (M, D)."""
    # k(x, z) = exp(-gamma ||x - z||^2)
    return torch.exp(-gamma * torch.cdist(x.double(), z.double()).square())


class KernelInterpolant:
    """The minimum-norm interpolant of one-hot labels in the Gaussian kernel's RKHS.

    Of all functions f = (f_1, ..., f_C) of the RKHS that take the labels' one-hot values on the
    training points, the one of least norm is f_c(x) = sum_i alpha_ic k(x_i, x) with K alpha = Y
    (K the training points' Gram matrix): the kernel form of the paper's minimum-norm solution
    of X w = y, reached by gradient descent from zero. It fits every training label exactly,
    whatever the labels; the class of a point is its largest f_c.
    """

    def __init__(self, x: torch.Tensor, labels: torch.Tensor, gamma: float, num_classes: int):
        n = checks.tensor("x", x, "(N, D)", dtype="floating")["N"]
        checks.tensor("labels", labels, "(N,)", N=n, dtype=torch.int64)
        self.gamma = checks.number("gamma", gamma, 0.0, low_open=True)
        self.num_classes = checks.integer("num_classes", num_classes, 2)
        if n and not (0 <= labels.min() and labels.max() < num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes - 1}]")
        if len(first_occurrences(x)) != n:
            raise ValueError("x has duplicate points: their Gram matrix is singular")
        self.x = x.double()
        self.K = gaussian_kernel(self.x, self.x, self.gamma)
        self.Y = torch.nn.functional.one_hot(labels, num_classes).double()
        self.alpha = interpolate(self.K, self.Y)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) (M, C) at the rows of x (M, D)."""
        checks.tensor("x", x, "(M, D)", D=self.x.shape[1], dtype="floating")
        # f_c(x) = sum_i alpha_ic k(x_i, x)
        return gaussian_kernel(x, self.x, self.gamma) @ self.alpha

    @property
    def norm(self) -> float:
        """||f||, the RKHS norm of the interpolant."""
        return rkhs_norm(self.K, self.alpha)


def interpolate(K: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """The coefficients alpha (N, C) of the minimum-norm interpolant: K alpha = Y."""
    # alpha = K^{-1} Y (K is positive definite on distinct points)
    return torch.linalg.solve(K, Y)


def gradient_descent_interpolation(
    K: torch.Tensor, Y: torch.Tensor, steps: int, lr: float
) -> torch.Tensor:
    """The coefficients alpha (N, C) of f after `steps` steps of gradient descent on the squared
    loss (1/2) sum_i ||f(x_i) - y_i||^2 from f = 0, f = sum_i alpha_i k(x_i, .) in the RKHS (the
    paper's SGD on a linear model from w = 0, w = sum_i alpha_i phi(x_i) in the kernel's feature
    space). From zero, f never leaves the span of the k(x_i, .), so where it fits the labels it
    is the minimum-norm interpolant."""
    N = checks.tensor("K", K, "(N, N)", dtype="floating")["N"]
    checks.tensor("Y", Y, "(N, C)", N=N, dtype="floating")
    steps = checks.integer("steps", steps, 0)
    lr = checks.number("lr", lr, 0.0, low_open=True)
    return descend(K.double(), Y.double(), steps, lr)


def descend(K, Y, steps, lr) -> torch.Tensor:
    """The unchecked core of `gradient_descent_interpolation`."""
    alpha = torch.zeros_like(Y)  # f_0 = 0 (w_0 = 0)
    for _ in range(steps):
        # f <- f - eta sum_i (f(x_i) - y_i) k(x_i, .), i.e. alpha <- alpha - eta (K alpha - Y)
        alpha = alpha - lr * (K @ alpha - Y)
    return alpha


def rkhs_norm(K: torch.Tensor, alpha: torch.Tensor) -> float:
    """The RKHS norm of f_c = sum_i alpha_ic k(x_i, .), over the C outputs together."""
    # ||f||^2 = sum_c alpha_c^T K alpha_c
    return (alpha * (K @ alpha)).sum().sqrt().item()
