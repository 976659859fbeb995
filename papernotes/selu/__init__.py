r"""Self-normalizing neural networks: SELU, its moment map, LeCun initialisation, alpha-dropout.

Klambauer, Unterthiner, Mayr & Hochreiter 2017, *Self-Normalizing Neural Networks*, NeurIPS
(arXiv:1706.02515). The chapter (chapters/selu.ipynb, "The idea") derives it; this module is
the mechanism alone, in the paper's order, each equation above the line that computes it:

1. the activation, a scaled ELU whose two constants alpha and lambda are chosen so that a layer
   maps zero mean and unit variance to zero mean and unit variance;
2. the moment map g: the mean and variance of a SELU unit's output given its inputs' (mu, nu) and
   its weights' sum omega and sum of squares tau, in closed form; (0, 1) is its fixed point for
   omega = 0, tau = 1, and an attracting one (the Jacobian's spectral norm is below 1);
3. LeCun-normal initialisation, which gives omega = 0 and tau = 1 on average at the start;
4. alpha-dropout, which drops to the SELU's saturation value and restores mean 0 and variance 1
   with an affine map (plain dropout, the ablation, beside it).

The constants, the moment map and everything that uses them read `ALPHA`, `LAMBDA` and the
functions of this module when called, so that a patched module (tests/mutants/selu.py) is seen
everywhere, the experiment (`papernotes.selu.experiment`: deep random networks and the deep
classifier) included. Arguments are checked where they enter (`selu`, `alpha_dropout`,
`alpha_dropout_affine`, `moment_map`, `lecun_normal_`); the helpers below them trust their input.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks

# -- 1. the activation and its constants ----------------------------------------------------------


def fixed_point_constants() -> tuple[float, float]:
    r"""The paper's closed form of $(\alpha_{01}, \lambda_{01})$: the SELU whose moment map
    fixes $(\mu, \nu) = (0, 1)$ when $\omega = 0$, $\tau = 1$, i.e. the solution of the two
    equations mu~(0, 1) = 0 and nu~(0, 1) = 1 (section 2 below)."""
    e, pi = math.e, math.pi
    c = math.erfc(1 / math.sqrt(2))
    # alpha_01 = -sqrt(2/pi) / (erfc(1/sqrt 2) e^{1/2} - 1)  ~ 1.6733
    alpha = -math.sqrt(2 / pi) / (c * math.exp(0.5) - 1)
    # lambda_01 = (1 - erfc(1/sqrt 2) sqrt e) sqrt(2 pi)
    #     * (2 erfc(sqrt 2) e^2 + pi erfc(1/sqrt 2)^2 e - 2 (2 + pi) erfc(1/sqrt 2) sqrt e
    #        + pi + 2)^{-1/2}  ~ 1.0507
    root = 2 * math.erfc(math.sqrt(2)) * e**2 + pi * c**2 * e - 2 * (2 + pi) * c * math.sqrt(e)
    lam = (1 - c * math.sqrt(e)) * math.sqrt(2 * pi) * (root + pi + 2) ** -0.5
    return alpha, lam


ALPHA, LAMBDA = fixed_point_constants()  # 1.6732632423543772..., 1.0507009873554805...


def selu(x: torch.Tensor) -> torch.Tensor:
    r"""$\lambda x$ for $x > 0$, $\lambda\alpha(e^x - 1)$ for $x \le 0$, elementwise, of a
    floating-point tensor."""
    _check_floating("x", x)
    return _selu(x)


def _selu(x: torch.Tensor) -> torch.Tensor:
    """`selu` on a tensor already checked. The bracket is an ELU with parameter alpha, which
    torch computes in one fused step, forward and backward."""
    # selu(x) = lambda * (x if x > 0 else alpha (e^x - 1))
    return LAMBDA * F.elu(x, alpha=ALPHA)


def _check_floating(name: str, x) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point tensor; got {got}")


class SELU(nn.SELU):
    """`selu` as a layer. An `nn.SELU` by type, so that code that stacks networks of elementwise
    layers (`papernotes.together`) runs it as one; its forward is this module's `selu`."""

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
    """The closed forms of the moment map (float64 tensors in and out)."""
    # z = sum_i w_i x_i is Gaussian (central limit theorem) with mean m = mu omega and
    # variance v = nu tau; y = selu(z) has, in closed form:
    m, v = mu * omega, nu * tau
    s = torch.sqrt(2 * v)
    gauss = math.sqrt(2 / math.pi) * torch.sqrt(v) * torch.exp(-(m**2) / (2 * v))
    erfc_m, erfc_mv = torch.erfc(m / s), torch.erfc((m + v) / s)
    # mu~ = lambda/2 (m erf(m / sqrt(2v)) + alpha e^{m + v/2} erfc((m + v) / sqrt(2v))
    #                 - alpha erfc(m / sqrt(2v)) + sqrt(2/pi) sqrt(v) e^{-m^2 / (2v)} + m)
    mean = (lam / 2) * (
        m * torch.erf(m / s) + alpha * torch.exp(m + v / 2) * erfc_mv - alpha * erfc_m + gauss + m
    )
    # xi~ = lambda^2/2 ((m^2 + v)(2 - erfc(m / sqrt(2v)))
    #                  + alpha^2 (-2 e^{m + v/2} erfc((m + v) / sqrt(2v))
    #                             + e^{2(m + v)} erfc((m + 2v) / sqrt(2v)) + erfc(m / sqrt(2v)))
    #                  + sqrt(2/pi) m sqrt(v) e^{-m^2 / (2v)})
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
    # g(mu, nu) = (mu~, nu~), nu~ = xi~ - mu~^2
    return mean, second - mean**2


def moment_map_jacobian(mu=0.0, nu=1.0, omega=0.0, tau=1.0, *, alpha=None, lam=None):
    r"""The Jacobian $\partial(\tilde\mu, \tilde\nu) / \partial(\mu, \nu)$ by autograd in
    float64: (..., 2, 2) for arguments that broadcast to the shape (...), rows (mean, variance),
    columns (mu, nu); a single point gives a 2x2 matrix. `alpha` and `lam` as in `moment_map`.

    At (0, 1) its spectral norm is 0.7877 (the paper's number); Theorem 1 needs it below 1 over
    all of the domain `THEOREM_1_DOMAIN`, which g maps into itself."""
    mu, nu, omega, tau = torch.broadcast_tensors(
        *(_float64(k, v) for k, v in (("mu", mu), ("nu", nu), ("omega", omega), ("tau", tau)))
    )
    mu, nu = mu.clone().requires_grad_(), nu.clone().requires_grad_()
    with torch.enable_grad():
        mean, variance = moment_map(mu, nu, omega, tau, alpha=alpha, lam=lam)
        # g acts elementwise, so the gradient of a sum holds every point's own partial derivatives
        rows = [
            torch.stack(torch.autograd.grad(out.sum(), (mu, nu), retain_graph=True), -1)
            for out in (mean, variance)
        ]
    return torch.stack(rows, -2).detach()


# Theorem 1's domain Omega: for (omega, tau) in these ranges, g maps the (mu, nu) box into itself
# and is a contraction on it, so it has one stable, attracting fixed point there (Banach).
THEOREM_1_DOMAIN = {"mu": (-0.1, 0.1), "omega": (-0.1, 0.1), "nu": (0.8, 1.5), "tau": (0.95, 1.1)}


def spectral_norm(matrix: torch.Tensor) -> float:
    """The largest singular value of a matrix (of a stack of matrices: the largest of them)."""
    return torch.linalg.matrix_norm(matrix, ord=2).max().item()


def iterate_moment_map(mu, nu, steps: int, omega=0.0, tau=1.0, *, alpha=None, lam=None):
    """(steps + 1, 2): the start and `steps` applications of the moment map, as (mean, variance):
    what a stack of `steps` layers with these weight statistics does to the moments. `alpha`
    and `lam` as in `moment_map`."""
    steps = checks.integer("steps", steps, 0)
    mu, nu = _float64("mu", mu), _float64("nu", nu)
    path = [torch.stack([mu, nu])]
    for _ in range(steps):
        mu, nu = moment_map(mu, nu, omega, tau, alpha=alpha, lam=lam)
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
    # w ~ N(0, 1/n): E[omega] = 0 and E[tau] = n * 1/n = 1, the fixed point's conditions
    with torch.no_grad():
        return tensor.normal_(0.0, math.sqrt(1.0 / fan_in), generator=generator)


# -- 4. alpha-dropout -----------------------------------------------------------------------------


def alpha_dropout_affine(p: float, saturation: float | None = None) -> tuple[float, float]:
    r"""The paper's $(a, b)$ for drop rate `p`: with keep probability $q = 1 - p$ and the drop
    value $\alpha'$ (`saturation`, by default $-\lambda\alpha$),
    $a = (q + \alpha'^2 q(1 - q))^{-1/2}$, $b = -a(1 - q)\alpha'$. `saturation=0` is the
    ablation: dropped units go to 0 and (a, b) = (q^{-1/2}, 0) still restore (0, 1)."""
    p = checks.number("p", p, 0.0, 1.0, high_open=True)
    if saturation is not None:
        saturation = checks.number("saturation", saturation)
    return _alpha_dropout_affine(p, saturation)


def _alpha_dropout_affine(p: float, saturation: float | None = None) -> tuple[float, float]:
    """`alpha_dropout_affine` for arguments already checked."""
    q = 1.0 - p
    # alpha' = -lambda alpha: where a SELU unit rests (x -> -inf), not 0
    if saturation is None:
        saturation = -LAMBDA * ALPHA
    # a = (q + alpha'^2 q (1 - q))^{-1/2},  b = -a (1 - q) alpha'
    a = (q + saturation**2 * q * (1 - q)) ** -0.5
    b = -a * (1 - q) * saturation
    return a, b


def alpha_dropout(
    x: torch.Tensor,
    p: float,
    training: bool = True,
    generator: torch.Generator | None = None,
    saturation: float | None = None,
) -> torch.Tensor:
    r"""Alpha-dropout: $a(x d + \alpha'(1 - d)) + b$ with $d \sim \mathrm{Bernoulli}(1 - p)$
    elementwise, $\alpha'$ = `saturation` (by default $-\lambda\alpha$); the identity when not
    training."""
    _check_floating("x", x)
    p = checks.number("p", p, 0.0, 1.0, high_open=True)
    if not training or p == 0.0:
        return x
    if saturation is None:
        saturation = -LAMBDA * ALPHA
    a, b = alpha_dropout_affine(p, saturation)
    # d ~ Bernoulli(q);  x -> a (x d + alpha' (1 - d)) + b
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return a * (x * keep + saturation * (1 - keep)) + b


def plain_dropout(
    x: torch.Tensor, p: float, training: bool = True, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Standard (inverted) dropout, the ablation: x * d / (1 - p), d ~ Bernoulli(1 - p)."""
    p = checks.number("p", p, 0.0, 1.0, high_open=True)
    if not training or p == 0.0:
        return x
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return x * keep / (1.0 - p)
