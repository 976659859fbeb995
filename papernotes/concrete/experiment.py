"""The chapter's experiments on the Concrete distribution (chapters/concrete.ipynb).

Goodness-of-fit of the samplers (Pearson's chi-square), the density against sampled
histograms, the estimator lab's test objective and its bias / variance measurements, and the
Gumbel-softmax paper's categorical VAE (its Table 1 experiment, at digits scale) trained with
the relaxed gradient, straight-through or REINFORCE.
The mechanism itself is `papernotes.concrete`; this module calls it through the module, so
that a patched mechanism (tests/mutants/concrete.py) reaches every experiment.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks, concrete, together
from papernotes.data import minibatches
from papernotes.training import Run, generator, mlp, seeded

# The random streams of a VAE run, each drawn from generator(seed, stream).
BATCHES, NOISE, EVALUATION = 1, 2, 3

# -- goodness of fit of the samplers -------------------------------------------------------------


def chi_square_statistic(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's X^2 of category counts (K,) against the probabilities (K,) they should have
    been drawn with."""
    k = checks.tensor("counts", counts, "(K,)")["K"]
    checks.tensor("probs", probs, "(K,)", K=k)
    counts, probs = counts.double(), probs.double()
    # X^2 = sum_k (n_k - N p_k)^2 / (N p_k)
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


# -- the nearest corner: argmax of the relaxed sample against Gumbel-max ------------------------


def corner_mismatches(
    logits: torch.Tensor, temperature: float, n: int, noise: tuple[int, int]
) -> int:
    """How many of n relaxed samples y = softmax((logits + g) / tau) have a largest coordinate
    other than the Gumbel-max category argmax(logits + g) of the same noise g.

    `noise` is the (seed, stream) of the generator; each side draws from a fresh generator of
    it, so both see the same g. Maddison et al.'s P(argmax y = k) = pi_k rests on this identity
    (softmax is increasing in each coordinate, dividing by tau > 0 keeps the order): zero for a
    right relaxation at every temperature.
    """
    checks.tensor("logits", logits, "(K,)", dtype="floating")
    n = checks.integer("n", n)
    draws = logits.expand(n, -1)
    y = concrete.relax(draws, temperature, generator=generator(*noise))
    z = concrete.gumbel_max(draws, generator(*noise))
    return int((y.argmax(-1) != z.argmax(-1)).sum())


# -- log-convexity of the density (Maddison et al., Proposition 1d) -------------------------------


def log_density_curvature(logits: torch.Tensor, temperature: float, points: torch.Tensor) -> float:
    """The most negative curvature of the Concrete log-density at `points` (N, K) inside the
    simplex, relative to the largest: min over points of lambda_min(H) / max |lambda(H)|, with
    H the Hessian of log p in the free coordinates y_1..y_{K-1} (y_K = 1 - their sum).

    At least 0 (up to rounding) wherever the density is log-convex; negative where it curves
    down somewhere.
    """
    k = checks.tensor("logits", logits, "(K,)", dtype="floating")["K"]
    checks.tensor("points", points, "(N, K)", K=k, dtype="floating")

    def log_p(free: torch.Tensor) -> torch.Tensor:
        y = torch.cat([free, (1 - free.sum()).reshape(1)])
        return concrete.log_density(y, logits, temperature)

    hessians = torch.func.vmap(torch.func.hessian(log_p))(points[:, :-1])
    eigenvalues = torch.linalg.eigvalsh(hessians)  # ascending, per point
    scale = eigenvalues.abs().amax(-1).clamp_min(torch.finfo(eigenvalues.dtype).tiny)
    return (eigenvalues[:, 0] / scale).min().item()


def uniform_simplex_points(n: int, k: int, generator: torch.Generator | None = None):
    """n points (n, K) drawn uniformly on the simplex (Dirichlet(1, ..., 1): normalised
    exponential variables), in float64."""
    e = -torch.log(torch.rand(n, k, generator=generator, dtype=torch.float64).clamp_min(1e-300))
    return e / e.sum(-1, keepdim=True)


# -- the density against sampled histograms, K = 3 ------------------------------------------------
# The density is compared in v = tau (log y_1 - log y_3, log y_2 - log y_3), where it is smooth
# (on the simplex it piles up at the corners): a histogram of samples on a square grid of v
# against the formula's mass in each cell.


def logit_histogram(y: torch.Tensor, temperature: float, edges: torch.Tensor) -> torch.Tensor:
    """The fraction of the samples y (N, 3) in each cell of the square grid `edges` x `edges`
    of v, row-major, shape ((len(edges) - 1)^2,); samples outside the grid are not counted."""
    checks.tensor("y", y, "(N, 3)", dtype="floating")
    checks.tensor("edges", edges, "(E,)", dtype="floating")
    # v = tau (log y_k - log y_3), k = 1, 2
    v = temperature * (torch.log(y[:, :2]) - torch.log(y[:, 2:]))
    cells = torch.bucketize(v, edges) - 1
    inside = ((cells >= 0) & (cells < len(edges) - 1)).all(-1)
    flat = cells[inside, 0] * (len(edges) - 1) + cells[inside, 1]
    return torch.bincount(flat, minlength=(len(edges) - 1) ** 2).double() / len(y)


def cell_masses(log_density, temperature: float, edges: torch.Tensor, sub: int = 4):
    """The mass that the density `log_density(y, temperature)` on the simplex (K = 3) puts in
    each cell of `logit_histogram`'s grid, by the midpoint rule with sub x sub points per cell."""
    checks.tensor("edges", edges, "(E,)", dtype="floating")
    sub = checks.integer("sub", sub)
    width = (edges[1] - edges[0]).item()
    offsets = (torch.arange(sub, dtype=torch.float64) + 0.5) / sub * width
    centres = (edges[:-1, None] + offsets).reshape(-1)
    v1, v2 = torch.meshgrid(centres, centres, indexing="ij")
    # y = softmax((v_1, v_2, 0) / tau); p(v) = p(y) |dy/dv| = p(y) prod_k y_k / tau^2
    log_y = torch.log_softmax(torch.stack([v1, v2, torch.zeros_like(v1)], -1) / temperature, -1)
    log_p_v = log_density(log_y.exp(), temperature) + log_y.sum(-1) - 2 * math.log(temperature)
    cells = len(edges) - 1
    masses = (log_p_v.exp() * (width / sub) ** 2).reshape(cells, sub, cells, sub).sum((1, 3))
    return masses.reshape(-1)


def histogram_distance(p: torch.Tensor, q: torch.Tensor) -> float:
    """Half the L1 distance between two cell masses (C,), with the mass outside the grid as one
    more cell: the total variation between the two distributions, seen through the grid."""
    c = checks.tensor("p", p, "(C,)")["C"]
    checks.tensor("q", q, "(C,)", C=c)
    return 0.5 * ((p - q).abs().sum() + ((1 - p.sum()) - (1 - q.sum())).abs()).item()


def concrete_samples_of_its_own(
    logits: torch.Tensor, temperature: float, n: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """n Concrete samples (n, K), softmax((logits + g) / tau), drawn apart from the mechanism
    (its own Gumbel noise): the reference histogram of the density check's nulls, which no
    mutant of the mechanism reaches."""
    k = checks.tensor("logits", logits, "(K,)", dtype="floating")["K"]
    n = checks.integer("n", n)
    noise = gumbel_noise_of_its_own((n, k), generator, logits.dtype)
    return torch.softmax((logits + noise) / temperature, dim=-1)


def ablated_log_density(
    y: torch.Tensor,
    logits: torch.Tensor,
    temperature: float,
    *,
    with_gamma: bool = True,
    exponent_shift: int = 0,
) -> torch.Tensor:
    """The Concrete log-density written afresh (not through the mechanism), with two ways to
    get it wrong: without the constant Gamma(K), or with the exponent -(K + exponent_shift)
    in place of -K. The density check's nulls; with the defaults it is the formula itself."""
    k = checks.tensor("logits", logits, "(K,)", dtype="floating")["K"]
    if not isinstance(y, torch.Tensor) or y.dim() == 0 or y.shape[-1] != k:
        raise ValueError(f"y must have shape (..., K) with K = {k}, as the logits")
    log_pi = torch.log_softmax(logits, dim=-1)
    log_y = torch.log(y)
    # log G(K) + (K-1) log tau - (K + shift) log sum_i pi_i y_i^-tau + sum_k log pi_k y_k^(-tau-1)
    constant = (math.lgamma(k) if with_gamma else 0.0) + (k - 1) * math.log(temperature)
    mixture = torch.logsumexp(log_pi - temperature * log_y, dim=-1)
    return constant - (k + exponent_shift) * mixture + (log_pi - (temperature + 1) * log_y).sum(-1)


# -- the estimator lab ---------------------------------------------------------------------------


def quadratic_objective(weights: torch.Tensor, target: float = 0.5) -> concrete.Objective:
    """f(z) = (w . z - target)^2: a function of a category whose exact gradient is easy."""
    return lambda z: (z @ weights - target) ** 2


@dataclass(frozen=True)
class EstimatorStats:
    """Bias = |mean estimate - exact gradient|; variance = trace of the estimates' covariance,
    with its standard error `variance_se` (`variance_standard_error`)."""

    bias: float
    variance: float
    variance_se: float = 0.0


def estimator_stats(estimates: torch.Tensor, exact: torch.Tensor) -> EstimatorStats:
    bias = (estimates.mean(0) - exact).norm().item()
    variance = estimates.var(0).sum().item()
    return EstimatorStats(
        bias=bias, variance=variance, variance_se=variance_standard_error(estimates)
    )


def variance_standard_error(estimates: torch.Tensor) -> float:
    """The standard error of `estimator_stats`' variance (the trace of the covariance of the
    estimates (n, K)): the spread of the squared distances to the mean, over sqrt(n)."""
    n = checks.tensor("estimates", estimates, "(n, K)")["n"]
    squared = (estimates - estimates.mean(0)).pow(2).sum(-1)
    return (squared.std() / math.sqrt(n)).item()


def gumbel_noise_of_its_own(shape, generator: torch.Generator | None = None, dtype=torch.float64):
    """Gumbel noise -log(-log u), written apart from the mechanism's, for the nulls."""
    u = torch.rand(shape, generator=generator, dtype=dtype).clamp(1e-12, 1 - 1e-12)
    return -torch.log(-torch.log(u))


def plain_score_function_gradients(
    logits: torch.Tensor, f, n: int, *, samples: int = 1, generator: torch.Generator | None = None
) -> torch.Tensor:
    """n REINFORCE estimates (n, K) without a baseline, each the mean over `samples` draws,
    with a sampler of their own (torch.multinomial): the lab's null, which no mutant of the
    mechanism reaches."""
    k = checks.tensor("logits", logits, "(K,)", dtype="floating")["K"]
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    z = sample_categorical(logits.expand(n * samples, k), generator)
    # f(z) * grad log p(z) = f(z) * (z - pi)
    score = z - torch.softmax(logits, dim=-1)
    return (f(z).unsqueeze(-1) * score).view(n, samples, k).mean(1)


def logits_alone_gradients(
    logits: torch.Tensor,
    f,
    n: int,
    temperature: float,
    *,
    samples: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """n reparameterised estimates (n, K) through softmax(logits / tau + g), the temperature on
    the logits alone: a softmax that also turns one-hot as tau falls, but whose argmax is not a
    sample of the categorical. Written apart from the mechanism, for the nulls."""
    k = checks.tensor("logits", logits, "(K,)", dtype="floating")["K"]
    n, samples = checks.integer("n", n), checks.integer("samples", samples)
    temperature = checks.number("temperature", temperature, 0.0, low_open=True)
    theta = logits.detach().expand(n * samples, k).clone().requires_grad_(True)
    noise = gumbel_noise_of_its_own(theta.shape, generator, logits.dtype)
    f(torch.softmax(theta / temperature + noise, dim=-1)).sum().backward()
    return theta.grad.view(n, samples, k).mean(1)


def crossing(xs, ys, level: float) -> float | None:
    """Where the curve (xs, ys) first crosses `level`, interpolated on log-log axes; None if it
    never does. For the temperature below which a variance exceeds another estimator's."""
    points = list(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if (y0 - level) * (y1 - level) <= 0 and y0 != y1:
            t = (math.log(level) - math.log(y0)) / (math.log(y1) - math.log(y0))
            return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))
    return None


# -- a categorical VAE -----------------------------------------------------------------------------


class CategoricalVAE(nn.Module):
    """x -> q(z|x), z = `n_latents` categorical variables of `n_categories` -> p(x|z) Bernoulli,
    with a learned categorical prior p(z) (one softmax per variable), as in Jang et al.

    The paper's VAE has 20 variables of 10 categories on 784-pixel MNIST; ours has 8 of 10 on
    the 64-pixel digits. `baseline` is REINFORCE's input-dependent baseline b(x) (NVIL's); it is
    built for every estimator, so that all of them start from the same encoder and decoder, and
    only REINFORCE trains it.
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
        self.encoder = mlp([n_pixels, hidden, code])
        self.decoder = mlp([code, hidden, n_pixels])
        self.prior_logits = nn.Parameter(torch.zeros(n_latents, n_categories))
        self.baseline = mlp([n_pixels, hidden // 2, 1])

    def posterior_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of q(z|x), shape (B, n_latents, n_categories)."""
        return self.encoder(x).unflatten(-1, (self.n_latents, self.n_categories))

    def reconstruction_nll(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """-log p(x|z) in nats per example, shape (B,); z is (B, n_latents, n_categories)."""
        logits = self.decoder(z.flatten(-2))
        return F.binary_cross_entropy_with_logits(
            logits, x.expand_as(logits), reduction="none"
        ).sum(-1)

    def kl_to_prior(self, logits: torch.Tensor) -> torch.Tensor:
        """KL(q(z|x) || p(z)), summed over variables: (B,).

        This is the Gumbel-softmax paper's convention (discrete KL), not the Concrete paper's
        relaxed one; do not mix the two.
        """
        # KL = sum_k q_k (log q_k - log p_k)
        log_q = torch.log_softmax(logits, dim=-1)
        log_p = torch.log_softmax(self.prior_logits, dim=-1)
        return (log_q.exp() * (log_q - log_p)).sum((-1, -2))


class _OnAll(nn.Module):
    """A stack of K networks that gives every member the same input: (B, D) -> (K, B, C)."""

    def __init__(self, stack: together.MLPStack):
        super().__init__()
        self.stack = stack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack.on_all(x)


class StackedVAE(CategoricalVAE):
    """K CategoricalVAEs of one shape as one model (papernotes.together): every parameter leads
    with the member axis, the prior's as (K, 1, n_latents, n_categories), and the methods take
    one batch x (B, D) for all and give each member's values, (K, B, ...), so that `vae_loss`
    trains K runs at once. `member(k)` is member k as a plain CategoricalVAE."""

    def __init__(self, members: Sequence[CategoricalVAE]):
        nn.Module.__init__(self)
        first = members[0]
        self.members = len(members)
        self.n_latents, self.n_categories = first.n_latents, first.n_categories
        self.encoder = _OnAll(together.stack([m.encoder for m in members]))
        self.decoder = together.stack([m.decoder for m in members])
        self.baseline = _OnAll(together.stack([m.baseline for m in members]))
        priors = [m.prior_logits.detach() for m in members]
        self.prior_logits = nn.Parameter(torch.stack(priors).unsqueeze(1))
        self._plain = [copy.deepcopy(first)]  # in a list: the skeleton is no submodule

    def member(self, k: int) -> CategoricalVAE:
        plain = copy.deepcopy(self._plain[0])
        plain.encoder = self.encoder.stack.member(k)
        plain.decoder = self.decoder.member(k)
        plain.baseline = self.baseline.stack.member(k)
        with torch.no_grad():
            plain.prior_logits.copy_(self.prior_logits[k, 0])
        return plain.eval()


def sample_categorical(logits: torch.Tensor, generator: torch.Generator | None = None):
    """One-hot draws of Categorical(softmax(logits)) along the last dim, by inverse-CDF sampling
    (torch.multinomial), not by the mechanism's Gumbel-max: REINFORCE, the nulls and the
    evaluation sample with code of their own, which no mutant of the mechanism reaches."""
    k = logits.shape[-1]
    probs = torch.softmax(logits.detach().reshape(-1, k), dim=-1)
    index = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return F.one_hot(index, k).to(logits.dtype).view(logits.shape)


ESTIMATORS = (
    "gumbel_softmax",
    "straight_through",
    "reinforce",
    "reinforce_moving_average",
    "softmax",
)


@dataclass
class ScoreFunctionState:
    """REINFORCE's running statistics (NVIL): the mean c of the learning signal and the variance
    v of the centred signal, as exponential moving averages over batches (tensors (1,), or
    (K, 1) for a StackedVAE); None before the first batch."""

    decay: float = 0.9
    mean: float | torch.Tensor | None = None
    variance: float | torch.Tensor | None = None

    def update(self, signal: torch.Tensor, centred: torch.Tensor) -> None:
        # over the batch (the last axis), one statistic a member of a stack
        m, v = signal.mean(-1, keepdim=True), centred.pow(2).mean(-1, keepdim=True)
        if self.mean is None:
            self.mean, self.variance = m, v
        else:
            self.mean = self.decay * self.mean + (1 - self.decay) * m
            self.variance = self.decay * self.variance + (1 - self.decay) * v


def vae_loss(
    model: CategoricalVAE,
    x: torch.Tensor,
    *,
    estimator: str,
    temperature: float,
    state: ScoreFunctionState | None = None,
    generator: torch.Generator | None = None,
    normalise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A surrogate loss whose gradient is the estimator's (its mean over the batch: a scalar, or
    one a member (K,) for a StackedVAE), and -log p(x|z) per example.

    - "gumbel_softmax": decode the relaxed sample y; gradients flow through y.
    - "straight_through": decode the one-hot z; gradients flow through y.
    - "reinforce": decode the one-hot z; the encoder gets the score-function gradient with
      NVIL's variance reduction: the learning signal -log p(x|z) centred by a running mean c and
      an input-dependent baseline b(x) (trained to predict it), and the encoder's gradient
      divided by max(1, sqrt(v)), v the running variance of the centred signal.
    - "reinforce_moving_average": the same without b(x) and without the normalisation (a null).
    - "softmax": decode softmax(logits / tau), the relaxation without its Gumbel noise (a null:
      a differentiable bottleneck at the same temperature, written here, not the mechanism's).
    The KL term is analytic in every case. `normalise=False` leaves out REINFORCE's division by
    max(1, sqrt v): the score-function estimate itself, as `encoder_gradients` measures it.
    """
    checks.one_of("estimator", estimator, ESTIMATORS)
    logits = model.posterior_logits(x)
    kl = model.kl_to_prior(logits)
    if estimator.startswith("reinforce"):
        state = ScoreFunctionState() if state is None else state
        z = sample_categorical(logits, generator)
        nll = model.reconstruction_nll(x, z)
        signal = nll.detach()
        log_q = (torch.log_softmax(logits, dim=-1) * z).sum((-1, -2))
        c = signal.mean(-1, keepdim=True) if state.mean is None else state.mean
        if estimator == "reinforce":
            b = model.baseline(x).squeeze(-1)
            centred = signal - c - b.detach()
            state.update(signal, centred)
            scale = state.variance.sqrt().clamp_min(1.0) if normalise else 1.0
            # (l - c - b(x)) / max(1, sqrt v) * grad log q(z|x), and b(x) fitted to l - c
            encoder = (centred * log_q + kl) / scale
            surrogate = nll + encoder + (signal - c - b) ** 2
        else:
            centred = signal - c
            state.update(signal, centred)
            surrogate = nll + centred * log_q + kl
    elif estimator == "softmax":
        # y = softmax(logits / tau): no noise, so the code is a deterministic function of x
        y = torch.softmax(logits / temperature, dim=-1)
        nll = model.reconstruction_nll(x, y)
        surrogate = nll + kl
    else:
        hard = estimator == "straight_through"
        # (K, B, L, C) of a stack as (K B, L, C): the mechanism sees one VAE's shape
        y = concrete.relax(logits.flatten(0, -3), temperature, hard=hard, generator=generator)
        y = y.view_as(logits)
        nll = model.reconstruction_nll(x, y)
        surrogate = nll + kl
    return surrogate.mean(-1), nll.detach()


def encoder_gradients(
    model: CategoricalVAE,
    x: torch.Tensor,
    *,
    estimator: str,
    temperature: float,
    draws: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The encoder's gradient (draws, P) of one estimator at a fixed model and batch x, once per
    independent draw of its noise: its spread over the draws is the estimator's variance.

    REINFORCE's estimate is the score function centred by a fixed c (the mean learning signal
    of `draws` draws made first) and, for "reinforce", the model's b(x), without NVIL's division
    by max(1, sqrt v): at a fixed model that is one constant, which Adam undoes, and it would
    scale the variance it divides.
    """
    checks.one_of("estimator", estimator, ESTIMATORS)
    checks.tensor("x", x, "(B, D)", D=model.decoder[-1].out_features)
    draws = checks.integer("draws", draws, 2)
    state = None
    if estimator.startswith("reinforce"):
        with torch.no_grad():
            signal = [
                model.reconstruction_nll(
                    x, sample_categorical(model.posterior_logits(x), generator)
                )
                for _ in range(draws)
            ]
        state = ScoreFunctionState(mean=torch.cat(signal).mean().item(), variance=1.0)
    parameters = list(model.encoder.parameters())
    gradients = []
    for _ in range(draws):
        loss, _ = vae_loss(
            model,
            x,
            estimator=estimator,
            temperature=temperature,
            state=None if state is None else replace(state),
            generator=generator,
            normalise=False,
        )
        gradients.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, parameters)]))
    return torch.stack(gradients)


def negative_bound(
    model: CategoricalVAE, x: torch.Tensor, *, samples: int = 100, seed: int = 0
) -> torch.Tensor:
    """The negative m-sample bound per example, in nats, shape (N,):
    -log (1/m) sum_i p(x|z_i) p(z_i) / q(z_i|x), z_i ~ q(z|x) discrete (the relaxation is for
    training only). m = 1 is the single-sample -ELBO; it falls toward -log p(x) as m grows.
    The noise follows `seed`, the same at every call."""
    checks.tensor("x", x, "(B, D)", D=model.decoder[-1].out_features)
    samples = checks.integer("samples", samples)
    noise = generator(seed, stream=EVALUATION)
    with torch.no_grad():
        logits = model.posterior_logits(x)
        log_q_all = torch.log_softmax(logits, dim=-1)
        log_p_all = torch.log_softmax(model.prior_logits, dim=-1)
        weights = []
        for _ in range(samples):
            z = sample_categorical(logits, noise)
            # log w = log p(x|z) + log p(z) - log q(z|x)
            weights.append(
                -model.reconstruction_nll(x, z)
                + (z * log_p_all).sum((-1, -2))
                - (z * log_q_all).sum((-1, -2))
            )
        return -(torch.logsumexp(torch.stack(weights), 0) - math.log(samples))


def negative_elbo(
    model: CategoricalVAE, x: torch.Tensor, *, samples: int = 10, seed: int = 0
) -> float:
    """Mean -ELBO in nats with the KL analytic: E_q[-log p(x|z)] over `samples` discrete
    draws, plus KL(q || p)."""
    checks.tensor("x", x, "(B, D)", D=model.decoder[-1].out_features)
    noise = generator(seed, stream=EVALUATION)
    with torch.no_grad():
        logits = model.posterior_logits(x)
        nll = torch.stack(
            [model.reconstruction_nll(x, sample_categorical(logits, noise)) for _ in range(samples)]
        )
        return (nll.mean(0) + model.kl_to_prior(logits)).mean().item()


def independent_pixels_nll(train_x: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """-log p(x) per example (N,) of the model without a latent variable: each pixel an
    independent Bernoulli at its training frequency (add-one counts, so that no pixel has
    probability 0 or 1). It is what a decoder with a learned constant input converges to."""
    d = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")["D"]
    checks.tensor("x", x, "(M, D)", D=d, dtype="floating")
    p = (train_x.sum(0) + 1) / (len(train_x) + 2)
    return -(x * p.log() + (1 - x) * (1 - p).log()).sum(-1)


def paired_standard_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The standard error of mean(a - b) over paired per-example values (N,)."""
    n = checks.tensor("a", a, "(N,)")["N"]
    checks.tensor("b", b, "(N,)", N=n)
    return ((a - b).double().std() / math.sqrt(n)).item()


def temperature_schedule(step: int, rate: float, floor: float = 0.5) -> float:
    """The Gumbel-softmax paper's annealing."""
    # tau = max(floor, exp(-rate * step))
    return max(floor, math.exp(-rate * step))


@dataclass
class VAERun(Run):
    """A trained CategoricalVAE and the History of its validation bound ("val_bound")."""

    model: CategoricalVAE


def train_vae(
    train_x: torch.Tensor,
    val_x: torch.Tensor,
    *,
    estimator: str,
    seed: int,
    lr: float = 1e-3,
    **options,
) -> VAERun:
    """One run of `train_vaes`, at the learning rate `lr`."""
    return train_vaes(train_x, val_x, estimator=estimator, seed=seed, rates=[lr], **options)[0]


def train_vaes(
    train_x: torch.Tensor,
    val_x: torch.Tensor,
    *,
    estimator: str,
    seed: int,
    rates: Sequence[float],
    steps: int = 2000,
    batch_size: int = 100,
    anneal_rate: float = 3e-4,
    eval_every: int = 250,
    eval_samples: int = 10,
) -> list[VAERun]:
    """Train a CategoricalVAE with one estimator (`ESTIMATORS`) at each learning rate of
    `rates`, the runs together as one StackedVAE; each run's validation bound (`negative_bound`
    with `eval_samples` draws) is logged every `eval_every` updates.

    `seed` fixes every random choice: the initial weights (the same for every rate, as separate
    runs of one seed would have), the batches (one order for all), the estimator's noise (one
    draw for all the runs a step, a row each) and the evaluation's noise, each from its own
    stream.
    """
    checks.one_of("estimator", estimator, ESTIMATORS)
    n_pixels = checks.tensor("train_x", train_x, "(N, D)", dtype="floating")["D"]
    checks.tensor("val_x", val_x, "(M, D)", D=n_pixels, dtype="floating")
    checks.integer("seed", seed, 0)
    rates = [checks.number("rates", lr, 0.0, low_open=True) for lr in rates]
    if not rates:
        raise ValueError("rates must hold at least one learning rate; got none")
    checks.number("anneal_rate", anneal_rate, 0.0)
    with seeded(seed):
        model = CategoricalVAE(n_pixels=n_pixels)
    stack = StackedVAE([copy.deepcopy(model) for _ in rates])
    optimizer = together.Adam(stack.parameters(), lr=rates)
    batches = minibatches(len(train_x), batch_size, generator(seed, stream=BATCHES))
    noise = generator(seed, stream=NOISE)
    state = ScoreFunctionState()

    def losses_of_update(i: int) -> torch.Tensor:  # (K,): each run's own mean loss
        losses, _ = vae_loss(
            stack,
            train_x[next(batches)],
            estimator=estimator,
            temperature=temperature_schedule(i, anneal_rate),
            state=state,
            generator=noise,
        )
        return losses

    def evaluate() -> dict[str, list[float]]:
        bounds = [
            negative_bound(stack.member(k), val_x, samples=eval_samples, seed=seed)
            for k in range(len(rates))
        ]
        return {"val_bound": [bound.mean().item() for bound in bounds]}

    histories = together.train(
        stack,
        optimizer,
        losses_of_update,
        steps,
        evaluate=evaluate,
        eval_every=eval_every,
        desc=estimator,
    )
    return [VAERun(stack.member(k), history) for k, history in enumerate(histories)]
