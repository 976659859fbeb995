"""The chapter's experiment (chapters/recurrent_batch_norm.ipynb): the gradient flow through a
batch-normalized tanh RNN (the paper's Figure 1) and through the BN-LSTM, sequential and
permuted digits read one pixel per step, the classifiers and their training run, the nulls, and
the measurements and ablations of the per-step statistics.

The BN-LSTM and its statistics are the mechanism's (`papernotes.recurrent_batch_norm`), looked
up at call time so that a broken variant patched into that module is the one these run. The
nulls (the LSTM, the LSTM with BN on its input term only, and the BN-LSTM and the Figure-1
network written a second time for the runs that set gamma at 1) are code of their own, which a
broken mechanism cannot reach.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import batch_norm, checks, training
from papernotes import recurrent_batch_norm as rbn
from papernotes.data import minibatches

# Random streams of a training run, each its own generator derived from the run's seed.
BATCHES, H0_NOISE, POPULATION_NOISE = 0, 1, 2
# The random stream of the h_0 noise under which the frozen-statistics null fixes its statistics.
FROZEN_STATISTICS = 3
# The random stream of the gradient-flow sweep: which digits each draw reads, and its seed.
FLOW_DRAWS = 5

# The BNs whose statistics depend on the recurrent state: the recurrent term and the cell.
RECURRENT = ("bn_h", "bn_c")

# -- why gamma = 0.1: gradient flow through a batch-normalized tanh RNN ------------------------


def tanh_derivative_statistics(
    std: float, samples: int = 100_000, seed: int = 0
) -> tuple[float, float, float]:
    """For z ~ N(0, std^2): the mean, 25th and 75th percentiles of tanh'(z) = 1 - tanh(z)^2.

    The paper's Figure 1(b): the wider the pre-activation, the more often the tanh saturates and
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
    *,
    written_apart: bool = False,
    without_bn: bool = False,
) -> torch.Tensor:
    """||dL/dh_t|| for t = 0..T in a freshly initialised BNTanhRNN, in float64: shape (T + 1,).

    x (B, T, D). L is the mean cross-entropy of an orthogonally initialised linear read-out of
    h_T; the norm is taken per example and averaged over the batch (as the authors' plotting
    code does). h_0 is `h0_noise` times standard normal noise, the paper's fix for zero-variance
    first steps. The weights and the noise follow `seed`. `written_apart` measures the same
    network written apart from the mechanism (`TanhRNNWrittenApart`, for the nulls);
    `without_bn` the same network without its BN (`TanhRNNWithoutBN`, a null; gamma unused).
    """
    batch = checks.tensor("x", x, "(B, T, D)", dtype="floating")["B"]
    checks.tensor("labels", labels, "(B,)", B=batch)
    h0_noise = checks.number("h0_noise", h0_noise, 0.0)
    network = TanhRNNWrittenApart if written_apart else rbn.BNTanhRNN
    network = TanhRNNWithoutBN if without_bn else network
    model, readout, h0 = _flow_network(x, gamma, hidden_size, h0_noise, seed, network, n_classes)
    states = model(x.double(), h0)
    loss = F.cross_entropy(readout(states[-1]), labels)
    grads = torch.autograd.grad(loss, states)
    return torch.stack([g.norm(dim=1).mean() for g in grads])


def _flow_network(x, gamma, hidden_size, h0_noise, seed, network, n_classes=10):
    """The gradient-flow measurements' network, read-out and h_0 (requiring a gradient), in
    float64, drawn from `seed`: `network(D, hidden_size, gamma)` and an orthogonal read-out."""
    with training.seeded(seed):
        model = network(x.shape[2], hidden_size, gamma).double()
        readout = nn.Linear(hidden_size, n_classes).double()
        nn.init.orthogonal_(readout.weight)
        nn.init.zeros_(readout.bias)
    h0 = h0_noise * torch.randn(
        len(x), hidden_size, dtype=torch.float64, generator=training.generator(seed)
    )
    return model, readout, h0.requires_grad_(True)


class TanhRNNWrittenApart(nn.Module):
    """The Figure-1 network of the mechanism (`BNTanhRNN`) written a second time, with torch's
    F.batch_norm, for the nulls: h_t = tanh(BN(W_h h_{t-1} + W_x x_t; gamma, 0)), W_h = I, its
    weights drawn as BNTanhRNN draws them."""

    def __init__(self, input_size: int, hidden_size: int, gamma: float, eps: float = 1e-5):
        super().__init__()
        gamma = checks.number("gamma", gamma, 0.0, low_open=True)
        self.eps = eps
        self.gamma = nn.Parameter(torch.full((hidden_size,), gamma))
        self.weight_h = nn.Parameter(torch.eye(hidden_size))
        self.weight_x = nn.Parameter(nn.init.orthogonal_(torch.empty(input_size, hidden_size)))

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> list[torch.Tensor]:
        states = [h0]
        for x_t in x.unbind(1):
            z = states[-1] @ self.weight_h + x_t @ self.weight_x
            z_bn = F.batch_norm(z, None, None, self.gamma, None, True, 0.0, self.eps)
            states.append(torch.tanh(z_bn))
        return states


class TanhRNNWithoutBN(TanhRNNWrittenApart):
    """The Figure-1 network without its BN, for a null: h_t = tanh(W_h h_{t-1} + W_x x_t),
    W_h = I, its weights drawn as BNTanhRNN draws them (gamma is kept and unused)."""

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> list[torch.Tensor]:
        states = [h0]
        for x_t in x.unbind(1):
            states.append(torch.tanh(states[-1] @ self.weight_h + x_t @ self.weight_x))
        return states


def step_factors(
    x: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    hidden_size: int = 100,
    h0_noise: float = 0.1,
    seed: int = 0,
) -> dict[str, float]:
    """What each step of a freshly initialised BNTanhRNN does to a gradient on its way back, in
    its two factors (W_h = I): per unit, BN multiplies it by gamma / sigma_t (sigma_t the
    batch's standard deviation of the pre-activation z_t) and the tanh by tanh'(gamma z_hat).

    Returns, over steps 2..T (step 1 reads h_0's noise) and units, the geometric mean of the BN
    factor ("bn_gain"), the geometric mean of the tanh factor over examples too ("tanh"), the
    share of (example, unit) pairs in the tanh's linear range, tanh' > 0.9 ("linear"), and the
    tanh factor the gradient meets ("tanh_on_gradient"): the geometric mean over steps of
    ||tanh' * dL/dh_t|| / ||dL/dh_t||, each example and unit weighted by the gradient it
    carries (the loss and the draws of `gradient_norms_through_time` with the same seed).
    """
    batch = checks.tensor("x", x, "(B, T, D)", dtype="floating")["B"]
    checks.tensor("labels", labels, "(B,)", B=batch)
    model, readout, h0 = _flow_network(x, gamma, hidden_size, h0_noise, seed, rbn.BNTanhRNN)
    states = model(x.double(), h0)
    grads = torch.autograd.grad(F.cross_entropy(readout(states[-1]), labels), states[1:])
    bn_gain, tanh, linear, on_gradient = [], [], [], []
    with torch.no_grad():
        steps = list(zip(states[:-1], x.double().unbind(1), grads, strict=True))[1:]
        for h_prev, x_t, grad in steps:
            z = h_prev @ model.weight_h + x_t @ model.weight_x
            mean, variance = batch_norm.batch_statistics(z)
            z_hat = batch_norm.normalize(z, mean, variance, model.eps)
            derivative = 1 - torch.tanh(model.gamma * z_hat).square()
            bn_gain.append((model.gamma / (variance + model.eps).sqrt()).log().mean())
            tanh.append(derivative.log().mean())
            linear.append((derivative > 0.9).double().mean())
            on_gradient.append(((derivative * grad).norm() / grad.norm()).log())
    return {
        "bn_gain": torch.stack(bn_gain).mean().exp().item(),
        "tanh": torch.stack(tanh).mean().exp().item(),
        "linear": torch.stack(linear).mean().item(),
        "tanh_on_gradient": torch.stack(on_gradient).mean().exp().item(),
    }


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
    written_apart: bool = False,
    without_bn: bool = False,
) -> torch.Tensor:
    """`gradient_norms_through_time` for several draws: shape (draws, T + 1).

    images (N, P) flattened, labels (N,). Draw d reads `batch_size` of the images (as pixel
    sequences of `steps` steps, see `pixel_sequences`) with its own initial weights and h_0
    noise; the digits and the seeds of the draws follow `seed`, and they are the same for every
    gamma, so that a sweep over gamma compares like with like.
    """
    return torch.stack(
        [
            gradient_norms_through_time(
                x,
                y,
                gamma,
                h0_noise=h0_noise,
                seed=draw_seed,
                written_apart=written_apart,
                without_bn=without_bn,
            )
            for x, y, draw_seed in flow_draws(images, labels, draws, batch_size, steps, seed)
        ]
    )


def flow_draws(
    images: torch.Tensor,
    labels: torch.Tensor,
    draws: int = 4,
    batch_size: int = 128,
    steps: int | None = None,
    seed: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """The draws of the gradient-flow measurements: for each, `batch_size` digits as pixel
    sequences (B, T, 1), their labels and the seed of its weights and noise, all following
    `seed` (stream FLOW_DRAWS)."""
    n = checks.tensor("images", images, "(N, P)", dtype="floating")["N"]
    checks.tensor("labels", labels, "(N,)", N=n)
    draws = checks.integer("draws", draws)
    batch_size = min(checks.integer("batch_size", batch_size), n)
    stream = training.generator(seed, FLOW_DRAWS)
    found = []
    for _ in range(draws):
        rows = torch.randperm(n, generator=stream)[:batch_size]
        draw_seed = int(torch.randint(2**31, (1,), generator=stream))
        found.append((pixel_sequences(images[rows], steps=steps), labels[rows], draw_seed))
    return found


def bn_lstm_gradient_norms(
    x: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    hidden_size: int = 32,
    h0_noise: float = 0.1,
    seed: int = 0,
) -> torch.Tensor:
    """||dL/dh_t|| for t = 0..T in a freshly initialised BN-LSTM classifier (the mechanism's,
    training mode, float64): shape (T + 1,), per example and averaged over the batch, L the
    cross-entropy of its read-out of h_T.

    Measured from outside the mechanism: h_{t-1} enters step t only through the recurrent term
    z_t = W_h h_{t-1}, so dL/dh_{t-1} = (dL/dz_t) W_h^T, read off a hook on bn_h's input.
    """
    batch, steps = checks.tensor("x", x, "(B, T, D)", dtype="floating")["B"], x.shape[1]
    checks.tensor("labels", labels, "(B,)", B=batch)
    model = bn_lstm_classifier(hidden_size, steps, gamma, input_size=x.shape[2], seed=seed).double()
    h0 = checks.number("h0_noise", h0_noise, 0.0) * torch.randn(
        batch, hidden_size, dtype=torch.float64, generator=training.generator(seed)
    )
    recurrent_terms = []
    hook = model.rnn.bn_h.register_forward_pre_hook(lambda _, args: recurrent_terms.append(args[0]))
    try:
        model.train()
        _, (h, _) = model.rnn(x.double(), (h0, torch.zeros_like(h0)))
        loss = F.cross_entropy(model.readout(h), labels)
    finally:
        hook.remove()
    *grads, last = torch.autograd.grad(loss, [*recurrent_terms, h])
    norms = [(g @ model.rnn.weight_h.T).norm(dim=1).mean() for g in grads]
    return torch.stack([*norms, last.norm(dim=1).mean()]).detach()


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


def classifier(make_rnn: Callable[[], nn.Module], seed: int = 0) -> SequenceClassifier:
    """A sequence classifier on the recurrent layer `make_rnn()`, its initial weights (the
    layer's, then the read-out's) drawn from `seed`."""
    with training.seeded(seed):
        return SequenceClassifier(make_rnn())


def bn_lstm_classifier(hidden_size=64, max_steps=64, gamma_init=0.1, *, input_size=1, seed=0):
    """A sequence classifier on the mechanism's BN-LSTM, its initial weights drawn from `seed`."""
    return classifier(lambda: rbn.BNLSTM(input_size, hidden_size, max_steps, gamma_init), seed)


def lstm_classifier(hidden_size: int = 64, *, input_size: int = 1, seed: int = 0):
    """A sequence classifier on the plain LSTM (a null), its initial weights drawn from `seed`."""
    return classifier(lambda: LSTM(input_size, hidden_size), seed)


def input_bn_lstm_classifier(hidden_size=64, max_steps=64, gamma_init=0.1, *, input_size=1, seed=0):
    """A sequence classifier on the input-only BN ablation (a null), weights drawn from `seed`."""
    rnn = InputNormalizedLSTM
    return classifier(lambda: rnn(input_size, hidden_size, max_steps, gamma_init), seed)


def bn_lstm_written_apart_classifier(
    hidden_size=64, max_steps=64, gamma_init=0.1, *, input_size=1, seed=0, **settings
):
    """A sequence classifier on the BN-LSTM written apart (`BNLSTMWrittenApart` with its
    `settings`, for nulls), its initial weights the mechanism's BN-LSTM's at the same seed."""
    sizes = (input_size, hidden_size, max_steps, gamma_init)
    return classifier(lambda: BNLSTMWrittenApart(*sizes, **settings), seed)


def bn_h_dropped_classifier(hidden_size=64, max_steps=64, gamma_init=0.1, *, input_size=1, seed=0):
    """A null: the BN-LSTM written apart less only the BN of its hidden-to-hidden term W_h h
    (the input and cell BNs kept), its initial weights the BN-LSTM's at the same seed."""
    return bn_lstm_written_apart_classifier(
        hidden_size, max_steps, gamma_init, input_size=input_size, seed=seed, recurrent_bn=False
    )


def frozen_statistics_classifier(
    x: torch.Tensor,
    hidden_size: int = 64,
    max_steps: int = 64,
    gamma_init: float = 0.1,
    *,
    h0_noise: float = 0.1,
    seed: int = 0,
) -> SequenceClassifier:
    """A null: the BN-LSTM written apart with its recurrent and cell statistics frozen at
    initialisation, estimated once on the sequences x (N, T, D) from noisy h_0 (its own stream
    of `seed`): the BN-LSTM's initial scale without normalization while it trains. Its initial
    weights are the BN-LSTM's at the same seed."""
    sizes = checks.tensor("x", x, "(N, T, D)", dtype="floating")
    model = bn_lstm_written_apart_classifier(
        hidden_size, max_steps, gamma_init, input_size=sizes["D"], seed=seed, frozen=True
    )
    state = _noisy_initial_state(
        sizes["N"], hidden_size, h0_noise, training.generator(seed, FROZEN_STATISTICS)
    )
    model.rnn.freeze_statistics(x, state)
    return model


@dataclass
class SequenceRun(training.Run):
    """A training run of a sequence classifier: the model, its History, and for each evaluated
    split a (evaluations, N) boolean tensor of which sequences it classified right at each
    evaluation (for paired comparisons of two runs on the same sequences). `snapshots` are the
    model as each evaluation measured it (its population statistics set), for `measure_later`."""

    correct: dict[str, torch.Tensor]
    snapshots: list[SequenceClassifier]

    def mean_correct(self, split: str) -> torch.Tensor:
        """Per sequence, the fraction of the run's evaluations that classified it right: (N,).
        Its mean is the split's accuracy averaged over the run."""
        return self.correct[split].double().mean(dim=0)

    def measure_later(
        self, splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]], cut_steps=None
    ) -> None:
        """Measure every evaluation's snapshot on more splits, as if they had been evaluated
        during the run (`train_classifier`'s metrics and `cut_steps`): a split read only for
        the runs that were chosen, after the choice (the test split)."""
        for name in splits:
            if name in self.correct:
                raise ValueError(f"split {name!r} was measured already")
        found = {}
        for snapshot in self.snapshots:
            for name, value in _measure(snapshot, splits, cut_steps, found).items():
                self.history.metrics.setdefault(name, []).append(value)
        self.correct |= {name: torch.stack(rows) for name, rows in found.items()}


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
    cut_steps: int | None = None,
    seed: int = 0,
) -> SequenceRun:
    """Train a classifier on sequences (N, T, D) with the paper's recipe: RMSProp (decay 0.9),
    gradient norm clipped at `clip`, noise on h_0 while training. Returns its SequenceRun.

    Every `eval_every` updates and after the last: population statistics from the first
    `population_size` training sequences (models with BN), then the accuracy and the mean
    cross-entropy on each of `splits` ({"val": (x, y), ...}), logged as "val_accuracy",
    "val_loss", ..., and which sequences were right. Minibatches, the h_0 noise and the
    population-statistics noise are streams of `seed`, so two models trained with one seed see
    the same minibatches.

    With `cut_steps` = k, each evaluation of the mechanism's BN-LSTM also measures a copy whose
    recurrent and cell BNs keep population statistics for their first k steps only, later
    steps reusing step k's (`statistics_for_first`, the paper's rule beyond T_max), logged as
    "<split>_cut_accuracy" and recorded as the split "<split>_cut". Other models ignore it.
    """
    if not isinstance(model, SequenceClassifier):
        raise TypeError(f"model must be a SequenceClassifier; got {type(model).__name__}")
    n = checks.tensor("train_x", train_x, "(N, T, D)", dtype="floating")["N"]
    checks.tensor("train_y", train_y, "(N,)", N=n)
    checks.integer("batch_size", batch_size)
    checks.number("lr", lr, 0.0, low_open=True)
    h0_noise = checks.number("h0_noise", h0_noise, 0.0)
    population_size = min(checks.integer("population_size", population_size), n)
    if cut_steps is not None:
        checks.integer("cut_steps", cut_steps)
    for name, (x, _) in splits.items():
        checks.tensor(f"{name} x", x, "(N, T, D)")
    hidden = model.hidden_size
    optimizer = torch.optim.RMSprop(
        [p for p in model.parameters() if p.requires_grad], lr=lr, alpha=0.9
    )
    batches = minibatches(n, batch_size, training.generator(seed, BATCHES))
    noise = training.generator(seed, H0_NOISE)
    population_noise = training.generator(seed, POPULATION_NOISE)
    # The mechanism's BN-LSTM draws its h_0 with the mechanism's initial_state; the nulls with
    # their own copy of it (the same draws), out of a broken mechanism's reach.
    initial_state = rbn.initial_state if _is_mechanism(model) else _noisy_initial_state
    found, snapshots = {}, []

    def evaluate() -> dict[str, float]:
        state = initial_state(population_size, hidden, h0_noise, population_noise)
        set_population_statistics(model, train_x[:population_size], state)
        snapshots.append(copy.deepcopy(model))
        return _measure(model, splits, cut_steps, found)

    history = training.train_classifier(
        model,
        train_y,
        optimizer,
        steps,
        batches=batches,
        # The h_0 noise is drawn before each forward pass, the noise the paper puts on h_0.
        logits_of=lambda index: model(
            train_x[index], initial_state(len(index), hidden, h0_noise, noise)
        ),
        evaluate=evaluate,
        eval_every=eval_every,
        clip=clip,
        desc=type(model.rnn).__name__,
    )
    correct = {name: torch.stack(rows) for name, rows in found.items()}
    return SequenceRun(model, history, correct, snapshots)


def _measure(
    model: SequenceClassifier,
    splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    cut_steps: int | None,
    found: dict[str, list[torch.Tensor]],
) -> dict[str, float]:
    """Accuracy and loss of the model on each split (its statistics cut at `cut_steps` too, for
    the mechanism's BN-LSTM), in eval mode; which sequences were right appended to `found`."""
    metrics = {}
    if not splits:
        return metrics
    # Every split in one forward pass (evaluation uses the population statistics, so the batch
    # it sits in does not matter), then cut apart.
    every_x = torch.cat([x for x, _ in splits.values()])
    sizes = [len(x) for x, _ in splits.values()]
    measured = {"": model}
    if cut_steps is not None and _is_mechanism(model):
        measured["_cut"] = statistics_for_first(model, cut_steps)
    with training.evaluating(model):
        for suffix, each in measured.items():
            logits = each(every_x).split(sizes)
            for (name, (_, y)), split_logits in zip(splits.items(), logits, strict=True):
                right = split_logits.argmax(dim=-1) == y
                found.setdefault(name + suffix, []).append(right)
                metrics[f"{name}{suffix}_accuracy"] = right.float().mean().item()
                if not suffix:
                    metrics[f"{name}_loss"] = F.cross_entropy(split_logits, y).item()
    return metrics


def train_classifiers(
    make: Callable[[], SequenceClassifier],
    rates: Sequence[float],
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    splits: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    **recipe,
) -> list[SequenceRun]:
    """`train_classifier(make(), train_x, train_y, splits, lr=rate, **recipe)` for each rate of
    `rates`: one arm over a grid, the runner `tune_learning_rate` calls.

    One run after another. Stacked (`together.stack`, vmap over the model's own code) the
    runs were slower here, not faster: at 128 sequences of 32 units an update is mostly
    arithmetic on (B, 4H) tensors, which a stack of K members multiplies by K, and vmap's
    batching rules cost more than the per-operation overhead they save.
    """
    return [
        train_classifier(make(), train_x, train_y, splits, lr=lr, **recipe)
        for lr in (checks.number("lr", lr, 0.0, low_open=True) for lr in rates)
    ]


# Learning rates a half-decade apart: the values a grid is drawn from and extended along.
LEARNING_RATE_LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


def tune_learning_rate(
    train: Callable[[Callable[[], SequenceClassifier], list[float]], list[SequenceRun]],
    arms: Mapping[str, Callable[[], SequenceClassifier]],
    grid: Sequence[float],
    *,
    tuned: Sequence[str] | None = None,
    ladder: Sequence[float] = LEARNING_RATE_LADDER,
    max_values: int = 6,
    runs: Mapping[str, Mapping[float, SequenceRun]] | None = None,
) -> tuple[list[float], dict[str, dict[float, SequenceRun]]]:
    """Every arm trained at every learning rate of one grid, the grid widened until it brackets
    each tuned arm's best rate.

    `train(make, rates)` trains the model `make()` at each of `rates` (a list, trained together
    by `train_classifiers`) and returns their runs; `arms` maps a name to its `make`. The
    best rate of an arm is the one of highest mean validation accuracy over its run. While the
    best rate of an arm of `tuned` (default: every arm) is the grid's smallest or largest, the
    grid gains the next rate of `ladder` on that side (up to `max_values` rates), and every arm
    is trained at it, so that all arms end on the same grid. Returns (grid, runs), runs[name][lr]
    the SequenceRun of that arm at that rate.

    `runs` (as returned) carries on from an earlier tuning: the runs it holds are not trained
    again, so that a tuning can be done in parts (some arms, then more on the grid they chose).
    """
    grid = sorted(checks.number("learning rate", lr, 0.0, low_open=True) for lr in grid)
    tuned = list(arms) if tuned is None else list(tuned)
    for name in tuned:
        if name not in arms:
            raise ValueError(f"tuned arm {name!r} is not one of the arms {list(arms)}")
    ladder = sorted(ladder)
    runs = {name: dict((runs or {}).get(name, {})) for name in arms}
    while True:
        for name, make in arms.items():
            missing = [lr for lr in grid if lr not in runs[name]]
            if missing:  # an arm's new rates in one call: trained together
                runs[name].update(zip(missing, train(make, missing), strict=True))
        chosen = [best_learning_rate(runs[name]) for name in tuned]
        wider = list(grid)
        if grid[0] in chosen:
            wider[:0] = [lr for lr in ladder if lr < grid[0]][-1:]
        if grid[-1] in chosen:
            wider += [lr for lr in ladder if lr > grid[-1]][:1]
        if wider == grid or len(wider) > max_values:
            return grid, runs
        grid = wider


def validation_scores(runs: Mapping[float, SequenceRun]) -> dict[float, float]:
    """Each learning rate's mean validation accuracy over its run."""
    return {lr: run.history.mean("val_accuracy") for lr, run in sorted(runs.items())}


def best_learning_rate(runs: Mapping[float, SequenceRun]) -> float:
    """The learning rate of the highest mean validation accuracy over the run."""
    scores = validation_scores(runs)
    return max(scores, key=scores.get)


def _is_mechanism(model: SequenceClassifier) -> bool:
    return any(isinstance(m, rbn.StepwiseBatchNorm) for m in model.modules())


def _noisy_initial_state(batch: int, hidden_size: int, noise: float, generator=None):
    """The nulls' (h_0, c_0): h_0 = noise * N(0, 1), c_0 = 0, drawn as rbn.initial_state draws."""
    h0 = noise * torch.randn(batch, hidden_size, generator=generator)
    return h0, torch.zeros(batch, hidden_size)


def set_population_statistics(model: SequenceClassifier, x: torch.Tensor, state) -> None:
    """The test-time statistics of a classifier's BNs from the training sequences x: the
    mechanism's estimate for the BN-LSTM, each null's own for the nulls; none for the LSTM."""
    if isinstance(model.rnn, (InputNormalizedLSTM, BNLSTMWrittenApart)):
        model.rnn.estimate_population_statistics(x, state)
    elif _is_mechanism(model):
        rbn.estimate_population_statistics(model, x, state)


def paired_standard_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The standard error of mean(a) - mean(b) for paired per-sequence scores a, b (N,) of two
    runs on the same sequences: std(a - b) / sqrt(N)."""
    n = checks.tensor("a", a, "(N,)")["N"]
    checks.tensor("b", b, "(N,)", N=n)
    if n < 2:
        raise ValueError("a paired standard error needs two sequences at least")
    return ((a.double() - b.double()).std() / n**0.5).item()


# -- the nulls: the same LSTM without the paper's idea, written apart from the mechanism --------
#
# A null must be computed by code that the mechanism's bugs cannot reach, so these models use
# torch's fused LSTM and torch's F.batch_norm, never papernotes.recurrent_batch_norm: a broken
# StepwiseBatchNorm patched into that module leaves them as they are. A unit test holds each one
# equal to the mechanism's model it stands for.


def lstm_weights(input_size: int, hidden_size: int):
    """(W_x (D, 4H), W_h (H, 4H), b (4H,)), gate blocks in the order (f, i, o, g), drawn as the
    BN-LSTM draws its own (the initialisation of the paper's code): W_x orthogonal; W_h the
    identity on the candidate block g and orthogonal on the three gates; forget bias 1."""
    gates = 4 * hidden_size
    weight_x, weight_h = torch.empty(input_size, gates), torch.empty(hidden_size, gates)
    bias = torch.zeros(gates)
    nn.init.orthogonal_(weight_x)
    nn.init.orthogonal_(weight_h[:, : 3 * hidden_size])
    with torch.no_grad():
        weight_h[:, 3 * hidden_size :] = torch.eye(hidden_size)
        bias[:hidden_size] = 1.0
    return weight_x, weight_h, bias


def torch_gate_order(m: torch.Tensor) -> torch.Tensor:
    """Gate blocks along the last dim from ours (f, i, o, g) to torch's (i, f, g, o)."""
    f, i, o, g = m.chunk(4, dim=-1)
    return torch.cat([i, f, g, o], dim=-1)


def _fused_lstm(input_size: int, hidden_size: int) -> nn.LSTM:
    """torch's fused LSTM; its own initialisation draws leave the global stream alone (every
    weight is overwritten), so the read-out drawn after it is the BN-LSTM's."""
    with torch.random.fork_rng():
        return nn.LSTM(input_size, hidden_size, batch_first=True)


def _state(state, batch: int, hidden_size: int, like: torch.Tensor):
    """The initial (h, c) as torch's LSTM takes them, (1, B, H) each; None means zeros."""
    if state is None:
        zeros = like.new_zeros(1, batch, hidden_size)
        return zeros, zeros
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError("state must be a pair (h, c) of tensors")
    for name, value in zip(("h", "c"), state, strict=True):
        checks.tensor(f"state {name}", value, "(B, H)", B=batch, H=hidden_size)
    return state[0][None], state[1][None]


def _input_bn(layer: nn.Module, z: torch.Tensor, population) -> torch.Tensor:
    """BN(W_x x_t; gamma_x, 0) for every step of z = W_x x (B, T, 4H) at once, the nulls' input
    BN: as a (B, T * 4H) batch each column is one feature at one step, so torch's batch norm
    computes each step's statistics in training; in evaluation step t reads row
    min(t, max_steps - 1) of the (mean, var) tables `population`."""
    batch, steps, _ = z.shape
    flat = z.reshape(batch, -1)
    gamma = layer.gamma_x.repeat(steps)
    if layer.training:
        normalized = F.batch_norm(flat, None, None, gamma, None, True, 0.0, layer.eps)
    else:
        rows = torch.arange(steps).clamp(max=layer.max_steps - 1)
        mean, var = (table[rows].flatten() for table in population)
        normalized = F.batch_norm(flat, mean, var, gamma, None, False, 0.0, layer.eps)
    return normalized.view(batch, steps, -1)


class LSTM(nn.Module):
    """The paper's baseline: the BN-LSTM's LSTM with the same initialisation and no BN, on
    torch's fused LSTM. forward(x (B, T, D), state=None) -> (outputs (B, T, H), (h, c))."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        weight_x, weight_h, bias = lstm_weights(input_size, hidden_size)
        self.lstm = _fused_lstm(input_size, hidden_size)
        with torch.no_grad():  # torch computes W z, not z W: transpose
            self.lstm.weight_ih_l0.copy_(torch_gate_order(weight_x).T)
            self.lstm.weight_hh_l0.copy_(torch_gate_order(weight_h).T)
            self.lstm.bias_ih_l0.copy_(torch_gate_order(bias))
            self.lstm.bias_hh_l0.zero_()

    def forward(self, x: torch.Tensor, state=None):
        batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)["B"]
        outputs, (h, c) = self.lstm(x, _state(state, batch, self.hidden_size, x))
        return outputs, (h[0], c[0])


class InputNormalizedLSTM(nn.Module):
    """The BN-LSTM without its recurrent and cell BNs: the exact ablation of the paper's idea,
    BN on the input-to-hidden term only (where Laurent et al. put it), with the BN-LSTM's
    per-step statistics, gamma_x and initialisation:

        (f~, i~, o~, g~) = W_h h_{t-1} + BN(W_x x_t; gamma_x, 0) + b,  h_t = sigma(o~) tanh(c_t).

    The input term does not depend on the state, so it is normalized for every step at once and
    fed to torch's fused LSTM, whose input weights are fixed at the identity. Training
    normalizes step t with the minibatch's statistics of step t; evaluation with the population
    statistics set by `estimate_population_statistics` (every step from max_steps on uses the
    last step's).
    """

    def __init__(self, input_size: int, hidden_size: int, max_steps: int, gamma_init: float = 0.1):
        super().__init__()
        gamma_init = rbn.set_sizes(self, input_size, hidden_size, max_steps, gamma_init)
        self.eps = 1e-5
        gates = 4 * hidden_size
        weight_x, weight_h, bias = lstm_weights(input_size, hidden_size)
        self.lstm = _fused_lstm(gates, hidden_size)
        # torch's gate order throughout, so that the normalized term goes in as it is
        self.weight_x = nn.Parameter(torch_gate_order(weight_x))
        self.gamma_x = nn.Parameter(torch.full((gates,), gamma_init))
        self.bias = nn.Parameter(torch_gate_order(bias))
        with torch.no_grad():
            self.lstm.weight_ih_l0.copy_(torch.eye(gates))
            self.lstm.weight_hh_l0.copy_(torch_gate_order(weight_h).T)
            self.lstm.bias_ih_l0.zero_()
            self.lstm.bias_hh_l0.zero_()
        for fixed in (self.lstm.weight_ih_l0, self.lstm.bias_ih_l0, self.lstm.bias_hh_l0):
            fixed.requires_grad_(False)
        self.register_buffer("population_mean", torch.zeros(max_steps, gates))
        self.register_buffer("population_var", torch.ones(max_steps, gates))

    def input_term(self, x: torch.Tensor) -> torch.Tensor:
        """BN(W_x x_t; gamma_x, 0) + b for every step of x (B, T, D): (B, T, 4H)."""
        if self.training:
            rbn.check_trainable(x.shape[1], x.shape[0], self.max_steps)
        population = (self.population_mean, self.population_var)
        return _input_bn(self, x @ self.weight_x, population) + self.bias

    def forward(self, x: torch.Tensor, state=None):
        batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)["B"]
        state = _state(state, batch, self.hidden_size, x)
        outputs, (h, c) = self.lstm(self.input_term(x), state)
        return outputs, (h[0], c[0])

    @torch.no_grad()
    def estimate_population_statistics(self, x: torch.Tensor, state=None) -> None:
        """Each step's mean and unbiased variance of W_x x_t over the sequences x (the state
        does not enter the input term)."""
        steps = checks.tensor("x", x, "(N, T, D)", dtype="floating", D=self.input_size)["T"]
        z = x @ self.weight_x
        self.population_mean[:steps] = z.mean(0)
        self.population_var[:steps] = z.var(0, unbiased=True)


class BNLSTMWrittenApart(nn.Module):
    """The mechanism's BN-LSTM written a second time, for the nulls that change one of its
    settings: the same equations, parameters and initialisation, with torch's F.batch_norm for
    the normalizing transform. forward(x, state) as BNLSTM's; evaluation uses the population
    statistics set by `estimate_population_statistics` (every step from max_steps on uses the
    last step's).

    The nulls' settings: `gamma_init` (1, the customary value); `recurrent_bn=False` drops the
    BN of the hidden-to-hidden term only, (f~, i~, o~, g~) = W_h h_{t-1} + BN(W_x x_t) + b, the
    cell's BN kept; `frozen=True` normalizes the recurrent term and the cell with statistics
    fixed once, at initialisation (`freeze_statistics`), in training as in evaluation: the
    BN-LSTM's initial scale, gamma = 0.1 included, without normalization while it trains.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        max_steps: int,
        gamma_init: float = 0.1,
        *,
        recurrent_bn: bool = True,
        frozen: bool = False,
    ):
        super().__init__()
        self.recurrent_bn, self.frozen = bool(recurrent_bn), bool(frozen)
        self._frozen_set = False
        gamma_init = rbn.set_sizes(self, input_size, hidden_size, max_steps, gamma_init)
        self.eps = 1e-5
        gates = 4 * hidden_size
        weight_x, weight_h, bias = lstm_weights(input_size, hidden_size)
        self.weight_x = nn.Parameter(weight_x)
        self.weight_h = nn.Parameter(weight_h)
        self.bias = nn.Parameter(bias)
        self.gamma_x = nn.Parameter(torch.full((gates,), gamma_init))
        if self.recurrent_bn:
            self.gamma_h = nn.Parameter(torch.full((gates,), gamma_init))
        self.gamma_c = nn.Parameter(torch.full((hidden_size,), gamma_init))
        self.beta_c = nn.Parameter(torch.zeros(hidden_size))
        for name, width in (("x", gates), ("h", gates), ("c", hidden_size)):
            self.register_buffer(f"mean_{name}", torch.zeros(max_steps, width))
            self.register_buffer(f"var_{name}", torch.ones(max_steps, width))
        self._collect = None

    def _bn(self, z, name, t, gamma, beta=None):
        if self.training and not (self.frozen and name in ("h", "c")):
            if self._collect is not None:  # estimating: keep step t's mean and unbiased var
                self._collect[name].append((z.mean(0), z.var(0, unbiased=True)))
            return F.batch_norm(z, None, None, gamma, beta, True, 0.0, self.eps)
        row = min(t, self.max_steps - 1)
        mean, var = getattr(self, f"mean_{name}")[row], getattr(self, f"var_{name}")[row]
        return F.batch_norm(z, mean, var, gamma, beta, False, 0.0, self.eps)

    def _input_terms(self, x: torch.Tensor) -> torch.Tensor:
        """BN(W_x x_t; gamma_x, 0) + b for every step at once, (B, T, 4H): each column of the
        flattened (B, T * 4H) term is one feature at one step."""
        z = x @ self.weight_x
        if self.training and self._collect is not None:  # estimating: each step's statistics
            self._collect["x"] = list(
                zip(z.mean(0).unbind(0), z.var(0, unbiased=True).unbind(0), strict=True)
            )
        return _input_bn(self, z, (self.mean_x, self.var_x)) + self.bias

    def forward(self, x: torch.Tensor, state=None):
        sizes = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        if self.training:
            rbn.check_trainable(sizes["T"], sizes["B"], self.max_steps)
        h, c = (s[0] for s in _state(state, sizes["B"], self.hidden_size, x))
        split = 3 * self.hidden_size
        outputs = []
        for t, input_term in enumerate(self._input_terms(x).unbind(1)):
            recurrent = h @ self.weight_h
            if self.recurrent_bn:
                recurrent = self._bn(recurrent, "h", t, self.gamma_h)
            gates = recurrent + input_term
            f, i, o = torch.sigmoid(gates[:, :split]).chunk(3, dim=1)
            c = f * c + i * torch.tanh(gates[:, split:])
            h = o * torch.tanh(self._bn(c, "c", t, self.gamma_c, self.beta_c))
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)

    @torch.no_grad()
    def estimate_population_statistics(self, x: torch.Tensor, state=None) -> None:
        """Each step's mean and unbiased variance of every normalized term over the sequences x
        (one pass in training mode, as the mechanism's estimate), the mode restored. With
        `frozen`, the recurrent and cell statistics keep the values `freeze_statistics` set."""
        self._estimate(x, state, ("x",) if self.frozen and self._frozen_set else ("x", "h", "c"))

    @torch.no_grad()
    def freeze_statistics(self, x: torch.Tensor, state=None) -> None:
        """Fix the recurrent and cell statistics of a `frozen` model to those of the sequences x
        under its current (initial) weights, once: training and evaluation use them from then
        on, and later estimates leave them as they are."""
        if not self.frozen:
            raise ValueError("freeze_statistics is for a model built with frozen=True")
        self.frozen = False  # estimated with each step's batch statistics, as at initialisation
        try:
            self._estimate(x, state, ("x", "h", "c"))
        finally:
            self.frozen = True
        self._frozen_set = True

    @torch.no_grad()
    def _estimate(self, x: torch.Tensor, state, names: tuple[str, ...]) -> None:
        was_training = self.training
        self._collect = {"x": [], "h": [], "c": []}
        try:
            self.train()
            self(x, state)
            for name, found in self._collect.items():
                if name not in names or not found:
                    continue
                steps = len(found)
                getattr(self, f"mean_{name}")[:steps] = torch.stack([m for m, _ in found])
                getattr(self, f"var_{name}")[:steps] = torch.stack([v for _, v in found])
        finally:
            self._collect = None
            self.train(was_training)


# -- stationarity of the population statistics --------------------------------------------------


def statistics_drift(bn: rbn.StepwiseBatchNorm) -> torch.Tensor:
    """How far the population statistics move from one step to the next: shape (max_steps - 1,).

    For steps t -> t + 1: the mean over features of |mean_{t+1} - mean_t| + |std_{t+1} - std_t|,
    in units of each feature's typical standard deviation (its median over the steps), so that
    features of different scales count alike.
    """
    return statistics_drift_per_feature(bn).mean(dim=1)


def statistics_drift_per_feature(bn: rbn.StepwiseBatchNorm) -> torch.Tensor:
    """`statistics_drift` before the mean over features: shape (max_steps - 1, features)."""
    return _drift(bn.running_mean, bn.running_var.clamp_min(0).sqrt())


def sequence_drift(x: torch.Tensor) -> torch.Tensor:
    """`statistics_drift` of the sequences x (N, T, D) themselves: how far each step's mean and
    standard deviation over the N sequences move from one step to the next, shape (T - 1,)."""
    checks.tensor("x", x, "(N, T, D)", dtype="floating")
    return _drift(x.mean(dim=0), x.std(dim=0)).mean(dim=1)


def _drift(mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Per step and feature, |mean_{t+1} - mean_t| + |std_{t+1} - std_t| in units of the
    feature's median std over the steps: (T - 1, F)."""
    scale = std.median(dim=0).values.clamp_min(1e-12)
    return (mean.diff(dim=0).abs() + std.diff(dim=0).abs()) / scale


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
    model: SequenceClassifier, names: tuple[str, ...] = RECURRENT
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
