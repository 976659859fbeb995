r"""Recurrent Batch Normalization: batch-normalize the LSTM's step from one state to the next.

Cooijmans, Ballas, Laurent, Gülçehre & Courville 2016, *Recurrent Batch Normalization*
(ICLR 2017, arXiv:1603.09025). The chapter (chapters/recurrent_batch_norm.ipynb, "The idea")
derives it; this module is the mechanism alone, in the paper's order, each equation above the
line that computes it. Sequences are batch-first: (B, T, D) in and out, states (B, H).

1. The batch-normalizing transform is the Batch Normalization chapter's
   (`papernotes.batch_norm`: `batch_statistics` and `normalize`, its Algorithm 1).
2. Statistics per time step (`StepwiseBatchNorm`): unrolled in time a recurrent network is a deep
   network whose layers share weights, but its activations are not distributed alike at every
   step, so each step has its own mean and variance while gamma and beta are shared; a step past
   the last trained one reuses that one's population statistics.
3. The BN-LSTM (`BNLSTM`): the recurrent and the input term normalized separately, the cell only
   where it is read out. (The baselines, the LSTM without BN and the LSTM with BN on its input
   term only, are the experiment's: code of their own, out of a broken mechanism's reach.)
4. gamma starts at 0.1, not 1: at 1 the tanh saturates and the gradient dies on its way back
   through time. The paper shows it on a tanh RNN with one BN on the summed pre-activation
   (`BNTanhRNN`, its Figure 1(a)).
5. The zero-variance trap of the first steps, where every example has the same state: noise on
   h_0 while training (`initial_state`); and the test-time population statistics estimated on
   training data (`estimate_population_statistics`).

The sequential-digits experiment, the gradient-flow measurements and the ablations of the
statistics are in `papernotes.recurrent_batch_norm.experiment`.
"""

from __future__ import annotations

import torch
from torch import nn

from papernotes import batch_norm, checks

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
            # Past T_max, step T_max's statistics: they settle to stationary values.
            row = self.statistics_step(t)
            mean, variance = self.running_mean[row], self.running_var[row]
        # BN(z; gamma, beta) = beta + gamma * (z - E[z]) / sqrt(Var[z] + eps)
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
        # r <- (1 - momentum) r + momentum * (the batch's value)
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
    """The initialisation of the paper's sequential-MNIST code.

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
    """The batch-normalized LSTM, one layer: the recurrent and the input term normalized
    separately, the cell only where it is read out, never inside its own recurrence.

    forward(x, state=None): x (B, T, input_size), state an optional (h, c) of shape (B, H) each
    (zeros by default) -> (outputs (B, T, H), (h_T, c_T)).

    Three BNs with statistics per time step: `bn_x` on W_x x_t and `bn_h` on W_h h_{t-1} (4H
    features each, no shift) and `bn_c` on c_t (H features, with shift). Every gamma starts at
    `gamma_init` (the paper: 0.1). Training on a sequence longer than `max_steps` is an error;
    in evaluation every step from max_steps on uses step max_steps - 1's statistics.
    """

    def __init__(self, input_size: int, hidden_size: int, max_steps: int, gamma_init: float = 0.1):
        super().__init__()
        gamma_init = set_sizes(self, input_size, hidden_size, max_steps, gamma_init)
        gates = 4 * hidden_size
        self.weight_x = nn.Parameter(torch.empty(input_size, gates))
        self.weight_h = nn.Parameter(torch.empty(hidden_size, gates))
        self.bias = nn.Parameter(torch.empty(gates))
        _init_lstm_weights(self.weight_x, self.weight_h, self.bias)
        # BN fixes a pre-activation's std to gamma: at 0.1 (not 1) the tanh works in its linear
        # range and the gradient survives the way back through time.
        self.bn_x = StepwiseBatchNorm(gates, max_steps, gamma_init, shift=False)
        self.bn_h = StepwiseBatchNorm(gates, max_steps, gamma_init, shift=False)
        self.bn_c = StepwiseBatchNorm(hidden_size, max_steps, gamma_init, shift=True)

    def forward(self, x: torch.Tensor, state=None):
        sizes = checks.tensor("x", x, "(B, T, D)", dtype="floating", D=self.input_size)
        batch, steps = sizes["B"], sizes["T"]
        h, c = _initial_state(state, batch, self.hidden_size, x)
        if self.training:
            check_trainable(steps, batch, self.max_steps)
        return self._unroll(x, h, c)

    def _unroll(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """The BN-LSTM's steps over x (B, T, D) from (h, c), arguments already checked."""
        split = 3 * self.hidden_size
        # BN(W_x x_t; gamma_x, 0) + b for every t at once: the input term does not depend on
        # the state. (beta_x = beta_h = 0: the bias b already shifts their sum.)
        input_terms = self.bn_x.all_steps(x @ self.weight_x) + self.bias
        outputs = []
        # unbind, not indexing: x[:, t] would cost a gradient buffer of x's full size per step
        for t, input_term in enumerate(input_terms.unbind(1)):
            # (f~, i~, o~, g~) = BN(W_h h_{t-1}; gamma_h, 0) + BN(W_x x_t; gamma_x, 0) + b
            gates = self.bn_h(h @ self.weight_h, t) + input_term
            f, i, o = torch.sigmoid(gates[:, :split]).chunk(3, dim=1)
            g = torch.tanh(gates[:, split:])
            # c_t = sigma(f~) c_{t-1} + sigma(i~) tanh(g~): no BN inside the cell's recurrence
            c = torch.addcmul(f * c, i, g)
            # h_t = sigma(o~) tanh(BN(c_t; gamma_c, beta_c))
            h = o * torch.tanh(self.bn_c(c, t))
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)


def set_sizes(layer: nn.Module, input_size, hidden_size, max_steps, gamma_init) -> float:
    """Check a recurrent layer's sizes and set them on it (the nulls of the experiment set theirs
    with it too); returns gamma_init, checked."""
    layer.input_size = checks.integer("input_size", input_size)
    layer.hidden_size = checks.integer("hidden_size", hidden_size)
    layer.max_steps = checks.integer("max_steps", max_steps)
    return checks.number("gamma_init", gamma_init, 0.0, low_open=True)


def check_trainable(steps: int, batch: int, max_steps: int) -> None:
    """Training needs statistics for every step and a batch to compute them from (the nulls of
    the experiment check their sequences with it too)."""
    if steps > max_steps:
        raise ValueError(
            f"a training sequence of {steps} steps is longer than max_steps = {max_steps}: "
            f"there are population statistics for {max_steps} steps only; train on shorter "
            "sequences or raise max_steps"
        )
    if batch < 2:
        raise ValueError(f"batch statistics need at least 2 examples per batch; got {batch}")


# -- 4. Why gamma = 0.1: a batch-normalized tanh RNN -------------------------------------------


class BNTanhRNN(nn.Module):
    """The paper's Figure-1(a) network: h_t = tanh(BN(W_h h_{t-1} + W_x x_t; gamma, 0)), W_h = I.

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
            # z = W_h h_{t-1} + W_x x_t, one BN on the sum (the BN-LSTM has two)
            z = states[-1] @ self.weight_h + input_term
            mean, variance = batch_norm.batch_statistics(z)
            z_hat = batch_norm.normalize(z, mean, variance, self.eps)
            states.append(torch.tanh(self.gamma * z_hat))  # h_t = tanh(BN(z; gamma, 0))
        return states


# -- 5. The initial state and the test-time statistics ------------------------------------------


def initial_state(
    batch: int, hidden_size: int, noise: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_0, c_0) with h_0 = noise * N(0, 1) and c_0 = 0. The noise breaks the zero variance
    of the first steps, where every example has the same state and the same blank pixels."""
    noise = checks.number("noise", noise, 0.0)
    h0 = noise * torch.randn(batch, hidden_size, generator=generator)
    return h0, torch.zeros(batch, hidden_size)


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
