r"""The Concrete distribution / Gumbel-softmax: a continuous relaxation of a categorical sample.

Maddison, Mnih & Teh 2016, *The Concrete Distribution* (arXiv:1611.00712), and
Jang, Gu & Poole 2016, *Categorical Reparameterization with Gumbel-Softmax* (arXiv:1611.01144),
found the same distribution at the same time. The module follows the argument in order.

1. **Gumbel-max.** With logits $\theta_k$ (class probabilities $\pi = \mathrm{softmax}(\theta)$)
   and independent $g_k = -\log(-\log u_k)$, $u_k \sim U(0, 1)$,

   $$z = \mathrm{one\_hot}\big(\arg\max_k\, (\theta_k + g_k)\big) \sim \mathrm{Categorical}(\pi).$$

2. **Relaxation.** Replace the argmax by a softmax at temperature $\tau > 0$:

   $$y = \mathrm{softmax}\big((\theta + g) / \tau\big),$$

   a point inside the simplex that tends to the one-hot $z$ as $\tau \to 0$. It is a
   differentiable function of $\theta$ given the noise (the reparameterisation trick).
   *Straight-through*: use the one-hot $z$ forward and $y$'s gradient backward.

3. **Density.** On the simplex (with respect to the first $K-1$ coordinates),

   $$p_{\pi,\tau}(y) = \Gamma(K)\,\tau^{K-1}
       \Big(\sum_{i} \pi_i\, y_i^{-\tau}\Big)^{-K} \prod_{k} \pi_k\, y_k^{-\tau-1}.$$

4. **Gradient estimators** of $\nabla_\theta\, \mathbb{E}_{z}[f(z)]$: the unbiased but noisy
   score function (REINFORCE) $f(z)\,\nabla_\theta \log p_\theta(z) = f(z)\,(z - \pi)$, against
   the biased, low-variance relaxed gradient $\nabla_\theta f(y)$ and straight-through.

5. **A categorical VAE** trained with the relaxed gradient or with REINFORCE (the papers'
   Table 1 experiment, at digits scale).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import fit

# -- checks shared by the public functions ------------------------------------------------------


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not torch.is_floating_point(logits):
        raise TypeError(f"logits must be a floating-point tensor; got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] < 2:
        raise ValueError(
            f"logits must have shape (..., K) with K >= 2 categories; got {tuple(logits.shape)}"
        )
    if not torch.isfinite(logits).all():
        raise ValueError("logits must be finite; got inf or NaN")


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, torch.Tensor) and temperature.numel() == 1:
        temperature = temperature.item()
    return checks.number("temperature", temperature, 0.0, low_open=True)


# -- 1. Gumbel-max ---------------------------------------------------------------------------------


def gumbel_noise(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log u), u ~ U(0, 1), shaped like `like`.

    u is kept away from 0, where -log(-log u) would be -inf (torch.rand can return 0 exactly).
    """
    u = torch.rand(like.shape, generator=generator, dtype=like.dtype, device=like.device)
    u = u.clamp_min(torch.finfo(like.dtype).tiny)
    return -torch.log(-torch.log(u))


def gumbel_max_sample(
    logits: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One-hot samples of Categorical(softmax(logits)), shape (..., K), by the Gumbel-max trick."""
    _check_logits(logits)
    index = (logits + gumbel_noise(logits, generator)).argmax(dim=-1)
    return F.one_hot(index, logits.shape[-1]).to(logits.dtype)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test that `counts` (K,) were drawn with `probs` (K,).

    X^2 = sum_k (n_k - N p_k)^2 / (N p_k), compared with a chi-square law of K-1 degrees of
    freedom: p = Q((K-1)/2, X^2/2), the regularised upper incomplete gamma function.
    """
    if counts.shape != probs.shape or counts.dim() != 1:
        shapes = f"{tuple(counts.shape)} and {tuple(probs.shape)}"
        raise ValueError(f"counts and probs must both have shape (K,); got {shapes}")
    counts, probs = counts.double(), probs.double()
    expected = counts.sum() * probs
    statistic = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor(counts.numel() - 1, dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, statistic / 2).item()


# -- 2. The relaxation ---------------------------------------------------------------------------


def concrete_sample(
    logits: torch.Tensor,
    temperature: float,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Samples y = softmax((logits + g) / temperature) on the simplex, shape (..., K).

    The temperature divides logits and noise together, (logits + g) / tau, not logits / tau + g.
    With hard=True the forward value is the one-hot argmax (a Gumbel-max sample) and the
    gradient is the relaxed sample's: straight-through Gumbel-softmax.
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    y = torch.softmax((logits + gumbel_noise(logits, generator)) / temperature, dim=-1)
    if not hard:
        return y
    z = F.one_hot(y.argmax(dim=-1), logits.shape[-1]).to(y.dtype)
    return z - y.detach() + y


# -- 3. The density ------------------------------------------------------------------------------


def concrete_log_density(y: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(y) of the Concrete distribution at points y inside the simplex, shape (...).

    log p = log Gamma(K) + (K-1) log tau + sum_k (log pi_k - (tau+1) log y_k)
            - K logsumexp_k (log pi_k - tau log y_k),
    computed in log space. y and logits broadcast against each other over the leading dims.
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    if not isinstance(y, torch.Tensor) or y.shape[-1:] != logits.shape[-1:]:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(
            f"y must have shape (..., {logits.shape[-1]}) like the logits; got {shape}"
        )
    _check_on_simplex(y)
    k = logits.shape[-1]
    log_pi = torch.log_softmax(logits, dim=-1)
    log_y = torch.log(y)
    return (
        math.lgamma(k)
        + (k - 1) * math.log(temperature)
        + (log_pi - (temperature + 1) * log_y).sum(-1)
        - k * torch.logsumexp(log_pi - temperature * log_y, dim=-1)
    )


def _check_on_simplex(y: torch.Tensor) -> None:
    if not torch.is_floating_point(y):
        raise TypeError("y must be a floating-point tensor")
    if not (y > 0).all():
        raise ValueError(
            "y must lie strictly inside the simplex (every entry > 0); some entries are <= 0 "
            "(at low temperatures float32 samples underflow to 0: use float64)"
        )
    tolerance = math.sqrt(torch.finfo(y.dtype).eps) * y.shape[-1]
    if ((y.sum(-1) - 1).abs() > tolerance).any():
        raise ValueError("y must lie on the simplex: its entries must sum to 1 along the last dim")


# -- 4. Gradient estimators ------------------------------------------------------------------------

Objective = Callable[[torch.Tensor], torch.Tensor]  # (N, K) points -> (N,) values


def quadratic_objective(weights: torch.Tensor, target: float = 0.5) -> Objective:
    """f(z) = (w . z - target)^2: a function of a category whose exact gradient is easy."""
    return lambda z: (z @ weights - target) ** 2


def exact_gradient(logits: torch.Tensor, f: Objective) -> torch.Tensor:
    """d/dtheta E_{z ~ Cat(softmax theta)} f(z) = pi * (f - pi . f), with f at each one-hot."""
    _check_logits(logits)
    if logits.dim() != 1:
        raise ValueError(f"exact_gradient takes one logit vector (K,); got {tuple(logits.shape)}")
    values = f(torch.eye(logits.shape[-1], dtype=logits.dtype))
    pi = torch.softmax(logits, dim=-1)
    return pi * (values - (pi * values).sum())


def score_function_gradients(
    logits: torch.Tensor, f: Objective, n: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """n REINFORCE estimates, shape (n, K): f(z) * grad log p(z) = f(z) * (z - pi)."""
    z = gumbel_max_sample(logits.expand(n, -1), generator)
    return f(z).unsqueeze(-1) * (z - torch.softmax(logits, dim=-1))


def relaxed_gradients(
    logits: torch.Tensor,
    f: Objective,
    n: int,
    temperature: float,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """n reparameterised estimates, shape (n, K): grad_theta f(y) through y = concrete_sample.

    hard=False is Gumbel-softmax (f at the relaxed y); hard=True is straight-through
    (f at the one-hot z, gradient through y).
    """
    theta = logits.detach().expand(n, -1).clone().requires_grad_(True)
    f(concrete_sample(theta, temperature, hard=hard, generator=generator)).sum().backward()
    return theta.grad


@dataclass(frozen=True)
class EstimatorStats:
    """Bias = |mean estimate - exact gradient|; variance = trace of the estimates' covariance."""

    bias: float
    variance: float


def estimator_stats(estimates: torch.Tensor, exact: torch.Tensor) -> EstimatorStats:
    bias = (estimates.mean(0) - exact).norm().item()
    variance = estimates.var(0).sum().item()
    return EstimatorStats(bias=bias, variance=variance)


# -- 5. A categorical VAE -----------------------------------------------------------------------


class CategoricalVAE(nn.Module):
    """x -> q(z|x), z = `n_latents` categorical variables of `n_categories` -> p(x|z) Bernoulli.

    The papers' VAE has 20 variables of 10 categories on 784-pixel MNIST; ours has 8 of 10 on
    the 64-pixel digits. The prior is uniform over each variable's categories.
    """

    def __init__(
        self, n_pixels: int = 64, n_latents: int = 8, n_categories: int = 10, hidden: int = 128
    ):
        super().__init__()
        self.n_latents, self.n_categories = n_latents, n_categories
        code = n_latents * n_categories
        self.encoder = nn.Sequential(
            nn.Linear(n_pixels, hidden), nn.ReLU(), nn.Linear(hidden, code)
        )
        self.decoder = nn.Sequential(
            nn.Linear(code, hidden), nn.ReLU(), nn.Linear(hidden, n_pixels)
        )

    def posterior_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of q(z|x), shape (B, n_latents, n_categories)."""
        return self.encoder(x).view(-1, self.n_latents, self.n_categories)

    def reconstruction_nll(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """-log p(x|z) in nats per example, shape (B,); z is (B, n_latents, n_categories)."""
        logits = self.decoder(z.flatten(1))
        return F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)

    def kl_to_uniform(self, logits: torch.Tensor) -> torch.Tensor:
        """KL(q(z|x) || uniform) of the discrete posterior, summed over variables: shape (B,).

        This is the Gumbel-softmax paper's convention (discrete KL), not the Concrete paper's
        relaxed one; do not mix the two.
        """
        log_q = torch.log_softmax(logits, dim=-1)
        return (log_q.exp() * (log_q + math.log(self.n_categories))).sum((-1, -2))


ESTIMATORS = ("gumbel-softmax", "straight-through", "reinforce")


def vae_loss(
    model: CategoricalVAE,
    x: torch.Tensor,
    estimator: str,
    temperature: float,
    baseline: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A surrogate loss whose gradient is the estimator's, and -log p(x|z) per example.

    - gumbel-softmax: decode the relaxed sample y; gradients flow through y.
    - straight-through: decode the one-hot z; gradients flow through y.
    - reinforce: decode the one-hot z; the encoder gets (nll - baseline) * grad log q(z|x).
    The KL term is analytic in every case.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
    logits = model.posterior_logits(x)
    kl = model.kl_to_uniform(logits)
    if estimator == "reinforce":
        z = gumbel_max_sample(logits.detach())
        nll = model.reconstruction_nll(x, z)
        log_q = (torch.log_softmax(logits, dim=-1) * z).sum((-1, -2))
        surrogate = nll + (nll.detach() - baseline) * log_q + kl
    else:
        y = concrete_sample(logits, temperature, hard=estimator == "straight-through")
        nll = model.reconstruction_nll(x, y)
        surrogate = nll + kl
    return surrogate.mean(), nll.detach()


@torch.no_grad()
def negative_elbo(
    model: CategoricalVAE, x: torch.Tensor, samples: int = 10, seed: int = 0
) -> float:
    """Mean -ELBO in nats with discrete samples z ~ q(z|x) (the relaxation is for training only)."""
    generator = torch.Generator().manual_seed(seed)
    logits = model.posterior_logits(x)
    kl = model.kl_to_uniform(logits)
    nll = torch.stack(
        [model.reconstruction_nll(x, gumbel_max_sample(logits, generator)) for _ in range(samples)]
    )
    return (nll.mean(0) + kl).mean().item()


def temperature_schedule(step: int, rate: float, floor: float = 0.5) -> float:
    """The Gumbel-softmax paper's annealing: tau = max(floor, exp(-rate * step))."""
    return max(floor, math.exp(-rate * step))


def train_vae(
    train_x: torch.Tensor,
    test_x: torch.Tensor,
    estimator: str,
    steps: int = 3000,
    batch_size: int = 100,
    lr: float = 1e-3,
    anneal_rate: float = 3e-4,
    baseline_decay: float = 0.99,
    eval_every: int = 250,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train a CategoricalVAE with one estimator; return the test -ELBO every `eval_every` steps."""
    torch.manual_seed(seed)
    model = CategoricalVAE(n_pixels=train_x.shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = minibatches(len(train_x), batch_size, torch.Generator().manual_seed(seed))
    baseline = 0.0

    def step(i: int):
        nonlocal baseline
        x = train_x[next(batches)]
        loss, nll = vae_loss(model, x, estimator, temperature_schedule(i, anneal_rate), baseline)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # REINFORCE's control variate: a moving average of the reconstruction term.
        baseline = baseline_decay * baseline + (1 - baseline_decay) * nll.mean().item()
        if (i + 1) % eval_every == 0:
            return {"test_neg_elbo": negative_elbo(model, test_x)}
        return None

    return fit(step, steps, desc=estimator)
