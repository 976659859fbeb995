"""The Concrete distribution / Gumbel-softmax: a continuous relaxation of a categorical sample.

Maddison, Mnih & Teh 2016, *The Concrete Distribution* (arXiv:1611.00712), and
Jang, Gu & Poole 2016, *Categorical Reparameterization with Gumbel-Softmax* (arXiv:1611.01144),
found the same distribution at the same time. A categorical sample is the argmax of logits plus
Gumbel noise; replacing the argmax by a softmax at a temperature gives a point inside the simplex
that is a differentiable function of the logits given the noise, with a density in closed form.
Its reparameterised gradient is biased but far less noisy than the score function's. The
chapter (chapters/concrete.ipynb, "The idea") derives each step; this module computes them in
the same order: Gumbel-max, the relaxation and straight-through, the density, and the gradient
estimators. The chapter's measurements and the categorical VAE are in
`papernotes.concrete.experiment`.

Arguments are checked where they enter (the samplers, the density, the estimators); `relax`,
`straight_through`, `log_density` and the helpers below them trust their input.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from papernotes import checks

# -- checks at the door ---------------------------------------------------------------------------


def _check_logits(logits) -> int:
    """Finite floating-point logits of shape (..., K) with K >= 2; returns K.

    Any number of leading dimensions and finiteness: what `checks.tensor` cannot say."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor of shape (..., K); got {got}")
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape (..., K) with K >= 2; got {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        raise ValueError("logits must be finite; got inf or NaN")
    return logits.shape[-1]


def _check_inside_simplex(y: torch.Tensor) -> None:
    """Every entry > 0 and each row summing to 1, within float tolerance."""
    if not (y > 0).all():
        raise ValueError(
            "y must lie strictly inside the simplex (every entry > 0); some entries are <= 0 "
            "(at low temperatures float32 samples underflow to 0: use float64)"
        )
    tolerance = math.sqrt(torch.finfo(y.dtype).eps) * y.shape[-1]
    if ((y.sum(-1) - 1).abs() > tolerance).any():
        raise ValueError("y must lie on the simplex: its entries must sum to 1 along the last dim")


# -- 1. Gumbel-max ---------------------------------------------------------------------------------


def gumbel_noise(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise, shaped like `like`."""
    # g = -log(-log u), u ~ U(0, 1); u is kept away from 0, where g would be -inf (torch.rand can
    # return 0 exactly).
    u = torch.rand(like.shape, generator=generator, dtype=like.dtype)
    u = u.clamp_min(torch.finfo(like.dtype).tiny)
    return -torch.log(-torch.log(u))


def gumbel_max_sample(
    logits: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One-hot samples of Categorical(softmax(logits)), shape (..., K), by the Gumbel-max trick."""
    _check_logits(logits)
    return gumbel_max(logits, generator)


def gumbel_max(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A one-hot sample of Categorical(softmax(logits)) per row."""
    # z = one_hot(argmax_k (theta_k + g_k)) ~ Categorical(softmax(theta))
    return one_hot_argmax(logits + gumbel_noise(logits, generator))


def one_hot_argmax(scores: torch.Tensor) -> torch.Tensor:
    """The one-hot vector of each row's largest score, shape (..., K), in the scores' dtype."""
    return F.one_hot(scores.argmax(dim=-1), scores.shape[-1]).to(scores.dtype)


# -- 2. The relaxation ---------------------------------------------------------------------------


def concrete_sample(
    logits: torch.Tensor,
    temperature: float,
    *,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Samples y = softmax((logits + g) / temperature) on the simplex, shape (..., K).

    The temperature divides logits and noise together, (logits + g) / tau, not logits / tau + g.
    With hard=True the forward value is the one-hot argmax (a Gumbel-max sample) and the
    gradient is the relaxed sample's: straight-through Gumbel-softmax.
    """
    _check_logits(logits)
    temperature = checks.number("temperature", temperature, 0.0, low_open=True)
    checks.boolean("hard", hard)
    return relax(logits, temperature, hard=hard, generator=generator)


def relax(
    logits: torch.Tensor,
    temperature: float,
    *,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A Concrete sample per row, or its straight-through version with hard=True."""
    # y = softmax((theta + g) / tau): the argmax of Gumbel-max, relaxed; tends to the one-hot z
    # as tau -> 0, and is differentiable in theta given g (the reparameterisation trick)
    y = torch.softmax((logits + gumbel_noise(logits, generator)) / temperature, dim=-1)
    return straight_through(y) if hard else y


def straight_through(y: torch.Tensor) -> torch.Tensor:
    """The one-hot argmax z forward, the gradient of y backward."""
    # z - stop_gradient(y) + y
    return one_hot_argmax(y) - y.detach() + y


# -- 3. The density ------------------------------------------------------------------------------


def concrete_log_density(y: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(y) of the Concrete distribution at points y inside the simplex, shape (...).

    y (..., K) and logits (..., K) broadcast against each other over the leading dims.
    """
    k = _check_logits(logits)
    temperature = checks.number("temperature", temperature, 0.0, low_open=True)
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.shape[-1:] != (k,):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be a floating-point tensor of shape (..., {k}); got {got}")
    _check_inside_simplex(y)
    return log_density(y, logits, temperature)


def log_density(y: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The Concrete density on the simplex (with respect to the first K-1 coordinates), in log
    space."""
    # p(y) = Gamma(K) tau^(K-1) (sum_i pi_i y_i^-tau)^-K prod_k pi_k y_k^(-tau-1), so
    # log p = log Gamma(K) + (K-1) log tau - K log sum_i pi_i y_i^-tau
    #         + sum_k (log pi_k - (tau+1) log y_k)
    k = logits.shape[-1]
    log_pi = torch.log_softmax(logits, dim=-1)
    log_y = torch.log(y)
    return (
        math.lgamma(k)  # Gamma(K)
        + (k - 1) * math.log(temperature)  # tau^(K-1)
        - k * torch.logsumexp(log_pi - temperature * log_y, dim=-1)  # (sum pi_i y_i^-tau)^-K
        + (log_pi - (temperature + 1) * log_y).sum(-1)  # prod pi_k y_k^(-tau-1)
    )


# -- 4. Gradient estimators of d/dtheta E_z[f(z)] -------------------------------------------------

Objective = Callable[[torch.Tensor], torch.Tensor]  # (N, K) points -> (N,) values


def exact_gradient(logits: torch.Tensor, f: Objective) -> torch.Tensor:
    """The gradient every estimator below estimates, exactly, from f at each one-hot."""
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    values = f(torch.eye(k, dtype=logits.dtype))
    pi = torch.softmax(logits, dim=-1)
    # d/dtheta E_{z ~ Cat(softmax theta)} f(z) = pi * (f - pi . f)
    return pi * (values - (pi * values).sum())


def score_function_gradients(
    logits: torch.Tensor,
    f: Objective,
    n: int,
    *,
    samples: int = 1,
    leave_one_out: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """n REINFORCE estimates, shape (n, K), each the mean over `samples` draws z_s; unbiased
    but noisy.

    The baseline b_s is 0, or with `leave_one_out=True` the mean of f over the estimate's other
    draws (a baseline that does not depend on z_s, so the estimate stays unbiased; needs
    samples >= 2).
    """
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    checks.boolean("leave_one_out", leave_one_out)
    if leave_one_out and samples < 2:
        raise ValueError("a leave-one-out baseline needs samples >= 2 draws per estimate")
    z = gumbel_max(logits.expand(n * samples, k), generator)
    values = f(z).view(n, samples)
    if leave_one_out:
        # b_s = mean_{s' != s} f(z_s')
        others = (values.sum(1, keepdim=True) - values) / (samples - 1)
        values = values - others
    # (f(z_s) - b_s) * grad log p(z_s) = (f(z_s) - b_s) * (z_s - pi)
    score = (z - torch.softmax(logits, dim=-1)).view(n, samples, k)
    return (values.unsqueeze(-1) * score).mean(1)


def relaxed_gradients(
    logits: torch.Tensor,
    f: Objective,
    n: int,
    temperature: float,
    *,
    samples: int = 1,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """n reparameterised estimates, shape (n, K), each the mean over `samples` draws; biased
    but far less noisy than REINFORCE.

    hard=False is Gumbel-softmax (f at the relaxed y); hard=True is straight-through
    (f at the one-hot z, gradient through y).
    """
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    temperature = checks.number("temperature", temperature, 0.0, low_open=True)
    checks.boolean("hard", hard)
    theta = logits.detach().expand(n * samples, k).clone().requires_grad_(True)
    # grad_theta f(y), y = relax(theta, tau). Each row of theta is its own copy of the logits,
    # so theta.grad's row i is draw i's gradient.
    f(relax(theta, temperature, hard=hard, generator=generator)).sum().backward()
    return theta.grad.view(n, samples, k).mean(1)
