r"""Batch Normalization: normalise each layer's inputs with the statistics of the mini-batch.

Ioffe & Szegedy 2015, *Batch Normalization: Accelerating Deep Network Training by Reducing
Internal Covariate Shift* (arXiv:1502.03167). The module follows the paper's order.

1. **Training (the paper's Algorithm 1).** For one feature $x$ over a mini-batch
   $\mathcal{B} = \{x_1, \dots, x_m\}$,

   $$\mu_\mathcal{B} = \frac{1}{m}\sum_{i=1}^m x_i, \qquad
     \sigma^2_\mathcal{B} = \frac{1}{m}\sum_{i=1}^m (x_i - \mu_\mathcal{B})^2,$$

   $$\hat{x}_i = \frac{x_i - \mu_\mathcal{B}}{\sqrt{\sigma^2_\mathcal{B} + \epsilon}}, \qquad
     y_i = \gamma\, \hat{x}_i + \beta.$$

   The variance that normalises is the *biased* one (divide by $m$). $\gamma$ and $\beta$ are
   learned per feature, so the layer can undo the normalisation ($\gamma = \sigma$,
   $\beta = \mu$ gives back $x$) if that is what the loss wants. Gradients flow through
   $\mu_\mathcal{B}$ and $\sigma^2_\mathcal{B}$ too: the statistics are part of the network.

2. **Convolutions (Section 3.2).** One $\gamma, \beta$ per channel, and the statistics of a
   channel are taken over the batch *and* every spatial position: an effective batch of
   $m' = m \cdot p \cdot q$ values for a $p \times q$ feature map.

3. **Inference (Algorithm 2).** A prediction should not depend on the other examples in its
   batch, so eval mode uses population statistics instead of the batch's, gathered over training
   mini-batches $\mathcal{B}$ of size $m$ with the weights frozen:

   $$\mathrm{E}[x] = \mathrm{E}_\mathcal{B}[\mu_\mathcal{B}], \qquad
     \mathrm{Var}[x] = \frac{m}{m-1}\,\mathrm{E}_\mathcal{B}[\sigma^2_\mathcal{B}].$$

   The layer keeps them as moving averages updated at every training step (the paper's
   "moving averages", which let a model be evaluated while it trains),
   $r \leftarrow (1 - \text{momentum})\, r + \text{momentum} \cdot \text{batch value}$
   (momentum weighs the *new* batch, PyTorch's convention); `population_statistics` computes
   Algorithm 2's averages after training, to check the moving averages against.

4. **One linear map at test time.** With fixed statistics BN is an affine map per feature,

   $$y = \frac{\gamma}{\sqrt{\mathrm{Var}[x] + \epsilon}}\, x
       + \Big(\beta - \frac{\gamma\, \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}}\Big),$$

   so it folds into the linear layer before it.

5. **Where it goes.** BN normalises $x = Wu$, the input of the nonlinearity:
   $z = g(\mathrm{BN}(Wu))$. The bias of $Wu + b$ is dropped because $\beta$ takes its place.

6. **The paper's MNIST experiment** (Section 4.1): three hidden layers of 100 sigmoid units and
   batch 60, with and without BN, here on the 8x8 digits; and the paper's Figure 1 (b, c), the
   15th, 50th and 85th percentiles of a last-layer sigmoid's input over training.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from papernotes import checks
from papernotes.data import Digits, minibatches
from papernotes.training import History, accuracy, generator, seeded, train

# -- 1 and 2. Mini-batch statistics and the normalising transform -------------------------------


def _feature_dims(x: torch.Tensor) -> tuple[int, ...]:
    """The dims a feature's statistics are taken over: the batch, and the pixels of a map."""
    return (0,) if x.dim() == 2 else (0, 2, 3)


def _per_feature(stat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Shape a (C,) statistic or parameter to broadcast against x, (N, C) or (N, C, H, W)."""
    return stat if x.dim() == 2 else stat.view(-1, 1, 1)


def values_per_feature(x: torch.Tensor) -> int:
    """m' = N (fully connected) or N * H * W (convolutional): values behind one statistic."""
    return x.numel() // x.shape[1]


def batch_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-feature mean and *biased* variance of a mini-batch (Algorithm 1), each of shape (C,).

    $\mu_\mathcal{B} = \frac{1}{m}\sum_i x_i$ and
    $\sigma^2_\mathcal{B} = \frac{1}{m}\sum_i (x_i - \mu_\mathcal{B})^2$: divide by m', not
    m' - 1. x is (N, C), or (N, C, H, W) with the pixels of a map pooled with the batch.
    """
    dims = _feature_dims(x)
    mean = x.mean(dim=dims)
    # Written out rather than x.var(dims): the same number, and 2x faster on a small CPU.
    variance = (x - _per_feature(mean, x)).square().mean(dim=dims)
    return mean, variance


def normalize(
    x: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor, eps: float
) -> torch.Tensor:
    r"""$\hat{x} = (x - \mu) / \sqrt{\sigma^2 + \epsilon}$ (Algorithm 1), with per-feature (C,)
    statistics: the batch's in training, the population's at inference."""
    return (x - _per_feature(mean, x)) * _per_feature(torch.rsqrt(variance + eps), x)


def unbiased(variance: torch.Tensor, m: int) -> torch.Tensor:
    r"""$\frac{m}{m-1}\sigma^2$: the unbiased estimate of a population variance from a batch's
    biased variance over m values (Algorithm 2)."""
    return variance * (m / (m - 1))


# -- 3. The layer: batch statistics to train, population statistics to predict --------------------


class BatchNorm(nn.Module):
    """Batch normalisation of (N, C) features or (N, C, H, W) feature maps, one gamma and beta
    per feature (channel).

    - train mode: normalise with the batch's mean and biased variance, and move the running
      mean and the running *unbiased* variance towards the batch's by `momentum`;
    - eval mode: normalise with the running statistics (the paper's population statistics).

    gamma starts at 1 and beta at 0, so a fresh layer outputs x_hat itself.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.num_features = checks.integer("num_features", num_features)
        self.eps = checks.number("eps", eps, low=0.0, low_open=True)
        self.momentum = checks.number("momentum", momentum, low=0.0, low_open=True, high=1.0)
        self.gamma = nn.Parameter(torch.ones(num_features))
        self.beta = nn.Parameter(torch.zeros(num_features))
        # Before any batch is seen, "population" statistics that leave x unchanged.
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if self.training:
            mean, variance = batch_statistics(x)
            self._update_running_statistics(mean, variance, values_per_feature(x))
        else:
            mean, variance = self.running_mean, self.running_var
        x_hat = normalize(x, mean, variance, self.eps)
        return _per_feature(self.gamma, x) * x_hat + _per_feature(self.beta, x)  # y = γ x̂ + β

    @torch.no_grad()
    def _update_running_statistics(self, mean, variance, m: int) -> None:
        # r <- (1 - momentum) r + momentum * (the batch's value); the variance unbiased.
        self.running_mean.lerp_(mean, self.momentum)
        self.running_var.lerp_(unbiased(variance, m), self.momentum)

    def _check_input(self, x: torch.Tensor) -> None:
        maps = isinstance(x, torch.Tensor) and x.dim() == 4
        shape = "(N, C, H, W)" if maps else "(N, C)"
        checks.tensor("x", x, shape, dtype=self.gamma.dtype, C=self.num_features)
        if self.training and values_per_feature(x) < 2:
            raise ValueError(
                "BatchNorm in train mode needs at least 2 values per feature to estimate a "
                f"variance; got input {tuple(x.shape)} (use eval mode to predict one example)"
            )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps:g}, momentum={self.momentum:g}"


# -- 4. At test time BN is one linear map ------------------------------------------------------


def fold_into_linear(linear: nn.Linear, bn: BatchNorm) -> nn.Linear:
    """One nn.Linear equal to bn(linear(x)) with bn in eval mode (its running statistics).

    With s = gamma / sqrt(running_var + eps):  W' = diag(s) W  and
    b' = s * (b - running_mean) + beta  (b = 0 when the linear layer has no bias).
    """
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be a torch.nn.Linear; got {type(linear).__name__}")
    if not isinstance(bn, BatchNorm):
        raise TypeError(f"bn must be a papernotes.batch_norm.BatchNorm; got {type(bn).__name__}")
    if linear.out_features != bn.num_features:
        raise ValueError(
            f"linear has {linear.out_features} outputs but bn normalises {bn.num_features} features"
        )
    with torch.no_grad():
        scale = bn.gamma / torch.sqrt(bn.running_var + bn.eps)
        bias = linear.bias if linear.bias is not None else torch.zeros_like(bn.running_mean)
        folded = nn.Linear(linear.in_features, linear.out_features, bias=True)
        folded = folded.to(dtype=linear.weight.dtype, device=linear.weight.device)
        folded.weight.copy_(scale[:, None] * linear.weight)
        folded.bias.copy_(scale * (bias - bn.running_mean) + bn.beta)
    return folded


# -- 5 and 6. The paper's MNIST network, with and without BN ------------------------------------

ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU}


class MNISTNet(nn.Module):
    """The paper's Section 4.1 network: `n_layers` hidden layers of `hidden` units and a linear
    read-out to 10 classes. With batch_norm, each hidden layer is g(BN(Wu)) (no bias, beta
    replaces it); without, g(Wu + b). Weights start as small Gaussians, N(0, init_std^2), and
    biases at 0.

    `nonlinearity_inputs(x)` returns what enters each nonlinearity, the quantity of the paper's
    Figure 1 (b, c).
    """

    def __init__(
        self,
        *,
        batch_norm: bool,
        activation: str = "sigmoid",
        n_inputs: int = 64,
        hidden: int = 100,
        n_layers: int = 3,
        n_classes: int = 10,
        init_std: float = 0.1,
    ):
        super().__init__()
        if not isinstance(batch_norm, bool):
            raise TypeError(f"batch_norm must be True or False; got {batch_norm!r}")
        checks.one_of("activation", activation, tuple(ACTIVATIONS))
        for name, value in [
            ("n_inputs", n_inputs),
            ("hidden", hidden),
            ("n_layers", n_layers),
            ("n_classes", n_classes),
        ]:
            checks.integer(name, value)
        checks.number("init_std", init_std, low=0.0, low_open=True)
        self.batch_norm = batch_norm
        widths = [n_inputs] + [hidden] * n_layers + [n_classes]
        shapes = list(zip(widths[1:], widths[:-1], strict=True))  # (out, in) of each weight
        # Drawn before any layer is built (building one draws its default initialisation, more
        # of it with a bias), so the networks with and without BN start from the same weights.
        weights = [torch.randn(shape) * init_std for shape in shapes]
        self.linears = nn.ModuleList(
            nn.Linear(n_in, n_out, bias=not batch_norm) for n_out, n_in in shapes[:-1]
        )
        self.norms = nn.ModuleList(BatchNorm(hidden) for _ in range(n_layers if batch_norm else 0))
        self.act = ACTIVATIONS[activation]()
        self.readout = nn.Linear(hidden, n_classes)
        with torch.no_grad():
            for layer, weight in zip([*self.linears, self.readout], weights, strict=True):
                layer.weight.copy_(weight)
                if layer.bias is not None:
                    layer.bias.zero_()

    def nonlinearity_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The input of every hidden layer's nonlinearity, in order: BN(Wu) or Wu + b."""
        inputs = []
        for i, linear in enumerate(self.linears):
            pre = linear(x)
            if self.batch_norm:
                pre = self.norms[i](pre)
            inputs.append(pre)
            x = self.act(pre)
        return inputs

    def logits(self, last_input: torch.Tensor) -> torch.Tensor:
        """The read-out of the last hidden layer, from its nonlinearity's input."""
        return self.readout(self.act(last_input))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits(self.nonlinearity_inputs(x)[-1])


PERCENTILES = (0.15, 0.50, 0.85)  # the paper's Figure 1 (b, c)


def percentile_band(inputs: torch.Tensor) -> torch.Tensor:
    """The 15th, 50th and 85th percentiles over examples of each unit's input (N, units) ->
    (3, units)."""
    return torch.quantile(inputs, torch.tensor(PERCENTILES, dtype=inputs.dtype), dim=0)


@dataclass(frozen=True)
class Run:
    """One training run: the network as training left it (in eval mode), its History (the
    training loss, and the validation and test accuracy, every `eval_every` updates and after
    the last), and the percentile bands of the last hidden layer's nonlinearity inputs over the
    test set at each of those evaluations, shape (evaluations, 3, hidden)."""

    model: MNISTNet
    history: History
    bands: torch.Tensor


def train_mnist_net(
    digits: Digits,
    lr: float,
    *,
    batch_norm: bool,
    activation: str = "sigmoid",
    seed: int,
    steps: int = 800,
    batch_size: int = 60,
    eval_every: int = 50,
) -> Run:
    """Plain SGD on cross-entropy, as in the paper's MNIST experiment, through the book's loop.

    The initial weights and the order of the batches follow `seed`, so runs of one seed with and
    without BN start from the same weights and see the same batches. A run whose loss stops
    being finite stops updating (`run.history.diverged`) and is scored as it stands.
    """
    checks.number("lr", lr, low=0.0, low_open=True)
    for name, value in [("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)]:
        checks.integer(name, value)
    checks.integer("seed", seed, 0)
    if eval_every > steps:
        raise ValueError(f"eval_every ({eval_every}) must not exceed steps ({steps})")
    with seeded(seed):
        model = MNISTNet(batch_norm=batch_norm, activation=activation, n_inputs=digits.n_pixels)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = minibatches(len(digits.train_x), batch_size, generator(seed, stream=1))
    loss_fn = nn.CrossEntropyLoss()
    bands: list[torch.Tensor] = []

    def loss_of_update(_: int) -> torch.Tensor:
        index = next(batches)
        return loss_fn(model(digits.train_x[index]), digits.train_y[index])

    def evaluate() -> dict[str, float]:
        last_input = model.nonlinearity_inputs(digits.test_x)[-1]
        bands.append(percentile_band(last_input))
        return {
            "val_accuracy": accuracy(model(digits.val_x), digits.val_y),
            "test_accuracy": accuracy(model.logits(last_input), digits.test_y),
        }

    name = f"{'BN' if batch_norm else 'no BN'}, {activation}, lr {lr:g}"
    history = train(
        model, optimizer, loss_of_update, steps, evaluate=evaluate, eval_every=eval_every, desc=name
    )
    return Run(model, history, torch.stack(bands))


# -- measuring the claims -----------------------------------------------------------------------


def band_drift(bands: torch.Tensor) -> torch.Tensor:
    """How far a unit's percentile band wanders over training: for each of the 15th, 50th and
    85th percentile, its range (max - min) over the evaluations, averaged over the three.

    bands: (evaluations, 3, units) -> (units,). A steady input distribution has a small drift.
    """
    spread = bands.max(dim=0).values - bands.min(dim=0).values
    return spread.mean(dim=0)


@dataclass(frozen=True)
class Statistics:
    """Per-feature mean and (unbiased) variance of the inputs of one BN layer, each (C,)."""

    mean: torch.Tensor
    variance: torch.Tensor


@torch.no_grad()
def population_statistics(
    model: MNISTNet, x: torch.Tensor, batch_size: int, seed: int
) -> tuple[list[Statistics], list[list[Statistics]]]:
    r"""Algorithm 2's population statistics of every BN layer of a trained network.

    One pass over `x` (the training set) in shuffled mini-batches of `batch_size`, the network
    in training mode (each layer normalised with its batch's statistics, as in training) with its
    weights frozen; for each BN layer $\mathrm{E}[x] = \mathrm{E}_\mathcal{B}[\mu_\mathcal{B}]$
    and $\mathrm{Var}[x] = \frac{m}{m-1}\mathrm{E}_\mathcal{B}[\sigma^2_\mathcal{B}]$.

    Returns the population statistics of each layer, and each layer's per-batch statistics
    (mean and unbiased variance of every batch): what one batch alone would estimate.
    """
    checks.integer("batch_size", batch_size, 2)
    probe = copy.deepcopy(model).train()  # a copy: its running statistics move, the model's not
    seen: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in probe.norms]
    hooks = [
        bn.register_forward_pre_hook(lambda _, args, i=i: seen[i].append(batch_statistics(args[0])))
        for i, bn in enumerate(probe.norms)
    ]
    batches = minibatches(len(x), batch_size, generator(seed, stream=2))
    for _ in range(len(x) // batch_size):  # one epoch
        probe(x[next(batches)])
    for hook in hooks:
        hook.remove()
    population, per_batch = [], []
    for layer in seen:
        means = torch.stack([mean for mean, _ in layer])
        variances = torch.stack([unbiased(variance, batch_size) for _, variance in layer])
        population.append(Statistics(means.mean(0), variances.mean(0)))
        per_batch.append([Statistics(m, v) for m, v in zip(means, variances, strict=True)])
    return population, per_batch


def normalisation_error(estimate: Statistics, population: Statistics, eps: float) -> float:
    r"""How far normalising with `estimate` instead of `population` moves $\hat{x}$: the RMS over
    the population of the difference, averaged over the features.

    With $\hat{x}_p = (x - \mathrm{E}[x]) / \sigma_p$ of unit variance and
    $\hat{x}_e = (x - \mu_e) / \sigma_e$ (each $\sigma = \sqrt{\mathrm{Var} + \epsilon}$),
    $\hat{x}_e - \hat{x}_p = (\mathrm{E}[x] - \mu_e)/\sigma_e + (\sigma_p/\sigma_e - 1)\,
    \hat{x}_p$, whose mean square is the sum of the two terms' squares.
    """
    sigma_e = torch.sqrt(estimate.variance + eps)
    sigma_p = torch.sqrt(population.variance + eps)
    shift = (population.mean - estimate.mean) / sigma_e
    stretch = sigma_p / sigma_e - 1.0
    return torch.sqrt(shift.square() + stretch.square()).mean().item()


def running_statistics(model: MNISTNet) -> list[Statistics]:
    """The running averages each BN layer of a network predicts with (copies)."""
    return [Statistics(bn.running_mean.clone(), bn.running_var.clone()) for bn in model.norms]


def with_statistics(model: MNISTNet, statistics: list[Statistics]) -> MNISTNet:
    """A copy of a BN network (in eval mode) whose layers predict with the given statistics."""
    copied = copy.deepcopy(model).eval()
    with torch.no_grad():
        for bn, stats in zip(copied.norms, statistics, strict=True):
            bn.running_mean.copy_(stats.mean)
            bn.running_var.copy_(stats.variance)
    return copied
