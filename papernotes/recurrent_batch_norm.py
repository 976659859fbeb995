r"""Recurrent Batch Normalization: batch-normalize the LSTM's step from one state to the next.

Cooijmans, Ballas, Laurent, Gülçehre & Courville 2016, *Recurrent Batch Normalization*
(ICLR 2017, arXiv:1603.09025). The module follows the paper in order.

1. **The batch-normalizing transform.** For pre-activations $z$ of a minibatch,

   $$\mathrm{BN}(z; \gamma, \beta) = \beta + \gamma \odot
       \frac{z - \widehat{\mathbb{E}}[z]}{\sqrt{\widehat{\mathrm{Var}}[z] + \epsilon}},$$

   with the mean and variance taken over the minibatch while training and replaced by population
   estimates at test time.

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

   $\beta_h = \beta_x = 0$ because the bias $b$ already shifts their sum.

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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from papernotes import checks
from papernotes.data import minibatches
from papernotes.training import accuracy, fit

# -- checks shared by the public functions ------------------------------------------------------


def _check_sequence(x, input_size: int | None = None) -> tuple[int, int]:
    """x must be a float tensor (T, B, input_size); returns (T, B)."""
    if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
        raise TypeError(f"x must be a floating-point tensor; got {type(x).__name__}")
    size = x.shape[-1] if input_size is None else input_size
    if x.dim() != 3 or x.shape[2] != size or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(
            f"x must have shape (T, B, input_size) with input_size = {size}; got {tuple(x.shape)}"
        )
    return x.shape[0], x.shape[1]


def _check_state(state, batch: int, hidden_size: int, like: torch.Tensor):
    """The initial (h, c), each (B, H); None means zeros."""
    if state is None:
        zeros = like.new_zeros(batch, hidden_size)
        return zeros, zeros
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError("state must be a pair (h, c) of tensors")
    for name, value in zip(("h", "c"), state, strict=True):
        if not isinstance(value, torch.Tensor) or value.shape != (batch, hidden_size):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"state {name} must have shape (B, H) = {(batch, hidden_size)}; got {got}"
            )
    return state[0], state[1]


# -- 1 and 2. BN with statistics per time step ---------------------------------------------------


class StepwiseBatchNorm(nn.Module):
    """BN(z; gamma, beta) with one set of statistics per time step, gamma and beta shared.

    Training: step t is normalized with its own minibatch mean and (biased) variance, and step
    t's population estimates `running_mean[t]`, `running_var[t]` (unbiased) move toward them by
    `momentum`. Evaluation: step t uses the population estimates of step min(t, max_steps - 1),
    so every step past the last trained one reuses the last one's statistics (the paper's rule).

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
        """Normalize the pre-activations z (B, F) of time step t (counted from 0)."""
        if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[1] != self.num_features:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(f"z must have shape (B, {self.num_features}); got {got}")
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"the time step t must be an integer >= 0; got {t!r}")
        if self.training:
            self.check_trainable(t + 1, z.shape[0])
        return self.step(z, t)

    def step(self, z: torch.Tensor, t: int) -> torch.Tensor:
        """`forward` without its checks, for the inner loop of a recurrent network."""
        s = t if self.training else self.statistics_step(t)
        # torch's fused BN. In training it normalizes with z's batch statistics and updates the
        # row views running_mean[t], running_var[t] in place: step t's population estimates.
        return torch.batch_norm(
            z,
            self.gamma,
            self.beta,
            self.running_mean[s],
            self.running_var[s],
            self.training,
            self.momentum,
            self.eps,
            False,
        )

    def keep_first_steps(self, steps: int) -> None:
        """Forget the population statistics of every step from `steps` on, as if training had
        seen sequences of `steps` steps only: from then on step steps - 1's are reused."""
        if not 1 <= checks.integer("steps", steps) <= self.max_steps:
            raise ValueError(f"steps must lie in [1, {self.max_steps}]; got {steps}")
        self.max_steps = steps
        self.running_mean = self.running_mean[:steps].clone()
        self.running_var = self.running_var[:steps].clone()

    def check_trainable(self, steps: int, batch: int) -> None:
        """Training needs statistics for every step and a batch to compute them from."""
        if steps > self.max_steps:
            raise ValueError(
                f"a training sequence of {steps} steps is longer than max_steps = "
                f"{self.max_steps}: there are population statistics for {self.max_steps} steps "
                "only; train on shorter sequences or raise max_steps"
            )
        if batch < 2:
            raise ValueError(f"batch statistics need at least 2 examples per batch; got {batch}")


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


def _project(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight for x (..., D). With one input feature (pixel sequences) it is an outer product,
    which broadcasting computes far faster on a CPU than a matrix product with inner size 1."""
    return x * weight[0] if weight.shape[0] == 1 else x @ weight


class BNLSTM(nn.Module):
    """The batch-normalized LSTM of section 3 of the module docstring, one layer.

    forward(x, state=None): x (T, B, input_size), state an optional (h, c) of shape (B, H) each
    (zeros by default) -> (outputs (T, B, H), (h_T, c_T)).

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
        steps, batch = _check_sequence(x, self.input_size)
        h, c = _check_state(state, batch, self.hidden_size, x)
        if self.training:
            self.bn_h.check_trainable(steps, batch)
        split = 3 * self.hidden_size
        outputs = []
        # unbind, not x[t]: indexing would cost a gradient buffer of x's full size per step
        for t, x_t in enumerate(x.unbind(0)):
            recurrent_term = self.bn_h.step(h @ self.weight_h, t)
            input_term = self.bn_x.step(_project(x_t, self.weight_x), t)
            gates = recurrent_term + input_term + self.bias
            f, i, o = torch.sigmoid(gates[:, :split]).chunk(3, dim=1)
            g = torch.tanh(gates[:, split:])
            c = torch.addcmul(f * c, i, g)  # c = f c + i g: no BN inside the cell's recurrence
            h = o * torch.tanh(self.bn_c.step(c, t))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


class LSTM(nn.Module):
    """The baseline: the same LSTM with the same initialisation, and no BN.

    It runs on torch's fused LSTM (our weights copied into its gate order i, f, g, o), with
    BNLSTM's interface: forward(x (T, B, D), state=None) -> (outputs (T, B, H), (h, c)).
    """

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size = checks.integer("input_size", input_size)
        self.hidden_size = checks.integer("hidden_size", hidden_size)
        self.lstm = nn.LSTM(input_size, hidden_size)
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
        _, batch = _check_sequence(x, self.input_size)
        h, c = _check_state(state, batch, self.hidden_size, x)
        outputs, (h, c) = self.lstm(x, (h[None], c[None]))
        return outputs, (h[0], c[0])


# -- 4. Why gamma = 0.1: gradient flow through a batch-normalized tanh RNN ------------------------


class BNTanhRNN(nn.Module):
    """The paper's Figure-1 network: h_t = tanh(BN(W_h h_{t-1} + W_x x_t; gamma, 0)), W_h = I.

    One BN on the summed pre-activation (not the BN-LSTM's two), minibatch statistics at every
    step, W_x orthogonal. forward(x, h0) returns the states [h_0, h_1, ..., h_T], so that the
    gradient of a loss with respect to each of them can be read off.
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
        _, batch = _check_sequence(x, self.input_size)
        if batch < 2:
            raise ValueError(f"batch statistics need at least 2 examples per batch; got {batch}")
        if not isinstance(h0, torch.Tensor) or h0.shape != (batch, self.hidden_size):
            raise ValueError(f"h0 must have shape (B, H) = {(batch, self.hidden_size)}")
        states = [h0]
        for input_term in _project(x, self.weight_x).unbind(0):
            z = states[-1] @ self.weight_h + input_term
            mean = z.mean(dim=0)
            var = (z - mean).square().mean(dim=0)
            states.append(torch.tanh(self.gamma * (z - mean) / torch.sqrt(var + self.eps)))
        return states


def tanh_derivative_statistics(
    std: float, samples: int = 100_000, seed: int = 0
) -> tuple[float, float, float]:
    """For z ~ N(0, std^2): the mean, 25th and 75th percentiles of tanh'(z) = 1 - tanh(z)^2.

    The paper's Figure 1a: the wider the pre-activation, the more often the tanh saturates and
    the smaller its expected derivative, the factor by which it passes a gradient back.
    """
    std = checks.number("std", std, 0.0)
    generator = torch.Generator().manual_seed(seed)
    z = std * torch.randn(checks.integer("samples", samples), generator=generator)
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

    L is the mean cross-entropy of an orthogonally initialised linear read-out of h_T; the norm
    is taken per example and averaged over the batch (as the authors' plotting code does).
    h_0 is `h0_noise` times standard normal noise, the paper's fix for zero-variance first steps.
    """
    _, batch = _check_sequence(x)
    if not isinstance(labels, torch.Tensor) or labels.shape != (batch,):
        got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"labels must have shape (B,) = ({batch},); got {got}")
    h0_noise = checks.number("h0_noise", h0_noise, 0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BNTanhRNN(x.shape[2], hidden_size, gamma).double()
        readout = nn.Linear(hidden_size, n_classes).double()
        nn.init.orthogonal_(readout.weight)
        nn.init.zeros_(readout.bias)
        h0 = h0_noise * torch.randn(batch, hidden_size, dtype=torch.float64)
    states = model(x.double(), h0.requires_grad_(True))
    loss = F.cross_entropy(readout(states[-1]), labels)
    grads = torch.autograd.grad(loss, states)
    return torch.stack([g.norm(dim=1).mean() for g in grads])


# -- 5. Sequential digits --------------------------------------------------------------------------


def pixel_sequences(
    images: torch.Tensor, steps: int | None = None, order: torch.Tensor | None = None
) -> torch.Tensor:
    """Flattened images (N, P) -> pixel sequences (T, N, 1), one pixel per step.

    `order` (a permutation of the P pixels) reads them in another order (permuted digits).
    `steps` < P keeps the first `steps` pixels; `steps` > P continues with blank pixels, as if
    the digit sat at the top of a taller canvas (the longer test sequences).
    """
    if not isinstance(images, torch.Tensor) or images.dim() != 2:
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must have shape (N, P); got {got}")
    pixels = images.shape[1]
    if order is not None:
        if sorted(torch.as_tensor(order).tolist()) != list(range(pixels)):
            raise ValueError(f"order must be a permutation of the {pixels} pixel indices")
        images = images[:, order]
    steps = pixels if steps is None else checks.integer("steps", steps)
    if steps > pixels:
        images = torch.cat([images, images.new_zeros(len(images), steps - pixels)], dim=1)
    return images[:, :steps].T.unsqueeze(-1).contiguous()


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

    def forward(self, x: torch.Tensor, state=None) -> torch.Tensor:
        _, (h, _) = self.rnn(x, state)
        return self.readout(h)


MODELS = ("lstm", "bn-lstm")


def make_classifier(
    kind: str, hidden_size: int = 64, max_steps: int = 64, gamma_init: float = 0.1
) -> SequenceClassifier:
    """A pixel-sequence classifier on a BN-LSTM ("bn-lstm") or the plain LSTM ("lstm")."""
    if kind == "bn-lstm":
        return SequenceClassifier(BNLSTM(1, hidden_size, max_steps, gamma_init))
    if kind == "lstm":
        return SequenceClassifier(LSTM(1, hidden_size))
    raise ValueError(f"kind must be one of {', '.join(MODELS)}; got {kind!r}")


@torch.no_grad()
def estimate_population_statistics(model: nn.Module, x: torch.Tensor, state=None) -> None:
    """Set every StepwiseBatchNorm's population statistics to those of the sequences x under the
    model's current weights: the paper's test-time statistics, estimated on training data.

    One pass in training mode with all of x as one batch and momentum 1, so that each step's
    estimates become that step's mean and unbiased variance over x. (The moving averages kept
    during training lag behind weights that still change fast, and they start from a variance
    of 1 where the true one may be 1e-4: early in training they are far off.)
    """
    norms = [m for m in model.modules() if isinstance(m, StepwiseBatchNorm)]
    momenta = [bn.momentum for bn in norms]
    was_training = model.training
    model.train()
    try:
        for bn in norms:
            bn.momentum = 1.0
        model(x, state)
    finally:
        for bn, momentum in zip(norms, momenta, strict=True):
            bn.momentum = momentum
        model.train(was_training)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Accuracy in evaluation mode (population statistics, h_0 = 0); the mode is restored."""
    was_training = model.training
    model.eval()
    try:
        return accuracy(model(x), y)
    finally:
        model.train(was_training)


@dataclass
class TrainingRun:
    """A trained classifier and its history: "step", "loss" and "val_accuracy" every
    `eval_every` updates."""

    model: SequenceClassifier
    history: dict[str, list[float]]

    def updates_to_reach(self, target: float) -> int | None:
        """The first logged number of updates at which validation accuracy >= target, or None."""
        for step, acc in zip(self.history["step"], self.history["val_accuracy"], strict=True):
            if acc >= target:
                return int(step)
        return None


def train_classifier(
    kind: str,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    steps: int = 200,
    batch_size: int = 128,
    lr: float = 1e-2,
    clip: float = 1.0,
    h0_noise: float = 0.1,
    gamma_init: float = 0.1,
    hidden_size: int = 64,
    eval_every: int = 25,
    population_size: int = 256,
    seed: int = 0,
) -> TrainingRun:
    """Train a classifier on pixel sequences (T, N, 1) with the paper's recipe: RMSProp (decay
    0.9), gradient norm clipped at `clip`, noise on h_0 while training.

    Every `eval_every` updates: population statistics from the first `population_size` training
    sequences (BN-LSTM only), then the accuracy on the validation sequences. The same seed gives
    the LSTM and the BN-LSTM the same minibatches.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)):
        checks.integer(name, value)
    checks.number("lr", lr, 0.0, low_open=True)
    checks.number("clip", clip, 0.0, low_open=True)
    population_size = min(checks.integer("population_size", population_size), train_x.shape[1])
    torch.manual_seed(seed)
    model = make_classifier(kind, hidden_size, train_x.shape[0], gamma_init)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=0.9)
    generator = torch.Generator().manual_seed(seed)
    population_noise = torch.Generator().manual_seed(seed + 1)  # leaves the minibatches alone
    batches = minibatches(train_x.shape[1], batch_size, generator)

    def step(i: int):
        index = next(batches)
        state = initial_state(len(index), hidden_size, h0_noise, generator)
        loss = F.cross_entropy(model(train_x[:, index], state), train_y[index])
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if (i + 1) % eval_every:
            return None
        if kind == "bn-lstm":
            state = initial_state(population_size, hidden_size, h0_noise, population_noise)
            estimate_population_statistics(model, train_x[:, :population_size], state)
        return {"loss": loss.item(), "val_accuracy": evaluate(model, val_x, val_y)}

    history = fit(step, steps, desc=kind)
    return TrainingRun(model, history)


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
