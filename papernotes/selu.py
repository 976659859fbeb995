r"""Self-normalizing neural networks: SELU, its moment map, LeCun initialisation, alpha-dropout.

Klambauer, Unterthiner, Mayr & Hochreiter 2017, *Self-Normalizing Neural Networks*, NeurIPS
(arXiv:1706.02515). The module follows the paper's argument in order.

1. **The activation.** The scaled exponential linear unit,

   $$\mathrm{selu}(x) = \lambda \begin{cases} x & x > 0 \\ \alpha\,(e^{x} - 1) & x \le 0,
     \end{cases}$$

   with two constants $\alpha$ and $\lambda > 1$ chosen so that (section 2) a layer maps zero
   mean and unit variance to zero mean and unit variance.

2. **The moment map** $g$. A unit of the next layer computes $z = \sum_i w_i x_i$ of $n$ inputs
   with mean $\mu$ and variance $\nu$. With $\omega = \sum_i w_i$ and $\tau = \sum_i w_i^2$, the
   central limit theorem makes $z$ Gaussian with mean $\mu\omega$ and variance $\nu\tau$, and
   the unit's output $y = \mathrm{selu}(z)$ has mean $\tilde\mu$ and second moment $\tilde\xi$
   in closed form (with $m = \mu\omega$, $v = \nu\tau$):

   $$\tilde\mu = \tfrac{\lambda}{2}\Big( m\,\mathrm{erf}\big(\tfrac{m}{\sqrt{2v}}\big)
       + \alpha\, e^{m + v/2}\, \mathrm{erfc}\big(\tfrac{m + v}{\sqrt{2v}}\big)
       - \alpha\, \mathrm{erfc}\big(\tfrac{m}{\sqrt{2v}}\big)
       + \sqrt{\tfrac{2}{\pi}}\sqrt{v}\, e^{-m^2/(2v)} + m \Big),$$

   $$\tilde\xi = \tfrac{\lambda^2}{2}\Big( (m^2 + v)
       \big(2 - \mathrm{erfc}(\tfrac{m}{\sqrt{2v}})\big)
       + \alpha^2 \Big(-2 e^{m + v/2} \mathrm{erfc}\big(\tfrac{m + v}{\sqrt{2v}}\big)
       + e^{2(m + v)} \mathrm{erfc}\big(\tfrac{m + 2v}{\sqrt{2v}}\big)
       + \mathrm{erfc}\big(\tfrac{m}{\sqrt{2v}}\big)\Big)
       + \sqrt{\tfrac{2}{\pi}}\, m \sqrt{v}\, e^{-m^2/(2v)} \Big),$$

   and $g(\mu, \nu) = (\tilde\mu, \tilde\nu)$ with $\tilde\nu = \tilde\xi - \tilde\mu^2$.

   **The constants.** Asking that $(0, 1)$ be a fixed point of $g$ for normalised weights
   ($\omega = 0$, $\tau = 1$), $\tilde\mu(0, 1) = 0$ and $\tilde\nu(0, 1) = 1$, gives two equations
   whose solution the paper writes in closed form:

   $$\alpha_{01} = -\frac{\sqrt{2/\pi}}{\mathrm{erfc}(1/\sqrt 2)\, e^{1/2} - 1} \approx 1.6733,$$

   $$\lambda_{01} = \big(1 - \mathrm{erfc}(1/\sqrt 2)\sqrt e\big)\sqrt{2\pi}\,
       \Big(2\,\mathrm{erfc}(\sqrt 2)\, e^2 + \pi\, \mathrm{erfc}(1/\sqrt 2)^2 e
       - 2(2 + \pi)\, \mathrm{erfc}(1/\sqrt 2)\sqrt e + \pi + 2\Big)^{-1/2} \approx 1.0507.$$

   **Stability.** The fixed point attracts: the Jacobian of $g$ at $(0, 1)$ has spectral norm
   below 1 (the paper: 0.7877), so $g$ is a contraction near it and, by Banach's fixed-point
   theorem, iterating it (stacking layers) converges to zero mean and unit variance.

3. **LeCun-normal initialisation.** Weights drawn from $\mathcal N(0, 1/n)$ give
   $\mathbb E[\omega] = 0$ and $\mathbb E[\tau] = 1$: the fixed point's conditions, at the start.

4. **Alpha-dropout.** Plain dropout sets inputs to 0, which is not where a SELU unit rests:
   for $x \to -\infty$ it saturates at $\alpha' = -\lambda\alpha$. Alpha-dropout sets dropped
   inputs to $\alpha'$ and then restores mean 0 and variance 1 with an affine map. With keep
   probability $q = 1 - p$ and $d \sim \mathrm{Bernoulli}(q)$,

   $$x \mapsto a\big(x d + \alpha'(1 - d)\big) + b,\qquad
     a = \big(q + \alpha'^2 q (1 - q)\big)^{-1/2},\quad b = -a\,(1 - q)\,\alpha'.$$

5. **Experiments**: the mean and variance of activations layer after layer in deep random
   networks (SELU against ReLU, tanh and ELU, with or without a dropout), and a deep
   self-normalizing classifier against a ReLU network of the same depth without normalisation,
   trained through the book's one training loop.

The constants, the moment map and everything that uses them read `ALPHA`, `LAMBDA` and the
functions of this module when called, so that a patched module (tests/mutants/selu.py) is seen
everywhere. Arguments are checked where they enter (`selu`, `alpha_dropout`,
`alpha_dropout_affine`, `moment_map`, `lecun_normal_`, `forward_statistics`, `mlp`,
`train_classifier`); the helpers below them trust their input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, generator, seeded, train

# -- 1. the activation and its constants ----------------------------------------------------------


def fixed_point_constants() -> tuple[float, float]:
    r"""The paper's closed form of $(\alpha_{01}, \lambda_{01})$: the SELU whose moment map
    fixes $(\mu, \nu) = (0, 1)$ when $\omega = 0$, $\tau = 1$ (module docstring, section 2)."""
    e, pi = math.e, math.pi
    c = math.erfc(1 / math.sqrt(2))
    alpha = -math.sqrt(2 / pi) / (c * math.exp(0.5) - 1)
    root = 2 * math.erfc(math.sqrt(2)) * e**2 + pi * c**2 * e - 2 * (2 + pi) * c * math.sqrt(e)
    lam = (1 - c * math.sqrt(e)) * math.sqrt(2 * pi) * (root + pi + 2) ** -0.5
    return alpha, lam


ALPHA, LAMBDA = fixed_point_constants()  # 1.6732632423543772..., 1.0507009873554805...


def selu(x: torch.Tensor) -> torch.Tensor:
    r"""$\lambda x$ for $x > 0$, $\lambda\alpha(e^x - 1)$ for $x \le 0$, elementwise.

    The bracket is an ELU with parameter $\alpha$ (x for x > 0, $\alpha(e^x - 1)$ otherwise),
    which torch computes in one fused step, forward and backward.
    """
    _check_floating("x", x)
    return LAMBDA * F.elu(x, alpha=ALPHA)


def _check_floating(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point tensor; got {got}")


class SELU(nn.Module):
    """`selu` as a layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return selu(x)


# -- 2. the moment map ----------------------------------------------------------------------------


def moment_map(mu, nu, omega=0.0, tau=1.0, *, alpha=None, lam=None):
    r"""The next layer's mean and variance, $g(\mu, \nu) = (\tilde\mu, \tilde\nu)$, in closed form.

    `mu`, `nu` are the inputs' mean and variance, `omega` $= \sum_i w_i$ and `tau`
    $= \sum_i w_i^2$ summarise a unit's weights; each may be a number or a tensor (they
    broadcast). Returns two float64 tensors (mean, variance). `alpha` and `lam` default to the
    SELU constants; other values give the map of another scaled ELU (ELU: 1 and 1).
    """
    mu, nu, omega, tau = (
        _float64(name, v)
        for name, v in zip(("mu", "nu", "omega", "tau"), (mu, nu, omega, tau), strict=True)
    )
    for name, value in (("nu", nu), ("tau", tau)):
        if not (value > 0).all():
            raise ValueError(f"{name} must be positive (a variance, a sum of squares); got {value}")
    alpha = ALPHA if alpha is None else checks.number("alpha", alpha, 0.0)
    lam = LAMBDA if lam is None else checks.number("lam", lam, 0.0, low_open=True)
    return _moments(mu, nu, omega, tau, alpha, lam)


def _float64(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(
                f"{name} must be a number or a floating-point tensor; got {value.dtype}"
            )
        value = value.to(torch.float64)
    else:
        value = torch.tensor(checks.number(name, value), dtype=torch.float64)
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def _moments(mu, nu, omega, tau, alpha, lam):
    """The closed forms of the module docstring, section 2 (float64 tensors in and out)."""
    m, v = mu * omega, nu * tau
    s = torch.sqrt(2 * v)
    gauss = math.sqrt(2 / math.pi) * torch.sqrt(v) * torch.exp(-(m**2) / (2 * v))
    erfc_m, erfc_mv = torch.erfc(m / s), torch.erfc((m + v) / s)
    mean = (lam / 2) * (
        m * torch.erf(m / s) + alpha * torch.exp(m + v / 2) * erfc_mv - alpha * erfc_m + gauss + m
    )
    second = (lam**2 / 2) * (
        (m**2 + v) * (2 - erfc_m)
        + alpha**2
        * (
            -2 * torch.exp(m + v / 2) * erfc_mv
            + torch.exp(2 * (m + v)) * torch.erfc((m + 2 * v) / s)
            + erfc_m
        )
        + m * gauss
    )
    return mean, second - mean**2


def moment_map_jacobian(mu=0.0, nu=1.0, omega=0.0, tau=1.0) -> torch.Tensor:
    r"""The 2x2 Jacobian $\partial(\tilde\mu, \tilde\nu) / \partial(\mu, \nu)$ by autograd in
    float64; rows (mean, variance), columns (mu, nu)."""
    point = torch.stack([_float64("mu", mu), _float64("nu", nu)])
    omega, tau = _float64("omega", omega), _float64("tau", tau)

    def g(p):
        return torch.stack(moment_map(p[0], p[1], omega, tau))

    return torch.autograd.functional.jacobian(g, point)


def spectral_norm(matrix: torch.Tensor) -> float:
    """The largest singular value."""
    return torch.linalg.matrix_norm(matrix, ord=2).item()


def iterate_moment_map(mu, nu, steps: int, omega=0.0, tau=1.0) -> torch.Tensor:
    """(steps + 1, 2): the start and `steps` applications of the moment map, as (mean, variance):
    what a stack of `steps` layers with these weight statistics does to the moments."""
    steps = checks.integer("steps", steps, 0)
    mu, nu = _float64("mu", mu), _float64("nu", nu)
    path = [torch.stack([mu, nu])]
    for _ in range(steps):
        mu, nu = moment_map(mu, nu, omega, tau)
        path.append(torch.stack([mu, nu]))
    return torch.stack(path)


# -- 3. LeCun-normal initialisation ---------------------------------------------------------------


def lecun_normal_(tensor: torch.Tensor, *, generator: torch.Generator | None = None):
    r"""Fill a weight (out, in, ...) in place from $\mathcal N(0, 1/n)$, $n$ = fan-in, so that
    $\mathbb E[\omega] = 0$ and $\mathbb E[\tau] = 1$ for every unit. Returns the tensor."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"tensor must be a weight of shape (out, in, ...); got {got}")
    fan_in = tensor[0].numel()
    with torch.no_grad():
        return tensor.normal_(0.0, math.sqrt(1.0 / fan_in), generator=generator)


# -- 4. alpha-dropout -----------------------------------------------------------------------------


def alpha_dropout_affine(p: float) -> tuple[float, float]:
    r"""The paper's $(a, b)$ for drop rate `p`: with keep probability $q = 1 - p$ and
    $\alpha' = -\lambda\alpha$, $a = (q + \alpha'^2 q(1 - q))^{-1/2}$, $b = -a(1 - q)\alpha'$."""
    q = 1.0 - checks.number("p", p, 0.0, 1.0, high_open=True)
    saturation = -LAMBDA * ALPHA
    a = (q + saturation**2 * q * (1 - q)) ** -0.5
    b = -a * (1 - q) * saturation
    return a, b


def alpha_dropout(
    x: torch.Tensor,
    p: float,
    training: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Alpha-dropout: $a(x d + \alpha'(1 - d)) + b$ with $d \sim \mathrm{Bernoulli}(1 - p)$
    elementwise; the identity when not training."""
    _check_floating("x", x)
    p = checks.number("p", p, 0.0, 1.0, high_open=True)
    if not training or p == 0.0:
        return x
    a, b = alpha_dropout_affine(p)
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return a * (x * keep + (-LAMBDA * ALPHA) * (1 - keep)) + b


def plain_dropout(
    x: torch.Tensor, p: float, training: bool = True, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Standard (inverted) dropout, the ablation: x * d / (1 - p), d ~ Bernoulli(1 - p)."""
    p = checks.number("p", p, 0.0, 1.0, high_open=True)
    if not training or p == 0.0:
        return x
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return x * keep / (1.0 - p)


# -- 5a. statistics of deep random networks -------------------------------------------------------

ACTIVATIONS = ("selu", "relu", "tanh", "elu")
DROPOUTS = ("none", "dropout", "alpha_dropout")


def activation(name: str):
    """The activation function of that name (SELU is this module's, read when called)."""
    checks.one_of("activation", name, ACTIVATIONS)
    return {"selu": selu, "relu": F.relu, "tanh": torch.tanh, "elu": F.elu}[name]


def forward_statistics(
    name: str,
    *,
    depth: int = 32,
    width: int = 256,
    n: int = 256,
    init_scale: float = 1.0,
    dropout: str = "none",
    p: float = 0.1,
    seed: int = 0,
) -> torch.Tensor:
    r"""Mean and variance of the activations after each layer of a deep random network.

    `n` inputs from $\mathcal N(0, 1)$ of `width` features pass through `depth` layers
    $x \mapsto f(W x)$, no biases, $W$ LeCun-normal times $\sqrt{\text{init\_scale}}$ (so
    $\mathbb E[\tau]$ = `init_scale`), with `dropout` ("dropout" or "alpha_dropout", rate `p`)
    after each activation. Returns (depth, 2): per layer the mean and the variance over all
    units and inputs. Everything random follows `seed`.
    """
    f = activation(name)
    depth, width, n = (
        checks.integer(k, v) for k, v in (("depth", depth), ("width", width), ("n", n))
    )
    init_scale = checks.number("init_scale", init_scale, 0.0, low_open=True)
    checks.one_of("dropout", dropout, DROPOUTS)
    drop = {"none": None, "dropout": plain_dropout, "alpha_dropout": alpha_dropout}[dropout]
    if drop is not None:
        checks.number("p", p, 0.0, 1.0, high_open=True)
    weights, noise = generator(seed, 1), generator(seed, 2)
    x = torch.randn(n, width, generator=generator(seed, 0))
    stats = torch.empty(depth, 2)
    w = torch.empty(width, width)
    for layer in range(depth):
        lecun_normal_(w, generator=weights)
        x = f(x @ (w * math.sqrt(init_scale)).T)
        if drop is not None:
            x = drop(x, p, generator=noise)
        stats[layer] = torch.stack([x.mean(), x.var()])
    return stats


# -- 5b. a deep self-normalizing classifier against a deep ReLU network ---------------------------


def mlp(n_in: int, n_out: int, *, depth: int, width: int, snn: bool = True) -> nn.Sequential:
    """`depth` hidden layers of `width` units and a linear output, biases at zero.

    `snn=True`: the self-normalizing network, SELU with LeCun-normal weights. `snn=False`: the
    baseline, ReLU with He-normal weights (variance 2/n, the initialisation made for ReLU), no
    normalisation of any kind. The output layer is LeCun-normal in both.
    """
    n_in, n_out, depth, width = (
        checks.integer(k, v)
        for k, v in (("n_in", n_in), ("n_out", n_out), ("depth", depth), ("width", width))
    )
    layers: list[nn.Module] = []
    fan_in = n_in
    for _ in range(depth):
        linear = nn.Linear(fan_in, width)
        if snn:
            lecun_normal_(linear.weight)
        else:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)
        layers += [linear, SELU() if snn else nn.ReLU()]
        fan_in = width
    out = nn.Linear(fan_in, n_out)
    lecun_normal_(out.weight)
    nn.init.zeros_(out.bias)
    return nn.Sequential(*layers, out)


def standardize(train_x: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Centre every split on the training pixels' means and divide by the training data's one
    overall standard deviation (per-pixel deviations would blow up pixels that are almost
    always blank): inputs with mean 0 and variance 1 on average, as the SNN theory assumes."""
    checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    mean = train_x.mean(0)
    std = (train_x - mean).std()
    return [(x - mean) / std for x in (train_x, *others)]


@dataclass
class ClassifierRun:
    """A trained network and the History of its validation accuracy ("val_accuracy")."""

    model: nn.Sequential
    history: History


def train_classifier(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    snn: bool,
    seed: int,
    depth: int = 32,
    width: int = 64,
    lr: float = 0.01,
    steps: int = 300,
    batch_size: int = 128,
    eval_every: int = 50,
) -> ClassifierRun:
    """Train `mlp(..., snn=snn)` with plain SGD (the paper's optimiser) on cross-entropy."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, D)", D=d["D"], dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    lr = checks.number("lr", lr, 0.0, low_open=True)
    n_classes = int(train_y.max()) + 1
    with seeded(seed):
        model = mlp(d["D"], n_classes, depth=depth, width=width, snn=snn)
    batches = minibatches(d["N"], batch_size, generator(seed, stream=3))

    def loss_of_update(_):
        index = next(batches)
        return F.cross_entropy(model(train_x[index]), train_y[index])

    history = train(
        model,
        torch.optim.SGD(model.parameters(), lr=lr),
        loss_of_update,
        steps,
        evaluate=lambda: {"val_accuracy": accuracy(model(val_x), val_y)},
        eval_every=eval_every,
        desc="SNN" if snn else "ReLU",
    )
    return ClassifierRun(model, history)
