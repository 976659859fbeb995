r"""Recurrent Batch Normalization: batch-normalize the LSTM's step from one state to the next.

Cooijmans, Ballas, Laurent, Gülçehre & Courville 2016, *Recurrent Batch Normalization*
(ICLR 2017, arXiv:1603.09025). The module follows the paper in order. Sequences are batch-first:
(B, T, D) in and out, states (B, H).

1. **The batch-normalizing transform**, imported from the Batch Normalization chapter
   (`papernotes.batch_norm`, the paper's Algorithm 1). For pre-activations $z$ of a minibatch,

   $$\mathrm{BN}(z; \gamma, \beta) = \beta + \gamma \odot
       \frac{z - \widehat{\mathbb{E}}[z]}{\sqrt{\widehat{\mathrm{Var}}[z] + \epsilon}},$$

   with the mean and (biased) variance taken over the minibatch while training
   (`batch_norm.batch_statistics`) and replaced by population estimates at test time;
   `batch_norm.normalize` computes the fraction.

2. **Statistics per time step.** Unrolled in time, a recurrent network is a deep network whose
   layers share weights, but its activations are not distributed alike at every step (the
   first steps are a transient). So $\widehat{\mathbb{E}}$ and $\widehat{\mathrm{Var}}$ are
   estimated separately for each step $t = 1, \dots, T_{\max}$, while $\gamma, \beta$ are
   shared. A test sequence longer than $T_{\max}$ reuses step $T_{\max}$'s population statistics
   for every later step: the paper observes that the statistics settle to stationary values.

3. **The BN-LSTM.** The recurrent term and the input term are normalized *separately*, and the
   cell only where it is read out, never inside its own recurrence:

   $$\begin{pmatrix}\tilde f_t\\ \tilde i_t\\ \tilde o_t\\ \tilde g_t\end{pmatrix}
       = \mathrm{BN}(W_h h_{t-1}; \gamma_h, 0) + \mathrm{BN}(W_x x_t; \gamma_x, 0) + b,$$
   $$c_t = \sigma(\tilde f_t) \odot c_{t-1} + \sigma(\tilde i_t) \odot \tanh(\tilde g_t),\qquad
     h_t = \sigma(\tilde o_t) \odot \tanh\big(\mathrm{BN}(c_t; \gamma_c, \beta_c)\big).$$

   $\beta_h = \beta_x = 0$ because the bias $b$ already shifts their sum. With a single input
   feature (a pixel per step), $\mathrm{BN}(W_x x_t)$ is the pixel standardised with step $t$'s
   statistics times the vector $\gamma_x \odot \mathrm{sign}(W_x)$: the input-term BN does no
   more than an LSTM fed standardised pixels (`standardize_steps`).

4. **$\gamma$ starts at 0.1, not 1.** BN fixes a pre-activation's standard deviation to $\gamma$.
   At $\gamma = 1$ a tanh spends much of its time saturated, its derivative is small, and the
   gradient dies on its way back through time; at $\gamma = 0.1$ the tanh works in its linear
   range and the gradient survives. The paper shows it on a tanh RNN with a *single* BN on the
   summed pre-activation, $h_t = \tanh(\mathrm{BN}(W_h h_{t-1} + W_x x_t; \gamma, 0))$ with
   $W_h = I$ (its Figure 1, as its authors' code builds it): `BNTanhRNN` below.

5. **Sequential digits.** The paper's sequential MNIST at the book's scale: an 8x8 digit read
   one pixel per step (64 steps), or in a fixed random order (permuted), and classified from the
   last hidden state. The zero-variance trap: the first pixels are blank in every image and
   $h_0$ is the same for every example, so early pre-activations have (almost) no variance to
   divide by; the paper injects noise into $h_0$ while training.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import batch_norm, checks
from papernotes.data import minibatches
from papernotes.training import History, accuracy, evaluating, generator, seeded, train

# Random streams of a training run, each its own generator derived from the run's seed.
BATCHES, H0_NOISE, POPULATION_NOISE = 0, 1, 2


# -- 1 and 2. BN with statistics per time step ---------------------------------------------------


class StepwiseBatchNorm(nn.Module):
    """BN(z; gamma, beta) with one set of statistics per time step, gamma and beta shared.

    Training: step t is normalized with its own minibatch mean and biased variance, and row t of
    the population estimates `running_mean`, `running_var` (unbiased variance) moves toward them
    by `momentum`. Evaluation: step t uses row `statistics_step(t)` = min(t, max_steps - 1), so
    every step past the last trained one reuses the last one's statistics (the paper's rule).

    `shift=False` fixes beta at 0 (the BN-LSTM's input and recurrent terms, whose shift is the
    LSTM's bias b).
    """

    def __init__(
        self,
        num_features: int,
        max_steps: int,
        gamma_init: float = 0.1,
        shift: bool = True,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ):
        super().__init__()
        checks.integer("num_features", num_features)
        self.max_steps = checks.integer("max_steps", max_steps)
        gamma_init = checks.number("gamma_init", gamma_init, 0.0, low_open=True)
        self.momentum = checks.number("momentum", momentum, 0.0, 1.0, low_open=True)
        self.eps = checks.number("eps", eps, 0.0, low_open=True)
        self.gamma = nn.Parameter(torch.full((num_features,), gamma_init))
        self.beta = nn.Parameter(torch.zeros(num_features)) if shift else None
        self.register_buffer("running_mean", torch.zeros(max_steps, num_features))
        self.register_buffer("running_var", torch.ones(max_steps, num_features))

    @property
    def num_features(self) -> int:
        return self.gamma.shape[0]

    def statistics_step(self, t: int) -> int:
        """The step whose population statistics step t uses at evaluation."""
        return min(t, self.max_steps - 1)

    def forward(self, z: torch.Tensor, t: int) -> torch.Tensor:
        """BN(z_t) = beta + gamma * (z_t - mean_t) / sqrt(var_t + eps) for step t's
        pre-activations z (B, F), t counted from 0: the minibatch's mean and biased variance in
        training, row statistics_step(t) of the population estimates in evaluation."""
        if self.training:
            mean, variance = batch_norm.batch_statistics(z)  # mu_B, sigma^2_B of step t
            self.remember(t, mean, variance, len(z))
        else:
            row = self.statistics_step(t)
            mean, variance = self.running_mean[row], self.running_var[row]
        return self.scale_and_shift(batch_norm.normalize(z, mean, variance, self.eps))

    def all_steps(self, z: torch.Tensor) -> torch.Tensor:
        """BN of every step of z (B, T, F) at once, step t with step t's statistics.

        For a term that does not depend on the recurrent state (the input term W_x x_t): as an
        (N, C) = (B, T*F) batch, each of its columns is one feature at one step, so
        `batch_statistics` returns exactly the per-step statistics.
        """
        batch, steps, features = z.shape
        flat = z.reshape(batch, steps * features)
        if self.training:
            mean, variance = batch_norm.batch_statistics(flat)
            self.remember(slice(0, steps), mean.view(steps, -1), variance.view(steps, -1), batch)
        else:
            rows = [self.statistics_step(t) for t in range(steps)]
            mean, variance = self.running_mean[rows].flatten(), self.running_var[rows].flatten()
        x_hat = batch_norm.normalize(flat, mean, variance, self.eps)
        return self.scale_and_shift(x_hat.view(batch, steps, features))

    def scale_and_shift(self, x_hat: torch.Tensor) -> torch.Tensor:
        """gamma * x_hat + beta (beta = 0 without shift)."""
        if self.beta is None:
            return x_hat * self.gamma
        return torch.addcmul(self.beta, x_hat, self.gamma)

    @torch.no_grad()
    def remember(self, rows, mean: torch.Tensor, variance: torch.Tensor, m: int) -> None:
        """Move the population estimates of `rows` (a step or a slice of steps) toward a batch's
        statistics; the variance enters unbiased, m / (m - 1) times the batch's (Algorithm 2)."""
        self.running_mean[rows].lerp_(mean, self.momentum)
        self.running_var[rows].lerp_(variance * (m / (m - 1)), self.momentum)

    def keep_first_steps(self, steps: int) -> None:
        """Forget the population statistics of every step from `steps` on, as if training had
        seen sequences of `steps` steps only: from then on step steps - 1's are reused."""
        if not 1 <= checks.integer("steps", steps) <= self.max_steps:
            raise ValueError(f"steps must lie in [1, {self.max_steps}]; got {steps}")
        self.max_steps = steps
        self.running_mean = self.running_mean[:steps].clone()
        self.running_var = self.running_var[:steps].clone()


# -- 3. The BN-LSTM -----------------------------------------------------------------------------


def _init_lstm_weights(weight_x: torch.Tensor, weight_h: torch.Tensor, bias: torch.Tensor):
    """The initialisation of the paper's sequential-MNIST code, for the LSTM and the BN-LSTM alike.

    Gate blocks in the order (f, i, o, g). W_x orthogonal; W_h the identity on the candidate
    block g (so that content is carried from step to step at first) and orthogonal on the
    three gates; the forget gate's bias 1, every other bias 0.
    """
    hidden = weight_h.shape[0]
    with torch.no_grad():
        nn.init.orthogonal_(weight_x)
        nn.init.orthogonal_(weight_h[:, : 3 * hidden])
        weight_h[:, 3 * hidden :] = torch.eye(hidden)
        bias.zero_()
        bias[:hidden] = 1.0


def _initial_state(state, batch: int, hidden_size: int, like: torch.Tensor):
    """The initial (h, c), each (B, H); None means zeros."""
    if state is None:
        zeros = like.new_zeros(batch, hidden_size)
        return zeros, zeros
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError("state must be a pair (h, c) of tensors")
    for name, value in zip(("h", "c"), state, strict=True):
        checks.tensor(f"state {name}", value, "(B, H)", B=batch, H=hidden_size)
    return state[0], state[1]


class BNLSTM(nn.Module):
    """The batch-normalized LSTM of section 3 of the module docstring, one layer.

    forward(x, state=None): x (B, T, input_size), state an optional (h, c) of shape (B, H) each
    (zeros by default) -> (outputs (B, T, H), (h_T, c_T)).

    Three BNs with statistics per time step: `bn_x` on W_x x_t and `bn_h` on W_h h_{t-1} (4H
    features each, no shift) and `bn_c` on c_t (H features, with shift). Every gamma starts at
    `gamma_init` (the paper: 0.1). Training on a sequence longer than `max_steps` is an error;
    in evaluation every step from max_steps on uses step max_steps - 1's statistics.
    """

    def __init__(self, input_size: int, hidden_size: int, max_steps: int, gamma_init: float = 0.1):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        self.max_steps = checks.integer("max_steps", max_steps)
        gamma_init = checks.number("gamma_init", gamma_init, 0.0, low_open=True)
        gates = 4 * hidden_size
        self.weight_x = nn.Parameter(torch.empty(input_size, gates))
        self.weight_h = nn.Parameter(torch.empty(hidden_size, gates))
        self.bias = nn.Parameter(torch.empty(gates))
        _init_lstm_weights(self.weight_x, self.weight_h, self.bias)
        self.bn_x = StepwiseBatchNorm(gates, max_steps, gamma_init, shift=False)
        self.bn_h = StepwiseBatchNorm(gates, max_steps, gamma_init, shift=False)
        self.bn_c = StepwiseBatchNorm(hidden_size, max_steps, gamma_init, shift=True)

    def forward(self, x: torch.Tensor, state=None):
        sizes = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        batch, steps = sizes["B"], sizes["T"]
        h, c = _initial_state(state, batch, self.hidden_size, x)
        if self.training:
            _check_trainable(steps, batch, self.max_steps)
        split = 3 * self.hidden_size
        # BN(W_x x_t) + b for every t at once: the input term does not depend on the state.
        input_terms = self.bn_x.all_steps(x @ self.weight_x) + self.bias
        outputs = []
        # unbind, not indexing: x[:, t] would cost a gradient buffer of x's full size per step
        for t, input_term in enumerate(input_terms.unbind(1)):
            gates = self.bn_h(h @ self.weight_h, t) + input_term
            f, i, o = torch.sigmoid(gates[:, :split]).chunk(3, dim=1)
            g = torch.tanh(gates[:, split:])
            c = torch.addcmul(f * c, i, g)  # c = f c + i g: no BN inside the cell's recurrence
            h = o * torch.tanh(self.bn_c(c, t))
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)


def _check_trainable(steps: int, batch: int, max_steps: int) -> None:
    """Training needs statistics for every step and a batch to compute them from."""
    if steps > max_steps:
        raise ValueError(
            f"a training sequence of {steps} steps is longer than max_steps = {max_steps}: "
            f"there are population statistics for {max_steps} steps only; train on shorter "
            "sequences or raise max_steps"
        )
    if batch < 2:
        raise ValueError(f"batch statistics need at least 2 examples per batch; got {batch}")


class LSTM(nn.Module):
    """The baseline: the same LSTM with the same initialisation, and no BN.

    It runs on torch's fused LSTM (our weights copied into its gate order i, f, g, o), with
    BNLSTM's interface: forward(x (B, T, D), state=None) -> (outputs (B, T, H), (h, c)).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        gates = 4 * hidden_size
        weight_x, weight_h, bias = (
            torch.empty(input_size, gates),
            torch.empty(hidden_size, gates),
            torch.empty(gates),
        )
        _init_lstm_weights(weight_x, weight_h, bias)

        def torch_order(m):  # ours (f, i, o, g) -> torch's (i, f, g, o)
            f, i, o, g = m.chunk(4, dim=-1)
            return torch.cat([i, f, g, o], dim=-1)

        with torch.no_grad():  # torch computes W z, not z W: transpose
            self.lstm.weight_ih_l0.copy_(torch_order(weight_x).T)
            self.lstm.weight_hh_l0.copy_(torch_order(weight_h).T)
            self.lstm.bias_ih_l0.copy_(torch_order(bias))
            self.lstm.bias_hh_l0.zero_()

    def forward(self, x: torch.Tensor, state=None):
        batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)["B"]
        h, c = _initial_state(state, batch, self.hidden_size, x)
        outputs, (h, c) = self.lstm(x, (h[None], c[None]))
        return outputs, (h[0], c[0])


# -- 4. Why gamma = 0.1: gradient flow through a batch-normalized tanh RNN ------------------------


class BNTanhRNN(nn.Module):
    """The paper's Figure-1 network: h_t = tanh(BN(W_h h_{t-1} + W_x x_t; gamma, 0)), W_h = I.

    One BN on the summed pre-activation (not the BN-LSTM's two), minibatch statistics at every
    step, W_x orthogonal. forward(x (B, T, D), h0 (B, H)) returns the states [h_0, h_1, ...,
    h_T], so that the gradient of a loss with respect to each of them can be read off.
    """

    def __init__(self, input_size: int, hidden_size: int, gamma: float, eps: float = 1e-5):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        gamma = checks.number("gamma", gamma, 0.0, low_open=True)
        self.eps = checks.number("eps", eps, 0.0, low_open=True)
        self.gamma = nn.Parameter(torch.full((hidden_size,), gamma))
        self.weight_h = nn.Parameter(torch.eye(hidden_size))
        self.weight_x = nn.Parameter(nn.init.orthogonal_(torch.empty(input_size, hidden_size)))

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> list[torch.Tensor]:
        batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)["B"]
        checks.tensor("h0", h0, "(B, H)", B=batch, H=self.hidden_size)
        if batch < 2:
            raise ValueError(f"batch statistics need at least 2 examples per batch; got {batch}")
        states = [h0]
        for input_term in (x @ self.weight_x).unbind(1):
            z = states[-1] @ self.weight_h + input_term
            mean, variance = batch_norm.batch_statistics(z)
            z_hat = batch_norm.normalize(z, mean, variance, self.eps)
            states.append(torch.tanh(self.gamma * z_hat))  # h_t = tanh(BN(z; gamma, 0))
        return states


def tanh_derivative_statistics(
    std: float, samples: int = 100_000, seed: int = 0
) -> tuple[float, float, float]:
    """For z ~ N(0, std^2): the mean, 25th and 75th percentiles of tanh'(z) = 1 - tanh(z)^2.

    The paper's Figure 1a: the wider the pre-activation, the more often the tanh saturates and
    the smaller its expected derivative, the factor by which it passes a gradient back.
    """
    std = checks.number("std", std, 0.0)
    z = std * torch.randn(checks.integer("samples", samples), generator=generator(seed))
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
    with seeded(seed):
        model = BNTanhRNN(x.shape[2], hidden_size, gamma).double()
        readout = nn.Linear(hidden_size, n_classes).double()
        nn.init.orthogonal_(readout.weight)
        nn.init.zeros_(readout.bias)
    h0 = h0_noise * torch.randn(batch, hidden_size, dtype=torch.float64, generator=generator(seed))
    states = model(x.double(), h0.requires_grad_(True))
    loss = F.cross_entropy(readout(states[-1]), labels)
    grads = torch.autograd.grad(loss, states)
    return torch.stack([g.norm(dim=1).mean() for g in grads])


# -- 5. Sequential digits --------------------------------------------------------------------------


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
    set's statistics (see section 3 of the module docstring).
    """
    sizes = checks.tensor("reference", reference, "(N, T, D)", dtype="floating")
    steps, features = sizes["T"], sizes["D"]
    batch = checks.tensor("x", x, "(B, T, D)", dtype="floating", T=steps, D=features)["B"]
    mean, variance = batch_norm.batch_statistics(reference.reshape(sizes["N"], steps * features))
    flat = x.reshape(batch, steps * features)
    return batch_norm.normalize(flat, mean, variance, eps).view(x.shape)


def initial_state(
    batch: int, hidden_size: int, noise: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_0, c_0) with h_0 = noise * N(0, 1) and c_0 = 0. The noise breaks the zero variance
    of the first steps, where every example has the same state and the same blank pixels."""
    noise = checks.number("noise", noise, 0.0)
    h0 = noise * torch.randn(batch, hidden_size, generator=generator)
    return h0, torch.zeros(batch, hidden_size)


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
    with seeded(seed):
        return SequenceClassifier(BNLSTM(input_size, hidden_size, max_steps, gamma_init))


def lstm_classifier(
    hidden_size: int = 64, *, input_size: int = 1, seed: int = 0
) -> SequenceClassifier:
    """A sequence classifier on the plain LSTM, its initial weights drawn from `seed`."""
    with seeded(seed):
        return SequenceClassifier(LSTM(input_size, hidden_size))


@torch.no_grad()
def estimate_population_statistics(model: nn.Module, x: torch.Tensor, state=None) -> None:
    """Set every StepwiseBatchNorm's population statistics to those of the sequences x under the
    model's current weights: the paper's test-time statistics, estimated on training data.

    One pass in training mode with all of x as one batch and momentum 1, so that each step's
    estimates become that step's mean and unbiased variance over x. (The moving averages kept
    during training lag behind weights that still change fast, and they start from a variance
    of 1 where the true one may be 1e-4: early in training they are far off.) The model's mode
    and the momenta are restored.
    """
    norms = [m for m in model.modules() if isinstance(m, StepwiseBatchNorm)]
    momenta = [bn.momentum for bn in norms]
    was_training = model.training
    try:
        model.train()
        for bn in norms:
            bn.momentum = 1.0
        model(x, state)
    finally:
        for bn, momentum in zip(norms, momenta, strict=True):
            bn.momentum = momentum
        model.train(was_training)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy in evaluation mode (population statistics, h_0 = 0)."""
    with evaluating(model):
        return accuracy(model(x), y)


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
) -> History:
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
    normalized = any(isinstance(m, StepwiseBatchNorm) for m in model.modules())
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=0.9)
    batches = minibatches(n, batch_size, generator(seed, BATCHES))
    noise = generator(seed, H0_NOISE)
    population_noise = generator(seed, POPULATION_NOISE)

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        state = initial_state(len(index), hidden, h0_noise, noise)
        return F.cross_entropy(model(train_x[index], state), train_y[index])

    def measure() -> dict[str, float]:
        if normalized:
            state = initial_state(population_size, hidden, h0_noise, population_noise)
            estimate_population_statistics(model, train_x[:population_size], state)
        return {f"{name}_accuracy": accuracy(model(x), y) for name, (x, y) in splits.items()}

    return train(
        model,
        optimizer,
        loss_of_update,
        steps,
        evaluate=measure,
        eval_every=eval_every,
        clip=clip,
        desc=type(model.rnn).__name__,
    )


# -- Stationarity of the population statistics --------------------------------------------------


def statistics_drift(bn: StepwiseBatchNorm) -> torch.Tensor:
    """How far the population statistics move from one step to the next: shape (max_steps - 1,).

    For steps t -> t + 1: the mean over features of |mean_{t+1} - mean_t| + |std_{t+1} - std_t|,
    in units of each feature's typical standard deviation (its median over the steps), so that
    features of different scales count alike.
    """
    mean, std = bn.running_mean, bn.running_var.clamp_min(0).sqrt()
    scale = std.median(dim=0).values.clamp_min(1e-12)
    change = (mean.diff(dim=0).abs() + std.diff(dim=0).abs()) / scale
    return change.mean(dim=1)
