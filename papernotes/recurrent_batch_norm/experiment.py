"""The chapter's experiment (chapters/recurrent_batch_norm.ipynb): the gradient flow through a
batch-normalized tanh RNN (the paper's Figure 1), sequential and permuted digits read one pixel
per step, the classifiers and their training run, and the measurements and ablations of the
per-step statistics.

The BN-LSTM and its statistics are the mechanism's (`papernotes.recurrent_batch_norm`), looked
up at call time so that a broken variant patched into that module is the one these run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import batch_norm, checks, training
from papernotes import recurrent_batch_norm as rbn
from papernotes.data import minibatches

# Random streams of a training run, each its own generator derived from the run's seed.
BATCHES, H0_NOISE, POPULATION_NOISE = 0, 1, 2
# The random stream of the gradient-flow sweep: which digits each draw reads, and its seed.
FLOW_DRAWS = 5

# The BNs whose statistics depend on the recurrent state: the recurrent term and the cell.
RECURRENT = ("bn_h", "bn_c")

# -- why gamma = 0.1: gradient flow through a batch-normalized tanh RNN ------------------------


def tanh_derivative_statistics(
    std: float, samples: int = 100_000, seed: int = 0
) -> tuple[float, float, float]:
    """For z ~ N(0, std^2): the mean, 25th and 75th percentiles of tanh'(z) = 1 - tanh(z)^2.

    The paper's Figure 1a: the wider the pre-activation, the more often the tanh saturates and
    the smaller its expected derivative, the factor by which it passes a gradient back.
    """
    std = checks.number("std", std, 0.0)
    z = std * torch.randn(checks.integer("samples", samples), generator=training.generator(seed))
    derivative = 1 - torch.tanh(z.double()).square()
    low, high = torch.quantile(derivative, torch.tensor([0.25, 0.75], dtype=torch.float64))
    return derivative.mean().item(), low.item(), high.item()


def gradient_norms_through_time(
    x: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    hidden_size: int = 100,
    h0_noise: float = 0.1,
    n_classes: int = 10,
    seed: int = 0,
) -> torch.Tensor:
    """||dL/dh_t|| for t = 0..T in a freshly initialised BNTanhRNN, in float64: shape (T + 1,).

    x (B, T, D). L is the mean cross-entropy of an orthogonally initialised linear read-out of
    h_T; the norm is taken per example and averaged over the batch (as the authors' plotting
    code does). h_0 is `h0_noise` times standard normal noise, the paper's fix for zero-variance
    first steps. The weights and the noise follow `seed`.
    """
    batch = checks.tensor("x", x, "(B, T, D)", dtype="floating")["B"]
    checks.tensor("labels", labels, "(B,)", B=batch)
    h0_noise = checks.number("h0_noise", h0_noise, 0.0)
    with training.seeded(seed):
        model = rbn.BNTanhRNN(x.shape[2], hidden_size, gamma).double()
        readout = nn.Linear(hidden_size, n_classes).double()
        nn.init.orthogonal_(readout.weight)
        nn.init.zeros_(readout.bias)
    h0 = h0_noise * torch.randn(
        batch, hidden_size, dtype=torch.float64, generator=training.generator(seed)
    )
    states = model(x.double(), h0.requires_grad_(True))
    loss = F.cross_entropy(readout(states[-1]), labels)
    grads = torch.autograd.grad(loss, states)
    return torch.stack([g.norm(dim=1).mean() for g in grads])


def gradient_flow_over_draws(
    images: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    *,
    draws: int = 4,
    batch_size: int = 128,
    steps: int | None = None,
    h0_noise: float = 0.1,
    seed: int = 0,
) -> torch.Tensor:
    """`gradient_norms_through_time` for several draws: shape (draws, T + 1).

    images (N, P) flattened, labels (N,). Draw d reads `batch_size` of the images (as pixel
    sequences of `steps` steps, see `pixel_sequences`) with its own initial weights and h_0
    noise; the digits and the seeds of the draws follow `seed`, and they are the same for every
    gamma, so that a sweep over gamma compares like with like.
    """
    n = checks.tensor("images", images, "(N, P)", dtype="floating")["N"]
    checks.tensor("labels", labels, "(N,)", N=n)
    draws = checks.integer("draws", draws)
    batch_size = min(checks.integer("batch_size", batch_size), n)
    stream = training.generator(seed, FLOW_DRAWS)
    norms = []
    for _ in range(draws):
        rows = torch.randperm(n, generator=stream)[:batch_size]
        draw_seed = int(torch.randint(2**31, (1,), generator=stream))
        x = pixel_sequences(images[rows], steps=steps)
        norms.append(
            gradient_norms_through_time(x, labels[rows], gamma, h0_noise=h0_noise, seed=draw_seed)
        )
    return torch.stack(norms)


# -- sequential digits --------------------------------------------------------------------------


def pixel_sequences(
    images: torch.Tensor, steps: int | None = None, order: torch.Tensor | None = None
) -> torch.Tensor:
    """Flattened images (N, P) -> pixel sequences (N, T, 1), one pixel per step.

    `order` (a permutation of the P pixels) reads them in another order (permuted digits).
    `steps` < P keeps the first `steps` pixels; `steps` > P continues with blank pixels, as if
    the digit sat at the top of a taller canvas (the longer test sequences).
    """
    pixels = checks.tensor("images", images, "(N, P)", dtype="floating")["P"]
    if order is not None:
        if sorted(torch.as_tensor(order).tolist()) != list(range(pixels)):
            raise ValueError(f"order must be a permutation of the {pixels} pixel indices")
        images = images[:, order]
    steps = pixels if steps is None else checks.integer("steps", steps)
    if steps > pixels:
        images = torch.cat([images, images.new_zeros(len(images), steps - pixels)], dim=1)
    return images[:, :steps, None].contiguous()


def standardize_steps(x: torch.Tensor, reference: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x (B, T, D) with each step's features standardised by the statistics of that step over
    `reference` (N, T, D): (x_t - mean_t) / sqrt(var_t + eps), the mean and biased variance over
    the reference sequences.

    What the input-term BN does to one-pixel inputs, done once to the data with the training
    set's statistics. With a single input feature (a pixel per step), BN(W_x x_t) is the pixel
    standardised with step t's statistics times the vector gamma_x * sign(W_x): the input-term
    BN does no more than an LSTM fed standardised pixels, the chapter's control.
    """
    sizes = checks.tensor("reference", reference, "(N, T, D)", dtype="floating")
    steps, features = sizes["T"], sizes["D"]
    batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", T=steps, D=features)["B"]
    mean, variance = batch_norm.batch_statistics(reference.reshape(sizes["N"], steps * features))
    flat = x.reshape(batch, steps * features)
    return batch_norm.normalize(flat, mean, variance, eps).view(x.shape)


class SequenceClassifier(nn.Module):
    """A recurrent layer (BNLSTM or LSTM) and a linear read-out of its last hidden state."""

    def __init__(self, rnn: nn.Module, n_classes: int = 10):
        super().__init__()
        self.rnn = rnn
        self.readout = nn.Linear(rnn.hidden_size, checks.integer("n_classes", n_classes))
        nn.init.orthogonal_(self.readout.weight)
        nn.init.zeros_(self.readout.bias)

    @property
    def hidden_size(self) -> int:
        return self.rnn.hidden_size

    def forward(self, x: torch.Tensor, state=None) -> torch.Tensor:
        _, (h, _) = self.rnn(x, state)
        return self.readout(h)


def bn_lstm_classifier(
    hidden_size: int = 64,
    max_steps: int = 64,
    gamma_init: float = 0.1,
    *,
    input_size: int = 1,
    seed: int = 0,
) -> SequenceClassifier:
    """A sequence classifier on a BN-LSTM, its initial weights drawn from `seed`."""
    with training.seeded(seed):
        return SequenceClassifier(rbn.BNLSTM(input_size, hidden_size, max_steps, gamma_init))


def lstm_classifier(
    hidden_size: int = 64, *, input_size: int = 1, seed: int = 0
) -> SequenceClassifier:
    """A sequence classifier on the plain LSTM, its initial weights drawn from `seed`."""
    with training.seeded(seed):
        return SequenceClassifier(rbn.LSTM(input_size, hidden_size))


def train_classifier(
    model: SequenceClassifier,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    *,
    steps: int = 150,
    batch_size: int = 128,
    lr: float = 1e-2,
    clip: float = 1.0,
    h0_noise: float = 0.1,
    eval_every: int = 25,
    population_size: int = 256,
    seed: int = 0,
) -> training.History:
    """Train a classifier on sequences (N, T, D) with the paper's recipe: RMSProp (decay 0.9),
    gradient norm clipped at `clip`, noise on h_0 while training. Returns the run's History.

    Every `eval_every` updates and after the last: population statistics from the first
    `population_size` training sequences (models with StepwiseBatchNorm only), then the accuracy
    on each of `splits` ({"val": (x, y), ...}), logged as "val_accuracy", .... Minibatches, the
    h_0 noise and the population-statistics noise are streams of `seed`, so two models trained
    with one seed see the same minibatches.
    """
    if not isinstance(model, SequenceClassifier):
        raise TypeError(f"model must be a SequenceClassifier; got {type(model).__name__}")
    n = checks.tensor("train_x", train_x, "(N, T, D)", dtype="floating")["N"]
    checks.tensor("train_y", train_y, "(N,)", N=n)
    checks.integer("batch_size", batch_size)
    checks.number("lr", lr, 0.0, low_open=True)
    h0_noise = checks.number("h0_noise", h0_noise, 0.0)
    population_size = min(checks.integer("population_size", population_size), n)
    hidden = model.hidden_size
    normalized = any(isinstance(m, rbn.StepwiseBatchNorm) for m in model.modules())
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=0.9)
    batches = minibatches(n, batch_size, training.generator(seed, BATCHES))
    noise = training.generator(seed, H0_NOISE)
    population_noise = training.generator(seed, POPULATION_NOISE)

    def measure() -> dict[str, float]:
        if normalized:
            state = rbn.initial_state(population_size, hidden, h0_noise, population_noise)
            rbn.estimate_population_statistics(model, train_x[:population_size], state)
        return {
            f"{name}_accuracy": training.accuracy(model(x), y) for name, (x, y) in splits.items()
        }

    return training.train_classifier(
        model,
        train_y,
        optimizer,
        steps,
        batches=batches,
        # The h_0 noise is drawn before each forward pass, the noise the paper puts on h_0.
        logits_of=lambda index: model(
            train_x[index], rbn.initial_state(len(index), hidden, h0_noise, noise)
        ),
        evaluate=measure,
        eval_every=eval_every,
        clip=clip,
        desc=type(model.rnn).__name__,
    )


# -- stationarity of the population statistics --------------------------------------------------


def statistics_drift(bn: rbn.StepwiseBatchNorm) -> torch.Tensor:
    """How far the population statistics move from one step to the next: shape (max_steps - 1,).

    For steps t -> t + 1: the mean over features of |mean_{t+1} - mean_t| + |std_{t+1} - std_t|,
    in units of each feature's typical standard deviation (its median over the steps), so that
    features of different scales count alike.
    """
    mean, std = bn.running_mean, bn.running_var.clamp_min(0).sqrt()
    scale = std.median(dim=0).values.clamp_min(1e-12)
    change = (mean.diff(dim=0).abs() + std.diff(dim=0).abs()) / scale
    return change.mean(dim=1)


# -- the statistics beyond T_max, and the ablations of per-step statistics ----------------------


def statistics_for_first(
    model: SequenceClassifier, steps: int, names: tuple[str, ...] = RECURRENT
) -> SequenceClassifier:
    """A copy of a BN-LSTM classifier with population statistics for its first `steps` steps
    only in the BNs `names`; later steps reuse step steps - 1's (the paper's rule)."""
    cut = copy.deepcopy(model)
    for name in names:
        getattr(cut.rnn, name).keep_first_steps(steps)
    return cut


def averaged_from(
    model: SequenceClassifier, steps: int, names: tuple[str, ...] = RECURRENT
) -> SequenceClassifier:
    """The ablation of the paper's rule: a copy whose BNs `names` use, from step `steps` on, the
    average of the statistics of the steps before it (rather than the last one's)."""
    checks.integer("steps", steps)
    ablated = copy.deepcopy(model)
    for name in names:
        bn = getattr(ablated.rnn, name)
        with torch.no_grad():
            bn.running_mean[steps:] = bn.running_mean[:steps].mean(dim=0)
            bn.running_var[steps:] = bn.running_var[:steps].mean(dim=0)
    return ablated


def shared_by_every_step(
    model: SequenceClassifier, names: tuple[str, ...] = ("bn_x", *RECURRENT)
) -> SequenceClassifier:
    """The shortcut the paper warns against: a copy whose BNs `names` use one set of statistics,
    the average over all steps, at every step."""
    shared = copy.deepcopy(model)
    for name in names:
        bn = getattr(shared.rnn, name)
        with torch.no_grad():
            bn.running_mean[:] = bn.running_mean.mean(dim=0)
            bn.running_var[:] = bn.running_var.mean(dim=0)
    return shared


def cut_comparison(
    model: SequenceClassifier,
    x: torch.Tensor,
    y: torch.Tensor,
    cuts: tuple[int, ...],
    names: tuple[str, ...] = RECURRENT,
) -> dict[str, list[float]]:
    """Accuracy on (x, y) when the BNs `names` keep population statistics for their first k
    steps only, for each k of `cuts`, filled in two ways for the later steps: the paper's rule
    (step k's reused, `statistics_for_first`) and the ablation (the average of steps 1..k,
    `averaged_from`). Returns {"rule": [...], "average": [...]}, one accuracy per cut."""
    for k in cuts:
        checks.integer("cut", k)
    return {
        "rule": [training.accuracy_of(statistics_for_first(model, k, names), x, y) for k in cuts],
        "average": [training.accuracy_of(averaged_from(model, k, names), x, y) for k in cuts],
    }
