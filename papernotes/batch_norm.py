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
   batch, so eval mode uses population statistics instead of the batch's:
   $\mathrm{E}[x]$ and the unbiased $\mathrm{Var}[x] = \frac{m}{m-1}\mathrm{E}_\mathcal{B}
   [\sigma^2_\mathcal{B}]$. We keep them as running averages updated at every training step,
   $r \leftarrow (1 - \text{momentum})\, r + \text{momentum} \cdot \text{batch value}$
   (momentum weighs the *new* batch, PyTorch's convention).

4. **One linear map at test time.** With fixed statistics BN is an affine map per feature,

   $$y = \frac{\gamma}{\sqrt{\mathrm{Var}[x] + \epsilon}}\, x
       + \Big(\beta - \frac{\gamma\, \mathrm{E}[x]}{\sqrt{\mathrm{Var}[x] + \epsilon}}\Big),$$

   so it folds into the linear layer before it.

5. **Where it goes.** BN normalises $x = Wu$, the input of the nonlinearity:
   $z = g(\mathrm{BN}(Wu))$. The bias of $Wu + b$ is dropped because $\beta$ takes its place.

6. **The paper's MNIST experiment** (Section 4.1): three hidden layers of 100 sigmoid units and
   batch 60, with and without BN, here on the 8x8 digits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from papernotes import checks
from papernotes.data import Digits, minibatches
from papernotes.training import accuracy, fit

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
    """Per-feature mean and *biased* variance of a mini-batch, each of shape (C,).

    mu_B = mean of x over the batch (and the pixels of a map);
    sigma^2_B = mean of (x - mu_B)^2, dividing by m', not m' - 1 (Algorithm 1).
    """
    dims = _feature_dims(x)
    mean = x.mean(dim=dims)
    # Written out rather than x.var(dims): the same number, and 2x faster on a small CPU.
    variance = (x - _per_feature(mean, x)).square().mean(dim=dims)
    return mean, variance


def normalize(
    x: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor, eps: float
) -> torch.Tensor:
    """x_hat = (x - mean) / sqrt(variance + eps), with per-feature (C,) statistics."""
    return (x - _per_feature(mean, x)) * _per_feature(torch.rsqrt(variance + eps), x)


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
        checks.integer("num_features", num_features)
        self.num_features = num_features
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
        # y = gamma * x_hat + beta, as one fused operation
        return torch.addcmul(_per_feature(self.beta, x), x_hat, _per_feature(self.gamma, x))

    @torch.no_grad()
    def _update_running_statistics(self, mean, variance, m: int) -> None:
        # Population variance is estimated without bias: m / (m - 1) times the batch's.
        unbiased = variance * (m / (m - 1))
        self.running_mean.lerp_(mean, self.momentum)
        self.running_var.lerp_(unbiased, self.momentum)

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"BatchNorm needs a floating-point tensor; got {got}")
        if x.dim() not in (2, 4) or x.shape[1] != self.num_features:
            raise ValueError(
                f"BatchNorm({self.num_features}) needs input (N, {self.num_features}) or "
                f"(N, {self.num_features}, H, W); got {tuple(x.shape)}"
            )
        if x.dtype != self.gamma.dtype:
            raise TypeError(
                f"BatchNorm's parameters are {self.gamma.dtype} but the input is {x.dtype}; "
                "convert one of them (module.double() or x.float())"
            )
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
    replaces it); without, g(Wu + b). Weights start as small Gaussians, N(0, init_std^2).

    `sigmoid_inputs(x)` returns what enters each nonlinearity, the quantity of the paper's
    Figure 1 (b, c).
    """

    def __init__(
        self,
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
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}; got {activation!r}"
            )
        for name, value in [("n_inputs", n_inputs), ("hidden", hidden), ("n_layers", n_layers)]:
            checks.integer(name, value)
        checks.number("init_std", init_std, low=0.0, low_open=True)
        self.batch_norm = batch_norm
        widths = [n_inputs] + [hidden] * n_layers
        self.linears = nn.ModuleList(
            nn.Linear(a, b, bias=not batch_norm)
            for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.norms = nn.ModuleList(BatchNorm(hidden) for _ in range(n_layers if batch_norm else 0))
        self.act = ACTIVATIONS[activation]()
        self.readout = nn.Linear(hidden, n_classes)
        with torch.no_grad():
            for layer in [*self.linears, self.readout]:
                layer.weight.normal_(0.0, init_std)
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.act(self.nonlinearity_inputs(x)[-1]))


PERCENTILES = (0.15, 0.50, 0.85)


@dataclass(frozen=True)
class Run:
    """One training run: test accuracy every `eval_every` steps, and the 15th/50th/85th
    percentiles over the test set of each last-hidden-layer unit's nonlinearity input,
    shape (evals, 3, hidden). `diverged` is True if the loss stopped being finite; `model` is
    the network as training left it."""

    steps: list[int]
    test_accuracy: list[float]
    band: torch.Tensor
    diverged: bool
    model: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def final_accuracy(self) -> float:
        return self.test_accuracy[-1]


@torch.no_grad()
def _evaluate(model: MNISTNet, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    model.eval()
    inputs = model.nonlinearity_inputs(x)
    logits = model.readout(model.act(inputs[-1]))
    model.train()
    band = torch.quantile(inputs[-1], torch.tensor(PERCENTILES, dtype=inputs[-1].dtype), dim=0)
    return accuracy(logits, y), band


def train_mnist_net(
    digits: Digits,
    lr: float,
    batch_norm: bool,
    activation: str = "sigmoid",
    steps: int = 1000,
    batch_size: int = 60,
    eval_every: int = 50,
    seed: int = 0,
) -> Run:
    """Plain SGD on cross-entropy, as in the paper's MNIST experiment; evaluated in eval mode.

    A run whose loss turns inf or NaN stops updating (it has diverged) and is scored as it is.
    """
    checks.number("lr", lr, low=0.0, low_open=True)
    for name, value in [("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)]:
        checks.integer(name, value)
    if eval_every > steps:
        raise ValueError(f"eval_every ({eval_every}) must not exceed steps ({steps})")
    torch.manual_seed(seed)
    model = MNISTNet(batch_norm, activation, n_inputs=digits.n_pixels)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = minibatches(len(digits.train_x), batch_size, torch.Generator().manual_seed(seed))
    loss_fn = nn.CrossEntropyLoss()
    diverged = False
    bands: list[torch.Tensor] = []

    def step(i: int):
        nonlocal diverged
        if not diverged:
            index = next(batches)
            loss = loss_fn(model(digits.train_x[index]), digits.train_y[index])
            diverged = not torch.isfinite(loss).item()
            if not diverged:
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        if (i + 1) % eval_every and i != steps - 1:
            return None
        acc, band = _evaluate(model, digits.test_x, digits.test_y)
        bands.append(band)
        return {"test_accuracy": acc}

    name = f"{'BN' if batch_norm else 'no BN'}, {activation}, lr {lr:g}"
    history = fit(step, steps, desc=name)
    return Run(
        steps=[int(s) for s in history["step"]],
        test_accuracy=history["test_accuracy"],
        band=torch.stack(bands),
        diverged=diverged,
        model=model.eval(),
    )


# -- measuring the claims -----------------------------------------------------------------------


def steps_to_reach(run: Run, target: float) -> int | None:
    """The first evaluated step at which the test accuracy is at least `target` (None: never)."""
    for step, acc in zip(run.steps, run.test_accuracy, strict=True):
        if acc >= target:
            return step
    return None


def band_drift(band: torch.Tensor) -> torch.Tensor:
    """How far a unit's percentile band wanders over training: for each of the 15th, 50th and
    85th percentile, its range (max - min) over the evaluations, averaged over the three.

    band: (evals, 3, units) -> (units,). A steady input distribution has a small drift.
    """
    if band.dim() != 3 or band.shape[1] != len(PERCENTILES):
        raise ValueError(f"band must have shape (evals, 3, units); got {tuple(band.shape)}")
    spread = band.max(dim=0).values - band.min(dim=0).values
    return spread.mean(dim=0)
