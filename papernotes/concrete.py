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
   score function (REINFORCE) $(f(z) - b)\,\nabla_\theta \log p_\theta(z) = (f(z) - b)\,(z - \pi)$,
   here with a leave-one-out baseline $b$, against the biased, low-variance relaxed gradient
   $\nabla_\theta f(y)$ and straight-through.

5. **A categorical VAE** trained with the relaxed gradient, straight-through or REINFORCE (the
   Gumbel-softmax paper's Table 1 experiment, at digits scale). The estimator is chosen by name:
   `"gumbel_softmax"`, `"straight_through"` or `"reinforce"`.

Arguments are checked where they enter (the samplers, the density, the estimators, `train_vae`);
the helpers below them trust their input.
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
from papernotes.training import History, generator, seeded, train

# -- checks at the door ---------------------------------------------------------------------------


def _check_logits(logits) -> int:
    """Finite floating-point logits of shape (..., K) with K >= 2; returns K."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor of shape (..., K); got {got}")
    if logits.dim() == 0 or logits.shape[-1] < 2:
        raise ValueError(f"logits must have shape (..., K) with K >= 2; got {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        raise ValueError("logits must be finite; got inf or NaN")
    return logits.shape[-1]


def _check_temperature(temperature) -> float:
    if isinstance(temperature, torch.Tensor) and temperature.numel() == 1:
        temperature = temperature.item()
    return checks.number("temperature", temperature, 0.0, low_open=True)


# -- 1. Gumbel-max ---------------------------------------------------------------------------------


def gumbel_noise(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Standard Gumbel noise g = -log(-log u), u ~ U(0, 1), shaped like `like`.

    u is kept away from 0, where -log(-log u) would be -inf (torch.rand can return 0 exactly).
    """
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
    """z = one_hot(argmax_k (theta_k + g_k))."""
    return one_hot_argmax(logits + gumbel_noise(logits, generator))


def one_hot_argmax(scores: torch.Tensor) -> torch.Tensor:
    """The one-hot vector of each row's largest score, shape (..., K), in the scores' dtype."""
    return F.one_hot(scores.argmax(dim=-1), scores.shape[-1]).to(scores.dtype)


def chi_square_statistic(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's X^2 = sum_k (n_k - N p_k)^2 / (N p_k) of category counts (K,) against the
    probabilities (K,) they should have been drawn with."""
    k = checks.tensor("counts", counts, "(K,)")["K"]
    checks.tensor("probs", probs, "(K,)", K=k)
    counts, probs = counts.double(), probs.double()
    expected = counts.sum() * probs
    return ((counts - expected) ** 2 / expected).sum().item()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """The probability that a chi-square law of K-1 degrees of freedom exceeds X^2."""
    from scipy.stats import chi2  # scipy comes with scikit-learn

    return float(chi2.sf(chi_square_statistic(counts, probs), len(counts) - 1))


def chi_square_critical_value(k: int, level: float = 1e-3) -> float:
    """The X^2 that a chi-square law of K-1 degrees of freedom exceeds with probability `level`:
    a goodness-of-fit test at that false-alarm rate rejects above it."""
    from scipy.stats import chi2

    return float(chi2.isf(level, checks.integer("k", k, 2) - 1))


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
    return relax(logits, _check_temperature(temperature), hard=hard, generator=generator)


def relax(
    logits: torch.Tensor,
    temperature: float,
    *,
    hard: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """y = softmax((theta + g) / tau), or its straight-through version with hard=True."""
    y = torch.softmax((logits + gumbel_noise(logits, generator)) / temperature, dim=-1)
    return straight_through(y) if hard else y


def straight_through(y: torch.Tensor) -> torch.Tensor:
    """z - stop_gradient(y) + y: the one-hot argmax z forward, the gradient of y backward."""
    return one_hot_argmax(y) - y.detach() + y


# -- 3. The density ------------------------------------------------------------------------------


def concrete_log_density(y: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(y) of the Concrete distribution at points y inside the simplex, shape (...).

    y (..., K) and logits (..., K) broadcast against each other over the leading dims.
    """
    k = _check_logits(logits)
    temperature = _check_temperature(temperature)
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.shape[-1:] != (k,):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be a floating-point tensor of shape (..., {k}); got {got}")
    _check_inside_simplex(y)
    return log_density(y, logits, temperature)


def log_density(y: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The density formula in log space:

    log p = log Gamma(K) + (K-1) log tau - K log sum_i pi_i y_i^-tau
            + sum_k (log pi_k - (tau+1) log y_k).
    """
    k = logits.shape[-1]
    log_pi = torch.log_softmax(logits, dim=-1)
    log_y = torch.log(y)
    return (
        math.lgamma(k)  # Gamma(K)
        + (k - 1) * math.log(temperature)  # tau^(K-1)
        - k * torch.logsumexp(log_pi - temperature * log_y, dim=-1)  # (sum pi_i y_i^-tau)^-K
        + (log_pi - (temperature + 1) * log_y).sum(-1)  # prod pi_k y_k^(-tau-1)
    )


def _check_inside_simplex(y: torch.Tensor) -> None:
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
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    values = f(torch.eye(k, dtype=logits.dtype))
    pi = torch.softmax(logits, dim=-1)
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
    """n REINFORCE estimates, shape (n, K), each the mean over `samples` draws z_s of

        (f(z_s) - b_s) * grad log p(z_s) = (f(z_s) - b_s) * (z_s - pi),

    with b_s = 0, or with `leave_one_out=True` the mean of f over the estimate's other draws
    (a baseline that does not depend on z_s, so the estimate stays unbiased; needs samples >= 2).
    """
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    if leave_one_out and samples < 2:
        raise ValueError("a leave-one-out baseline needs samples >= 2 draws per estimate")
    z = gumbel_max(logits.expand(n * samples, k), generator)
    values = f(z).view(n, samples)
    if leave_one_out:
        others = (values.sum(1, keepdim=True) - values) / (samples - 1)
        values = values - others
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
    """n reparameterised estimates, shape (n, K), each the mean over `samples` draws of
    grad_theta f(y) through y = concrete_sample(theta, temperature).

    hard=False is Gumbel-softmax (f at the relaxed y); hard=True is straight-through
    (f at the one-hot z, gradient through y).
    """
    k = _check_logits(logits)
    checks.tensor("logits", logits, "(K,)")
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    temperature = _check_temperature(temperature)
    theta = logits.detach().expand(n * samples, k).clone().requires_grad_(True)
    # Each row of theta is its own copy of the logits, so theta.grad's row i is draw i's gradient.
    f(relax(theta, temperature, hard=hard, generator=generator)).sum().backward()
    return theta.grad.view(n, samples, k).mean(1)


@dataclass(frozen=True)
class EstimatorStats:
    """Bias = |mean estimate - exact gradient|; variance = trace of the estimates' covariance."""

    bias: float
    variance: float


def estimator_stats(estimates: torch.Tensor, exact: torch.Tensor) -> EstimatorStats:
    bias = (estimates.mean(0) - exact).norm().item()
    variance = estimates.var(0).sum().item()
    return EstimatorStats(bias=bias, variance=variance)


def crossing(xs, ys, level: float) -> float | None:
    """Where the curve (xs, ys) first crosses `level`, interpolated on log-log axes; None if it
    never does. For the temperature below which a variance exceeds another estimator's."""
    points = list(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if (y0 - level) * (y1 - level) <= 0 and y0 != y1:
            t = (math.log(level) - math.log(y0)) / (math.log(y1) - math.log(y0))
            return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))
    return None


# -- 5. A categorical VAE -----------------------------------------------------------------------


class CategoricalVAE(nn.Module):
    """x -> q(z|x), z = `n_latents` categorical variables of `n_categories` -> p(x|z) Bernoulli.

    The paper's VAE has 20 variables of 10 categories on 784-pixel MNIST; ours has 8 of 10 on
    the 64-pixel digits. The prior is uniform over each variable's categories.
    """

    def __init__(
        self, n_pixels: int = 64, n_latents: int = 8, n_categories: int = 10, hidden: int = 128
    ):
        super().__init__()
        for name, value in [("n_pixels", n_pixels), ("n_latents", n_latents), ("hidden", hidden)]:
            checks.integer(name, value)
        checks.integer("n_categories", n_categories, 2)
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
        """KL(q(z|x) || uniform) = sum_k q_k (log q_k + log K), summed over variables: (B,).

        This is the Gumbel-softmax paper's convention (discrete KL), not the Concrete paper's
        relaxed one; do not mix the two.
        """
        log_q = torch.log_softmax(logits, dim=-1)
        return (log_q.exp() * (log_q + math.log(self.n_categories))).sum((-1, -2))


ESTIMATORS = ("gumbel_softmax", "straight_through", "reinforce")


def vae_loss(
    model: CategoricalVAE,
    x: torch.Tensor,
    *,
    estimator: str,
    temperature: float,
    baseline: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A surrogate loss whose gradient is the estimator's, and -log p(x|z) per example.

    - "gumbel_softmax": decode the relaxed sample y; gradients flow through y.
    - "straight_through": decode the one-hot z; gradients flow through y.
    - "reinforce": decode the one-hot z; the encoder gets (nll - baseline) * grad log q(z|x),
      with the batch's mean nll as the baseline when none is given.
    The KL term is analytic in every case.
    """
    checks.one_of("estimator", estimator, ESTIMATORS)
    logits = model.posterior_logits(x)
    kl = model.kl_to_uniform(logits)
    if estimator == "reinforce":
        z = gumbel_max(logits.detach(), generator)
        nll = model.reconstruction_nll(x, z)
        if baseline is None:
            baseline = nll.detach().mean()
        log_q = (torch.log_softmax(logits, dim=-1) * z).sum((-1, -2))
        surrogate = nll + (nll.detach() - baseline) * log_q + kl
    else:
        hard = estimator == "straight_through"
        y = relax(logits, temperature, hard=hard, generator=generator)
        nll = model.reconstruction_nll(x, y)
        surrogate = nll + kl
    return surrogate.mean(), nll.detach()


def negative_elbo(
    model: CategoricalVAE, x: torch.Tensor, *, samples: int = 10, seed: int = 0
) -> float:
    """Mean -ELBO = E_q[-log p(x|z)] + KL(q || prior) in nats, with discrete z ~ q(z|x) (the
    relaxation is for training only); the noise follows `seed`, the same at every call."""
    checks.tensor("x", x, "(B, D)", D=model.decoder[-1].out_features)
    noise = generator(seed, stream=3)
    with torch.no_grad():
        logits = model.posterior_logits(x)
        nll = torch.stack(
            [model.reconstruction_nll(x, gumbel_max(logits, noise)) for _ in range(samples)]
        )
        return (nll.mean(0) + model.kl_to_uniform(logits)).mean().item()


def temperature_schedule(step: int, rate: float, floor: float = 0.5) -> float:
    """The Gumbel-softmax paper's annealing: tau = max(floor, exp(-rate * step))."""
    return max(floor, math.exp(-rate * step))


@dataclass
class VAERun:
    """A trained model and the History of its validation -ELBO ("val_neg_elbo")."""

    model: CategoricalVAE
    history: History


def train_vae(
    train_x: torch.Tensor,
    val_x: torch.Tensor,
    *,
    estimator: str,
    seed: int,
    steps: int = 2000,
    batch_size: int = 100,
    lr: float = 1e-3,
    anneal_rate: float = 3e-4,
    baseline_decay: float = 0.99,
    eval_every: int = 250,
) -> VAERun:
    """Train a CategoricalVAE with one estimator ("gumbel_softmax", "straight_through" or
    "reinforce"); its validation -ELBO is logged every `eval_every` updates.

    `seed` fixes every random choice: the initial weights, the batches, the estimator's noise
    and the evaluation's noise, each from its own stream.
    """
    checks.one_of("estimator", estimator, ESTIMATORS)
    n_pixels = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")["D"]
    checks.tensor("val_x", val_x, "(M, D)", D=n_pixels, dtype="floating")
    checks.integer("seed", seed, 0)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.number("anneal_rate", anneal_rate, 0.0)
    checks.number("baseline_decay", baseline_decay, 0.0, 1.0, high_open=True)
    with seeded(seed):
        model = CategoricalVAE(n_pixels=n_pixels)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    batches = minibatches(len(train_x), batch_size, generator(seed, stream=1))
    noise = generator(seed, stream=2)
    # REINFORCE's control variate: a moving average of the reconstruction term, started at the
    # first batch's mean (from zero it would take hundreds of updates to reach the nll's scale).
    baseline = None

    def loss_of_update(i: int) -> torch.Tensor:
        nonlocal baseline
        loss, nll = vae_loss(
            model,
            train_x[next(batches)],
            estimator=estimator,
            temperature=temperature_schedule(i, anneal_rate),
            baseline=baseline,
            generator=noise,
        )
        mean_nll = nll.mean().item()
        baseline = (
            mean_nll
            if baseline is None
            else (baseline_decay * baseline + (1 - baseline_decay) * mean_nll)
        )
        return loss

    history = train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=lambda: {"val_neg_elbo": negative_elbo(model, val_x, seed=seed)},
        eval_every=eval_every,
        desc=estimator,
    )
    return VAERun(model, history)
