"""The chapter's experiment (chapters/selu.ipynb): the mean and variance of activations layer
after layer in deep random networks (SELU against ReLU, tanh and ELU, with or without a
dropout), Theorem 1's conditions checked on a grid of its domain, and deep classifiers trained
through the book's loop: the self-normalizing network against a ReLU network without
normalisation, and against the ablations that each remove one part of self-normalisation (ELU
with LeCun's initialisation, SELU with He's, and a ReLU network with batch normalization).

SELU, LeCun-normal weights and alpha-dropout are the mechanism's (`papernotes.selu`), looked up
at call time so that a broken variant patched into that module is the one these run. The batch
normalization is the book's (`papernotes.batch_norm`).

The nulls (the networks and maps without the paper's idea that the claims compare against) run
on this module's own code, which never calls `papernotes.selu`: torch's activations (its own
SELU among them), LeCun-normal weights drawn here (`lecun_weights_`), plain dropout and
alpha-dropout with another drop value written here (`null_dropout`), and moment maps by
numerical integration (`quadrature_moments`) instead of the mechanism's closed form. A broken
mechanism therefore moves the paper's arm and never its nulls.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from papernotes import batch_norm, checks, selu, together, training
from papernotes.data import minibatches

# Random streams: the random networks' inputs, weights and dropout masks; the classifiers'
# minibatches.
INPUTS, WEIGHTS, NOISE, BATCHES = 0, 1, 2, 3


# -- the nulls' own code ----------------------------------------------------------------------


def lecun_weights_(tensor: torch.Tensor, *, generator: torch.Generator | None = None):
    """LeCun-normal weights, N(0, 1/fan-in), drawn by this module's own code for the nulls:
    from the same generator they are the very numbers `selu.lecun_normal_` draws, but a broken
    mechanism's initialisation does not reach them."""
    fan_in = tensor[0].numel()
    with torch.no_grad():
        return tensor.normal_(0.0, math.sqrt(1.0 / fan_in), generator=generator)


def null_dropout(
    x: torch.Tensor, p: float, drop_value: float | None, generator: torch.Generator
) -> torch.Tensor:
    r"""The nulls' dropouts, written apart from the mechanism: `drop_value=None` is plain
    (inverted) dropout, $x d / q$; a number $v$ is alpha-dropout's affine form with that drop
    value, $a(x d + v(1 - d)) + b$, with (a, b) solved here from the two moment conditions for
    inputs of mean 0 and variance 1 (mean $a(1 - q)v + b = 0$, variance
    $a^2(q + v^2 q(1 - q)) = 1$); $d \sim$ Bernoulli(q), $q = 1 - p$."""
    q = 1.0 - p
    keep = torch.empty_like(x).bernoulli_(q, generator=generator)
    if drop_value is None:
        return x * keep / q
    a = 1.0 / math.sqrt(q + drop_value**2 * q * (1.0 - q))
    b = -a * (1.0 - q) * drop_value
    return a * (x * keep + drop_value * (1 - keep)) + b


# Torch's own SELU constants, for the nulls: lambda = selu(1), the saturation value -lambda alpha.
TORCH_LAMBDA = F.selu(torch.tensor(1.0, dtype=torch.float64)).item()
TORCH_SATURATION = F.selu(torch.tensor(-100.0, dtype=torch.float64)).item()
TORCH_ALPHA = -TORCH_SATURATION / TORCH_LAMBDA


# -- statistics of deep random networks -------------------------------------------------------

# "selu" is the mechanism's activation on the mechanism's LeCun-normal weights; the others,
# torch's activations ("torch_selu": torch's SELU) on `lecun_weights_`, are the nulls.
ACTIVATIONS = ("selu", "relu", "tanh", "elu")
NULL_ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "elu": F.elu, "torch_selu": F.selu}
# "zero_alpha_dropout": alpha-dropout's affine correction with the drop value alpha' = 0 instead
# of the saturation value, the ablation of alpha' (it too restores mean 0 and variance 1). Only
# "alpha_dropout" is the mechanism's; the other two are `null_dropout`.
DROPOUTS = ("none", "dropout", "alpha_dropout", "zero_alpha_dropout")


def activation(name: str):
    """The activation function of that name (SELU is this module's, read when called)."""
    checks.one_of("activation", name, (*ACTIVATIONS, "torch_selu"))
    return selu.selu if name == "selu" else NULL_ACTIVATIONS[name]


def _random_layers(name: str, width: int, init_scale: float, seed: int):
    """The activation and a function that draws each next weight matrix, from stream WEIGHTS
    of `seed`: the mechanism's for "selu", the nulls' own for the others."""
    f = activation(name)
    weights = training.generator(seed, WEIGHTS)
    draw = selu.lecun_normal_ if name == "selu" else lecun_weights_
    scale = math.sqrt(init_scale)

    def next_weight() -> torch.Tensor:
        return draw(torch.empty(width, width), generator=weights) * scale

    return f, next_weight


def forward_statistics(name: str, **network) -> torch.Tensor:
    r"""Mean and variance of the activations after each layer of a deep random network.

    `network` (keywords, all optional): `n` inputs (256) from
    $\mathcal N(0, \text{input\_variance})$ (1) of `width` (256) features pass through `depth`
    (32) layers $x \mapsto f(W x)$, no biases, $W$ LeCun-normal times
    $\sqrt{\text{init\_scale}}$ (1; so $\mathbb E[\tau]$ = `init_scale`), with `dropout`
    ("none", "dropout", "alpha_dropout" or "zero_alpha_dropout", rate `p`, 0.1) after each
    activation; everything random follows `seed` (0). `name` is one of `ACTIVATIONS` or
    "torch_selu" (torch's SELU, a null's). Returns (depth, 2): per layer the mean and the
    variance over all units and inputs. The weights do not depend on the inputs' variance or
    the activation.
    """
    layers = _forward(name, **network)
    return torch.stack([torch.stack([x.mean(), x.var()]) for x in layers])


def last_layer(name: str, **network) -> torch.Tensor:
    """The activations (n, width) after the last layer of the network
    `forward_statistics(name, **network)` describes (the same weights and inputs for the same
    arguments), without dropout: each column is one unit's values over the inputs."""
    *_, x = _forward(name, **network, dropout="none")
    return x


def _forward(
    name: str,
    *,
    depth: int = 32,
    width: int = 256,
    n: int = 256,
    init_scale: float = 1.0,
    dropout: str = "none",
    p: float = 0.1,
    input_variance: float = 1.0,
    seed: int = 0,
) -> list[torch.Tensor]:
    """The activations after each layer of `forward_statistics`'s network, as a list."""
    depth, width, n = (
        checks.integer(k, v) for k, v in (("depth", depth), ("width", width), ("n", n))
    )
    init_scale = checks.number("init_scale", init_scale, 0.0, low_open=True)
    input_variance = checks.number("input_variance", input_variance, 0.0, low_open=True)
    checks.one_of("dropout", dropout, DROPOUTS)
    if dropout != "none":
        checks.number("p", p, 0.0, 1.0, high_open=True)
    f, next_weight = _random_layers(name, width, init_scale, seed)
    noise = training.generator(seed, NOISE)
    x = torch.randn(n, width, generator=training.generator(seed, INPUTS)) * input_variance**0.5
    layers = []
    for _ in range(depth):
        x = f(x @ next_weight().T)
        if dropout == "dropout":
            x = null_dropout(x, p, None, noise)
        elif dropout == "alpha_dropout":
            x = selu.alpha_dropout(x, p, generator=noise)
        elif dropout == "zero_alpha_dropout":
            x = null_dropout(x, p, 0.0, noise)
        layers.append(x)
    return layers


def unit_moments(x: torch.Tensor) -> torch.Tensor:
    """Each unit's mean and variance over the inputs: (units, 2) for activations (n, units)."""
    checks.tensor("x", x, "(N, U)", dtype="floating")
    return torch.stack([x.mean(0), x.var(0)], -1)


def units_in_box(moments: torch.Tensor) -> float:
    """The share of units whose own (mean, variance) lie in Theorem 1's (mu, nu) box."""
    checks.tensor("moments", moments, "(U, 2)", dtype="floating")
    (mu_low, mu_high), (nu_low, nu_high) = (
        selu.THEOREM_1_DOMAIN["mu"],
        selu.THEOREM_1_DOMAIN["nu"],
    )
    mean, variance = moments.unbind(-1)
    inside = (mean >= mu_low) & (mean <= mu_high) & (variance >= nu_low) & (variance <= nu_high)
    return inside.double().mean().item()


def average_unit(moments: torch.Tensor) -> tuple[float, float]:
    """The layer's average unit: the mean over units of each unit's mean and variance."""
    checks.tensor("moments", moments, "(U, 2)", dtype="floating")
    mean, variance = moments.mean(0).tolist()
    return mean, variance


def gradient_growth(
    name: str, *, depth: int = 128, width: int = 128, init_scale: float = 1.0, seed: int = 0
) -> torch.Tensor:
    r"""The squared norm of a gradient at each layer of a deep random network, first layer
    first, as a multiple of the last layer's: (depth,).

    `width` inputs from $\mathcal N(0, 1)$ pass through `depth` layers as in
    `forward_statistics` (the same weights for the same `seed`); a random gradient
    $r \sim \mathcal N(0, 1)$ (stream NOISE) on the last activations is backpropagated, and
    entry $l$ is $\|\partial (r \cdot x_L) / \partial z_l\|^2$ over all inputs and units, $z_l$
    layer $l$'s pre-activations. The mean field predicts a factor
    $\chi_1 = \tau\,\mathbb E[f'(z)^2]$ per layer, backwards."""
    depth, width = checks.integer("depth", depth), checks.integer("width", width)
    init_scale = checks.number("init_scale", init_scale, 0.0, low_open=True)
    f, next_weight = _random_layers(name, width, init_scale, seed)
    x = torch.randn(width, width, generator=training.generator(seed, INPUTS))
    pre = []
    with torch.enable_grad():
        for _ in range(depth):
            z = (x @ next_weight().T).requires_grad_()
            pre.append(z)
            x = f(z)
        r = torch.randn(x.shape, generator=training.generator(seed, NOISE))
        grads = torch.autograd.grad((x * r).sum(), pre)
    squared = torch.stack([g.double().square().sum() for g in grads])
    return squared / squared[-1]


def gradient_factor(growth: torch.Tensor) -> float:
    """The per-layer factor of a squared gradient norm, measured: the geometric mean over the
    layers of `gradient_growth`'s profile, (first / last) ** (1 / (depth - 1)); the mean field
    calls it chi_1."""
    checks.tensor("growth", growth, "(L,)", dtype="floating")
    if len(growth) < 2:
        raise ValueError(f"growth needs at least two layers; got {len(growth)}")
    return (growth[0] / growth[-1]).item() ** (1 / (len(growth) - 1))


def chi_1_range(domain: dict, points: int = 11) -> tuple[float, float]:
    r"""(smallest, largest) of $\chi_1 = \tau\,\mathbb E[\mathrm{selu}'(z)^2]$,
    $z \sim \mathcal N(\mu\omega, \nu\tau)$, on a grid of `domain` (`domain_grid`): the
    per-layer gradient factors of SELU networks whose statistics and weights lie in it. With
    torch's SELU constants and this module's closed form, apart from the mechanism:
    $\mathbb E[\mathrm{selu}'^2] = \lambda^2 (\Phi(m/s) + \alpha^2 e^{2m + 2v}
    \Phi(-(m + 2v)/s))$ with $m = \mu\omega$, $v = \nu\tau$, $s = \sqrt v$."""
    mu, omega, nu, tau = domain_grid(domain, points)
    m, v = mu * omega, nu * tau
    s = v.sqrt()

    def phi(x):  # the standard normal's distribution function
        return 0.5 * torch.erfc(-x / math.sqrt(2))

    # P(z > 0) + alpha^2 E[e^{2z}; z <= 0],  E[e^{2z}; z <= 0] = e^{2m + 2v} Phi(-(m + 2v)/s)
    slope = phi(m / s) + TORCH_ALPHA**2 * torch.exp(2 * m + 2 * v) * phi(-(m + 2 * v) / s)
    chi = tau * TORCH_LAMBDA**2 * slope
    return chi.min().item(), chi.max().item()


def fraction_in_theorem_domain(weight: torch.Tensor) -> float:
    r"""The fraction of a weight matrix's units (rows of (out, in)) whose $\omega = \sum_i w_i$
    and $\tau = \sum_i w_i^2$ both lie in Theorem 1's ranges (`selu.THEOREM_1_DOMAIN`)."""
    checks.tensor("weight", weight, "(O, I)", dtype="floating")
    omega, tau = weight.sum(1), weight.square().sum(1)
    (omega_low, omega_high), (tau_low, tau_high) = (
        selu.THEOREM_1_DOMAIN["omega"],
        selu.THEOREM_1_DOMAIN["tau"],
    )
    inside = (omega >= omega_low) & (omega <= omega_high) & (tau >= tau_low) & (tau <= tau_high)
    return inside.double().mean().item()


@dataclass(frozen=True)
class DomainCheck:
    """Theorem 1's two conditions on a grid of its domain: the box that g's image spans (its
    mean and variance ranges), and the largest spectral norm of g's Jacobian, with where it is
    (mu, omega, nu, tau); and, for the paper's own bound on the variance, the range of the
    second moment xi~ = nu~ + mu~^2 and the largest mu~^2."""

    points: int
    image_mean: tuple[float, float]
    image_variance: tuple[float, float]
    largest_norm: float
    where: tuple[float, float, float, float]
    second_moment: tuple[float, float] = (float("nan"), float("nan"))
    largest_squared_mean: float = float("nan")

    def excursion(self) -> float:
        """How far g's image reaches beyond the (mu, nu) box of the domain: negative when the
        image lies inside it (by that much, at the closest side)."""
        return box_excursion(self.image_mean, self.image_variance)

    def papers_variance_range(self) -> tuple[float, float]:
        """The variance range the way the paper bounds it: nu~ = xi~ - mu~^2 lies between
        min xi~ - max mu~^2 and max xi~."""
        return (self.second_moment[0] - self.largest_squared_mean, self.second_moment[1])


def box_excursion(mean_range, variance_range) -> float:
    """How far a (mean, variance) range reaches beyond Theorem 1's (mu, nu) box: negative when
    it lies inside (by that much, at the closest side)."""
    (mu_low, mu_high), (nu_low, nu_high) = (
        selu.THEOREM_1_DOMAIN["mu"],
        selu.THEOREM_1_DOMAIN["nu"],
    )
    return max(
        mu_low - mean_range[0],
        mean_range[1] - mu_high,
        nu_low - variance_range[0],
        variance_range[1] - nu_high,
    )


def domain_grid(domain: dict, points: int) -> list[torch.Tensor]:
    """`points` evenly spaced values of each of mu, omega, nu and tau over `domain` (a dict of
    (low, high) like `selu.THEOREM_1_DOMAIN`), every combination: four float64 vectors."""
    points = checks.integer("points", points, 2)
    axes = [
        torch.linspace(*domain[k], points, dtype=torch.float64)
        for k in ("mu", "omega", "nu", "tau")
    ]
    return [g.reshape(-1) for g in torch.meshgrid(*axes, indexing="ij")]


def check_theorem_one(points: int = 21) -> DomainCheck:
    """Evaluate g and its Jacobian at `points` evenly spaced values of each of mu, omega, nu and
    tau over Theorem 1's domain (points**4 points, the corners included), in float64: the
    mechanism's moment map, Jacobian and spectral norm."""
    mu, omega, nu, tau = domain_grid(selu.THEOREM_1_DOMAIN, points)
    mean, variance = selu.moment_map(mu, nu, omega, tau)
    jacobians = selu.moment_map_jacobian(mu, nu, omega, tau)
    i = int(torch.linalg.matrix_norm(jacobians, ord=2).argmax())
    second = variance + mean**2
    return DomainCheck(
        points=points,
        image_mean=(mean.min().item(), mean.max().item()),
        image_variance=(variance.min().item(), variance.max().item()),
        largest_norm=selu.spectral_norm(jacobians),
        where=(mu[i].item(), omega[i].item(), nu[i].item(), tau[i].item()),
        second_moment=(second.min().item(), second.max().item()),
        largest_squared_mean=mean.square().max().item(),
    )


def variance_change_range(domain: dict, points: int = 11) -> tuple[float, float]:
    """(smallest, largest) of nu~ - nu, the mechanism's map, on a grid of `domain` (Theorems 2
    and 3 say its sign: below 0 on their large-variance domain, above on their small one)."""
    mu, omega, nu, tau = domain_grid(domain, points)
    change = selu.moment_map(mu, nu, omega, tau)[1] - nu
    return change.min().item(), change.max().item()


# Theorems 2 and 3's domains: for large variances nu~ < nu (decreasing), for small ones nu~ > nu.
THEOREM_2_DOMAIN = {"mu": (-1.0, 1.0), "omega": (-0.1, 0.1), "nu": (3.0, 16.0), "tau": (0.8, 1.25)}
THEOREM_3_DOMAIN = {"mu": (-0.1, 0.1), "omega": (-0.1, 0.1), "nu": (0.02, 0.16), "tau": (0.8, 1.25)}


# -- the nulls' moment maps, by numerical integration -------------------------------------------

_LEGENDRE = np.polynomial.legendre.leggauss(96)


def quadrature_moments(mu, nu, omega, tau, *, alpha: float, lam: float):
    r"""Mean and variance of $\lambda\,\mathrm{elu}_\alpha(z)$, $z \sim \mathcal N(\mu\omega,
    \nu\tau)$, by Gauss-Legendre quadrature (96 nodes on each side of the kink at $z = 0$,
    the Gaussian cut at 12 standard deviations), with torch's ELU: the nulls' moment map,
    written apart from the mechanism's closed form. Arguments broadcast; float64 out."""
    mu, nu, omega, tau = (torch.as_tensor(v, dtype=torch.float64) for v in (mu, nu, omega, tau))
    m, s = mu * omega, torch.sqrt(nu * tau)
    kink = (-m / s).clamp(-12.0, 12.0).unsqueeze(-1)
    x, w = (torch.tensor(a, dtype=torch.float64) for a in _LEGENDRE)
    first = second = 0.0
    for low, high in ((torch.full_like(kink, -12.0), kink), (kink, torch.full_like(kink, 12.0))):
        t = low + (high - low) * (x + 1) / 2
        weight = (high - low) / 2 * w * torch.exp(-(t**2) / 2) / math.sqrt(2 * math.pi)
        y = lam * F.elu(m.unsqueeze(-1) + s.unsqueeze(-1) * t, alpha=alpha)
        first = first + (weight * y).sum(-1)
        second = second + (weight * y**2).sum(-1)
    return first, second - first**2


def quadrature_jacobian(mu: float, nu: float, *, alpha: float, lam: float, h: float = 1e-5):
    """The 2x2 Jacobian of `quadrature_moments` (omega = 0, tau = 1) at (mu, nu) by central
    differences: rows (mean, variance), columns (mu, nu)."""
    columns = []
    for dmu, dnu in ((h, 0.0), (0.0, h)):
        plus = torch.stack(quadrature_moments(mu + dmu, nu + dnu, 0.0, 1.0, alpha=alpha, lam=lam))
        minus = torch.stack(quadrature_moments(mu - dmu, nu - dnu, 0.0, 1.0, alpha=alpha, lam=lam))
        columns.append((plus - minus) / (2 * h))
    return torch.stack(columns, -1)


def quadrature_domain(domain: dict, *, alpha: float, lam: float, points: int = 5, tau_scale=1.0):
    """A null's moment map on a grid of `domain` (tau multiplied by `tau_scale`): its image's
    mean and variance ranges, the paper-style variance range (min xi~ - max mu~^2, max xi~),
    and the range of nu~ - nu, as a dict."""
    mu, omega, nu, tau = domain_grid(domain, points)
    mean, variance = quadrature_moments(mu, nu, omega, tau * tau_scale, alpha=alpha, lam=lam)
    second = variance + mean**2
    change = variance - nu
    return {
        "mean": (mean.min().item(), mean.max().item()),
        "variance": (variance.min().item(), variance.max().item()),
        "papers_variance": (
            second.min().item() - mean.square().max().item(),
            second.max().item(),
        ),
        "change": (change.min().item(), change.max().item()),
    }


def stability_at_fixed_point(omega: float = 0.0) -> tuple[float, float]:
    """(spectral norm, spectral radius) of the moment map's Jacobian at (0, 1) for weights that
    sum to `omega` with tau = 1: (0, 1) stays a fixed point for every omega (the inputs' mean
    is 0), but only a norm below 1 makes g a contraction there, and a radius above 1 makes the
    iterates leave it."""
    omega = checks.number("omega", omega)
    jacobian = selu.moment_map_jacobian(0.0, 1.0, omega, 1.0)
    return selu.spectral_norm(jacobian), torch.linalg.eigvals(jacobian).abs().max().item()


def moment_path(
    mu: float,
    nu: float,
    steps: int,
    omega: float = 0.0,
    lam: float | None = None,
    tau: float = 1.0,
) -> torch.Tensor:
    """`selu.iterate_moment_map` that stops early once the iterates leave the box
    |mean| <= 5, 0 < variance <= 20, where an unstable map sends them: (layers + 1, 2)."""
    steps = checks.integer("steps", steps, 0)
    path = [torch.tensor([mu, nu], dtype=torch.float64)]
    for _ in range(steps):
        point = selu.iterate_moment_map(path[-1][0], path[-1][1], 1, omega, tau, lam=lam)[-1]
        path.append(point)
        if point[0].abs() > 5 or not 0 < point[1] <= 20:
            break
    return torch.stack(path)


def chi_1(tau: float = 1.0, nu: float = 1.0) -> float:
    r"""The mean-field growth of a squared gradient norm through one SELU layer at mean 0:
    $\chi_1 = \tau\, \mathbb E[\mathrm{selu}'(z)^2]$, $z \sim \mathcal N(0, \nu\tau)$, in closed
    form $\tau \lambda^2 (1/2 + \alpha^2 e^{2v} \Phi(-2\sqrt v))$ with $v = \nu\tau$ (about 1.07
    at the fixed point). The gradient norm grows by $\sqrt{\chi_1}$ per layer, backwards."""
    tau = checks.number("tau", tau, 0.0, low_open=True)
    nu = checks.number("nu", nu, 0.0, low_open=True)
    v = nu * tau
    # E[e^{2z}; z <= 0] = e^{2v} Phi(-2 sqrt v) for z ~ N(0, v);  Phi(x) = erfc(-x / sqrt 2) / 2
    tail = math.exp(2 * v) * 0.5 * math.erfc(2 * math.sqrt(v) / math.sqrt(2))
    return tau * selu.LAMBDA**2 * (0.5 + selu.ALPHA**2 * tail)


# -- deep classifiers: the SNN, the ReLU network, and the ablations of self-normalisation -------


class ScaledELU(nn.ELU):
    r"""$\lambda\,\mathrm{elu}_\alpha(x)$ on torch's ELU: a SELU with other constants, for the
    nulls (never the mechanism's code). An `nn.ELU`, so that the book's stacks
    (`papernotes.together`) run it as the elementwise activation it is."""

    def __init__(self, alpha: float, lam: float):
        super().__init__(alpha=alpha)
        self.lam = lam

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lam * F.elu(x, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, lam={self.lam}"


# name: (activation, initialisation, where the batch normalization goes: None, "before" or
# "after" the activation). Only "snn" runs the mechanism (its SELU, its LeCun-normal weights);
# the others are the nulls, on torch's activations and weights drawn by this module.
ARMS = {
    "snn": ("selu", "lecun", None),
    "relu_he": ("relu", "he", None),
    "relu_lsuv": ("relu", "lsuv", None),
    "elu_lecun": ("elu", "lecun", None),
    "selu_lambda_one": ("selu_lambda_one", "lecun", None),
    "selu_alpha_one": ("selu_alpha_one", "lecun", None),
    "selu_he": ("torch_selu", "he", None),
    "relu_he_bn": ("relu", "he", "before"),
    "relu_he_bn_after": ("relu", "he", "after"),
}
ARM_NAMES = {
    "snn": "SNN: SELU, LeCun",
    "relu_he": "ReLU, He",
    "relu_lsuv": "ReLU, LSUV",
    "elu_lecun": "ELU, LeCun",
    "selu_lambda_one": "SELU with λ = 1, LeCun",
    "selu_alpha_one": "SELU with α = 1, LeCun",
    "selu_he": "SELU, He",
    "relu_he_bn": "ReLU, He, BN before ReLU",
    "relu_he_bn_after": "ReLU, He, BN after ReLU",
}
_MODULES = {
    "selu": lambda: selu.SELU(),
    "torch_selu": nn.SELU,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "selu_lambda_one": lambda: nn.ELU(alpha=TORCH_ALPHA),
    "selu_alpha_one": lambda: ScaledELU(alpha=1.0, lam=TORCH_LAMBDA),
}


def mlp(n_in: int, n_out: int, *, depth: int, width: int, arm: str = "snn") -> nn.Sequential:
    """`depth` hidden layers of `width` units and a linear output, biases at zero, for one of
    `ARMS`: its activation, its initialisation of the hidden layers (LeCun-normal, variance
    1/n; He-normal, 2/n, the one made for ReLU; "lsuv": orthogonal, to be rescaled on data by
    `lsuv_start`) and the book's batch normalization
    (`papernotes.batch_norm.BatchNorm`) before or after each hidden activation. The output layer
    is LeCun-normal in every arm: the mechanism's `selu.lecun_normal_` in the SNN,
    `lecun_weights_` in the nulls (the same numbers). The weights are drawn from torch's global
    generator, layer by layer (`training.seeded` around the call)."""
    n_in, n_out, depth, width = (
        checks.integer(k, v)
        for k, v in (("n_in", n_in), ("n_out", n_out), ("depth", depth), ("width", width))
    )
    checks.one_of("arm", arm, tuple(ARMS))
    name, initialisation, normalised = ARMS[arm]

    def init(linear: nn.Linear, is_output: bool) -> None:
        if arm == "snn":
            selu.lecun_normal_(linear.weight)
        elif initialisation == "lecun" or is_output:
            lecun_weights_(linear.weight)
        elif initialisation == "lsuv":
            nn.init.orthogonal_(linear.weight)  # LSUV's start, rescaled on data by lsuv_start
        else:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)

    model = training.mlp([n_in, *[width] * depth, n_out], _MODULES[name], init=init)
    if normalised is None:
        return model
    layers = []
    for module in model:
        hidden = module is not model[-1]
        if normalised == "before" and isinstance(module, nn.Linear) and hidden:
            layers += [module, batch_norm.BatchNorm(module.out_features)]
        elif normalised == "after" and not isinstance(module, nn.Linear):
            layers += [module, batch_norm.BatchNorm(width)]
        else:
            layers.append(module)
    return nn.Sequential(*layers)


@torch.no_grad()
def lsuv_start(model: nn.Sequential, x: torch.Tensor) -> None:
    r"""Layer-sequential unit-variance initialisation (LSUV, Mishkin & Matas 2016), on a
    network whose hidden weights are orthogonal: first to last, divide each hidden linear
    layer's weights by the standard deviation of its outputs over the inputs x (all units and
    examples pooled), so that every layer's outputs have variance 1 at the start, with the
    layers before it already rescaled. A data-dependent start, and never again."""
    checks.tensor("x", x, "(N, D)", dtype="floating")
    if any(isinstance(m, batch_norm.BatchNorm) for m in model):
        raise ValueError("lsuv_start rescales networks without batch normalization")
    h = x
    for module in model[:-1]:
        h = module(h)
        if isinstance(module, nn.Linear):
            # W <- W / sqrt(Var(W u + b)) with b = 0: the layer's outputs get variance 1
            std = h.std()
            module.weight.div_(std)
            h = h / std


def standardize(train_x: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Centre every split on the training pixels' means and divide by the training data's one
    overall standard deviation (per-pixel deviations would blow up pixels that are almost
    always blank): inputs with mean 0 and variance 1 on average, as the SNN theory assumes."""
    checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    mean = train_x.mean(0)
    std = (train_x - mean).std()
    return [(x - mean) / std for x in (train_x, *others)]


class ArmStack(nn.Module):
    """Networks of one layout trained side by side as one module: `mlp`s of any arms with the
    same depth, width and batch normalization, each member with its own weights and its own
    activation, so that the SNN and the nulls of one shape make one forward and one backward
    per update. `together.stack` takes neither members with different activations nor the
    book's batch normalization (its general path, torch.func's vmap, runs that two to three
    times slower here and warns on every update that the running averages fall back to a
    loop).

    The members' linear layers are one batched matrix product, their batch norms one
    `BatchNorm` over members x features (each member's statistics over its own batch), and each
    run of members with the same activation applies it to its slice of the activations, so no
    member's output, gradient or statistics depend on another's. `member(k)` gives member k
    back as a stand-alone copy of its network. The weights are held as (members, in, out), as
    `together.MLPStack` holds them (a stack of one runs `F.linear`, as its does), and with
    batch normalization as (members, out, in), as `nn.Linear` does: the layouts of the stacks
    each arm used to train in alone, so that beside other arms a member's every update is the
    same to the bit as in a stack of its own arm's rates."""

    def __init__(self, models: list[nn.Sequential]):
        super().__init__()
        if not isinstance(models, (list, tuple)) or not models:
            raise ValueError("models must be a non-empty list of nn.Sequentials")
        for k, model in enumerate(models):
            if not isinstance(model, nn.Sequential):
                raise TypeError(f"models[{k}] must be an nn.Sequential; got {type(model).__name__}")
            if _layout(model) != _layout(models[0]):
                raise ValueError(f"models[{k}] has another layout than models[0]")
        self.members = len(models)
        self.normalised = any(isinstance(m, batch_norm.BatchNorm) for m in models[0])
        self.transposed = not self.normalised  # weights (members, in, out)
        copies = {id(model): copy.deepcopy(model) for model in models}  # one a network
        self.templates = [copies[id(model)] for model in models]  # plain, not submodules
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        self.norms = nn.ModuleList()
        # ("linear", index), ("norm", index) or ("activation", [(first, stop, module), ...])
        self.layers: list[tuple[str, object]] = []
        for position, first in enumerate(models[0]):
            column = [model[position] for model in models]
            if isinstance(first, nn.Linear):
                self.layers.append(("linear", len(self.weights)))
                self.weights.append(
                    _stacked([m.weight.T if self.transposed else m.weight for m in column])
                )
                self.biases.append(_stacked([m.bias for m in column]))
            elif isinstance(first, batch_norm.BatchNorm):
                self.layers.append(("norm", len(self.norms)))
                self.norms.append(_stacked_norm(column))
            else:
                self.layers.append(("activation", _runs_of_one_activation(column)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, D) inputs, the same for every member -> logits (members, B, classes)."""
        h = x.expand(self.members, *x.shape)
        for kind, what in self.layers:
            if kind == "linear":
                h = self._linear(h, self.weights[what], self.biases[what])
            elif kind == "norm":
                k, n, features = h.shape
                flat = h.transpose(0, 1).reshape(n, k * features)  # (B, members x features)
                h = self.norms[what](flat).reshape(n, k, features).transpose(0, 1)
            elif len(what) == 1:
                h = what[0][2](h)
            else:
                h = torch.cat([f(h[first:stop]) for first, stop, f in what])
        return h

    def _linear(self, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not self.transposed:
            return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if self.members == 1:
            return F.linear(h[0], w[0].T.contiguous(), b[0]).unsqueeze(0)
        return torch.baddbmm(b.unsqueeze(1), h, w)

    def on_all(self, x: torch.Tensor) -> torch.Tensor:
        """The members on the same x (B, D): (members, B, classes), as `together`'s stacks."""
        return self(x)

    def member(self, k: int) -> nn.Sequential:
        """Member `k` as a stand-alone copy of its network, in eval mode."""
        k = checks.integer("k", k, 0)
        if k >= self.members:
            raise ValueError(f"k must be below the number of members, {self.members}; got {k}")
        model = copy.deepcopy(self.templates[k])
        with torch.no_grad():
            for module, (kind, i) in zip(model, self.layers, strict=True):
                if kind == "linear":
                    w = self.weights[i][k]
                    module.weight.copy_(w.T if self.transposed else w)
                    module.bias.copy_(self.biases[i][k])
                elif kind == "norm":
                    rows = slice(k * module.num_features, (k + 1) * module.num_features)
                    for name in ("gamma", "beta", "running_mean", "running_var"):
                        getattr(module, name).copy_(getattr(self.norms[i], name)[rows])
        return model.eval()


def _layout(model: nn.Sequential) -> list[tuple]:
    """What members of one `ArmStack` share, layer by layer: the linear layers' shapes, the
    batch norms' widths, and where the (parameter-free) activations sit."""
    layout = []
    for module in model:
        if isinstance(module, nn.Linear):
            layout.append(("linear", module.in_features, module.out_features))
        elif isinstance(module, batch_norm.BatchNorm):
            layout.append(("norm", module.num_features, module.eps, module.momentum))
        elif next(module.parameters(), None) is None:
            layout.append(("activation",))
        else:
            raise ValueError(f"an ArmStack's activations have no parameters; got {module!r}")
    return layout


def _stacked(tensors: list[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.stack([t.detach() for t in tensors]))


def _stacked_norm(norms: list[batch_norm.BatchNorm]) -> batch_norm.BatchNorm:
    """One `BatchNorm` over the members' features side by side, each member's own values."""
    stacked = batch_norm.BatchNorm(len(norms) * norms[0].num_features, norms[0].eps)
    stacked.momentum = norms[0].momentum
    with torch.no_grad():
        for name in ("gamma", "beta", "running_mean", "running_var"):
            getattr(stacked, name).copy_(torch.cat([getattr(m, name) for m in norms]))
    return stacked


def _runs_of_one_activation(column: list[nn.Module]) -> list[tuple[int, int, nn.Module]]:
    """The members' activations at one layer as runs of consecutive members with the same
    one: (first member, one past the last, the module)."""
    runs: list[tuple[int, int, nn.Module]] = []
    for k, module in enumerate(column):
        if runs and repr(runs[-1][2]) == repr(module) and type(runs[-1][2]) is type(module):
            runs[-1] = (runs[-1][0], k + 1, runs[-1][2])
        else:
            runs.append((k, k + 1, module))
    return runs


def train_members(
    stack: ArmStack,
    rates: list[float],
    losses_of_update,
    steps: int,
    *,
    evaluate,
    eval_every,
    desc,
) -> list[training.History]:
    """Plain SGD of every member of `stack` at its own rate through the book's loop: each
    member's History (`evaluate()` gives per-member values, (members,)), a member whose loss
    stops being finite stopping alone. `together.train` with `together.SGD` for a stack
    without batch normalization (every parameter leads with the member axis); for one with
    it, the members' losses weighted by their rates and stepped at rate 1, which moves member k
    by -rate_k times its own gradient, as its own SGD would."""
    if not stack.normalised:
        return together.train(
            stack,
            together.SGD(stack.parameters(), lr=list(rates)),
            losses_of_update,
            steps,
            evaluate=evaluate,
            eval_every=eval_every,
            desc=desc,
        )
    weights = torch.tensor(rates)
    alive = torch.ones(len(rates), dtype=torch.bool)
    histories = [training.History() for _ in rates]
    last = [math.nan] * len(rates)

    def loss_of_update(i: int) -> torch.Tensor:
        losses = losses_of_update(i)
        for k, value in enumerate(losses.detach().tolist()):
            if alive[k]:
                last[k] = value
                if not math.isfinite(value):
                    alive[k] = False
                    histories[k].diverged = True
        if not alive.any():
            return losses.sum()  # not finite: the loop stops updating
        # sum_k lr_k L_k, stepped with rate 1: member k moves by -lr_k grad L_k
        return (weights[alive] * losses[alive]).sum()

    def log_members() -> dict:
        metrics = {name: torch.as_tensor(v).tolist() for name, v in evaluate().items()}
        step = min((len(histories[0].steps) + 1) * eval_every, steps)  # training.train's
        for k, history in enumerate(histories):
            history.log(step, {"loss": last[k], **{n: v[k] for n, v in metrics.items()}})
        return {}

    training.train(
        stack,
        torch.optim.SGD(stack.parameters(), lr=1.0),
        loss_of_update,
        steps,
        evaluate=log_members,
        eval_every=eval_every,
        desc=desc,
    )
    return histories


@dataclass
class ArmRun:
    """One arm trained at every learning rate of a grid, side by side (`together`): the
    stacked networks (`stacks[j]`, member `slots[k]` of it trained at `learning_rates[k]`) and
    each rate's History ("val_accuracy"; `diverged` once its loss stopped being finite). The
    rates ascend; `extended` adds the rates of another run of the same arm."""

    arm: str
    learning_rates: tuple[float, ...]
    stacks: list[nn.Module]
    slots: list[tuple[int, int]]
    histories: list[training.History]

    def member(self, k: int) -> nn.Module:
        """The network trained at `learning_rates[k]`, as a plain module in eval mode."""
        stack, index = self.slots[k]
        return self.stacks[stack].member(index)

    def diverged(self) -> list[bool]:
        return [h.diverged for h in self.histories]

    def val_accuracy(self) -> list[float]:
        """Each member's validation accuracy after the last update."""
        return [h.final("val_accuracy") for h in self.histories]

    def validation_scores(self) -> dict[float, float]:
        """Each learning rate to its member's final validation accuracy, 0 for a member whose
        loss stopped being finite (for `pn.Arm.best`)."""
        return {
            rate: 0.0 if h.diverged else h.final("val_accuracy")
            for rate, h in zip(self.learning_rates, self.histories, strict=True)
        }

    def extended(self, other: ArmRun) -> ArmRun:
        """This run and `other`, a run of the same arm at other rates, as one, rates ascending."""
        if other.arm != self.arm or set(other.learning_rates) & set(self.learning_rates):
            raise ValueError("extended takes a run of the same arm at other learning rates")
        shift = len(self.stacks)
        entries = sorted(
            [*zip(self.learning_rates, self.slots, self.histories, strict=True)]
            + [
                (rate, (j + shift, k), h)
                for rate, (j, k), h in zip(
                    other.learning_rates, other.slots, other.histories, strict=True
                )
            ],
            key=lambda entry: entry[0],
        )
        rates, slots, histories = (list(column) for column in zip(*entries, strict=True))
        return ArmRun(self.arm, tuple(rates), [*self.stacks, *other.stacks], slots, histories)


def _rates(learning_rates) -> tuple[float, ...]:
    rates = tuple(checks.number("learning_rates", r, 0.0, low_open=True) for r in learning_rates)
    if not rates:
        raise ValueError("learning_rates must hold at least one rate")
    return rates


def train_arms(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    grid: dict,
    seed: int,
    depth: int = 32,
    width: int = 32,
    steps: int = 200,
    batch_size: int = 64,
    eval_every: int = 50,
) -> dict[str, ArmRun]:
    """Train `mlp(..., arm=arm)` for each arm of `grid` (arm: its learning rates) with plain
    SGD (the paper's optimiser) on cross-entropy at each of its rates, the networks of one
    layout (with or without batch normalization, before or after the activation) together as
    one `ArmStack`: every arm's members start from the same initial weights (of `seed`;
    LSUV's rescaled on the training inputs), every member sees the same minibatches (stream
    BATCHES of `seed`) and makes exactly the updates of its own run. A member whose loss stops
    being finite stops updating; the others carry on. Each arm's `ArmRun`, by arm."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.tensor("val_x", val_x, "(M, D)", D=d["D"], dtype="floating")
    checks.tensor("val_y", val_y, "(M,)", M=val_x.shape[0])
    if not isinstance(grid, dict) or not grid:
        raise ValueError("grid must map at least one arm to its learning rates")
    for arm in grid:
        checks.one_of("arm", arm, tuple(ARMS))
    rates_of = {arm: sorted(_rates(rates)) for arm, rates in grid.items()}
    models = {}
    for arm in grid:
        with training.seeded(seed):
            models[arm] = mlp(d["D"], int(train_y.max()) + 1, depth=depth, width=width, arm=arm)
        if ARMS[arm][1] == "lsuv":
            lsuv_start(models[arm], train_x)
    runs = {}
    for normalised in dict.fromkeys(ARMS[arm][2] for arm in grid):  # one stack a layout
        members = [(arm, r) for arm in grid if ARMS[arm][2] == normalised for r in rates_of[arm]]
        stack = ArmStack([models[arm] for arm, _ in members])
        batches = minibatches(d["N"], batch_size, training.generator(seed, BATCHES))

        def losses_of_update(_: int, stack=stack, batches=batches) -> torch.Tensor:
            index = next(batches)
            return together.cross_entropy(stack.on_all(train_x[index]), train_y[index])

        histories = train_members(
            stack,
            [rate for _, rate in members],
            losses_of_update,
            steps,
            evaluate=lambda stack=stack: {
                "val_accuracy": together.accuracy(stack.on_all(val_x), val_y)
            },
            eval_every=eval_every,
            desc=", ".join(dict.fromkeys(ARM_NAMES[arm] for arm, _ in members)),
        )
        for arm in dict.fromkeys(arm for arm, _ in members):
            slots = [k for k, (member_arm, _) in enumerate(members) if member_arm == arm]
            runs[arm] = ArmRun(
                arm,
                tuple(rates_of[arm]),
                [stack],
                [(0, k) for k in slots],
                [histories[k] for k in slots],
            )
    return {arm: runs[arm] for arm in grid}


def rate_beyond_the_edge(run: ArmRun, factor: float) -> float | None:
    """The rate to try next when `run`'s best validation accuracy sits at its grid's edge:
    `factor` below its lowest rate or above its highest; None when the best rate lies inside,
    or is the highest and the next one up would follow a rate whose loss stopped being finite
    (a larger step only diverges sooner)."""
    scores = run.validation_scores()
    rates = run.learning_rates
    best = max(rates, key=lambda rate: (scores[rate], -rate))
    if best == rates[0]:
        return rates[0] / factor
    if best == rates[-1] and not run.diverged()[-1]:
        return rates[-1] * factor
    return None


def tuned_arms(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    arms,
    learning_rates,
    seed: int,
    factor: float = 4.0,
    extensions: int = 3,
    **settings,
) -> dict[str, ArmRun]:
    """`train_arms` for each of `arms` on the common grid `learning_rates`, each arm's grid
    then extended one rate at a time (`rate_beyond_the_edge`, at most `extensions` times)
    while its best validation accuracy sits at the grid's edge: every arm's grid then brackets
    its best rate. The arms that need a rate more in the same round train it together."""
    factor = checks.number("factor", factor, 1.0, low_open=True)
    extensions = checks.integer("extensions", extensions, 0)
    data = (train_x, train_y, val_x, val_y)
    runs = train_arms(*data, grid=dict.fromkeys(arms, learning_rates), seed=seed, **settings)
    for _ in range(extensions):
        beyond = {arm: rate_beyond_the_edge(run, factor) for arm, run in runs.items()}
        grid = {arm: (rate,) for arm, rate in beyond.items() if rate is not None}
        if not grid:
            break
        for arm, more in train_arms(*data, grid=grid, seed=seed, **settings).items():
            runs[arm] = runs[arm].extended(more)
    return runs


# -- the paper's Figure 1: training curves at one learning rate ------------------------------------

# The two networks of the authors' released Figure 1 code: SELU with LeCun-normal weights, and
# ReLU with He-normal weights and batch normalization after each hidden activation.
FIGURE_ONE_ARMS = ("snn", "relu_he_bn_after")


@dataclass
class CurveRun:
    """One network trained at each of a few learning rates side by side, with its training
    loss over the whole training set before every epoch: `losses` (epochs + 1, rates), the
    last row after the last epoch."""

    arm: str
    learning_rates: tuple[float, ...]
    losses: torch.Tensor


def training_set_loss(stack, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Each member's mean cross-entropy over the training set, in training mode (batch
    normalization with each minibatch's statistics, as the released code measures it), over
    the unshuffled minibatches of `batch_size` (the last partial one left out): (members,).
    Without batch normalization the minibatches do not interact, and one pass does them all."""
    n = len(x) // batch_size * batch_size
    was_training = stack.training
    stack.train()
    with torch.no_grad():
        if stack.normalised:
            per_batch = [
                together.cross_entropy(stack.on_all(x[i : i + batch_size]), y[i : i + batch_size])
                for i in range(0, n, batch_size)
            ]
            loss = torch.stack(per_batch).mean(0)
        else:
            loss = together.cross_entropy(stack.on_all(x[:n]), y[:n])
    stack.train(was_training)
    return loss


def train_curves(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    *,
    arm: str,
    learning_rates,
    seed: int,
    epochs: int,
    depth: int = 8,
    width: int = 64,
    batch_size: int = 64,
) -> CurveRun:
    r"""The released Figure 1 run, for one of `FIGURE_ONE_ARMS` at each of `learning_rates`
    (trained together, one `ArmStack`): plain SGD on the cross-entropy *summed* over each
    minibatch of `batch_size` (the released code's loss, so a rate is per example), `epochs`
    shuffled passes (stream BATCHES of `seed`) over the training set, and before every epoch
    and after the last the whole training set's loss (`training_set_loss`)."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")
    checks.tensor("train_y", train_y, "(N,)", N=d["N"])
    checks.one_of("arm", arm, FIGURE_ONE_ARMS)
    rates = _rates(learning_rates)
    epochs = checks.integer("epochs", epochs)
    with training.seeded(seed):
        model = mlp(d["D"], int(train_y.max()) + 1, depth=depth, width=width, arm=arm)
    stack = ArmStack([model] * len(rates))
    batches = minibatches(d["N"], batch_size, training.generator(seed, BATCHES))
    per_epoch = d["N"] // batch_size
    losses = [training_set_loss(stack, train_x, train_y, batch_size)]

    def losses_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        # the loss summed over the minibatch, as the released code's
        return batch_size * together.cross_entropy(stack.on_all(train_x[index]), train_y[index])

    def evaluate() -> dict:
        losses.append(training_set_loss(stack, train_x, train_y, batch_size))
        return {}

    train_members(
        stack,
        rates,
        losses_of_update,
        epochs * per_epoch,
        evaluate=evaluate,
        eval_every=per_epoch,
        desc=f"Figure 1, {ARM_NAMES[arm]}",
    )
    return CurveRun(arm, rates, torch.stack(losses))


def loss_rise(losses: torch.Tensor, start: int = 0) -> torch.Tensor:
    r"""How far a training curve climbs back: the sum of its rises,
    $\sum_t \max(0, \ln L_{t+1} - \ln L_t)$, from entry `start` on, of a curve (T,) or of each
    column of (T, K) (a curve that only falls: 0). The part of the curve's path that is
    fluctuation, not descent: its total variation in $\ln L$ less its net fall, halved."""
    columns = isinstance(losses, torch.Tensor) and losses.dim() == 2
    checks.tensor("losses", losses, "(T, K)" if columns else "(T,)", dtype="floating")
    start = checks.integer("start", start, 0)
    return losses[start:].log().diff(dim=0).clamp_min(0.0).sum(0)


def paired_standard_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The standard error of mean(a) - mean(b) for paired measurements (a[i] and b[i] of the
    same test image, the same update): the standard deviation of the differences over
    sqrt(n)."""
    checks.tensor("a", a, "(N,)")
    checks.tensor("b", b, "(N,)", N=a.shape[0])
    differences = a.double() - b.double()
    return (differences.std() / math.sqrt(len(differences))).item()


# -- measuring the claims -------------------------------------------------------------------------


def distance_from_fixed_point(mean, variance) -> float:
    """How far a (mean, variance) pair is from (0, 1): max(|mean|, |variance - 1|)."""
    return max(abs(float(mean)), abs(float(variance) - 1.0))


def dropped_value_gap(dropped: torch.Tensor) -> float:
    """Where a dropout's dropped units land among the kept ones: the most frequent value of
    `dropped` (the value every dropped unit shares) minus the lowest of the other values;
    negative when every kept unit lies above the dropped ones."""
    checks.tensor("dropped", dropped, "(N,)", dtype="floating")
    values, counts = torch.unique(dropped, return_counts=True)
    atom = values[counts.argmax()]
    return (atom - dropped[dropped != atom].min()).item()


def moved_from_fixed_point(x: torch.Tensor) -> float:
    """How far a sample's mean and (unbiased) variance are from (0, 1)."""
    return distance_from_fixed_point(x.mean(), x.var())


def layers_to_converge(path: torch.Tensor, tolerance: float = 1e-3) -> int | None:
    """The first layer of a moment-map path (layers + 1, 2) (as `selu.iterate_moment_map`
    returns) whose mean and variance are both within `tolerance` of (0, 1); None if none is."""
    close = ((path - torch.tensor([0.0, 1.0], dtype=path.dtype)).abs() <= tolerance).all(-1)
    return int(close.nonzero()[0]) if close.any() else None
